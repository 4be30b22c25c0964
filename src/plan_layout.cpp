#include <graphsafe/arena.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/plan.hpp>
#include <graphsafe/plan_layout.hpp>

#include <algorithm>
#include <sstream>

namespace graphsafe {

namespace {

constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ull;
constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

struct Fnv {
  std::uint64_t h = kFnvBasis;
  void byte(unsigned char c) { h = (h ^ c) * kFnvPrime; }
  void word(std::uint64_t w) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(w >> (8 * i)));
  }
};

void put_text(std::vector<std::uint64_t>& out, const std::string& s) {
  for (std::size_t i = 0; i < s.size(); i += 8) {
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 8 && i + j < s.size(); ++j)
      w |= std::uint64_t(static_cast<unsigned char>(s[i + j])) << (8 * j);
    out.push_back(w);
  }
}

std::uint64_t text_words(std::uint64_t chars) { return chars / 8 + (chars % 8 != 0); }

// Reads the encoding, refusing anything outside it with the word's index, value and limit.
class Reader {
 public:
  Reader(std::span<const std::uint64_t> w, std::uint64_t end) : w_(w), end_(end) {}
  std::uint64_t next(const char* what) {
    if (pos_ >= end_)
      throw invalid_argument_error("graphsafe: layout buffer ends at word " + std::to_string(end_) +
                                   " while reading " + what + "; the buffer is truncated");
    return w_[pos_++];
  }
  // `at`: the index of the word that gave the length.
  std::string text(std::uint64_t chars, std::uint64_t at, const char* what) {
    if (chars > (end_ - pos_) * 8)
      throw invalid_argument_error("graphsafe: layout " + std::string(what) + " length " + std::to_string(chars) +
                                   " at word " + std::to_string(at) + " exceeds the " +
                                   std::to_string((end_ - pos_) * 8) + " characters left in the buffer");
    std::string s(chars, '\0');
    for (std::uint64_t i = 0; i < chars; ++i) s[i] = static_cast<char>(w_[pos_ + i / 8] >> (8 * (i % 8)));
    pos_ += text_words(chars);
    return s;
  }
  std::uint64_t pos() const { return pos_; }

 private:
  std::span<const std::uint64_t> w_;
  std::uint64_t end_;
  std::uint64_t pos_ = 0;
};

const char* field_name(LayoutMismatch::Field f) {
  switch (f) {
    case LayoutMismatch::Field::name: return "name";
    case LayoutMismatch::Field::kind: return "kind";
    case LayoutMismatch::Field::offset: return "offset";
    case LayoutMismatch::Field::bytes: return "bytes";
    case LayoutMismatch::Field::physical_offset: return "physical offset";
    case LayoutMismatch::Field::alignment: return "alignment";
    case LayoutMismatch::Field::request_count: return "request count";
    case LayoutMismatch::Field::region_bytes: return "region bytes";
    case LayoutMismatch::Field::physical_bytes: return "physical bytes";
    case LayoutMismatch::Field::graph_count: return "graph count";
  }
  return "?";
}

std::string describe(bool has, const std::string& name, const std::string& site, std::uint64_t offset,
                     std::uint64_t bytes) {
  if (!has) return "no request";
  std::string s = "'" + name + "' at offset " + std::to_string(offset) + ", " + std::to_string(bytes) + " B";
  if (!site.empty()) s += ", at " + site;
  return s;
}

[[noreturn]] void raise(LayoutMismatch m) {
  std::ostringstream os;
  os << "graphsafe: rank " << m.rank << "'s captured layout";
  if (m.graph != LayoutMismatch::kNone && m.field != LayoutMismatch::Field::graph_count) os << " of graph " << m.graph;
  os << " differs from rank 0's in its " << field_name(m.field);
  switch (m.field) {
    case LayoutMismatch::Field::graph_count:
      os << ": " << m.value0 << " graphs on rank 0, " << m.value_r << " on rank " << m.rank;
      break;
    case LayoutMismatch::Field::region_bytes:
    case LayoutMismatch::Field::physical_bytes:
      os << ": " << m.value0 << " B on rank 0, " << m.value_r << " B on rank " << m.rank;
      break;
    default:
      if (m.field == LayoutMismatch::Field::request_count)
        os << " (" << m.value0 << " on rank 0, " << m.value_r << " on rank " << m.rank << ")";
      // Under a count mismatch, the rank with fewer requests has none at `request`.
      const bool count = m.field == LayoutMismatch::Field::request_count;
      os << " at request " << m.request << ": rank 0 has "
         << describe(!count || m.value0 > m.request, m.name0, m.site0, m.offset0, m.bytes0) << ", rank " << m.rank
         << " has " << describe(!count || m.value_r > m.request, m.name_r, m.site_r, m.offset_r, m.bytes_r);
      if (m.field != LayoutMismatch::Field::name && m.field != LayoutMismatch::Field::offset &&
          m.field != LayoutMismatch::Field::bytes && m.field != LayoutMismatch::Field::request_count)
        os << " (" << field_name(m.field) << " " << m.value0 << " vs " << m.value_r << ")";
  }
  os << ". Every rank must run the same capture with the same bindings and options";
  throw layout_mismatch_error(os.str(), std::move(m));
}

}  // namespace

