// Sizing policies, table-driven: the count each policy reserves, whether it is replay-safe, every
// refusal (with a message naming the symbol and the fix), the clamp of a static bound to the
// capacity bound, and how the arena records each policy's decision under capture.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {

struct Syms {
  Symbol B = Symbol::fixed("batch");
  Symbol T = Symbol::fixed("tokens");
  Symbol W = Symbol::fixed("window");
  Symbol n = Symbol::dynamic("seq_len", 512);
  Symbol u = Symbol::dynamic("unbounded");
  Symbol L = Symbol::batch("seq_lens", B, 512);
  Symbol M = Symbol::batch("free_lens", B);

  Bindings bind() const {
    Bindings b;
    b.set(B, 2).set(T, 4).set(W, 8).set(n, 100).set(u, 50).set(L, {30, 70}).set(M, {5, 9});
    return b;
  }
};

struct Row {
  const char* name;
  const SizingPolicy* policy;
  Extent need;
  std::int64_t count;
  bool replay_safe;
  std::string note_contains;
};

struct Refusal {
  const char* name;
  const SizingPolicy* policy;
  Extent need;
  std::vector<std::string> contains;
};

}  // namespace

TEST_CASE("policies: counts and replay-safety, table-driven", "[policies]") {
  Syms s;
  const Bindings b = s.bind();
  const Extent n(s.n), u(s.u), B(s.B), T(s.T), W(s.W);
  const auto swa = [&](const Extent& l) { return min(l, W); };
  const StaticQueryBound tokens_x_window(T * W);            // 32
  const StaticQueryBound batch_x_window(B * W);             // 16
  const StaticQueryBound two_hundred(Extent(200));          // below the capacity bound of seq_len (512)
  const StaticQueryBound thousand(Extent(1000));            // above it: clamped
  const StaticQueryBound exact_static(B * 128);             // need is static: equal bound is safe
  const std::vector<Row> rows = {
      // capacity_bound: dynamic symbols replaced by capacities; always replay-safe.
      {"cap n*4", &capacity_bound, n * 4, 2048, true, "seq_len <= 512"},
      {"cap static", &capacity_bound, B * 128, 256, true, "capacity bound"},
      {"cap sum ceil_div", &capacity_bound, sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }), 256, true,
       "seq_lens <= 512"},
      {"cap max_over min(l, W)", &capacity_bound, max_over(s.L, swa), 8, true, ""},
      {"cap constant", &capacity_bound, Extent(1000), 1000, true, ""},
      {"cap min(n, 64)", &capacity_bound, min(n, 64), 64, true, ""},
      // static_query_bound: the static bound, clamped to the capacity bound when that is tighter.
      {"sqb clamped to capacity", &tokens_x_window, max_over(s.L, swa), 8, true, "clamped to the capacity bound 8"},
      {"sqb clamped (sum)", &tokens_x_window, sum_over(s.L, swa), 16, true, "clamped to the capacity bound 16"},
      {"sqb not clamped, capacity above", &two_hundred, n, 200, false, "static bound 200 = 200"},
      {"sqb clamped to n's capacity", &thousand, n, 512, true, "clamped to the capacity bound 512"},
      {"sqb covers uncapped need", &batch_x_window, min(u, W) * B, 16, false, "static bound (batch * window) = 16"},
      {"sqb on a non-monotone need", &thousand, ceil_div(1000, n), 1000, false, ""},
      {"sqb on a static need", &exact_static, B * 128, 256, true, ""},
      // exact_at_capture: the need now; safe only when the need is static.
      {"exact n*4", &exact_at_capture, n * 4, 400, false, "seq_len = 100"},
      {"exact static", &exact_at_capture, B * 128, 256, true, "exact need"},
      {"exact sum", &exact_at_capture, sum_over(s.L, [](const Extent& l) { return l; }), 100, false,
       "seq_lens = [30, 70]"},
      {"exact uncapped", &exact_at_capture, u, 50, false, "unbounded = 50"},
      {"exact non-monotone", &exact_at_capture, ceil_div(1000, n), 10, false, ""},
  };
  for (const Row& r : rows) {
    for (bool capturing : {false, true}) {
      INFO(r.name << " (" << r.policy->name() << ", need " << r.need.to_string() << ", capturing " << capturing << ")");
      const SizingDecision d = r.policy->size("req", r.need, b, capturing);
      CHECK(d.count == r.count);
      CHECK(d.replay_safe == r.replay_safe);
      CHECK(d.count >= r.need.evaluate(b));  // every policy covers the need at request time
      // Notes are for plans and reports: written under capture, skipped eagerly (hot path).
      if (capturing && !r.note_contains.empty()) CHECK_THAT(d.note, Contains(r.note_contains));
      if (!capturing) CHECK(d.note.empty());
    }
  }
  CHECK(capacity_bound.name() == "capacity-bound");
  CHECK(exact_at_capture.name() == "exact-at-capture");
  CHECK(tokens_x_window.name() == "static-query-bound");
  CHECK(same_expression(static_query_bound(T * W).bound(), T * W));
}

