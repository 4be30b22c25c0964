// Per-rank layouts: tensor-parallel ranks run the same capture on arenas of their own and must get
// the same offsets. Each "rank" here is an arena on a host backend of its own; the layouts are
// compared as the ranks would after an all-gather of their serialized words.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {
constexpr std::uint64_t kMiB = 1ull << 20;

// What a rank does in its capture: a list of (name, bytes) workspace requests held to the end,
// then one opaque request, as a library temporary would.
struct Step {
  std::string name;
  std::int64_t bytes;
};

struct Rank {
  HostBackend backend;
  // No guard regions even under GRAPHSAFE_DEBUG: the offsets below are worked out without them.
  Arena arena{backend, ArenaOptions{.report_findings = false, .canary_bytes = 0}};
  HostStream s;
  std::vector<void*> ptrs;  // each request's address at capture, in order
  std::unique_ptr<CapturedGraph> graph;

  explicit Rank(const std::vector<Step>& steps, std::uint64_t opaque_bytes = 100) {
    arena.reserve(4 * kMiB, s);
    Bindings b;
    graph = std::make_unique<CapturedGraph>(capture(arena, s, b, [&](const Bindings& bb) {
      std::vector<Workspace> held;
      for (const Step& st : steps) {
        held.push_back(arena.request(s, st.name, Extent(st.bytes), 1, capacity_bound, bb));
        ptrs.push_back(held.back().data());
      }
      // A sized dimension holds no bytes: the layout leaves it out.
      (void)arena.dimension(s, "row_stride", Extent(7), capacity_bound, bb);
      void* p = arena.allocate(s, opaque_bytes);
      ptrs.push_back(p);
      arena.deallocate(s, p, opaque_bytes);  // released last: nothing after it reuses the range
    }));
  }
  PlanLayout layout() const { return graph->plan().layout(); }
};

const std::vector<Step> kSame{{"attn.qkv", 1000}, {"mlp.up", 3000}};

std::uintptr_t addr(void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// FNV-1a 64 over bytes, written here from its definition (not the library's).
std::uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
void le64(std::vector<unsigned char>& out, std::uint64_t w) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>((w >> (8 * i)) & 0xff));
}
// The digest's documented input for a layout, assembled independently of PlanLayout::digest.
std::uint64_t reference_digest(const PlanLayout& l) {
  std::vector<unsigned char> in;
  le64(in, 1);  // format
  le64(in, l.requests.size());
  le64(in, l.region_bytes);
  le64(in, l.physical_bytes);
  for (const auto& r : l.requests) {
    le64(in, r.kind == LayoutRequest::Kind::opaque ? 2 : 0);
    le64(in, r.offset);
    le64(in, r.physical_offset);
    le64(in, r.bytes);
    le64(in, r.alignment);
    le64(in, r.name.size());
    in.insert(in.end(), r.name.begin(), r.name.end());
  }
  return fnv1a(in);
}

PlanLayout small_layout() {
  PlanLayout l;
  l.region_bytes = 1280;
  l.physical_bytes = 1280;
  l.requests.push_back({LayoutRequest::Kind::workspace, "ws", 0, 0, 1000, 256, "f.cpp:1"});
  l.requests.push_back({LayoutRequest::Kind::opaque, "<opaque 100 B>", 1024, 1024, 100, 256, "g.cpp:22"});
  return l;
}

layout_mismatch_error mismatch_of(const std::vector<PlanLayout>& ranks) {
  try {
    check_identical_layouts(ranks);
  } catch (const layout_mismatch_error& e) {
    return e;
  }
  FAIL("check_identical_layouts accepted layouts that differ");
  return layout_mismatch_error("", {});  // not reached: FAIL ends the test case
}
}  // namespace

