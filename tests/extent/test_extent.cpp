// Extents and bindings: table-driven evaluation and capacity bounds of every operation, symbol
// discovery, monotonicity, readable forms, and every misuse as a typed error that names the value
// and the limit.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

using namespace graphsafe;
using Catch::Contains;

namespace {

constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();

struct Syms {
  Symbol a = Symbol::fixed("a");                       // static scalar
  Symbol B = Symbol::fixed("batch");                   // static batch length
  Symbol n = Symbol::dynamic("n", 100);                // dynamic, capacity 100
  Symbol u = Symbol::dynamic("unbounded");             // dynamic, no capacity
  Symbol L = Symbol::batch("seq_lens", B, 16);         // batch, capacity 16
  Symbol M = Symbol::batch("free_lens", B);            // batch, no capacity
  Symbol big = Symbol::dynamic("big", kI64Max);        // capacity at the top of int64

  Bindings bind() const {
    Bindings b;
    b.set(a, 7).set(B, 3).set(n, 10).set(u, 50).set(L, {3, 5, 8}).set(M, {1, 2, 3}).set(big, 2);
    return b;
  }
};

// What a call threw: its type (checked by `is`) and its message.
struct Thrown {
  bool threw = false;
  bool right_type = false;
  std::string type;
  std::string what;
};

template <class E>
Thrown thrown(const std::function<void()>& f) {
  Thrown t;
  try {
    f();
  } catch (const E& e) {
    t = {true, true, typeid(e).name(), e.what()};
  } catch (const std::exception& e) {
    t = {true, false, typeid(e).name(), e.what()};
  }
  return t;
}

struct Misuse {
  const char* name;
  std::function<Thrown()> run;
  std::vector<std::string> contains;
};

template <class E>
std::function<Thrown()> throws(std::function<void()> f) {
  return [f] { return thrown<E>(f); };
}

void check_misuse(const Misuse& m) {
  INFO("misuse: " << m.name);
  const Thrown t = m.run();
  REQUIRE(t.threw);
  INFO("thrown " << t.type << ": " << t.what);
  CHECK(t.right_type);
  CHECK_THAT(t.what, Contains("graphsafe:"));
  for (const auto& s : m.contains) CHECK_THAT(t.what, Contains(s));
}

}  // namespace

TEST_CASE("extent: table of evaluations and capacity bounds", "[extent]") {
  Syms s;
  const Bindings b = s.bind();
  struct Row {
    const char* name;
    Extent e;
    std::int64_t value;  // under bind(): a=7 batch=3 n=10 seq_lens=[3,5,8]
    std::int64_t bound;  // n -> 100, seq_lens[b] -> 16, static values as bound
    bool monotone;
  };
  const Extent n(s.n), a(s.a);
  const std::vector<Row> rows = {
      {"constant", Extent(42), 42, 42, true},
      {"zero", Extent(0), 0, 0, true},
      {"static symbol", a, 7, 7, true},
      {"dynamic symbol", n, 10, 100, true},
      {"a + 3", a + 3, 10, 10, true},
      {"n + a", n + a, 17, 107, true},
      {"a * n", a * n, 70, 700, true},
      {"batch * 128", Extent(s.B) * 128, 384, 384, true},
      {"max(a, n)", max(a, n), 10, 100, true},
      {"min(a, n)", min(a, n), 7, 7, true},
      {"min(n, 50)", min(n, 50), 10, 50, true},
      {"ceil_div(n, 4)", ceil_div(n, 4), 3, 25, true},
      {"ceil_div(8, 4)", ceil_div(8, 4), 2, 2, true},
      {"ceil_div(0, 4)", ceil_div(0, 4), 0, 0, true},
      {"ceil_div(n, a)", ceil_div(n, a), 2, 15, true},
      {"floor_div(n, 4)", floor_div(n, 4), 2, 25, true},
      {"floor_div(3, 4)", floor_div(3, 4), 0, 0, true},
      {"round_up(n, 8)", round_up(n, 8), 16, 104, true},
      {"round_up(16, 8)", round_up(16, 8), 16, 16, true},
      {"round_up(0, 8)", round_up(0, 8), 0, 0, true},
      {"sum_over(L, l)", sum_over(s.L, [](const Extent& l) { return l; }), 16, 48, true},
      {"sum_over(L, ceil_div(l, 4))", sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }), 5, 12, true},
      {"sum_over(L, l + n)", sum_over(s.L, [&](const Extent& l) { return l + n; }), 46, 348, true},
      {"max_over(L, l * 2)", max_over(s.L, [](const Extent& l) { return l * 2; }), 16, 32, true},
      {"max_over(L, min(l, a))", max_over(s.L, [&](const Extent& l) { return min(l, a); }), 7, 7, true},
      {"max_over(L, floor_div(l, 4))", max_over(s.L, [](const Extent& l) { return floor_div(l, 4); }), 2, 4, true},
      {"sum * 512", sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }) * 512, 2560, 6144, true},
      {"max_over + sum_over", max_over(s.L, [](const Extent& l) { return l; }) + sum_over(s.L, [](const Extent& l) { return l; }),
       24, 64, true},
  };
  for (const Row& r : rows) {
    INFO(r.name << " = " << r.e.to_string());
    CHECK(r.e.evaluate(b) == r.value);
    CHECK(r.e.monotone() == r.monotone);
    CHECK(r.e.capacity_bound(b) == r.bound);
    CHECK(r.bound >= r.value);  // the table itself: a bound bounds
  }
}