PlanLayout PlanLayout::of(const Plan& plan) {
  PlanLayout l;
  l.region_bytes = plan.bytes();
  l.physical_bytes = plan.physical_bytes();
  for (const PlanEntry& e : plan.entries()) {
    if (e.kind == PlanEntry::Kind::dimension) continue;
    LayoutRequest r;
    r.kind = e.kind == PlanEntry::Kind::opaque ? LayoutRequest::Kind::opaque : LayoutRequest::Kind::workspace;
    r.name = e.name;
    r.offset = e.offset;
    r.physical_offset = e.physical_offset == PlanEntry::kUnsetOffset ? e.offset : e.physical_offset;
    r.bytes = e.bytes;
    // Captured requests are placed on kAlignment boundaries (larger alignments are refused).
    r.alignment = kAlignment;
    r.site = e.site;
    l.requests.push_back(std::move(r));
  }
  return l;
}

PlanLayout Plan::layout() const { return PlanLayout::of(*this); }

std::uint64_t PlanLayout::digest() const {
  Fnv f;
  f.word(kFormat);
  f.word(requests.size());
  f.word(region_bytes);
  f.word(physical_bytes);
  for (const LayoutRequest& r : requests) {
    f.word(static_cast<std::uint64_t>(r.kind));
    f.word(r.offset);
    f.word(r.physical_offset);
    f.word(r.bytes);
    f.word(r.alignment);
    f.word(r.name.size());
    for (char c : r.name) f.byte(static_cast<unsigned char>(c));
  }
  return f.h;
}

std::vector<std::uint64_t> PlanLayout::serialize() const {
  std::vector<std::uint64_t> w{kMagic, 0, requests.size(), region_bytes, physical_bytes};
  for (const LayoutRequest& r : requests) {
    w.insert(w.end(), {static_cast<std::uint64_t>(r.kind), r.offset, r.physical_offset, r.bytes, r.alignment,
                       r.name.size(), r.site.size()});
    put_text(w, r.name);
    put_text(w, r.site);
  }
  w[1] = w.size();
  return w;
}

PlanLayout PlanLayout::deserialize(std::span<const std::uint64_t> words) {
  if (words.size() < 5)
    throw invalid_argument_error("graphsafe: layout buffer of " + std::to_string(words.size()) +
                                 " words is shorter than the 5-word header");
  if (words[0] != kMagic)
    throw invalid_argument_error("graphsafe: layout buffer word 0 is " + std::to_string(words[0]) +
                                 ", not the layout magic " + std::to_string(kMagic) +
                                 " (not a serialized PlanLayout, or another format version)");
  if (words[1] < 5 || words[1] > words.size())
    throw invalid_argument_error("graphsafe: layout buffer says it holds " + std::to_string(words[1]) +
                                 " words, outside 5.." + std::to_string(words.size()) + " (the buffer's size)");
  Reader rd(words, words[1]);
  rd.next("magic");
  rd.next("length");
  PlanLayout l;
  const std::uint64_t n = rd.next("request count");
  // Each request takes at least 7 words: a count above that cannot be honest (and must not allocate).
  if (n > (words[1] - 5) / 7)
    throw invalid_argument_error("graphsafe: layout request count " + std::to_string(n) + " exceeds the " +
                                 std::to_string((words[1] - 5) / 7) + " requests its " + std::to_string(words[1]) +
                                 " words can hold");
  l.region_bytes = rd.next("region bytes");
  l.physical_bytes = rd.next("physical bytes");
  l.requests.reserve(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    LayoutRequest r;
    const std::uint64_t kind = rd.next("kind");
    if (kind != static_cast<std::uint64_t>(LayoutRequest::Kind::workspace) &&
        kind != static_cast<std::uint64_t>(LayoutRequest::Kind::opaque))
      throw invalid_argument_error("graphsafe: layout request " + std::to_string(i) + " has kind " +
                                   std::to_string(kind) + " at word " + std::to_string(rd.pos() - 1) +
                                   "; the kinds are 0 (workspace) and 2 (opaque)");
    r.kind = static_cast<LayoutRequest::Kind>(kind);
    r.offset = rd.next("offset");
    r.physical_offset = rd.next("physical offset");
    r.bytes = rd.next("bytes");
    r.alignment = rd.next("alignment");
    const std::uint64_t name_len = rd.next("name length");
    const std::uint64_t site_len = rd.next("site length");
    const std::uint64_t lengths_at = rd.pos() - 2;
    r.name = rd.text(name_len, lengths_at, "name");
    r.site = rd.text(site_len, lengths_at + 1, "site");
    l.requests.push_back(std::move(r));
  }
  if (rd.pos() != words[1])
    throw invalid_argument_error("graphsafe: layout buffer says it holds " + std::to_string(words[1]) +
                                 " words but its requests end at word " + std::to_string(rd.pos()));
  return l;
}

