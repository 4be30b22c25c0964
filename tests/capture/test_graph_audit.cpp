// The graph audit of debug mode: after instantiation, every two workspaces of a capture that share
// bytes must be ordered by the graph itself. The audit's core is checked against a brute-force
// reference (transitive closure of random graphs, every pair of spans); the arena's hook on the
// host backend's recorded graphs: ordered reuse on one stream and across joined streams is clean,
// and a reuse forced over an unjoined stream (a backend that claims every release is ordered) is an
// unordered-reuse finding naming both request sites.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include "../support/forced_reuse_backend.hpp"
#include "graph_audit.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace graphsafe;
using graphsafe_test::ForcedReuseBackend;
using Catch::Contains;

namespace {
constexpr std::uint64_t kMiB = 1ull << 20;

void join(HostStream& from, HostStream& into) {
  HostEvent e;
  from.record(e);
  into.wait(e);
}
void use(HostStream& s, const Workspace& w, unsigned char v) {
  s.launch([p = w.data(), n = w.bytes(), v] { std::memset(p, v, n); });
}

std::vector<debug::Finding> unordered_reuse_findings() {
  std::vector<debug::Finding> out;
  for (auto& f : debug::findings())
    if (f.kind == debug::kind::unordered_reuse) out.push_back(f);
  return out;
}

std::string site_line(int line) { return "test_graph_audit.cpp:" + std::to_string(line) + " "; }

const void* node(std::size_t i) { return reinterpret_cast<const void*>((i + 1) * 16); }
}  // namespace

TEST_CASE("graph audit: the pairs it reports are those a transitive-closure reference finds unordered",
          "[graph_audit]") {
  std::mt19937_64 rng(20261203);
  std::size_t violations_seen = 0, clean_pairs_seen = 0;
  for (int round = 0; round < 200; ++round) {
    const std::size_t n = 1 + rng() % 24;
    GraphTopology g;
    std::vector<std::vector<char>> reach(n, std::vector<char>(n, 0));  // reach[a][b]: a is b or an ancestor
    for (std::size_t i = 0; i < n; ++i) {
      g.nodes.push_back(node(i));
      reach[i][i] = 1;
    }
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t i = 0; i < j; ++i)
        if (rng() % 4 == 0) {
          g.edges.emplace_back(node(i), node(j));
          reach[i][j] = 1;
        }
    std::shuffle(g.nodes.begin(), g.nodes.end(), rng);  // the audit must not rely on node order
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < n; ++j)
          if (reach[i][k] && reach[k][j]) reach[i][j] = 1;

    // Positions: a few nodes, now and then one the graph does not hold (index n).
    auto position = [&] {
      std::vector<std::size_t> p;
      for (std::size_t k = rng() % 4; k > 0; --k) p.push_back(rng() % 16 == 0 ? n : rng() % n);
      return p;
    };
    auto handles = [&](const std::vector<std::size_t>& p) {
      std::vector<const void*> h;
      for (std::size_t i : p) h.push_back(node(i));
      return h;
    };
    const std::size_t m = 1 + rng() % 12;
    std::vector<detail::AuditSpan> spans(m);
    std::vector<std::vector<std::size_t>> req(m), rel(m);
    for (std::size_t i = 0; i < m; ++i) {
      auto& sp = spans[i];
      sp.name = "ws" + std::to_string(i);
      sp.site = "site" + std::to_string(i);
      sp.offset = 256 * (rng() % 8);
      sp.bytes = rng() % 10 == 0 ? 0 : 256 * (1 + rng() % 4);
      sp.stream = reinterpret_cast<void*>(0x1000 * (1 + rng() % 2));
      sp.request_known = rng() % 10 != 0;
      req[i] = position();
      sp.requested_after = handles(req[i]);
      sp.released = rng() % 8 != 0;
      sp.release_stream = reinterpret_cast<void*>(0x1000 * (1 + rng() % 2));
      sp.release_known = rng() % 10 != 0;
      rel[i] = position();
      sp.released_after = handles(rel[i]);
    }
    // Reference: every pair, directly.
    std::set<std::pair<std::size_t, std::size_t>> expected;
    for (std::size_t a = 0; a < m; ++a)
      for (std::size_t b = a + 1; b < m; ++b) {
        const auto &e = spans[a], &l = spans[b];
        const bool share = e.bytes && l.bytes && e.offset < l.offset + l.bytes && l.offset < e.offset + e.bytes;
        if (!share) continue;
        bool ordered;
        if (!e.released)
          ordered = false;
        else if (!e.release_known || !l.request_known)
          ordered = e.release_stream == l.stream;
        else
          ordered = std::all_of(rel[a].begin(), rel[a].end(), [&](std::size_t r) {
            return r < n && std::any_of(req[b].begin(), req[b].end(), [&](std::size_t q) { return q < n && reach[r][q]; });
          });
        if (!ordered) expected.emplace(a, b);
        else ++clean_pairs_seen;
      }
    std::set<std::pair<std::size_t, std::size_t>> got;
    for (const auto& v : detail::audit_reuse(g, spans)) {
      CHECK(v.earlier < v.later);
      CHECK_THAT(v.message, Contains(spans[v.earlier].site) && Contains(spans[v.later].site));
      got.emplace(v.earlier, v.later);
    }
    INFO("round " << round);
    CHECK(got == expected);
    violations_seen += expected.size();
  }
  // The rounds exercised both outcomes.
  CHECK(violations_seen > 50);
  CHECK(clean_pairs_seen > 50);
}