TEST_CASE("extent: the capacity bound bounds every binding within capacities", "[extent]") {
  // Each extent beside its value in plain C++ (n, the three seq_lens, a = 7) and its capacity bound
  // worked out by hand (n <= 100, seq_lens[b] <= 16, batch = 3): evaluate() must give the C++ value,
  // capacity_bound() the hand-computed bound, and every value must stay at or below that bound.
  Syms s;
  const Extent n(s.n);
  using L3 = std::array<std::int64_t, 3>;
  struct Row {
    Extent e;
    std::function<std::int64_t(std::int64_t, const L3&)> value;
    std::int64_t bound;
  };
  const auto cdiv = [](std::int64_t x, std::int64_t d) { return (x + d - 1) / d; };
  const std::vector<Row> rows = {
      {n * 3 + 1, [](std::int64_t nv, const L3&) { return nv * 3 + 1; }, 301},
      {round_up(n, 16), [&](std::int64_t nv, const L3&) { return cdiv(nv, 16) * 16; }, 112},
      {sum_over(s.L, [&](const Extent& l) { return ceil_div(l, 4) + min(l, n); }),
       [&](std::int64_t nv, const L3& l) {
         std::int64_t t = 0;
         for (std::int64_t x : l) t += cdiv(x, 4) + std::min(x, nv);
         return t;
       },
       3 * (4 + 16)},
      {max_over(s.L, [](const Extent& l) { return floor_div(l, 3); }) * Extent(s.a),
       [](std::int64_t, const L3& l) { return std::max({l[0] / 3, l[1] / 3, l[2] / 3}) * 7; }, 16 / 3 * 7},
      {max(n, sum_over(s.L, [](const Extent& l) { return l; })),
       [](std::int64_t nv, const L3& l) { return std::max(nv, l[0] + l[1] + l[2]); }, 100},
  };
  Bindings b = s.bind();
  std::uint64_t x = 12345;
  auto next = [&](std::int64_t hi) {  // small LCG: deterministic, no <random> needed
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int64_t>((x >> 33) % static_cast<std::uint64_t>(hi + 1));
  };
  for (int i = 0; i < 500; ++i) {
    const std::int64_t nv = next(100);
    const L3 l = {next(16), next(16), next(16)};
    b.set(s.n, nv).set(s.L, {l[0], l[1], l[2]});
    for (const Row& r : rows) {
      INFO(r.e.to_string() << " under " << b.describe(s.n) << ", " << b.describe(s.L));
      const std::int64_t expected = r.value(nv, l);
      CHECK(r.e.evaluate(b) == expected);
      CHECK(r.e.capacity_bound(b) == r.bound);
      CHECK(expected <= r.bound);
    }
  }
  // At capacity the bound is reached.
  b.set(s.n, 100).set(s.L, {16, 16, 16});
  for (const Row& r : rows) CHECK(r.value(100, {16, 16, 16}) == r.bound);
}