TEST_CASE("ranks running the same capture get identical layouts, digests and serializations", "[rank_layouts]") {
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(std::make_unique<Rank>(kSame));
  std::vector<PlanLayout> layouts;
  for (auto& r : ranks) layouts.push_back(r->layout());

  // The layout of rank 0, against placement worked out by hand: 256-aligned, held together.
  const PlanLayout& l = layouts[0];
  REQUIRE(l.requests.size() == 3);  // the dimension holds no bytes and is left out
  CHECK(l.requests[0].name == "attn.qkv");
  CHECK(l.requests[0].kind == LayoutRequest::Kind::workspace);
  CHECK(l.requests[0].offset == 0);
  CHECK(l.requests[0].bytes == 1000);
  CHECK(l.requests[1].name == "mlp.up");
  CHECK(l.requests[1].offset == 1024);
  CHECK(l.requests[1].bytes == 3000);
  CHECK(l.requests[2].name == "<opaque 100 B>");
  CHECK(l.requests[2].kind == LayoutRequest::Kind::opaque);
  CHECK(l.requests[2].offset == 4096);
  CHECK(l.requests[2].bytes == 100);
  CHECK(l.region_bytes == 4096 + 256);
  CHECK(l.physical_bytes == l.region_bytes);
  for (const auto& r : l.requests) {
    CHECK(r.alignment == 256);
    CHECK(r.physical_offset == r.offset);
    CHECK_THAT(r.site, Contains("test_rank_layouts.cpp"));
  }
  // Offsets are the distances the capture's addresses actually had on every rank.
  for (auto& r : ranks)
    for (std::size_t i = 0; i < r->ptrs.size(); ++i)
      CHECK(addr(r->ptrs[i]) - addr(r->ptrs[0]) == l.requests[i].offset);
  // Different arenas, different addresses, the same offsets.
  CHECK(ranks[0]->ptrs[0] != ranks[1]->ptrs[0]);

  for (const auto& other : layouts) {
    CHECK(other == l);
    CHECK(other.digest() == l.digest());
    CHECK(layout_digest(other) == reference_digest(l));
    CHECK(other.serialize() == l.serialize());
  }
  CHECK_NOTHROW(check_identical_layouts(layouts));
  CHECK_NOTHROW(check_identical_layouts(std::span<const PlanLayout>(layouts.data(), 1)));
  CHECK_NOTHROW(check_identical_layouts(std::span<const PlanLayout>{}));

  // The graphs replay on every rank after the check.
  for (auto& r : ranks) r->graph->replay(Bindings{}, r->s);
}

TEST_CASE("a rank that requests a different size is named with the request on both ranks", "[rank_layouts]") {
  Rank r0(kSame), r1(kSame), r2({{"attn.qkv", 1000}, {"mlp.up", 5000}});
  const std::vector<PlanLayout> layouts{r0.layout(), r1.layout(), r2.layout()};
  CHECK(layouts[2].digest() != layouts[0].digest());
  const auto e = mismatch_of(layouts);
  const LayoutMismatch& m = e.mismatch();
  CHECK(m.rank == 2);
  CHECK(m.request == 1);
  CHECK(m.field == LayoutMismatch::Field::bytes);
  CHECK(m.name0 == "mlp.up");
  CHECK(m.name_r == "mlp.up");
  CHECK(m.offset0 == 1024);
  CHECK(m.offset_r == 1024);
  CHECK(m.bytes0 == 3000);
  CHECK(m.bytes_r == 5000);
  CHECK(m.value0 == 3000);
  CHECK(m.value_r == 5000);
  CHECK_THAT(m.site0, Contains("test_rank_layouts.cpp"));
  const std::string what = e.what();
  CHECK_THAT(what, Contains("rank 2"));
  CHECK_THAT(what, Contains("request 1"));
  CHECK_THAT(what, Contains("'mlp.up' at offset 1024, 3000 B"));
  CHECK_THAT(what, Contains("'mlp.up' at offset 1024, 5000 B"));
  CHECK_THROWS_AS(check_identical_layouts(layouts), error);  // in the hierarchy
}

