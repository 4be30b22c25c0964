// Virtual sharing (ArenaOptions::virtual_sharing = disjoint_lifetimes) on the host twin: workspaces
// whose lifetimes in a capture are disjoint map the same memfd pages (physical chunks) at their own
// addresses. HostVirtualMemory::chunk_at says which chunk an address shows, so the tests compare
// physical bytes directly: a write through one workspace's address is read through another's, two
// workspaces live at once never share a byte, and the randomized case checks every pair against
// an order model built here from the captured launches (not from the planner or the backend).
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {

constexpr std::uint64_t kG = 64 << 10;  // host granule

struct Fx {
  std::shared_ptr<HostVirtualMemory> vm;
  HostBackend backend;
  std::unique_ptr<Arena> arena;
  HostStream s;
  explicit Fx(VirtualSharing sharing = VirtualSharing::disjoint_lifetimes, bool debug = false) {
    vm = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = kG});
    ArenaOptions o;
    o.virtual_memory = vm;
    o.virtual_reserve_bytes = 512ull << 20;
    o.virtual_sharing = sharing;
    o.report_findings = false;
    o.debug = debug;
    arena = std::make_unique<Arena>(backend, o);
  }
};

Workspace bytes_ws(Arena& a, HostStream& s, const char* name, Extent n, const Bindings& b) {
  return a.request(s, name, n, 1, capacity_bound, b);
}

// The physical bytes [p, p + n) shows: (chunk, first byte in it, end) per granule it crosses.
struct Seg {
  std::int64_t chunk;
  std::uint64_t lo, hi;
};
std::vector<Seg> physical(const HostVirtualMemory& vm, const void* p, std::uint64_t n) {
  std::vector<Seg> out;
  auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = a + n;
  while (a < end) {
    const std::uintptr_t gend = (a / kG + 1) * kG;
    const std::uintptr_t e = std::min(end, gend);
    out.push_back({vm.chunk_at(reinterpret_cast<const void*>(a)), a % kG, e - a / kG * kG});
    a = e;
  }
  return out;
}
bool shares_physical(const HostVirtualMemory& vm, const void* p, std::uint64_t pn, const void* q, std::uint64_t qn) {
  for (const Seg& x : physical(vm, p, pn))
    for (const Seg& y : physical(vm, q, qn)) {
      REQUIRE(x.chunk >= 0);  // everything compared is mapped
      REQUIRE(y.chunk >= 0);
      if (x.chunk == y.chunk && x.lo < y.hi && y.lo < x.hi) return true;
    }
  return false;
}
bool overlap(const void* a, std::uint64_t an, const void* b, std::uint64_t bn) {
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}
void join(HostStream& from, HostStream& into) {
  HostEvent e;
  from.record(e);
  into.wait(e);
}

// Eight layers, each with a scratch of 3 granules requested, written and released in turn. Each
// layer records the first byte of its scratch before writing it.
struct Layers {
  Arena& arena;
  HostStream& s;
  std::uint64_t bytes = 3 * kG;
  int layers = 8;
  std::vector<void*> addr;
  std::vector<int> seen;
  void operator()(const Bindings& b) {
    addr.assign(layers, nullptr);
    seen.assign(layers, -1);
    for (int k = 0; k < layers; ++k) {
      Workspace ws = bytes_ws(arena, s, "layer.scratch", Extent(static_cast<std::int64_t>(bytes)), b);
      auto* p = static_cast<unsigned char*>(ws.data());
      addr[k] = p;
      int* out = &seen[k];
      const std::uint64_t n = bytes;
      s.launch([p, out, k, n] {
        *out = p[0];
        std::memset(p, 0x10 + k, n);
      });
    }
  }
};

}  // namespace