TEST_CASE("policies: a replay-safe decision covers every binding within capacities", "[policies]") {
  Syms s;
  Bindings b = s.bind();
  const Extent W(s.W), T(s.T);
  const Extent need = max_over(s.L, [&](const Extent& l) { return min(l, W); }) * T;
  const StaticQueryBound bound(T * W);
  // Worked out by hand: window 8, tokens 4, seq_lens <= 512: max_b min(L[b], 8) * 4 <= 32.
  constexpr std::int64_t kBound = 8 * 4;
  for (const SizingPolicy* p : {static_cast<const SizingPolicy*>(&capacity_bound), static_cast<const SizingPolicy*>(&bound)}) {
    const SizingDecision d = p->size("rows", need, b, true);
    REQUIRE(d.replay_safe);
    CHECK(d.count == kBound);
    for (std::int64_t x : {0, 1, 7, 8, 9, 100, 511, 512})
      for (std::int64_t y : {0, 8, 512}) {
        b.set(s.L, {x, y});
        const std::int64_t expected = std::max(std::min<std::int64_t>(x, 8), std::min<std::int64_t>(y, 8)) * 4;
        CHECK(need.evaluate(b) == expected);
        CHECK(expected <= d.count);
      }
    b = s.bind();
  }
}

TEST_CASE("policies: every refusal names the symbol and suggests a fix", "[policies][errors]") {
  Syms s;
  const Bindings b = s.bind();
  const Extent n(s.n), u(s.u), W(s.W);
  const StaticQueryBound dyn_bound(n * 2);
  const StaticQueryBound batch_bound(max_over(s.L, [](const Extent& l) { return l; }));
  const StaticQueryBound uncapped_bound(Extent(u) + 1);
  const StaticQueryBound too_small(Extent(4));
  const StaticQueryBound too_small_static(W);  // 8 < need 100
  const std::vector<Refusal> refusals = {
      {"capacity-bound, dynamic symbol without capacity", &capacity_bound, u * 2,
       {"capacity-bound cannot size request 'req'", "'unbounded' has no capacity",
        "Symbol::dynamic(\"unbounded\", capacity)", "static_query_bound"}},
      {"capacity-bound, batch symbol without capacity", &capacity_bound,
       sum_over(s.M, [](const Extent& l) { return l; }),
       {"request 'req'", "'free_lens' has no capacity", "Symbol::batch(\"free_lens\", length, capacity)"}},
      {"capacity-bound, uncapped symbol beside a capped one", &capacity_bound, n + u, {"'unbounded'"}},
      {"capacity-bound, dynamic divisor", &capacity_bound, ceil_div(1000, n),
       {"request 'req'", "ceil_div(1000, seq_len)", "divides by a dynamic value", "static_query_bound"}},
      {"static bound written with a dynamic symbol", &dyn_bound, n,
       {"static-query-bound for request 'req'", "dynamic symbol 'seq_len'", "(seq_len * 2)", "only static symbols"}},
      {"static bound written with a batch symbol", &batch_bound, n, {"dynamic symbol 'seq_lens'"}},
      {"static bound written with an uncapped symbol", &uncapped_bound, n, {"dynamic symbol 'unbounded'"}},
      {"static bound below the current need", &too_small, n,
       {"request 'req'", "gives 4", "needs 100", "seq_len", "fix the bound or use capacity_bound"}},
      {"static bound (symbol) below the current need", &too_small_static, n * 1,
       {"gives 8", "needs 100", "the bound window does not bound the need"}},
  };
  for (const Refusal& r : refusals) {
    INFO(r.name);
    for (bool capturing : {false, true}) {
      try {
        r.policy->size("req", r.need, b, capturing);
        FAIL("expected policy_refusal");
      } catch (const policy_refusal& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK_THAT(what, Contains("graphsafe:"));
        for (const auto& c : r.contains) CHECK_THAT(what, Contains(c));
      }
    }
  }
  // exact_at_capture never refuses; an unbound symbol is an unbound_symbol_error, not a refusal.
  CHECK_NOTHROW(exact_at_capture.size("req", u * 2, b, true));
  CHECK_THROWS_AS(exact_at_capture.size("req", n, Bindings(), true), unbound_symbol_error);
  CHECK_THROWS_AS(capacity_bound.size("req", Extent(s.B) * n, Bindings(), true), unbound_symbol_error);
}