TEST_CASE("a rank with an extra request is named at the first request it shifts", "[rank_layouts]") {
  Rank r0(kSame), r1({{"attn.qkv", 1000}, {"extra", 256}, {"mlp.up", 3000}});
  const auto e = mismatch_of({r0.layout(), r1.layout()});
  const LayoutMismatch& m = e.mismatch();
  CHECK(m.rank == 1);
  CHECK(m.request == 1);
  CHECK(m.field == LayoutMismatch::Field::name);
  CHECK(m.name0 == "mlp.up");
  CHECK(m.name_r == "extra");
  CHECK(m.offset0 == 1024);
  CHECK(m.offset_r == 1024);
  CHECK(m.bytes0 == 3000);
  CHECK(m.bytes_r == 256);
  CHECK_THAT(std::string(e.what()), Contains("rank 1 has 'extra' at offset 1024, 256 B"));
}

TEST_CASE("a rank with an extra request at the end is named by the request count", "[rank_layouts]") {
  // Every Rank's capture ends with its opaque request: the trailing extra request is added by hand.
  Rank r0(kSame);
  PlanLayout more = r0.layout();
  more.requests.push_back({LayoutRequest::Kind::workspace, "tail", 4352, 4352, 512, 256, "h.cpp:3"});
  more.region_bytes += 512;
  more.physical_bytes += 512;
  auto e = mismatch_of({r0.layout(), r0.layout(), more});
  CHECK(e.mismatch().rank == 2);
  CHECK(e.mismatch().field == LayoutMismatch::Field::request_count);
  CHECK(e.mismatch().request == 3);
  CHECK(e.mismatch().value0 == 3);
  CHECK(e.mismatch().value_r == 4);
  CHECK(e.mismatch().name0.empty());
  CHECK(e.mismatch().name_r == "tail");
  CHECK(e.mismatch().offset_r == 4352);
  CHECK(e.mismatch().bytes_r == 512);
  CHECK_THAT(std::string(e.what()), Contains("rank 0 has no request, rank 2 has 'tail' at offset 4352, 512 B"));
  // The other way round: rank 1 lacks rank 0's last request.
  e = mismatch_of({more, r0.layout()});
  CHECK(e.mismatch().rank == 1);
  CHECK(e.mismatch().name0 == "tail");
  CHECK(e.mismatch().value0 == 4);
  CHECK(e.mismatch().value_r == 3);
  CHECK_THAT(std::string(e.what()), Contains("rank 1 has no request"));
}

TEST_CASE("a rank that requests in another order is named at the first swapped request", "[rank_layouts]") {
  Rank r0(kSame), r1({{"mlp.up", 3000}, {"attn.qkv", 1000}});
  const PlanLayout a = r0.layout(), b = r1.layout();
  CHECK(a.region_bytes == b.region_bytes);  // same bytes in all, yet not the same layout
  CHECK(a.digest() != b.digest());
  const auto e = mismatch_of({a, b});
  const LayoutMismatch& m = e.mismatch();
  CHECK(m.rank == 1);
  CHECK(m.request == 0);
  CHECK(m.field == LayoutMismatch::Field::name);
  CHECK(m.name0 == "attn.qkv");
  CHECK(m.name_r == "mlp.up");
  CHECK(m.offset0 == 0);
  CHECK(m.offset_r == 0);
  CHECK(m.bytes0 == 1000);
  CHECK(m.bytes_r == 3000);
}

TEST_CASE("layouts that differ only in region or physical size are named by it", "[rank_layouts]") {
  const PlanLayout a = small_layout();
  PlanLayout b = a;
  b.region_bytes = 2048;
  auto e = mismatch_of({a, b});
  CHECK(e.mismatch().field == LayoutMismatch::Field::region_bytes);
  CHECK(e.mismatch().request == LayoutMismatch::kNone);
  CHECK(e.mismatch().value0 == 1280);
  CHECK(e.mismatch().value_r == 2048);
  CHECK_THAT(std::string(e.what()), Contains("region bytes: 1280 B on rank 0, 2048 B on rank 1"));
  b = a;
  b.physical_bytes = 1024;
  e = mismatch_of({a, a, b});
  CHECK(e.mismatch().field == LayoutMismatch::Field::physical_bytes);
  CHECK(e.mismatch().rank == 2);
  // A request's physical offset (virtual sharing) and kind are compared too.
  b = a;
  b.requests[1].physical_offset = 0;
  e = mismatch_of({a, b});
  CHECK(e.mismatch().field == LayoutMismatch::Field::physical_offset);
  CHECK(e.mismatch().value0 == 1024);
  CHECK(e.mismatch().value_r == 0);
  b = a;
  b.requests[0].kind = LayoutRequest::Kind::opaque;
  CHECK(mismatch_of({a, b}).mismatch().field == LayoutMismatch::Field::kind);
  // Sites are not compared: ranks may build the same source from different paths.
  b = a;
  b.requests[0].site = "/other/path/f.cpp:1";
  CHECK_NOTHROW(check_identical_layouts(std::vector<PlanLayout>{a, b}));
}