TEST_CASE("virtual sharing: disjoint lifetimes share physical chunks, each workspace at its own address",
          "[virtual_sharing]") {
  Fx f;
  Bindings b;
  Layers step{*f.arena, f.s};
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) { step(bb); });
  // Distinct, non-overlapping addresses for all eight workspaces.
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j) CHECK_FALSE(overlap(step.addr[i], step.bytes, step.addr[j], step.bytes));
  // Physically one layer's worth: every layer shows the same three chunks.
  CHECK(g.plan().physical_bytes() == 3 * kG);
  CHECK(g.plan().peak_live_bytes() == 3 * kG);
  CHECK(g.plan().bytes() >= 8 * 3 * kG);  // address space: one range each
  CHECK(f.arena->committed_bytes() == 3 * kG);
  CHECK(f.vm->stats().chunks_mapped == 3);
  CHECK(f.vm->stats().alias_mapped == 7 * 3);
  for (int k = 1; k < 8; ++k) {
    CHECK(g.plan().entries()[k].physical_offset == 0);
    CHECK(g.plan().entries()[k].shares_bytes);
    CHECK(f.vm->chunk_at(step.addr[k]) == f.vm->chunk_at(step.addr[0]));
  }
  g.replay(b, f.s);
  g.replay(b, f.s);
  // Each layer read, through its own address, what the layer before wrote through another one; the
  // first layer read what the last one wrote in the replay before.
  CHECK(step.seen[0] == 0x17);
  for (int k = 1; k < 8; ++k) CHECK(step.seen[k] == 0x10 + k - 1);
  // And on the host: the first layer's address shows the last layer's bytes.
  const auto* p0 = static_cast<const unsigned char*>(step.addr[0]);
  CHECK(p0[0] == 0x17);
  CHECK(p0[3 * kG - 1] == 0x17);
  const auto vs = g.virtual_stats();
  CHECK(vs.committed_bytes == 3 * kG);
  CHECK(vs.mapped_bytes == 8 * 3 * kG);
}

TEST_CASE("virtual sharing in debug mode: guards are part of the shared layout, no false overwrite is reported",
          "[virtual_sharing]") {
  Fx f(VirtualSharing::disjoint_lifetimes, /*debug=*/true);
  Bindings b;
  Layers step{*f.arena, f.s};
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) { step(bb); });
  // Each block carries its guard; the layout holds one layer and its guard.
  CHECK(g.plan().physical_bytes() == 3 * kG + 256);
  for (int r = 0; r < 3; ++r) g.replay(b, f.s);
  CHECK(debug::check_canaries(g, f.s).empty());
  for (int k = 1; k < 8; ++k) CHECK(step.seen[k] == 0x10 + k - 1);
}

TEST_CASE("virtual sharing off: the same layers commit one range each and read only their own bytes",
          "[virtual_sharing]") {
  Fx f(VirtualSharing::off);
  Bindings b;
  Layers step{*f.arena, f.s};
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) { step(bb); });
  g.replay(b, f.s);
  g.replay(b, f.s);
  CHECK(f.arena->committed_bytes() == 8 * 3 * kG);
  CHECK(g.plan().physical_bytes() == g.plan().bytes());
  CHECK(f.vm->stats().alias_mapped == 0);
  for (int k = 0; k < 8; ++k) CHECK(step.seen[k] == 0x10 + k);  // its own write of the replay before
}

TEST_CASE("virtual sharing: workspaces live at once never share physical bytes", "[virtual_sharing]") {
  Fx f;
  Bindings b;
  std::vector<void*> addr;
  std::vector<std::uint64_t> sizes{kG / 2, 3 * kG / 2, kG / 4, 2 * kG, 256};
  int bad = 0;
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
    std::vector<Workspace> held;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      held.push_back(bytes_ws(*f.arena, f.s, "held", Extent(static_cast<std::int64_t>(sizes[i])), bb));
      auto* p = static_cast<unsigned char*>(held.back().data());
      addr.push_back(p);
      const std::uint64_t n = sizes[i];
      f.s.launch([p, n, i] { std::memset(p, 0x40 + static_cast<int>(i), n); });
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto* p = static_cast<unsigned char*>(addr[i]);
      const std::uint64_t n = sizes[i];
      f.s.launch([p, n, i, &bad] {
        if (std::any_of(p, p + n, [i](unsigned char c) { return c != 0x40 + static_cast<int>(i); })) ++bad;
      });
    }
  });
  g.replay(b, f.s);
  CHECK(bad == 0);
  std::uint64_t sum = 0;
  for (auto n : sizes) sum += (n + 255) / 256 * 256;
  CHECK(g.plan().physical_bytes() == sum);
  CHECK(g.plan().peak_live_bytes() == sum);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CHECK_FALSE(g.plan().entries()[i].shares_bytes);
    for (std::size_t j = i + 1; j < sizes.size(); ++j) {
      INFO(i << " vs " << j);
      CHECK_FALSE(overlap(addr[i], sizes[i], addr[j], sizes[j]));
      CHECK_FALSE(shares_physical(*f.vm, addr[i], sizes[i], addr[j], sizes[j]));
    }
  }
  // Small workspaces live at once still pack into shared granules, at distinct bytes: the physical
  // commit is the packed layout's granules, not one granule per workspace.
  CHECK(f.arena->committed_bytes() <= (sum + kG - 1) / kG * kG + kG);
}