TEST_CASE("policies: the arena records each decision and guards only the unsafe ones", "[policies][arena]") {
  Syms s;
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream st;
  arena.reserve(1 << 20, st);
  Bindings b = s.bind();
  const Extent n(s.n), T(s.T), W(s.W);
  const StaticQueryBound bound(T * W);
  auto g = capture(arena, st, b, [&](const Bindings& bb) {
    auto a = arena.request(st, "cap", n * 4, 8, capacity_bound, bb);
    auto c = arena.request(st, "sqb", max_over(s.L, [&](const Extent& l) { return min(l, W); }), 8, bound, bb);
    auto d = arena.request(st, "exact", n * 4, 8, exact_at_capture, bb);
    auto e = arena.request(st, "exact.again", n * 4, 8, exact_at_capture, bb);  // same extent: shares a guard
    const std::int64_t rows = arena.dimension(st, "rows", n, exact_at_capture, bb);
    CHECK(a.count() == 2048);
    CHECK(c.count() == 8);
    CHECK(d.count() == 400);
    CHECK(e.count() == 400);
    CHECK(rows == 100);
  });
  const Plan& p = g.plan();
  REQUIRE(p.entries().size() == 5);
  CHECK(p.entries()[0].policy == "capacity-bound");
  CHECK(p.entries()[0].replay_safe);
  CHECK(p.entries()[1].policy == "static-query-bound");
  CHECK(p.entries()[1].replay_safe);
  CHECK_FALSE(p.entries()[2].replay_safe);
  CHECK(p.entries()[2].needed_at_capture == 400);
  CHECK(p.entries()[4].kind == PlanEntry::Kind::dimension);
  CHECK(p.guard_count() == 2);  // n*4 (shared by two requests) and the dimension n
  REQUIRE(p.findings().size() == 3);
  CHECK_THAT(p.findings()[0].message,
             Contains("seq_len = 100") && Contains("capacity_bound") && Contains("static_query_bound"));
  CHECK_THAT(p.report(), Contains("GUARDED") && Contains("replay-safe"));

  // Within the capture-time need: replays run. Above it: refused, naming request, symbol and limit.
  b.set(s.n, 90);
  CHECK_NOTHROW(g.replay(b, st));
  b.set(s.n, 101);
  try {
    g.replay(b, st);
    FAIL("expected guard_failure");
  } catch (const guard_failure& e) {
    REQUIRE(e.violations().size() == 2);
    CHECK(e.violations()[0].request == "exact");
    CHECK(e.violations()[0].required == 404);
    CHECK(e.violations()[0].reserved == 400);
    CHECK(e.violations()[1].request == "rows");
    CHECK_THAT(std::string(e.what()),
               Contains("seq_len = 101") && Contains("captured 100") && Contains("capacity 512") && Contains("fix:"));
  }
}

TEST_CASE("policies: refusals under capture abandon the capture and the arena keeps serving", "[policies][arena]") {
  Syms s;
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.refuse_unsafe_capture = true, .report_findings = false});
  HostStream st;
  arena.reserve(1 << 20, st);
  const Bindings b = s.bind();
  const ArenaStats before = arena.stats();
  const Extent n(s.n), u(s.u);
  struct Case {
    const char* name;
    std::function<void(const Bindings&)> fn;
    std::vector<std::string> contains;
  };
  const StaticQueryBound dyn_bound(n);
  const std::vector<Case> cases = {
      {"exact on a dynamic extent with refuse_unsafe_capture",
       [&](const Bindings& bb) { arena.request(st, "kv", n * 4, 8, exact_at_capture, bb); },
       {"capture refused", "'kv'", "seq_len = 100", "capacity_bound"}},
      {"capacity-bound on an uncapped symbol",
       [&](const Bindings& bb) { arena.request(st, "kv", u, 8, capacity_bound, bb); },
       {"'kv'", "'unbounded' has no capacity"}},
      {"static bound with a dynamic symbol",
       [&](const Bindings& bb) { arena.dimension(st, "rows", n, dyn_bound, bb); },
       {"'rows'", "dynamic symbol 'seq_len'"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    try {
      auto g = capture(arena, st, b, [&](const Bindings& bb) {
        arena.request(st, "before", 100, 8, capacity_bound, bb);  // acquired, then released by the failure
        c.fn(bb);
      });
      FAIL("expected policy_refusal");
    } catch (const policy_refusal& e) {
      for (const auto& x : c.contains) CHECK_THAT(std::string(e.what()), Contains(x));
    }
    const ArenaStats after = arena.stats();
    CHECK(after.free_bytes == before.free_bytes);
    CHECK(after.region_bytes == 0);
    CHECK(after.live_graphs == 0);
    CHECK(after.active_captures == 0);
    CHECK_FALSE(st.capturing());
  }
  // Static extents under exact_at_capture are safe and allowed even when refusing unsafe captures.
  auto g = capture(arena, st, b, [&](const Bindings& bb) {
    arena.request(st, "static", Extent(s.B) * 64, 8, exact_at_capture, bb);
  });
  CHECK(g.plan().guard_count() == 0);
  CHECK(g.plan().findings().empty());
  auto w = arena.request(st, "eager", n * 4, 8, exact_at_capture, b);  // eager: exact is fine
  CHECK(w.count() == 400);
}
