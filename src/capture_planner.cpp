#include "capture_planner.hpp"

#include <graphsafe/backend.hpp>
#include <graphsafe/error.hpp>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <numeric>

namespace graphsafe {

// Backends that cannot tell how a capture's nodes are ordered: no reuse across streams.
bool Backend::capture_dependencies(Stream, std::vector<const void*>&) const { return false; }
bool Backend::capture_ordered_after(Stream, const std::vector<const void*>& before) const { return before.empty(); }
bool Backend::graph_topology(const GraphHandle&, GraphTopology&) const { return false; }

namespace detail {

std::uint64_t best_fit_sorted(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& taken, std::uint64_t bytes) {
  std::uint64_t cur = 0, best = 0, best_gap = std::numeric_limits<std::uint64_t>::max();
  for (auto [off, size] : taken) {
    if (size == 0) continue;
    if (off > cur && off - cur >= bytes && off - cur < best_gap) {
      best_gap = off - cur;
      best = cur;
    }
    cur = std::max(cur, off + size);
  }
  return best_gap != std::numeric_limits<std::uint64_t>::max() ? best : cur;
}

std::uint64_t best_fit(std::vector<std::pair<std::uint64_t, std::uint64_t>> taken, std::uint64_t bytes) {
  std::sort(taken.begin(), taken.end());
  return best_fit_sorted(taken, bytes);
}

std::uint64_t first_fit_offset(std::vector<std::pair<std::uint64_t, std::uint64_t>> taken, std::uint64_t bytes) {
  std::sort(taken.begin(), taken.end());
  std::uint64_t cur = 0;
  for (auto [off, size] : taken) {
    if (size == 0) continue;
    if (off > cur && off - cur >= bytes) return cur;
    cur = std::max(cur, off + size);
  }
  return cur;
}

bool conflicts(const Lifetimes& l, std::uint32_t a, std::uint32_t b) {
  if (a > b) std::swap(a, b);
  if (l.released_at[a] > l.requested_at[b]) return true;  // live at b's request
  const auto& u = l.unordered_before[b];
  return !u.empty() && std::binary_search(u.begin(), u.end(), a);
}

std::vector<std::vector<std::uint32_t>> conflicts_before(const Lifetimes& l) {
  // Sweep requests in order keeping the blocks still live (released after the current request).
  const auto n = static_cast<std::uint32_t>(l.bytes.size());
  std::vector<std::vector<std::uint32_t>> out(n);
  std::vector<std::uint32_t> live;
  for (std::uint32_t b = 0; b < n; ++b) {
    std::erase_if(live, [&](std::uint32_t a) { return l.released_at[a] <= l.requested_at[b]; });
    out[b] = live;
    if (!l.unordered_before[b].empty()) {
      std::vector<std::uint32_t> merged;
      std::set_union(out[b].begin(), out[b].end(), l.unordered_before[b].begin(), l.unordered_before[b].end(),
                     std::back_inserter(merged));
      out[b] = std::move(merged);
    }
    live.push_back(b);
  }
  return out;
}

bool CapturePlanner::conflict(std::uint32_t a, std::uint32_t b) const { return conflicts(*lt_, a, b); }

const CapturePlanner::StreamView* CapturePlanner::view(void* stream) const {
  for (const StreamView& v : streams_)
    if (v.stream == stream) return &v;
  return nullptr;
}

namespace {
bool overlaps(std::uint64_t a, std::uint64_t an, std::uint64_t b, std::uint64_t bn) {
  return an && bn && a < b + bn && b < a + an;
}
std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
}  // namespace

CapturePlanner::Choice CapturePlanner::choose(std::uint64_t bytes, void* stream, const Ordered& ordered,
                                              bool explain) const {
  Choice c;
  c.bytes = bytes;
  c.stream = stream;
  // Released blocks this stream has not yet been proven to follow: its pending list, or for a
  // stream new to the capture every block released on another stream.
  std::vector<std::uint32_t> fresh;
  const StreamView* v = view(stream);
  if (!v)
    for (std::uint32_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].released && blocks_[i].release_stream != stream) fresh.push_back(i);
  const std::vector<std::uint32_t>& pending = v ? v->pending : fresh;
  const std::vector<std::uint32_t>& live = live_;
  std::vector<std::uint32_t> unordered;
  for (std::uint32_t i : pending) {
    const PlannedBlock& b = blocks_[i];
    if (b.position_known && ordered(stream, position(b.release_position)))
      c.ordered.push_back(i);
    else
      unordered.push_back(i);
  }
  std::sort(unordered.begin(), unordered.end());  // request order, whatever order they were released in
  // Lower bound: the live blocks conflict pairwise and with this request (none was released before
  // the others' requests); add unordered released blocks, largest first, that conflict with all.
  c.clique = bytes + live_bytes_;
  if (!unordered.empty()) {
    std::vector<std::uint32_t> clique = live;
    std::vector<std::uint32_t> by_size = unordered;
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](std::uint32_t a, std::uint32_t b) { return blocks_[a].bytes > blocks_[b].bytes; });
    for (std::uint32_t u : by_size)
      if (std::all_of(clique.begin(), clique.end(), [&](std::uint32_t m) { return conflict(u, m); })) {
        clique.push_back(u);
        c.clique += blocks_[u].bytes;
      }
  }

  // The ranges this request must not overlap, by offset: the live ones are kept sorted.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> with_unordered;
  if (!unordered.empty()) {
    with_unordered = live_ranges_;
    for (std::uint32_t i : unordered) with_unordered.emplace_back(blocks_[i].offset, blocks_[i].bytes);
    std::sort(with_unordered.begin(), with_unordered.end());
  }
  const auto& taken = unordered.empty() ? live_ranges_ : with_unordered;
  auto fits_at = [&](std::uint64_t off) {
    return std::none_of(taken.begin(), taken.end(), [&](const auto& t) { return overlaps(off, bytes, t.first, t.second); });
  };
  const std::size_t n = blocks_.size();
  bool proposed = false;
  for (std::size_t p = 0; p < proposals_.size() && !proposed; ++p) {
    const LayoutProposal& l = *proposals_[p];
    if (following_[p] && n < l.bytes().size() && l.bytes()[n] == bytes && fits_at(l.best().offsets[n])) {
      c.offset = l.best().offsets[n];
      proposed = true;
    }
  }
  if (!proposed) c.offset = unordered.empty() ? best_fit_live(bytes) : best_fit_sorted(taken, bytes);
  c.unordered = unordered;
  if (explain && c.offset + bytes > region_) {
    // The region grows: say which released ranges could have held it but were not proven ordered.
    for (std::uint32_t i : unordered) {
      const PlannedBlock& b = blocks_[i];
      if (b.bytes < bytes) continue;
      if (!c.why_not.empty()) c.why_not += "; ";
      c.why_not += "'" + name(i) + "' (" + std::to_string(b.bytes) + " B, released on stream " + hex(b.release_stream) +
                   ") is not reused: " +
                   (b.position_known ? "this stream's capture dependencies (" + hex(stream) +
                                           ") do not reach its release -- join the streams with an event first"
                                     : std::string("the backend cannot tell how the streams are ordered"));
    }
  }
  return c;
}