TEST_CASE("virtual sharing: a release on another stream not ordered before the request is not shared",
          "[virtual_sharing]") {
  Fx f;
  HostStream side;
  Bindings b;
  const std::uint64_t n = 2 * kG;
  void *x = nullptr, *y = nullptr, *x2 = nullptr, *y2 = nullptr;
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
    f.s.launch([] {});
    join(f.s, side);  // fork
    {
      Workspace wx = bytes_ws(*f.arena, f.s, "x", Extent(static_cast<std::int64_t>(n)), bb);
      x = wx.data();
      f.s.launch([p = x, n] { std::memset(p, 1, n); });
    }  // released on the main stream
    Workspace wy = bytes_ws(*f.arena, side, "y", Extent(static_cast<std::int64_t>(n)), bb);
    y = wy.data();  // side's work is concurrent with x's: unproven, so not shared
    side.launch([p = y, n] { std::memset(p, 2, n); });
    {
      Workspace wx2 = bytes_ws(*f.arena, f.s, "x2", Extent(static_cast<std::int64_t>(n)), bb);
      x2 = wx2.data();
      f.s.launch([p = x2, n] { std::memset(p, 3, n); });
    }
    join(f.s, side);  // side now follows x2's release
    Workspace wy2 = bytes_ws(*f.arena, side, "y2", Extent(static_cast<std::int64_t>(n)), bb);
    y2 = wy2.data();
    side.launch([p = y2, n] { std::memset(p, 4, n); });
    join(side, f.s);
  });
  g.replay(b, f.s);
  CHECK_FALSE(shares_physical(*f.vm, x, n, y, n));    // concurrent branches
  CHECK_FALSE(shares_physical(*f.vm, x2, n, y, n));   // y is still live
  CHECK(shares_physical(*f.vm, x, n, x2, n));         // same stream, in order
  CHECK(shares_physical(*f.vm, x2, n, y2, n));        // the join proves x2's uses come first
  for (void* p : {x, y, x2, y2})
    for (void* q : {x, y, x2, y2})
      if (p != q) CHECK_FALSE(overlap(p, n, q, n));
  CHECK(g.plan().physical_bytes() == 2 * n);
}

TEST_CASE("virtual sharing: graphs of one family share the physical slots, not the addresses",
          "[virtual_sharing]") {
  Fx f;
  Bindings b;
  auto fam = f.arena->family("decode");
  Layers small{*f.arena, f.s, 2 * kG, 4};
  Layers large{*f.arena, f.s, 3 * kG, 6};
  auto g1 = std::make_unique<CapturedGraph>(capture(*f.arena, f.s, b, [&](const Bindings& bb) { small(bb); }, {.family = fam}));
  auto g2 = std::make_unique<CapturedGraph>(capture(*f.arena, f.s, b, [&](const Bindings& bb) { large(bb); }, {.family = fam}));
  for (void* p : small.addr)
    for (void* q : large.addr) CHECK_FALSE(overlap(p, small.bytes, q, large.bytes));
  // The family holds the larger graph's physical layout, not the sum of both.
  CHECK(f.arena->committed_bytes() == 3 * kG);
  CHECK(f.vm->chunk_at(small.addr[0]) == f.vm->chunk_at(large.addr[0]));
  for (int r = 0; r < 3; ++r) {
    g1->replay(b, f.s);
    for (int k = 1; k < 4; ++k) CHECK(small.seen[k] == 0x10 + k - 1);
    g2->replay(b, f.s);
    CHECK(large.seen[0] == 0x13);  // g1's last layer wrote the shared bytes just before
    for (int k = 1; k < 6; ++k) CHECK(large.seen[k] == 0x10 + k - 1);
  }
  CHECK(f.arena->committed_bytes() == 3 * kG);
  // Both graphs gone: everything back to the pool; a new capture starts at the family's base again.
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(small.addr[0]);
  g1.reset();
  g2.reset();
  CHECK(f.arena->committed_bytes() == 0);
  CHECK(f.vm->stats().chunks_mapped == 0);
  CHECK(f.vm->stats().alias_mapped == 0);
  auto g3 = capture(*f.arena, f.s, b, [&](const Bindings& bb) { small(bb); }, {.family = fam});
  CHECK(reinterpret_cast<std::uintptr_t>(small.addr[0]) == first);
}