TEST_CASE("a serialized layout has the documented words and reads back", "[rank_layouts]") {
  const PlanLayout l = small_layout();
  // Written out from the format's definition: characters low byte first, zero-padded words.
  const std::vector<std::uint64_t> expected{
      0x3154554F59414C47ull,  // "GLAYOUT1"
      24, 2, 1280, 1280,      // magic, words, requests, region, physical
      0, 0, 0, 1000, 256, 2, 7,
      0x7377ull,              // "ws"
      0x00313A7070632E66ull,  // "f.cpp:1"
      2, 1024, 1024, 100, 256, 14, 8,
      0x2065757161706F3Cull,  // "<opaque "
      0x00003E4220303031ull,  // "100 B>"
      0x32323A7070632E67ull,  // "g.cpp:22"
  };
  const auto words = l.serialize();
  CHECK(words == expected);
  CHECK(PlanLayout::deserialize(expected) == l);

  // A real plan's layout (sites and all) reads back equal, with the same digest.
  Rank r(kSame);
  const PlanLayout real = r.layout();
  const PlanLayout back = PlanLayout::deserialize(real.serialize());
  CHECK(back == real);
  CHECK(back.digest() == real.digest());
  // Padded to a common size for a fixed-size all-gather: the padding is ignored.
  auto padded = real.serialize();
  padded.resize(padded.size() + 13, 0);
  CHECK(PlanLayout::deserialize(padded) == real);
  // An empty plan's layout.
  CHECK(PlanLayout::deserialize(PlanLayout{}.serialize()) == PlanLayout{});
}

TEST_CASE("a malformed layout buffer is refused with the word and the limit", "[rank_layouts]") {
  const auto good = small_layout().serialize();
  CHECK_THROWS_WITH(PlanLayout::deserialize(std::span<const std::uint64_t>(good.data(), 3)),
                    Contains("3 words is shorter than the 5-word header"));
  auto bad = good;
  bad[0] = 7;
  CHECK_THROWS_WITH(PlanLayout::deserialize(bad), Contains("word 0 is 7"));
  // Truncated: the length word says more than the buffer holds.
  CHECK_THROWS_WITH(PlanLayout::deserialize(std::span<const std::uint64_t>(good.data(), 20)),
                    Contains("holds 24 words, outside 5..20"));
  bad = good;
  bad[5] = 1;  // a dimension's kind: never in a layout
  CHECK_THROWS_WITH(PlanLayout::deserialize(bad), Contains("request 0 has kind 1 at word 5"));
  bad = good;
  bad[2] = 1ull << 40;  // a request count no buffer of 24 words can hold
  CHECK_THROWS_WITH(PlanLayout::deserialize(bad), Contains("request count 1099511627776 exceeds the 2 requests"));
  bad = good;
  bad[10] = 1000;  // name length past the end
  CHECK_THROWS_WITH(PlanLayout::deserialize(bad), Contains("name length 1000 at word 10"));
  bad = good;
  bad[2] = 1;  // one request, but the words of two
  CHECK_THROWS_WITH(PlanLayout::deserialize(bad), Contains("its requests end at word 14"));
  CHECK_THROWS_AS(PlanLayout::deserialize(bad), invalid_argument_error);
}