TEST_CASE("extent: symbols and dynamic_symbols in first-use order", "[extent]") {
  Syms s;
  struct Row {
    const char* name;
    Extent e;
    std::vector<Symbol> symbols;
    std::vector<Symbol> dynamic;
  };
  const std::vector<Row> rows = {
      {"constant", Extent(5), {}, {}},
      {"a * n", Extent(s.a) * Extent(s.n), {s.a, s.n}, {s.n}},
      {"n + n (deduplicated)", Extent(s.n) + Extent(s.n), {s.n}, {s.n}},
      {"sum_over(L, l + n)", sum_over(s.L, [&](const Extent& l) { return l + Extent(s.n); }), {s.L, s.B, s.n},
       {s.L, s.n}},
      {"batch * max_over(L)", Extent(s.B) * max_over(s.L, [](const Extent& l) { return l; }), {s.B, s.L}, {s.L}},
      {"static only", Extent(s.B) * Extent(s.a) + 3, {s.B, s.a}, {}},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    CHECK(r.e.symbols() == r.symbols);
    CHECK(r.e.dynamic_symbols() == r.dynamic);
    CHECK(r.e.is_static() == r.dynamic.empty());
  }
}

TEST_CASE("extent: monotone() is false exactly when a divisor is dynamic", "[extent]") {
  Syms s;
  const Extent n(s.n), a(s.a);
  struct Row {
    const char* name;
    Extent e;
    bool monotone;
  };
  const std::vector<Row> rows = {
      {"ceil_div(n, a)", ceil_div(n, a), true},
      {"ceil_div(a, n)", ceil_div(a, n), false},
      {"floor_div(1000, n)", floor_div(1000, n), false},
      {"round_up(a, n)", round_up(a, n), false},
      {"max(n, ceil_div(8, n))", max(n, ceil_div(8, n)), false},
      {"sum_over(L, ceil_div(8, l))", sum_over(s.L, [](const Extent& l) { return ceil_div(8, l); }), false},
      {"sum_over(L, ceil_div(l, a))", sum_over(s.L, [&](const Extent& l) { return ceil_div(l, a); }), true},
      {"floor_div(n, max_over(L))", floor_div(n, max_over(s.L, [](const Extent& l) { return l; })), false},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    CHECK(r.e.monotone() == r.monotone);
  }
}

TEST_CASE("extent: to_string, hash and structural identity", "[extent]") {
  Syms s;
  const Extent n(s.n), a(s.a);
  struct Row {
    Extent e;
    std::string text;
  };
  const std::vector<Row> rows = {
      {Extent(12), "12"},
      {a + 3, "(a + 3)"},
      {a * n, "(a * n)"},
      {max(a, n), "max(a, n)"},
      {min(a, n), "min(a, n)"},
      {ceil_div(n, 4), "ceil_div(n, 4)"},
      {floor_div(n, 4), "floor_div(n, 4)"},
      {round_up(n, 8), "(ceil_div(n, 8) * 8)"},
      {sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }) * 512, "(sum_b(ceil_div(seq_lens[b], 4)) * 512)"},
      {max_over(s.L, [&](const Extent& l) { return min(l, a); }), "max_b(min(seq_lens[b], a))"},
  };
  for (const Row& r : rows) CHECK(r.e.to_string() == r.text);

  const Extent x = sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }) * 512;
  const Extent y = sum_over(s.L, [](const Extent& l) { return ceil_div(l, 4); }) * 512;
  const Extent z = sum_over(s.L, [](const Extent& l) { return ceil_div(l, 8); }) * 512;
  CHECK(same_expression(x, y));
  CHECK(x.hash() == y.hash());
  CHECK_FALSE(same_expression(x, z));
  CHECK_FALSE(same_expression(a + 3, a + 4));
  CHECK_FALSE(same_expression(a + n, n + a));  // structural, not algebraic
  CHECK_FALSE(same_expression(max(a, n), min(a, n)));
}