TEST_CASE("graph audit: reuse ordered on one stream is clean, and the host graph's topology is the capture's",
          "[graph_audit]") {
  debug::clear_findings();
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.debug = true});
  HostStream s(backend);
  arena.reserve(4 * kMiB, s);
  Bindings b;
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    for (int layer = 0; layer < 6; ++layer) {
      auto ws = arena.request(s, "layer.scratch", Extent(64 * 1024), 1, capacity_bound, bb);
      use(s, ws, static_cast<unsigned char>(layer));
      use(s, ws, static_cast<unsigned char>(layer + 1));
    }
  });
  REQUIRE(g.plan().entries().size() == 6);
  for (std::size_t i = 1; i < 6; ++i) CHECK(g.plan().entries()[i].reuses);
  CHECK(unordered_reuse_findings().empty());

  // The recorded graph as graph_topology gives it: 12 nodes in one chain.
  HostStream t(backend);
  backend.begin_capture(t, CaptureMode::global);
  for (int i = 0; i < 12; ++i) t.launch([] {});
  GraphHandle h = backend.end_capture(t);
  GraphTopology topo;
  REQUIRE(backend.graph_topology(h, topo));
  CHECK(topo.nodes.size() == 12);
  CHECK(topo.edges.size() == 11);
  for (auto [from, to] : topo.edges)
    CHECK(reinterpret_cast<std::uintptr_t>(to) == reinterpret_cast<std::uintptr_t>(from) + 1);
  backend.destroy(h);
}

TEST_CASE("graph audit: a reuse forced over an unjoined stream is an unordered-reuse finding naming both sites",
          "[graph_audit]") {
  for (bool forced : {false, true}) {
    DYNAMIC_SECTION((forced ? "forced reuse" : "honest planner")) {
      debug::clear_findings();
      HostBackend host;
      ForcedReuseBackend backend(host);
      backend.force = forced;
      Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true});
      HostStream main(host), side(host);
      arena.reserve(4 * kMiB, main);
      Bindings b;
      int line_a = 0, line_b = 0;
      void* pa = nullptr;
      void* pb = nullptr;
      auto g = capture(arena, main, b, [&](const Bindings& bb) {
        join(main, side);  // fork: side runs concurrently with main from here
        {
          auto a = arena.request(main, "A", Extent(64 * 1024), 1, capacity_bound, bb); line_a = __LINE__;
          pa = a.data();
          use(main, a, 1);
        }  // released on main; side never waits for it
        auto bws = arena.request(side, "B", Extent(64 * 1024), 1, capacity_bound, bb); line_b = __LINE__;
        pb = bws.data();
        use(side, bws, 2);
        join(side, main);
      });
      const auto found = unordered_reuse_findings();
      if (!forced) {
        CHECK(pa != pb);  // not proven: no reuse
        CHECK_FALSE(g.plan().entries()[1].reuses);
        CHECK(found.empty());
      } else {
        CHECK(pa == pb);  // the backend's false answer made the planner reuse A's range
        CHECK(g.plan().entries()[1].reuses);
        REQUIRE(found.size() == 1);
        CHECK(found[0].request == "B");
        CHECK_THAT(found[0].site, Contains(site_line(line_b)));
        CHECK_THAT(found[0].message, Contains("'A'") && Contains("'B'") && Contains(site_line(line_a)) &&
                                         Contains(site_line(line_b)) && Contains("not ordered"));
      }
    }
  }
}

TEST_CASE("graph audit: fork and join on three streams: joined reuse is clean, an unjoined one is caught",
          "[graph_audit]") {
  for (bool forced : {false, true}) {
    DYNAMIC_SECTION((forced ? "forced reuse" : "honest planner")) {
      debug::clear_findings();
      HostBackend host;
      ForcedReuseBackend backend(host);
      backend.force = forced;
      Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true});
      HostStream main(host), s1(host), s2(host);
      arena.reserve(4 * kMiB, main);
      Bindings b;
      int line_x = 0, line_w = 0;
      void *px = nullptr, *py = nullptr, *pw = nullptr;
      auto g = capture(arena, main, b, [&](const Bindings& bb) {
        join(main, s1);
        join(main, s2);
        {
          auto x = arena.request(s1, "X", Extent(64 * 1024), 1, capacity_bound, bb); line_x = __LINE__;
          px = x.data();
          use(s1, x, 1);
        }  // released on s1
        join(s1, s2);  // s2 follows X's release: its request may take X's range
        {
          auto y = arena.request(s2, "Y", Extent(64 * 1024), 1, capacity_bound, bb);
          py = y.data();
          use(s2, y, 2);
        }  // released on s2; main never waits for s2 before W
        auto w = arena.request(main, "W", Extent(64 * 1024), 1, capacity_bound, bb); line_w = __LINE__;
        pw = w.data();
        use(main, w, 3);
        join(s1, main);
        join(s2, main);
      });
      CHECK(py == px);  // ordered through the s1 -> s2 join: reused either way
      const auto found = unordered_reuse_findings();
      if (!forced) {
        CHECK(pw != px);
        CHECK(found.empty());
      } else {
        // W took the range too although main is joined with neither s1 nor s2 before it: two
        // unordered pairs (X, W) and (Y, W).
        CHECK(pw == px);
        REQUIRE(found.size() == 2);
        for (const auto& f : found) {
          CHECK(f.request == "W");
          CHECK_THAT(f.site, Contains(site_line(line_w)));
        }
        const bool names_x = std::any_of(found.begin(), found.end(), [&](const debug::Finding& f) {
          return f.message.find(site_line(line_x)) != std::string::npos && f.message.find("'X'") != std::string::npos;
        });
        const bool names_y = std::any_of(found.begin(), found.end(), [&](const debug::Finding& f) {
          return f.message.find("'Y'") != std::string::npos;
        });
        CHECK(names_x);
        CHECK(names_y);
      }
    }
  }
}