namespace {
std::atomic<std::uint64_t> next_serial_base{1ull << 32};
}  // namespace

CapturePlanner::CapturePlanner() : base_(next_serial_base.fetch_add(kMaxBlocks, std::memory_order_relaxed)) {}

void CapturePlanner::adopt(PlannerStorage&& s) {
  if (!blocks_.empty() || s.capacity() <= blocks_.capacity()) return;
  blocks_ = std::move(s.blocks);
  positions_ = std::move(s.positions);
  live_ = std::move(s.live);
  live_ranges_ = std::move(s.live_ranges);
  // The lifetimes outlive the capture (a family's layout keeps them): sized as the last capture's
  // rather than grown by doubling; finish_lifetimes() gives back a large excess.
  lt_->bytes.reserve(s.last_blocks);
  lt_->offsets.reserve(s.last_blocks);
  lt_->requested_at.reserve(s.last_blocks);
  lt_->released_at.reserve(s.last_blocks);
  lt_->unordered_before.reserve(s.last_blocks);
  blocks_.clear();
  positions_.clear();
  live_.clear();
  live_ranges_.clear();
}

void CapturePlanner::finish_lifetimes() {
  Lifetimes& l = *lt_;
  if (l.bytes.capacity() <= 2 * l.bytes.size() + 64) return;
  l.bytes.shrink_to_fit();
  l.offsets.shrink_to_fit();
  l.requested_at.shrink_to_fit();
  l.released_at.shrink_to_fit();
  l.unordered_before.shrink_to_fit();
}

PlannerStorage CapturePlanner::take_storage() {
  PlannerStorage s;
  s.last_blocks = blocks_.size();
  s.blocks = std::move(blocks_);
  s.positions = std::move(positions_);
  s.live = std::move(live_);
  s.live_ranges = std::move(live_ranges_);
  blocks_.clear();
  positions_.clear();
  live_.clear();
  live_ranges_.clear();
  return s;
}