TEST_CASE("bindings: values, describe, re-binding", "[extent][bindings]") {
  Syms s;
  Bindings b = s.bind();
  CHECK(b.has(s.n));
  CHECK(b.has(s.L));
  CHECK(b.value(s.n) == 10);
  CHECK(std::vector<std::int64_t>(b.values(s.L).begin(), b.values(s.L).end()) == std::vector<std::int64_t>{3, 5, 8});
  CHECK(b.describe(s.L) == "seq_lens = [3, 5, 8]");
  CHECK(b.describe(s.n) == "n = 10");
  CHECK(Bindings().describe(s.n) == "n = <unbound>");
  b.set(s.n, 100);  // at capacity is fine
  CHECK(b.value(s.n) == 100);
  const std::vector<std::int32_t> lens32 = {16, 0, 1};
  b.set(s.L, std::span<const std::int32_t>(lens32));
  CHECK(b.describe(s.L) == "seq_lens = [16, 0, 1]");
  // Long batches are abbreviated with their count and maximum.
  Symbol R = Symbol::fixed("R");
  Symbol V = Symbol::batch("v", R);
  std::vector<std::int64_t> many(20, 1);
  many[13] = 99;
  Bindings m;
  m.set(V, std::span<const std::int64_t>(many));
  CHECK_THAT(m.describe(V), Contains("20 values, max 99"));
}