TEST_CASE("virtual sharing: growth after sharing maps behind the same addresses and keeps sharing",
          "[virtual_sharing]") {
  Fx f;
  const Symbol n = Symbol::dynamic("sharing.n", static_cast<std::int64_t>(16 * kG));
  Bindings b;
  b.set(n, static_cast<std::int64_t>(kG));
  std::vector<void*> addr(4);
  std::vector<int> seen(4, -1);
  std::int64_t cur = static_cast<std::int64_t>(kG);
  auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
    for (int k = 0; k < 4; ++k) {
      Workspace ws = bytes_ws(*f.arena, f.s, "grow", Extent(n), bb);
      auto* p = static_cast<unsigned char*>(ws.data());
      addr[k] = p;
      f.s.launch([p, k, &cur, out = &seen[k]] {
        *out = p[cur - 1];
        std::memset(p, 0x20 + k, static_cast<std::size_t>(cur));
      });
    }
  });
  const std::vector<void*> at_capture = addr;
  CHECK(f.arena->committed_bytes() == kG);
  g.replay(b, f.s);
  for (std::int64_t v : {5 * kG, 2 * kG, 16 * kG}) {
    INFO("n = " << v);
    cur = v;
    b.set(n, v);
    g.replay(b, f.s);
    CHECK(addr == at_capture);  // nothing the graph saw moved
    for (int k = 1; k < 4; ++k) CHECK(seen[k] == 0x20 + k - 1);  // the last byte too: shared after growth
    const auto vs = g.virtual_stats(&b);
    // Physical commit: the high-water need of one workspace; the address space mapped: four.
    const std::uint64_t high = static_cast<std::uint64_t>(std::max<std::int64_t>(v, 5 * kG));
    CHECK(vs.committed_bytes == high);
    CHECK(vs.mapped_bytes == 4 * high);
    CHECK(f.vm->chunk_at(static_cast<unsigned char*>(addr[3]) + v - 1) ==
          f.vm->chunk_at(static_cast<unsigned char*>(addr[0]) + v - 1));
  }
  // Shrink to a small need, then grow again: the slots are mapped afresh and shared again.
  b.set(n, static_cast<std::int64_t>(kG));
  cur = static_cast<std::int64_t>(kG);
  f.arena->shrink(f.s, b);
  CHECK(f.arena->committed_bytes() == kG);
  CHECK(f.vm->stats().alias_mapped == 3);
  cur = 7 * kG;
  b.set(n, cur);
  g.replay(b, f.s);
  g.replay(b, f.s);
  for (int k = 1; k < 4; ++k) CHECK(seen[k] == 0x20 + k - 1);
  CHECK(f.arena->committed_bytes() == 7 * kG);
}

TEST_CASE("virtual sharing: physical bytes equal the peak live bytes of an independent model", "[virtual_sharing]") {
  // One stream, equal sizes: any released range holds any later block, so the planner's layout
  // reaches the peak exactly; the model counts live workspaces in program order.
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    Fx f;
    Bindings b;
    std::mt19937_64 rng(seed);
    const std::uint64_t size = kG * (1 + seed % 3);
    std::uint64_t model_peak = 0;
    int bad = 0;
    auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
      // Each workspace is filled with its own value when made and checked when it dies: a later
      // workspace over its bytes before then would show.
      std::vector<std::pair<std::unique_ptr<Workspace>, unsigned char>> live;
      unsigned char tag = 0;
      for (int op = 0; op < 40; ++op) {
        if (live.empty() || (live.size() < 6 && rng() % 2)) {
          auto w = std::make_unique<Workspace>(bytes_ws(*f.arena, f.s, "w", Extent(static_cast<std::int64_t>(size)), bb));
          auto* p = static_cast<unsigned char*>(w->data());
          const unsigned char v = ++tag;
          f.s.launch([p, v, size] { std::memset(p, v, size); });
          live.emplace_back(std::move(w), v);
          model_peak = std::max<std::uint64_t>(model_peak, live.size() * size);
        } else {
          const std::size_t i = rng() % live.size();
          auto* p = static_cast<unsigned char*>(live[i].first->data());
          const unsigned char v = live[i].second;
          f.s.launch([p, v, size, &bad] {
            if (std::any_of(p, p + size, [v](unsigned char c) { return c != v; })) ++bad;
          });
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
    });
    g.replay(b, f.s);
    CHECK(bad == 0);
    CHECK(g.plan().peak_live_bytes() == model_peak);
    CHECK(g.plan().physical_bytes() == model_peak);
    CHECK(f.arena->committed_bytes() == model_peak);
  }
}