const std::string& CapturePlanner::name(std::size_t block) const {
  static const std::string none;
  return block < names_.size() ? names_[block] : none;
}

PositionRef CapturePlanner::keep_position(std::span<const void* const> p) {
  PositionRef r;
  if (p.empty()) return r;
  if (positions_.size() + p.size() > std::numeric_limits<std::uint32_t>::max())
    throw overflow_error("graphsafe: a capture recorded more than 2^32 capture dependencies for its workspaces");
  r.begin = static_cast<std::uint32_t>(positions_.size());
  r.count = static_cast<std::uint32_t>(p.size());
  positions_.insert(positions_.end(), p.begin(), p.end());
  return r;
}

std::uint64_t CapturePlanner::commit(Choice&& c, std::size_t entry, std::string name) {
  const std::size_t n = blocks_.size();
  if (n + 1 >= kMaxBlocks)
    throw overflow_error("graphsafe: a capture holds at most " + std::to_string(kMaxBlocks - 1) + " workspaces");
  for (std::size_t p = 0; p < proposals_.size(); ++p) {
    const LayoutProposal& l = *proposals_[p];
    following_[p] = following_[p] && n < l.bytes().size() && l.bytes()[n] == c.bytes && l.best().offsets[n] == c.offset;
  }
  // This stream now follows the blocks proven ordered: they leave its pending list for good.
  StreamView* v = nullptr;
  for (StreamView& x : streams_)
    if (x.stream == c.stream) v = &x;
  if (!v) {
    StreamView fresh;
    fresh.stream = c.stream;
    for (std::uint32_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i].released && blocks_[i].release_stream != c.stream) fresh.pending.push_back(i);
    streams_.push_back(std::move(fresh));
    v = &streams_.back();
  }
  if (!c.ordered.empty()) {
    std::sort(c.ordered.begin(), c.ordered.end());
    std::erase_if(v->pending, [&](std::uint32_t i) { return std::binary_search(c.ordered.begin(), c.ordered.end(), i); });
  }
  PlannedBlock b;
  b.serial = base_ + n;
  b.offset = c.offset;
  b.bytes = c.bytes;
  b.stream = c.stream;
  b.entry = entry;
  if (!name.empty()) {
    names_.resize(n);
    names_.push_back(std::move(name));
  }
  lt_->bytes.push_back(c.bytes);
  lt_->offsets.push_back(c.offset);
  if (!c.unordered.empty()) lt_->intervals = false;
  lt_->requested_at.push_back(clock_++);
  lt_->released_at.push_back(Lifetimes::kNever);
  lt_->unordered_before.push_back(std::move(c.unordered));
  b.request_known = c.request_known;
  b.request_position = keep_position(c.request_position);
  region_ = std::max(region_, c.offset + c.bytes);
  lt_->region = region_;
  peak_ = std::max(peak_, c.clique);
  live_.push_back(static_cast<std::uint32_t>(n));
  live_bytes_ += c.bytes;
  const std::pair<std::uint64_t, std::uint64_t> range{c.offset, c.bytes};
  live_ranges_.insert(std::upper_bound(live_ranges_.begin(), live_ranges_.end(), range), range);
  blocks_.push_back(b);
  return b.serial;
}

PlannedBlock* CapturePlanner::live(std::uint64_t serial) {
  // Block i has serial base_ + i.
  const std::uint64_t i = serial - base_;
  return i < blocks_.size() && !blocks_[i].released ? &blocks_[i] : nullptr;
}

PlannedBlock* CapturePlanner::live_at(std::uint64_t offset) {
  for (std::uint32_t i : live_)
    if (blocks_[i].offset == offset && blocks_[i].bytes) return &blocks_[i];
  return nullptr;
}

std::uint64_t CapturePlanner::best_fit_live(std::uint64_t bytes) const {
  if (bytes == 0) return best_fit_sorted(live_ranges_, bytes);  // only a gap of positive size counts
  // Live ranges never overlap (placement keeps clear of them) and none is empty, so each gap is the
  // space between neighbours: one branch-free pass.
  std::uint64_t cur = 0, best = 0, best_gap = std::numeric_limits<std::uint64_t>::max();
  for (const auto& [off, size] : live_ranges_) {
    const std::uint64_t gap = off - cur;
    const bool better = (gap >= bytes) & (gap < best_gap);
    best_gap = better ? gap : best_gap;
    best = better ? cur : best;
    cur = off + size;
  }
  return best_gap != std::numeric_limits<std::uint64_t>::max() ? best : cur;
}