namespace {

// The first difference of `b` from `a` (request fields, then count, region and physical size).
bool first_difference(const PlanLayout& a, const PlanLayout& b, LayoutMismatch& m) {
  using F = LayoutMismatch::Field;
  const std::size_t common = std::min(a.requests.size(), b.requests.size());
  for (std::size_t i = 0; i < common; ++i) {
    const LayoutRequest& x = a.requests[i];
    const LayoutRequest& y = b.requests[i];
    F f;
    std::uint64_t v0 = 0, vr = 0;
    if (x.name != y.name) f = F::name;
    else if (x.kind != y.kind) f = F::kind, v0 = std::uint64_t(x.kind), vr = std::uint64_t(y.kind);
    else if (x.offset != y.offset) f = F::offset, v0 = x.offset, vr = y.offset;
    else if (x.bytes != y.bytes) f = F::bytes, v0 = x.bytes, vr = y.bytes;
    else if (x.physical_offset != y.physical_offset) f = F::physical_offset, v0 = x.physical_offset, vr = y.physical_offset;
    else if (x.alignment != y.alignment) f = F::alignment, v0 = x.alignment, vr = y.alignment;
    else continue;
    m.field = f;
    m.request = i;
    m.name0 = x.name, m.name_r = y.name;
    m.site0 = x.site, m.site_r = y.site;
    m.offset0 = x.offset, m.offset_r = y.offset;
    m.bytes0 = x.bytes, m.bytes_r = y.bytes;
    m.value0 = v0, m.value_r = vr;
    return true;
  }
  if (a.requests.size() != b.requests.size()) {
    m.field = F::request_count;
    m.request = common;
    m.value0 = a.requests.size(), m.value_r = b.requests.size();
    if (common < a.requests.size()) {
      const LayoutRequest& x = a.requests[common];
      m.name0 = x.name, m.site0 = x.site, m.offset0 = x.offset, m.bytes0 = x.bytes;
    } else {
      const LayoutRequest& y = b.requests[common];
      m.name_r = y.name, m.site_r = y.site, m.offset_r = y.offset, m.bytes_r = y.bytes;
    }
    return true;
  }
  if (a.region_bytes != b.region_bytes) {
    m.field = F::region_bytes;
    m.value0 = a.region_bytes, m.value_r = b.region_bytes;
    return true;
  }
  if (a.physical_bytes != b.physical_bytes) {
    m.field = F::physical_bytes;
    m.value0 = a.physical_bytes, m.value_r = b.physical_bytes;
    return true;
  }
  return false;
}

}  // namespace

void check_identical_layouts(std::span<const PlanLayout> per_rank) {
  for (std::size_t rank = 1; rank < per_rank.size(); ++rank) {
    LayoutMismatch m;
    m.rank = rank;
    if (first_difference(per_rank[0], per_rank[rank], m)) raise(std::move(m));
  }
}

void check_identical_layouts(std::span<const std::vector<PlanLayout>> per_rank_graphs) {
  for (std::size_t rank = 1; rank < per_rank_graphs.size(); ++rank) {
    const auto& a = per_rank_graphs[0];
    const auto& b = per_rank_graphs[rank];
    LayoutMismatch m;
    m.rank = rank;
    for (std::size_t g = 0; g < std::min(a.size(), b.size()); ++g) {
      m.graph = g;
      if (first_difference(a[g], b[g], m)) raise(std::move(m));
    }
    if (a.size() != b.size()) {
      m.field = LayoutMismatch::Field::graph_count;
      m.graph = std::min(a.size(), b.size());
      m.value0 = a.size(), m.value_r = b.size();
      raise(std::move(m));
    }
  }
}

}  // namespace graphsafe