TEST_CASE("the layout digest is FNV-1a over the documented fields and changes with each", "[rank_layouts]") {
  const PlanLayout base = small_layout();
  CHECK(base.digest() == reference_digest(base));
  // A value fixed once from the definition: a regression here breaks every mixed-version job.
  CHECK(PlanLayout{}.digest() == 0x07295d91aa94b524ull);

  std::vector<PlanLayout> variants;
  auto vary = [&](auto&& change) {
    PlanLayout l = base;
    change(l);
    variants.push_back(l);
  };
  vary([](PlanLayout& l) { l.region_bytes += 256; });
  vary([](PlanLayout& l) { l.physical_bytes += 256; });
  vary([](PlanLayout& l) { l.requests[0].name = "wt"; });
  vary([](PlanLayout& l) { l.requests[0].kind = LayoutRequest::Kind::opaque; });
  vary([](PlanLayout& l) { l.requests[1].offset += 256; });
  vary([](PlanLayout& l) { l.requests[1].physical_offset = 0; });
  vary([](PlanLayout& l) { l.requests[0].bytes += 1; });
  vary([](PlanLayout& l) { l.requests[0].alignment = 512; });
  vary([](PlanLayout& l) { l.requests.pop_back(); });
  vary([](PlanLayout& l) { std::swap(l.requests[0], l.requests[1]); });
  // Name boundaries are in the digest: "ab"+"c" is not "a"+"bc".
  vary([](PlanLayout& l) { l.requests[0].name = "ab", l.requests[1].name = "c"; });
  vary([](PlanLayout& l) { l.requests[0].name = "a", l.requests[1].name = "bc"; });
  std::set<std::uint64_t> digests{base.digest()};
  for (const auto& v : variants) {
    CHECK(v.digest() == reference_digest(v));
    digests.insert(v.digest());
  }
  CHECK(digests.size() == variants.size() + 1);  // every change gave a digest of its own
  // The site is reported, not digested.
  PlanLayout moved = base;
  moved.requests[0].site = "/elsewhere/f.cpp:1";
  CHECK(moved.digest() == base.digest());
}

TEST_CASE("ranks capturing a family of buckets are compared graph by graph", "[rank_layouts]") {
  const Symbol T = Symbol::fixed("tp_tokens");
  // Each rank captures buckets of 8 and 16 tokens into one family; `wide_at` doubles the element
  // size at that bucket (a rank-dependent shard).
  auto rank_layouts = [&](std::int64_t wide_at, std::size_t buckets) {
    HostBackend backend;
    Arena arena(backend, ArenaOptions{.report_findings = false, .canary_bytes = 0});
    HostStream s;
    arena.reserve(4 * kMiB, s);
    CaptureOptions opts;
    opts.family = arena.family("decode");
    std::vector<CapturedGraph> graphs;
    std::vector<PlanLayout> layouts;
    for (std::int64_t tokens : std::vector<std::int64_t>{8, 16, 32}) {
      if (graphs.size() == buckets) break;
      Bindings b;
      b.set(T, tokens);
      graphs.push_back(capture(arena, s, b, [&](const Bindings& bb) {
        auto x = arena.request(s, "hidden", Extent(T), tokens == wide_at ? 2048 : 1024, capacity_bound, bb);
        auto y = arena.request(s, "logits", Extent(T), 512, capacity_bound, bb);
      }, opts));
      layouts.push_back(graphs.back().plan().layout());
    }
    return layouts;
  };
  const auto same = rank_layouts(0, 2);
  REQUIRE(same.size() == 2);
  // Bucket 16: hidden 16 KiB at 0, logits 8 KiB after it.
  CHECK(same[1].requests[1].offset == 16 * 1024);
  CHECK(same[1].requests[1].bytes == 8 * 1024);
  CHECK_NOTHROW(check_identical_layouts(std::vector<std::vector<PlanLayout>>{same, rank_layouts(0, 2)}));

  try {
    check_identical_layouts(std::vector<std::vector<PlanLayout>>{same, same, rank_layouts(16, 2)});
    FAIL("a rank with another size in its second bucket passed");
  } catch (const layout_mismatch_error& e) {
    CHECK(e.mismatch().rank == 2);
    CHECK(e.mismatch().graph == 1);
    CHECK(e.mismatch().request == 0);
    CHECK(e.mismatch().field == LayoutMismatch::Field::bytes);
    CHECK(e.mismatch().bytes0 == 16 * 1024);
    CHECK(e.mismatch().bytes_r == 32 * 1024);
    CHECK_THAT(std::string(e.what()), Contains("rank 2's captured layout of graph 1 differs"));
  }
  try {
    check_identical_layouts(std::vector<std::vector<PlanLayout>>{same, rank_layouts(0, 3)});
    FAIL("a rank with an extra bucket passed");
  } catch (const layout_mismatch_error& e) {
    CHECK(e.mismatch().rank == 1);
    CHECK(e.mismatch().field == LayoutMismatch::Field::graph_count);
    CHECK(e.mismatch().graph == 2);
    CHECK(e.mismatch().value0 == 2);
    CHECK(e.mismatch().value_r == 3);
    CHECK_THAT(std::string(e.what()), Contains("graph count: 2 graphs on rank 0, 3 on rank 1"));
  }
}