TEST_CASE("virtual sharing: randomized two-stream captures against an independent order model",
          "[virtual_sharing]") {
  std::uint64_t shared_pairs = 0, unshared_pairs = 0;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    INFO("seed " << seed);
    Fx f;
    HostStream side;
    HostStream* streams[2] = {&f.s, &side};
    Bindings b;
    std::mt19937_64 rng(seed * 7919);
    // The model: every launch is a node; a node's ancestors are those of its stream's frontier (and
    // the frontier itself); a join adds the recording stream's frontier to the waiting one's.
    std::vector<std::vector<bool>> anc;  // per node: ancestors, itself included
    std::vector<std::uint32_t> frontier[2];
    auto reach = [&](int s) {
      std::vector<bool> r(anc.size(), false);
      for (std::uint32_t d : frontier[s])
        for (std::size_t i = 0; i < anc[d].size(); ++i)
          if (anc[d][i]) r[i] = true;
      return r;
    };
    auto node = [&](int s) {
      std::vector<bool> a = reach(s);
      a.push_back(true);
      anc.push_back(std::move(a));
      frontier[s] = {static_cast<std::uint32_t>(anc.size() - 1)};
    };
    struct W {
      int stream;
      std::uint64_t bytes;
      void* p;
      std::vector<bool> req_reach;       // nodes ordered before its first use
      std::vector<std::uint32_t> rel;    // its stream's frontier at release (empty: live to the end)
      bool released = false;
    };
    std::vector<W> ws;
    int bad = 0;
    auto g = capture(*f.arena, f.s, b, [&](const Bindings& bb) {
      std::vector<std::pair<std::size_t, std::unique_ptr<Workspace>>> live;
      auto use = [&](std::size_t i, bool write) {
        W& w = ws[i];
        auto* p = static_cast<unsigned char*>(w.p);
        const auto v = static_cast<unsigned char>(i + 1);
        const std::uint64_t n = w.bytes;
        if (write)
          streams[w.stream]->launch([p, v, n] { std::memset(p, v, n); });
        else
          streams[w.stream]->launch([p, v, n, &bad] {
            if (std::any_of(p, p + n, [v](unsigned char c) { return c != v; })) ++bad;
          });
        node(w.stream);
      };
      auto release = [&](std::size_t k) {
        const std::size_t i = live[k].first;
        use(i, false);  // still holds its own bytes: nothing shared wrote over it
        ws[i].rel = frontier[ws[i].stream];
        ws[i].released = true;
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      };
      f.s.launch([] {});
      node(0);
      join(f.s, side);
      frontier[1] = frontier[0];
      for (int op = 0; op < 30; ++op) {
        const auto r = rng() % 10;
        if (r < 4 && live.size() < 6) {
          const int s = static_cast<int>(rng() % 2);
          const std::uint64_t bytes = (kG / 4) * (1 + rng() % 8);
          W w{s, bytes, nullptr, reach(s), {}, false};
          auto h = std::make_unique<Workspace>(
              bytes_ws(*f.arena, *streams[s], "r", Extent(static_cast<std::int64_t>(bytes)), bb));
          w.p = h->data();
          ws.push_back(std::move(w));
          live.emplace_back(ws.size() - 1, std::move(h));
          use(ws.size() - 1, true);
        } else if (r < 8 && !live.empty()) {
          release(rng() % live.size());
        } else {
          const int from = static_cast<int>(rng() % 2);
          join(*streams[from], *streams[1 - from]);
          auto& into = frontier[1 - from];
          for (std::uint32_t d : frontier[from])
            if (std::find(into.begin(), into.end(), d) == into.end()) into.push_back(d);
        }
      }
      while (!live.empty()) release(0);
      join(side, f.s);
    });
    g.replay(b, f.s);
    g.replay(b, f.s);
    CHECK(bad == 0);
    auto ordered = [&](const W& x, const W& y) {  // every use of x before every use of y
      if (!x.released || x.rel.empty()) return false;
      for (std::uint32_t d : x.rel)
        if (d >= y.req_reach.size() || !y.req_reach[d]) return false;
      return true;
    };
    std::uint64_t mapped_bytes = 0;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      mapped_bytes += ws[i].bytes;
      for (std::size_t j = i + 1; j < ws.size(); ++j) {
        INFO("workspaces " << i << " and " << j);
        CHECK_FALSE(overlap(ws[i].p, ws[i].bytes, ws[j].p, ws[j].bytes));
        const bool share = shares_physical(*f.vm, ws[i].p, ws[i].bytes, ws[j].p, ws[j].bytes);
        if (share) {
          CHECK((ordered(ws[i], ws[j]) || ordered(ws[j], ws[i])));
          ++shared_pairs;
        } else {
          ++unshared_pairs;
        }
      }
    }
    // The physical commit stays within the layout's granules.
    CHECK(f.arena->committed_bytes() <= (g.plan().physical_bytes() + kG - 1) / kG * kG);
    CHECK(g.plan().physical_bytes() >= g.plan().peak_live_bytes());
  }
  // Not vacuous: the captures shared and kept apart both.
  CHECK(shared_pairs > 50);
  CHECK(unshared_pairs > 50);
}