TEST_CASE("extent: every misuse is a typed error naming the value and the limit", "[extent][errors]") {
  Syms s;
  const Bindings good = s.bind();
  const Extent n(s.n);
  const std::vector<Misuse> misuses = {
      {"unbound scalar", throws<unbound_symbol_error>([&] { (Extent(s.a) + 3).evaluate(Bindings()); }),
       {"'a'", "not bound", "bindings.set(a"}},
      {"unbound batch", throws<unbound_symbol_error>([&] {
         Bindings b;
         b.set(s.B, 3);
         sum_over(s.L, [](const Extent& l) { return l; }).evaluate(b);
       }),
       {"'seq_lens'", "not bound"}},
      {"unbound batch length", throws<unbound_symbol_error>([&] {
         Bindings b;
         b.set(s.L, {1, 2, 3});
         sum_over(s.L, [](const Extent& l) { return l; }).evaluate(b);
       }),
       {"'batch'", "not bound"}},
      {"unbound static symbol in a capacity bound", throws<unbound_symbol_error>([&] {
         (Extent(s.a) * n).capacity_bound(Bindings());
       }),
       {"'a'"}},
      {"unknown symbol id", throws<invalid_argument_error>([] { Symbol::from_id(0xFFFFFFF0u); }),
       {"no symbol has id 4294967280"}},
      {"negative value", throws<invalid_argument_error>([&] { Bindings().set(s.n, -1); }), {"n = -1", "negative"}},
      {"negative batch element", throws<invalid_argument_error>([&] { Bindings().set(s.L, {1, -4}); }),
       {"seq_lens[1] = -4", "negative"}},
      {"value above capacity", throws<capacity_error>([&] { Bindings().set(s.n, 101); }),
       {"n = 101", "capacity 100", "raise the capacity"}},
      {"batch element above capacity", throws<capacity_error>([&] { Bindings().set(s.L, {16, 3, 17}); }),
       {"seq_lens[2] = 17", "capacity 16"}},
      {"int32 batch element above capacity", throws<capacity_error>([&] {
         const std::vector<std::int32_t> v = {40};
         Bindings().set(s.L, std::span<const std::int32_t>(v));
       }),
       {"seq_lens[0] = 40", "capacity 16"}},
      {"batch vector shorter than its bound length", throws<invalid_argument_error>([&] {
         Bindings b = s.bind();
         b.set(s.L, {1, 2});
       }),
       {"'seq_lens' has 2 values", "length 'batch' is 3"}},
      {"batch vector shorter than its length, bound before it", throws<invalid_argument_error>([&] {
         Bindings b;
         b.set(s.L, {1, 2}).set(s.B, 3);
         sum_over(s.L, [](const Extent& l) { return l; }).evaluate(b);
       }),
       {"'seq_lens' has 2 values", "length 'batch' is 3"}},
      {"batch vector longer than its length, bound before it", throws<invalid_argument_error>([&] {
         Bindings b;
         b.set(s.L, {1, 2, 3, 4}).set(s.B, 3);
         max_over(s.L, [](const Extent& l) { return l; }).evaluate(b);
       }),
       {"4 values", "is 3"}},
      {"overflow of *", throws<overflow_error>([&] { (n * Extent(kI64Max / 2)).evaluate(good); }),
       {"overflow", "10 * 4611686018427387903", "64 bits"}},
      {"overflow of +", throws<overflow_error>([&] { (n + Extent(kI64Max - 5)).evaluate(good); }),
       {"overflow", "+", "64 bits"}},
      {"overflow of a sum", throws<overflow_error>([&] {
         sum_over(s.L, [](const Extent& l) { return l * Extent(kI64Max / 8); }).evaluate(good);
       }),
       {"overflow"}},
      {"overflow of a capacity bound", throws<overflow_error>([&] { (Extent(s.big) * 2).capacity_bound(good); }),
       {"overflow", "9223372036854775807 * 2"}},
      {"overflow of a sum bound", throws<overflow_error>([&] {
         Symbol R = Symbol::fixed("R");
         Symbol V = Symbol::batch("v", R, kI64Max / 2);
         Bindings b;
         b.set(R, 3);
         sum_over(V, [](const Extent& l) { return l; }).capacity_bound(b);
       }),
       {"overflow"}},
      {"ceil_div by 0", throws<invalid_argument_error>([&] { ceil_div(n, 0).evaluate(good); }),
       {"ceil_div by 0", "divisor must be >= 1"}},
      {"floor_div by 0", throws<invalid_argument_error>([&] { floor_div(n, 0).evaluate(good); }),
       {"floor_div by 0", ">= 1"}},
      {"ceil_div by a static symbol bound to 0", throws<invalid_argument_error>([&] {
         Bindings b = s.bind();
         b.set(s.a, 0);
         ceil_div(n, Extent(s.a)).capacity_bound(b);
       }),
       {"ceil_div by 0"}},
      {"round_up to a multiple of 0", throws<invalid_argument_error>([&] { round_up(n, 0).evaluate(good); }),
       {"by 0"}},
      {"negative constant", throws<invalid_argument_error>([] { Extent(-3); }), {"-3", "negative"}},
      {"batch symbol used as scalar extent", throws<invalid_argument_error>([&] { Extent e(s.L); }),
       {"'seq_lens'", "sum_over or max_over"}},
      {"batch symbol bound to one value", throws<invalid_argument_error>([&] { Bindings().set(s.L, 3); }),
       {"'seq_lens' is a batch symbol"}},
      {"scalar bound to a vector", throws<invalid_argument_error>([&] { Bindings().set(s.n, {1, 2}); }),
       {"'n' is a scalar symbol"}},
      {"batch symbol read as a scalar", throws<invalid_argument_error>([&] { good.value(s.L); }),
       {"'seq_lens' is a batch symbol", "values()"}},
      {"fold over a scalar", throws<invalid_argument_error>([&] {
         sum_over(s.n, [](const Extent& l) { return l; });
       }),
       {"'n' is a scalar", "Symbol::batch"}},
      {"nested folds", throws<invalid_argument_error>([&] {
         sum_over(s.L, [&](const Extent& l) { return l + max_over(s.M, [](const Extent& m) { return m; }); });
       }),
       {"nested", "'seq_lens'"}},
      {"nested folds (same batch)", throws<invalid_argument_error>([&] {
         max_over(s.L, [&](const Extent&) { return sum_over(s.L, [](const Extent& m) { return m; }); });
       }),
       {"nested"}},
      {"non-monotone capacity bound (dynamic divisor)", throws<policy_refusal>([&] {
         ceil_div(1000, n).capacity_bound(good);
       }),
       {"ceil_div(1000, n)", "divides by a dynamic value", "static_query_bound"}},
      {"non-monotone capacity bound (batch divisor)", throws<policy_refusal>([&] {
         sum_over(s.L, [](const Extent& l) { return floor_div(64, l); }).capacity_bound(good);
       }),
       {"seq_lens[b]", "divides by a dynamic value"}},
      {"capacity bound of a dynamic symbol without capacity", throws<policy_refusal>([&] {
         (Extent(s.u) * 2).capacity_bound(good);
       }),
       {"'unbounded'", "has no capacity", "Symbol::dynamic(\"unbounded\", capacity)"}},
      {"capacity bound of a batch symbol without capacity", throws<policy_refusal>([&] {
         sum_over(s.M, [](const Extent& l) { return l; }).capacity_bound(good);
       }),
       {"'free_lens'", "has no capacity", "Symbol::batch(\"free_lens\""}},
      {"negative capacity", throws<invalid_argument_error>([] { Symbol::dynamic("neg", -1); }),
       {"'neg'", "capacity -1"}},
      {"empty symbol name", throws<invalid_argument_error>([] { Symbol::fixed(""); }), {"non-empty name"}},
      {"batch with a dynamic length", throws<invalid_argument_error>([&] { Symbol::batch("bad", s.n); }),
       {"'bad'", "static length", "'n'"}},
      {"length of a scalar", throws<invalid_argument_error>([&] { s.n.length(); }), {"'n' is not a batch symbol"}},
  };
  for (const Misuse& m : misuses) check_misuse(m);
}