void CapturePlanner::release(PlannedBlock& b, void* stream, std::span<const void* const> position, bool known) {
  b.released = true;
  b.release_stream = stream;
  b.release_position = known ? keep_position(position) : PositionRef{};
  b.position_known = known;
  const auto idx = static_cast<std::uint32_t>(&b - blocks_.data());
  if (auto it = std::find(live_.begin(), live_.end(), idx); it != live_.end()) {
    live_.erase(it);
    live_bytes_ -= b.bytes;
  }
  lt_->released_at[idx] = clock_++;
  const std::pair<std::uint64_t, std::uint64_t> range{b.offset, b.bytes};
  if (auto it = std::lower_bound(live_ranges_.begin(), live_ranges_.end(), range);
      it != live_ranges_.end() && *it == range)
    live_ranges_.erase(it);
  // Every other stream of the capture has yet to be proven to follow this release.
  for (StreamView& v : streams_)
    if (v.stream != stream) v.pending.push_back(idx);
}

void CapturePlanner::sharing(std::vector<char>& shares, std::vector<char>& reuses) const {
  const std::size_t n = blocks_.size();
  shares.assign(n, 0);
  reuses.assign(n, 0);
  // The union of the ranges seen so far, as disjoint [begin, end) intervals keyed by begin: a range
  // overlaps one of them iff it overlaps the union.
  auto sweep = [&](bool forward, std::vector<char>& hit) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> cover;  // sorted, disjoint; few once the region fills
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = forward ? k : n - 1 - k;
      const PlannedBlock& b = blocks_[i];
      if (!b.bytes) continue;
      std::uint64_t lo = b.offset, hi = b.offset + b.bytes;
      // First interval ending after lo; every one from there that begins before hi overlaps.
      auto first = std::partition_point(cover.begin(), cover.end(), [&](const auto& x) { return x.second <= lo; });
      auto last = first;
      while (last != cover.end() && last->first < hi) ++last;
      if (first != last) {
        hit[i] = 1;
        lo = std::min(lo, first->first);
        hi = std::max(hi, std::prev(last)->second);
        *first = {lo, hi};
        cover.erase(std::next(first), last);
      } else {
        cover.insert(first, {lo, hi});
      }
    }
  };
  sweep(true, reuses);
  std::vector<char> later;
  later.assign(n, 0);
  sweep(false, later);
  for (std::size_t i = 0; i < n; ++i) shares[i] = reuses[i] || later[i];
}

PackedLayout CapturePlanner::layout() const {
  PackedLayout l;
  for (const auto& b : blocks_) {
    l.bytes.push_back(b.bytes);
    l.offsets.push_back(b.offset);
  }
  l.region = region_;
  return l;
}

std::uint64_t clique_bound(const Lifetimes& l, std::uint64_t floor) {
  if (l.intervals) return floor;  // the greedy cliques were the live sets: exact
  // Max weight clique of the conflict graph (any placement gives its members disjoint bytes):
  // branch and bound per last member c over the earlier blocks conflicting with c, with a step
  // budget; the greedy clique recorded at each request is the floor.
  const auto n = static_cast<std::uint32_t>(l.bytes.size());
  auto conflict = [&](std::uint32_t a, std::uint32_t b) { return conflicts(l, a, b); };
  const auto before = conflicts_before(l);
  std::uint64_t best = floor;
  std::uint64_t budget = 2'000'000;
  for (std::uint32_t c = 0; c < n && budget; ++c) {
    std::vector<std::uint32_t> cand;
    std::uint64_t total = l.bytes[c];
    for (std::uint32_t j : before[c])
      if (l.bytes[j]) {
        cand.push_back(j);
        total += l.bytes[j];
      }
    if (total <= best) continue;
    std::sort(cand.begin(), cand.end(), [&](std::uint32_t a, std::uint32_t b) { return l.bytes[a] > l.bytes[b]; });
    std::function<void(std::size_t, std::uint64_t, std::uint64_t, std::vector<std::uint32_t>&)> grow =
        [&](std::size_t from, std::uint64_t weight, std::uint64_t rest, std::vector<std::uint32_t>& chosen) {
          best = std::max(best, weight);
          for (std::size_t k = from; k < cand.size() && budget; ++k, --budget) {
            if (weight + rest <= best) return;
            const std::uint32_t v = cand[k];
            rest -= l.bytes[v];
            if (std::all_of(chosen.begin(), chosen.end(), [&](std::uint32_t m) { return conflict(v, m); })) {
              chosen.push_back(v);
              grow(k + 1, weight + l.bytes[v], rest, chosen);
              chosen.pop_back();
            }
          }
        };
    std::vector<std::uint32_t> chosen;
    grow(0, l.bytes[c], total - l.bytes[c], chosen);
  }
  return best;
}