TEST_CASE("virtual sharing: bad options and bad aliases are refused with the value and the limit",
          "[virtual_sharing]") {
  HostBackend backend;
  ArenaOptions o;
  o.debug = false;
  o.virtual_sharing = VirtualSharing::disjoint_lifetimes;
  CHECK_THROWS_WITH(Arena(backend, o), Contains("virtual_sharing = disjoint_lifetimes needs") &&
                                           Contains("virtual_memory"));
  o.virtual_memory = std::make_shared<HostVirtualMemory>(HostVirtualMemoryOptions{.granularity = kG});
  o.virtual_sharing = static_cast<VirtualSharing>(7);
  CHECK_THROWS_AS(Arena(backend, o), invalid_argument_error);
  CHECK_THROWS_WITH(Arena(backend, o), Contains("virtual_sharing = 7") && Contains("disjoint_lifetimes = 1"));
  // alias() of a chunk that is not mapped (pooled after its last unmap) is refused, nothing mapped.
  HostVirtualMemory vm({.granularity = kG});
  const std::uintptr_t va = vm.reserve(4 * kG);
  std::uint64_t c = 0;
  vm.map(va, 1, &c);
  vm.alias(va + kG, 1, &c);
  CHECK(vm.mappings(c) == 2);
  vm.unmap(va, 1, &c);
  CHECK(vm.mappings(c) == 1);
  CHECK(vm.stats().chunks_pooled == 0);  // still mapped at va + kG
  vm.unmap(va + kG, 1, &c);
  CHECK(vm.stats().chunks_pooled == 1);
  CHECK_THROWS_WITH(vm.alias(va + 2 * kG, 1, &c), Contains("chunk " + std::to_string(c)) && Contains("not mapped"));
  CHECK_FALSE(vm.is_mapped(reinterpret_cast<void*>(va + 2 * kG), kG));
  CHECK_THROWS_WITH(vm.alias(va + 1, 1, &c), Contains("not granule-aligned"));
  vm.unreserve(va, 4 * kG);
}

TEST_CASE("VirtualMemory::alias: one chunk at two addresses, a write through one is read through the other",
          "[virtual_sharing]") {
  HostVirtualMemory vm({.granularity = kG});
  const std::uintptr_t a = vm.reserve(2 * kG), b = vm.reserve(2 * kG);
  std::uint64_t c[2];
  vm.map(a, 2, c);
  vm.alias(b, 2, c);
  auto* pa = reinterpret_cast<unsigned char*>(a);
  auto* pb = reinterpret_cast<unsigned char*>(b);
  pa[5] = 42;
  pb[kG + 7] = 43;
  CHECK(pb[5] == 42);
  CHECK(pa[kG + 7] == 43);
  CHECK(vm.stats().chunks_mapped == 2);
  CHECK(vm.stats().alias_mapped == 2);
  CHECK(vm.stats().physical_bytes() == 2 * kG);
  CHECK(vm.chunk_at(pa) == vm.chunk_at(pb));
  vm.unmap(b, 2, c);
  CHECK(pa[5] == 42);  // the first mapping keeps the bytes
  CHECK_FALSE(vm.is_mapped(pb, 1));
  vm.unmap(a, 2, c);
  CHECK(vm.stats().chunks_pooled == 2);
  vm.unreserve(a, 2 * kG);
  vm.unreserve(b, 2 * kG);
}