TEST_CASE("extent: errors leave bindings unchanged", "[extent][errors]") {
  Syms s;
  Bindings b = s.bind();
  CHECK_THROWS_AS(b.set(s.n, 1000), capacity_error);
  CHECK_THROWS_AS(b.set(s.L, {1, 2, 99}), capacity_error);
  CHECK_THROWS_AS(b.set(s.n, -5), invalid_argument_error);
  CHECK(b.value(s.n) == 10);
  CHECK(b.describe(s.L) == "seq_lens = [3, 5, 8]");
}

// sum_over evaluates bodies of the form op_k(...op_1(l, k1)..., kk) without walking the tree per
// element (a precompiled chain); anything unusual (an operand that throws, a divisor <= 0, an
// overflow) falls back to the tree walk. Reference: the same body plus 0 * l, which has two
// elements and therefore always walks the tree. Values and errors (type and message) must match.
TEST_CASE("extent: sum_over's compiled bodies match the tree walk, values and errors", "[extent]") {
  Symbol B = Symbol::fixed("len");
  Symbol L = Symbol::batch("lens", B);  // no capacity: values up to 2^63 - 1
  Symbol a = Symbol::fixed("a");
  Symbol zero = Symbol::fixed("zero");
  Symbol unbound = Symbol::fixed("never_bound");
  Symbol n = Symbol::dynamic("n", 1000);
  Symbol big = Symbol::dynamic("big");
  const Extent A(a), N(n), BIG(big), Z(zero), U(unbound);
  using Body = std::function<Extent(const Extent&)>;
  const std::vector<std::pair<const char*, Body>> bodies = {
      {"l", [](const Extent& l) { return l; }},
      {"ceil_div(l, 4)", [](const Extent& l) { return ceil_div(l, 4); }},
      {"ceil_div(l, 1)", [](const Extent& l) { return ceil_div(l, 1); }},
      {"ceil_div(l, 3)", [](const Extent& l) { return ceil_div(l, 3); }},
      {"floor_div(l, 128)", [](const Extent& l) { return floor_div(l, 128); }},
      {"floor_div(l, 7)", [](const Extent& l) { return floor_div(l, 7); }},
      {"ceil_div(l, a)", [&](const Extent& l) { return ceil_div(l, A); }},
      {"round_up(l, 64) * a", [&](const Extent& l) { return round_up(l, 64) * A; }},
      {"min(l, a) + n", [&](const Extent& l) { return min(l, A) + N; }},
      {"max(n, l)", [&](const Extent& l) { return max(N, l); }},
      {"4 * ceil_div(l + 3, 2)", [](const Extent& l) { return 4 * ceil_div(l + 3, 2); }},
      {"ceil_div(l, 2) + floor_div(a, 3)", [&](const Extent& l) { return ceil_div(l, 2) + floor_div(A, 3); }},
      {"l * big", [&](const Extent& l) { return l * BIG; }},
      {"l + big", [&](const Extent& l) { return l + BIG; }},
      {"ceil_div(l, zero)", [&](const Extent& l) { return ceil_div(l, Z); }},
      {"floor_div(l, zero)", [&](const Extent& l) { return floor_div(l, Z); }},
      {"floor_div(l * big, zero)", [&](const Extent& l) { return floor_div(l * BIG, Z); }},
      {"l + never_bound", [&](const Extent& l) { return l + U; }},
      {"ceil_div(l, ceil_div(a, zero))", [&](const Extent& l) { return ceil_div(l, ceil_div(A, Z)); }},
      {"l * l (tree walk)", [](const Extent& l) { return l * l; }},
      {"ceil_div(64, l + 1) (tree walk)", [](const Extent& l) { return ceil_div(64, l + 1); }},
  };
  struct Outcome {
    bool threw = false;
    std::string type, what;
    std::int64_t value = 0;
  };
  auto outcome = [](const Extent& e, const Bindings& b) {
    Outcome o;
    try {
      o.value = e.evaluate(b);
    } catch (const std::exception& x) {
      o = {true, typeid(x).name(), x.what(), 0};
    }
    return o;
  };
  std::uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  for (const auto& [name, body] : bodies) {
    const Extent fast = sum_over(L, body);
    const Extent walk = sum_over(L, [&](const Extent& l) { return body(l) + Extent(0) * l; });
    for (int trial = 0; trial < 60; ++trial) {
      const std::size_t len = trial < 4 ? static_cast<std::size_t>(trial) : next() % 150;  // blocks of 64
      std::vector<std::int64_t> v(len);
      const int scale = trial % 4;  // small, medium, huge (overflows), exact powers of two
      for (auto& x : v)
        x = scale == 0   ? static_cast<std::int64_t>(next() % 20000)
            : scale == 1 ? static_cast<std::int64_t>(next() % (1ull << 40))
            : scale == 2 ? static_cast<std::int64_t>(next() >> (1 + next() % 4))
                         : std::int64_t{1} << (next() % 62);
      Bindings b;
      b.set(B, static_cast<std::int64_t>(len)).set(L, std::span<const std::int64_t>(v));
      b.set(a, 1 + static_cast<std::int64_t>(next() % 300)).set(zero, 0).set(n, static_cast<std::int64_t>(next() % 1001));
      b.set(big, trial % 3 == 0 ? std::numeric_limits<std::int64_t>::max() / 2 : static_cast<std::int64_t>(next() % 100));
      INFO(name << ", trial " << trial << ", " << b.describe(L));
      const Outcome f = outcome(fast, b);
      const Outcome w = outcome(walk, b);
      CHECK(f.threw == w.threw);
      CHECK(f.type == w.type);
      CHECK(f.what == w.what);
      CHECK(f.value == w.value);
    }
  }
}