PackedLayout pack(const Lifetimes& lt, std::uint64_t floor_hint) {
  const auto n = static_cast<std::uint32_t>(lt.bytes.size());
  std::vector<std::vector<std::uint32_t>> adj(n);
  const auto before = conflicts_before(lt);
  for (std::uint32_t j = 0; j < n; ++j)
    for (std::uint32_t i : before[j]) {
      adj[i].push_back(j);
      adj[j].push_back(i);
    }
  auto place = [&](const std::vector<std::uint32_t>& order, bool first_fit) {
    PackedLayout l;
    l.bytes.resize(n);
    l.offsets.resize(n);
    std::vector<char> placed(n, 0);
    for (std::uint32_t i : order) {
      std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
      for (std::uint32_t j : adj[i])
        if (placed[j]) taken.emplace_back(l.offsets[j], lt.bytes[j]);
      l.offsets[i] = first_fit ? first_fit_offset(std::move(taken), lt.bytes[i]) : best_fit(std::move(taken), lt.bytes[i]);
      l.bytes[i] = lt.bytes[i];
      l.region = std::max(l.region, l.offsets[i] + lt.bytes[i]);
      placed[i] = 1;
    }
    return l;
  };
  // Orders tried (XLA's heap simulator tries several too): decreasing size, decreasing size x
  // conflicts, then seeded perturbations of the best; each with best fit and first fit.
  std::vector<std::uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return lt.bytes[a] > lt.bytes[b]; });
  PackedLayout best = place(order, false);
  std::vector<std::uint32_t> best_order = order;
  auto consider = [&](const std::vector<std::uint32_t>& o) {
    for (bool ff : {false, true}) {
      PackedLayout l = place(o, ff);
      if (l.region < best.region) {
        best = std::move(l);
        best_order = o;
      }
    }
  };
  consider(order);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return lt.bytes[a] * (adj[a].size() + 1) > lt.bytes[b] * (adj[b].size() + 1);
  });
  consider(order);
  const std::uint64_t floor = clique_bound(lt, floor_hint);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;  // fixed seed: the same lifetimes give the same layout
  const int rounds = n <= 512 ? 48 : 4;
  for (int r = 0; r < rounds && best.region > floor; ++r) {
    std::vector<std::uint32_t> o = best_order;
    for (int k = 0; k < 1 + static_cast<int>(n / 16); ++k) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      if (n > 1) std::swap(o[x % n], o[(x >> 32) % n]);
    }
    consider(o);
  }
  return best;
}

std::uint64_t CapturePlanner::clique_bound() const { return detail::clique_bound(*lt_, peak_); }

PackedLayout CapturePlanner::pack() const { return detail::pack(*lt_, peak_); }

PackedLayout CapturePlanner::best() const {
  PackedLayout packed = pack();
  PackedLayout made = layout();
  return packed.region < made.region ? packed : made;
}

std::uint64_t LayoutProposal::known_region() const {
  return packed_.load(std::memory_order_acquire) ? best_.region : lifetimes_->region;
}

const PackedLayout& LayoutProposal::best() const {
  std::call_once(once_, [&] {
    PackedLayout packed = pack(*lifetimes_, floor_);
    if (packed.region < lifetimes_->region) {
      best_ = std::move(packed);
    } else {
      best_.bytes = lifetimes_->bytes;
      best_.offsets = lifetimes_->offsets;
      best_.region = lifetimes_->region;
    }
    packed_.store(true, std::memory_order_release);
  });
  return best_;
}

void keep_layout(std::vector<std::shared_ptr<const LayoutProposal>>& layouts, const CapturePlanner& p) {
  auto same = std::find_if(layouts.begin(), layouts.end(), [&](const auto& l) { return l->bytes() == p.lifetimes().bytes; });
  // A capture with the sizes of a kept layout followed it where it could: its own placement
  // replaces it only when smaller than what is known of the kept one.
  if (same != layouts.end() && (*same)->known_region() <= p.region()) return;
  auto l = std::make_shared<const LayoutProposal>(p.shared_lifetimes(), p.peak_live());
  if (same != layouts.end()) {
    *same = std::move(l);
    return;
  }
  if (layouts.size() >= 16) layouts.erase(layouts.begin());
  layouts.push_back(std::move(l));
}

}  // namespace detail
}  // namespace graphsafe