TEST_CASE("under virtual sharing the physical offsets are compared too", "[rank_layouts]") {
  constexpr std::uint64_t kG = 64 << 10;  // host granule
  // A rank with virtual growth: `a` is released before `b` is requested, so with sharing on `b`
  // maps `a`'s physical chunk at addresses of its own.
  struct VRank {
    std::shared_ptr<HostVirtualMemory> vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = kG});
    HostBackend backend;
    std::unique_ptr<Arena> arena;
    HostStream s;
    void* a_ptr = nullptr;
    void* b_ptr = nullptr;
    std::unique_ptr<CapturedGraph> graph;
    explicit VRank(VirtualSharing sharing) {
      ArenaOptions o;
      o.virtual_memory = vm;
      o.virtual_reserve_bytes = 64ull << 20;
      o.virtual_sharing = sharing;
      o.report_findings = false;
      o.canary_bytes = 0;
      arena = std::make_unique<Arena>(backend, o);
      Bindings b;
      graph = std::make_unique<CapturedGraph>(capture(*arena, s, b, [&](const Bindings& bb) {
        {
          auto a = arena->request(s, "a", Extent(std::int64_t(kG)), 1, capacity_bound, bb);
          a_ptr = a.data();
        }
        auto w = arena->request(s, "b", Extent(std::int64_t(kG)), 1, capacity_bound, bb);
        b_ptr = w.data();
      }));
    }
  };
  VRank r0(VirtualSharing::disjoint_lifetimes), r1(VirtualSharing::disjoint_lifetimes);
  const PlanLayout l0 = r0.graph->plan().layout();
  REQUIRE(l0.requests.size() == 2);
  // Own addresses, one physical chunk (as the memory itself shows): the layout says the same.
  CHECK(r0.a_ptr != r0.b_ptr);
  CHECK(r0.vm->chunk_at(r0.b_ptr) == r0.vm->chunk_at(r0.a_ptr));
  CHECK(l0.requests[0].offset != l0.requests[1].offset);
  CHECK(l0.requests[1].physical_offset == l0.requests[0].physical_offset);
  CHECK(l0.physical_bytes == kG);
  CHECK_NOTHROW(check_identical_layouts(std::vector<PlanLayout>{l0, r1.graph->plan().layout()}));

  // A rank configured without sharing: same addresses, other physical layout.
  VRank off(VirtualSharing::off);
  const PlanLayout lo = off.graph->plan().layout();
  const auto e = mismatch_of({l0, lo});
  CHECK(e.mismatch().rank == 1);
  CHECK(e.mismatch().request == 1);
  CHECK(e.mismatch().field == LayoutMismatch::Field::physical_offset);
  CHECK(e.mismatch().value0 == l0.requests[0].physical_offset);
  CHECK(e.mismatch().value_r == lo.requests[1].offset);
  CHECK(e.mismatch().offset0 == e.mismatch().offset_r);
}
