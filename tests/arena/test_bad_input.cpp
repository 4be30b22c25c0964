// Bad input, table-driven: every public entry point of the core called with invalid
// arguments -- zero, negative and huge sizes, values above capacity, unbound symbols, the wrong
// stream or capture state, double release, foreign pointers, replay of a destroyed graph -- and, when
// the DS4 reference is built, indices out of range in the DS4 inputs. Each row names the error type
// it expects and fragments of the message (the offending value and the limit). After every row the
// arena must be unchanged by the failing call (stats identical), consistent (bytes add up, the
// backend holds exactly the slabs) and still serving (an eager request and a capture + replay).
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#ifdef GRAPHSAFE_TEST_DS4
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>
#endif

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

using namespace graphsafe;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kLimit = 256 * kMiB;  // upstream cap of the table's backend

bool same_stats(const ArenaStats& a, const ArenaStats& b) {
  return a.slab_bytes == b.slab_bytes && a.slabs == b.slabs && a.free_bytes == b.free_bytes &&
         a.largest_free == b.largest_free && a.eager_bytes == b.eager_bytes && a.eager_blocks == b.eager_blocks &&
         a.region_bytes == b.region_bytes && a.families == b.families && a.live_graphs == b.live_graphs &&
         a.active_captures == b.active_captures;
}

// A policy that returns whatever it is told (negative counts included): policies are user code.
class FixedPolicy final : public SizingPolicy {
 public:
  explicit FixedPolicy(std::int64_t c) : c_(c) {}
  std::string_view name() const override { return "fixed"; }
  SizingDecision size(std::string_view, const Extent&, const Bindings&, bool) const override {
    return {c_, true, "test"};
  }

 private:
  std::int64_t c_;
};

// Everything a row may need. Fresh per row.
struct Ctx {
  HostBackend backend{HostBackendOptions{.limit_bytes = kLimit}};
  Arena arena{backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false}};
  HostStream s, t;
  Symbol n = Symbol::dynamic("bad.n", 512);
  Symbol unb = Symbol::dynamic("bad.unbounded");
  Symbol B = Symbol::fixed("bad.B");
  Symbol seq = Symbol::batch("bad.seq", B, 512);
  Bindings b;
  Arena* target = &arena;  // the arena a row's failing call is made on (a row may make its own)
  Ctx() {
    b.set(n, 10).set(B, 2).set(seq, {3, 5});
    arena.reserve(4 * kMiB, s);
  }
};

enum class Kind { invalid, capacity, unbound, overflow, refusal, capture_state, oom, guard, std_invalid };
const char* kind_name(Kind k) {
  switch (k) {
    case Kind::invalid: return "invalid_argument_error";
    case Kind::capacity: return "capacity_error";
    case Kind::unbound: return "unbound_symbol_error";
    case Kind::overflow: return "overflow_error";
    case Kind::refusal: return "policy_refusal";
    case Kind::capture_state: return "capture_state_error";
    case Kind::oom: return "out_of_memory_error";
    case Kind::guard: return "guard_failure";
    default: return "std::invalid_argument";
  }
}
bool is_kind(const std::exception& e, Kind k) {
  switch (k) {
    case Kind::invalid: return dynamic_cast<const invalid_argument_error*>(&e);
    case Kind::capacity: return dynamic_cast<const capacity_error*>(&e);
    case Kind::unbound: return dynamic_cast<const unbound_symbol_error*>(&e);
    case Kind::overflow: return dynamic_cast<const overflow_error*>(&e);
    case Kind::refusal: return dynamic_cast<const policy_refusal*>(&e);
    case Kind::capture_state: return dynamic_cast<const capture_state_error*>(&e);
    case Kind::oom: return dynamic_cast<const out_of_memory_error*>(&e);
    case Kind::guard: return dynamic_cast<const guard_failure*>(&e);
    default: return dynamic_cast<const std::invalid_argument*>(&e);
  }
}

struct Row {
  const char* entry;    // the entry point and the bad input
  Kind kind;
  std::vector<std::string> fragments;  // must all appear in what()
  // Sets up (may change the arena) and returns the failing call; the arena's stats are compared
  // right before and right after that call.
  std::function<std::function<void()>(Ctx&)> call;
};

std::vector<Row> rows() {
  using F = std::function<void()>;
  const auto huge = std::numeric_limits<std::int64_t>::max();
  std::vector<Row> r;
  // ---- Symbol ----
  r.push_back({"Symbol::fixed with an empty name", Kind::invalid, {"non-empty name"},
               [](Ctx&) -> F { return [] { Symbol::fixed(""); }; }});
  r.push_back({"Symbol::dynamic with a negative capacity", Kind::invalid, {"capacity -5", ">= 0"},
               [](Ctx&) -> F { return [] { Symbol::dynamic("bad.negcap", -5); }; }});
  r.push_back({"Symbol::batch with a dynamic length", Kind::invalid, {"bad.dynlen", "static length", "bad.n"},
               [](Ctx& c) -> F { return [&c] { Symbol::batch("bad.dynlen", c.n, 4); }; }});
  r.push_back({"Symbol::from_id out of range", Kind::invalid, {"4000000000", "registered"},
               [](Ctx&) -> F { return [] { Symbol::from_id(4000000000u); }; }});
  r.push_back({"Symbol::length of a scalar", Kind::invalid, {"bad.n", "not a batch symbol"},
               [](Ctx& c) -> F { return [&c] { (void)c.n.length(); }; }});
  // ---- Bindings ----
  r.push_back({"Bindings::set negative", Kind::invalid, {"bad.n = -1", "negative"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.n, -1); }; }});
  r.push_back({"Bindings::set above capacity", Kind::capacity, {"bad.n = 513", "capacity 512"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.n, 513); }; }});
  r.push_back({"Bindings::set INT64_MAX above capacity", Kind::capacity, {"9223372036854775807", "capacity 512"},
               [huge](Ctx& c) -> F { return [&c, huge] { Bindings().set(c.n, huge); }; }});
  r.push_back({"Bindings::set batch element above capacity", Kind::capacity, {"bad.seq[1] = 600", "capacity 512"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.seq, {3, 600}); }; }});
  r.push_back({"Bindings::set batch element negative", Kind::invalid, {"bad.seq[0] = -2"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.seq, {-2}); }; }});
  r.push_back({"Bindings::set scalar value on a batch symbol", Kind::invalid, {"bad.seq", "batch symbol"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.seq, std::int64_t{3}); }; }});
  r.push_back({"Bindings::set values on a scalar symbol", Kind::invalid, {"bad.n", "scalar symbol"},
               [](Ctx& c) -> F { return [&c] { Bindings().set(c.n, {1, 2}); }; }});
  r.push_back({"Bindings::value unbound", Kind::unbound, {"bad.n", "not bound"},
               [](Ctx& c) -> F { return [&c] { (void)Bindings().value(c.n); }; }});
  r.push_back({"Bindings::values unbound", Kind::unbound, {"bad.seq", "not bound"},
               [](Ctx& c) -> F { return [&c] { (void)Bindings().values(c.seq); }; }});
  // ---- Extent ----
  r.push_back({"Extent of a negative constant", Kind::invalid, {"-3", ">= 0"},
               [](Ctx&) -> F { return [] { Extent(std::int64_t{-3}); }; }});
  r.push_back({"Extent of a batch symbol", Kind::invalid, {"bad.seq", "sum_over"},
               [](Ctx& c) -> F { return [&c] { Extent{c.seq}; }; }});
  r.push_back({"sum_over a scalar", Kind::invalid, {"bad.n", "batch symbol"},
               [](Ctx& c) -> F { return [&c] { sum_over(c.n, [](const Extent& e) { return e; }); }; }});
  r.push_back({"Extent::evaluate ceil_div by 0", Kind::invalid, {"ceil_div by 0", ">= 1"},
               [](Ctx& c) -> F {
                 return [&c] { Bindings z; z.set(c.unb, 0); (void)ceil_div(Extent(100), Extent(c.unb)).evaluate(z); };
               }});
  r.push_back({"Extent::evaluate floor_div by 0", Kind::invalid, {"floor_div by 0", ">= 1"},
               [](Ctx& c) -> F {
                 return [&c] { Bindings z; z.set(c.unb, 0); (void)floor_div(Extent(100), Extent(c.unb)).evaluate(z); };
               }});
  r.push_back({"Extent::evaluate overflow", Kind::overflow, {"4611686018427387904", "64 bits"},
               [](Ctx& c) -> F { return [&c] { (void)(Extent(std::int64_t{1} << 62) * 4).evaluate(c.b); }; }});
  r.push_back({"Extent::evaluate unbound symbol", Kind::unbound, {"bad.unbounded", "not bound"},
               [](Ctx& c) -> F { return [&c] { (void)Extent(c.unb).evaluate(c.b); }; }});
  r.push_back({"Bindings::set with the wrong batch length", Kind::invalid, {"3 values", "'bad.B' is 2"},
               [](Ctx& c) -> F { return [&c] { Bindings z = c.b; z.set(c.seq, {1, 2, 3}); }; }});
  r.push_back({"sum_over with the wrong batch length (bound before its length)", Kind::invalid,
               {"3 values", "'bad.B' is 2"},
               [](Ctx& c) -> F {
                 return [&c] {
                   Bindings z;
                   z.set(c.seq, {1, 2, 3}).set(c.B, 2);
                   (void)sum_over(c.seq, [](const Extent& e) { return e; }).evaluate(z);
                 };
               }});
  r.push_back({"Extent::capacity_bound without a capacity", Kind::refusal, {"bad.unbounded", "no capacity"},
               [](Ctx& c) -> F { return [&c] { (void)Extent(c.unb).capacity_bound(c.b); }; }});
  // ---- policies ----
  r.push_back({"capacity_bound on a symbol without capacity", Kind::refusal, {"'r'", "bad.unbounded", "capacity"},
               [](Ctx& c) -> F { return [&c] { Bindings z; z.set(c.unb, 3); (void)capacity_bound.size("r", Extent(c.unb), z, true); }; }});
  r.push_back({"capacity_bound with a dynamic divisor", Kind::refusal, {"divides by a dynamic value"},
               [](Ctx& c) -> F { return [&c] { (void)capacity_bound.size("r", ceil_div(Extent(512), Extent(c.n)), c.b, true); }; }});
  r.push_back({"static_query_bound written with a dynamic symbol", Kind::refusal, {"'r'", "dynamic symbol 'bad.n'"},
               [](Ctx& c) -> F { return [&c] { (void)static_query_bound(Extent(c.n)).size("r", Extent(c.n), c.b, true); }; }});
  r.push_back({"static_query_bound below the need", Kind::refusal, {"gives 8", "needs 10"},
               [](Ctx& c) -> F { return [&c] { (void)static_query_bound(Extent(c.B) * 4).size("r", Extent(c.n), c.b, true); }; }});
  // ---- Arena::request / dimension ----
  r.push_back({"request with element size 0", Kind::invalid, {"'ws'", "element size 0"},
               [](Ctx& c) -> F { return [&c] { c.arena.request(c.s, "ws", 10, 0, capacity_bound, c.b); }; }});
  r.push_back({"request sized to a negative count by its policy", Kind::invalid, {"'ws'", "-5 elements", ">= 0"},
               [](Ctx& c) -> F { return [&c] { c.arena.request(c.s, "ws", 10, 4, FixedPolicy(-5), c.b); }; }});
  r.push_back({"request overflowing 64-bit bytes", Kind::overflow, {"'ws'", "2305843009213693952 x 8", "overflows"},
               [](Ctx& c) -> F { return [&c] { c.arena.request(c.s, "ws", Extent(std::int64_t{1} << 61), 8, capacity_bound, c.b); }; }});
  r.push_back({"request above the upstream cap", Kind::oom, {"1073741824", "268435456-byte limit"},
               [](Ctx& c) -> F { return [&c] { c.arena.request(c.s, "ws", Extent(std::int64_t{1} << 30), 1, capacity_bound, c.b); }; }});
  r.push_back({"request with an unbound symbol", Kind::unbound, {"bad.unbounded"},
               [](Ctx& c) -> F { return [&c] { c.arena.request(c.s, "ws", Extent(c.unb), 4, exact_at_capture, c.b); }; }});
  r.push_back({"dimension with an unbound symbol", Kind::unbound, {"bad.unbounded"},
               [](Ctx& c) -> F { return [&c] { c.arena.dimension(c.s, "d", Extent(c.unb), exact_at_capture, c.b); }; }});
  // Only an arena that asks the backend for the capture state on every request sees the stream.
  r.push_back({"request with a null host stream, always_check_capture", Kind::invalid, {"null stream"},
               [](Ctx& c) -> F {
                 auto checked = std::make_shared<Arena>(
                     c.backend, ArenaOptions{.growth_bytes = 2 * kMiB, .report_findings = false, .always_check_capture = true});
                 checked->reserve(2 * kMiB, c.s);
                 { auto w = checked->request(c.s, "warm", 10, 1, capacity_bound, c.b); }
                 c.target = checked.get();
                 return [&c, checked] {
                   checked->request(Stream(static_cast<cudaStream_t>(nullptr)), "ws", 10, 1, capacity_bound, c.b);
                 };
               }});
  // ---- Arena::allocate / deallocate ----
  r.push_back({"allocate with alignment 0", Kind::invalid, {"alignment 0", "<= 256"},
               [](Ctx& c) -> F { return [&c] { c.arena.allocate(c.s, 10, 0); }; }});
  r.push_back({"allocate with alignment 3", Kind::invalid, {"alignment 3", "power of two"},
               [](Ctx& c) -> F { return [&c] { c.arena.allocate(c.s, 10, 3); }; }});
  r.push_back({"allocate with alignment 512", Kind::invalid, {"alignment 512", "<= 256"},
               [](Ctx& c) -> F { return [&c] { c.arena.allocate(c.s, 10, 512); }; }});
  r.push_back({"allocate UINT64_MAX bytes", Kind::overflow, {"18446744073709551615"},
               [](Ctx& c) -> F { return [&c] { c.arena.allocate(c.s, ~0ull); }; }});
  r.push_back({"allocate above the upstream cap", Kind::oom, {"268435456-byte limit"},
               [](Ctx& c) -> F { return [&c] { c.arena.allocate(c.s, 512 * kMiB); }; }});
  r.push_back({"deallocate a foreign pointer", Kind::invalid, {"not served by this arena", "nothing was changed"},
               [](Ctx& c) -> F { return [&c] { static int local; c.arena.deallocate(c.s, &local, 4); }; }});
  r.push_back({"deallocate an interior pointer", Kind::invalid, {"not served by this arena"},
               [](Ctx& c) -> F {
                 void* p = c.arena.allocate(c.s, 4096);
                 return [&c, p] { c.arena.deallocate(c.s, static_cast<char*>(p) + 256, 16); };
               }});
  r.push_back({"deallocate a workspace pointer", Kind::invalid, {"not served by this arena"},
               [](Ctx& c) -> F {
                 auto w = std::make_shared<Workspace>(c.arena.request(c.s, "ws", 100, 4, capacity_bound, c.b));
                 return [&c, w] { c.arena.deallocate(c.s, w->data(), 400); };
               }});
  r.push_back({"deallocate twice", Kind::invalid, {"double release"},
               [](Ctx& c) -> F {
                 void* p = c.arena.allocate(c.s, 1000);
                 c.arena.deallocate(c.s, p, 1000);
                 return [&c, p] { c.arena.deallocate(c.s, p, 1000); };
               }});
  r.push_back({"deallocate more bytes than allocated", Kind::invalid, {"5000", "holds 1024", "size given to allocate()"},
               [](Ctx& c) -> F {
                 void* p = c.arena.allocate(c.s, 1000);
                 return [&c, p] { c.arena.deallocate(c.s, p, 5000); };
               }});
  // ---- Arena::reserve / trim ----
  r.push_back({"reserve above the upstream cap", Kind::oom, {"1099511627776", "268435456-byte limit"},
               [](Ctx& c) -> F { return [&c] { c.arena.reserve(1ull << 40, c.s); }; }});
  r.push_back({"reserve UINT64_MAX bytes", Kind::overflow, {"18446744073709551615"},
               [](Ctx& c) -> F { return [&c] { c.arena.reserve(~0ull, c.s); }; }});
  r.push_back({"reserve on a capturing stream", Kind::capture_state, {"reserve(1048576)", "capturing stream"},
               [](Ctx& c) -> F {
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b);
                 return [&c, cs] { c.arena.reserve(kMiB, c.s); };
               }});
  r.push_back({"trim on a capturing stream", Kind::capture_state, {"trim()", "capturing stream"},
               [](Ctx& c) -> F {
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b);
                 return [&c, cs] { c.arena.trim(c.s); };
               }});
  // ---- capture ----
  r.push_back({"capture inside a capture on one stream", Kind::capture_state, {"already capturing"},
               [](Ctx& c) -> F {
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b);
                 return [&c, cs] { CaptureSession inner(c.arena, c.s, c.b); };
               }});
  r.push_back({"two captures of one family at once", Kind::capture_state, {"family 'fam'", "already capturing"},
               [](Ctx& c) -> F {
                 auto fam = c.arena.family("fam");
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b, CaptureOptions{.family = fam});
                 return [&c, cs, fam] { CaptureSession other(c.arena, c.t, c.b, CaptureOptions{.family = fam}); };
               }});
  r.push_back({"CaptureSession::finish twice", Kind::capture_state, {"finish() called twice"},
               [](Ctx& c) -> F {
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b);
                 auto g = std::make_shared<CapturedGraph>(cs->finish());
                 return [cs, g] { (void)cs->finish(); };
               }});
  r.push_back({"capture request above the free range", Kind::oom, {"'big'", "never grow the arena", "arena.reserve("},
               [](Ctx& c) -> F {
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.s, c.b);
                 return [&c, cs] { c.arena.request(c.s, "big", Extent(std::int64_t{64} << 20), 1, capacity_bound, c.b); };
               }});
  r.push_back({"capture with refuse_unsafe_capture and exact_at_capture", Kind::refusal, {"capture refused", "bad.n = 10"},
               [](Ctx& c) -> F {
                 auto strict = std::make_shared<Arena>(c.backend, ArenaOptions{.refuse_unsafe_capture = true});
                 strict->reserve(kMiB, c.t);
                 auto cs = std::make_shared<CaptureSession>(*strict, c.t, c.b);
                 return [&c, strict, cs] { strict->request(c.t, "x", Extent(c.n), 4, exact_at_capture, c.b); };
               }});
  r.push_back({"capture with no free memory and growth off", Kind::oom, {"holds no free memory", "arena.reserve"},
               [](Ctx& c) -> F {
                 auto fixed = std::make_shared<Arena>(c.backend, ArenaOptions{.grow_on_demand = false});
                 return [&c, fixed] { CaptureSession cs(*fixed, c.t, c.b); };
               }});
  r.push_back({"request on a stream captured outside graphsafe, always_check_capture", Kind::capture_state,
               {"outside graphsafe", "CaptureSession"},
               [](Ctx& c) -> F {
                 auto checked = std::make_shared<Arena>(c.backend, ArenaOptions{.always_check_capture = true});
                 checked->reserve(2 * kMiB, c.s);
                 c.target = checked.get();
                 c.backend.begin_capture(c.t, CaptureMode::global);
                 return [&c, checked] {
                   struct End {
                     Ctx& c;
                     ~End() { c.backend.abort_capture(c.t); }
                   } end{c};
                   checked->request(c.t, "ws", 10, 1, capacity_bound, c.b);
                 };
               }});
  // ---- replay ----
  auto graph = [](Ctx& c, const SizingPolicy& p) {
    return std::make_shared<CapturedGraph>(capture(c.arena, c.s, c.b, [&c, &p](const Bindings& bb) {
      auto w = c.arena.request(c.s, "kv", Extent(c.n) * Extent(c.B), 4, p, bb);
    }));
  };
  r.push_back({"replay beyond an exact_at_capture reservation", Kind::guard, {"'kv'", "needs 600 elements", "reserved 20", "bad.n = 300"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, exact_at_capture);
                 return [&c, g] {
                   Bindings z = c.b;
                   z.set(c.n, 300);
                   g->replay(z, c.s);
                 };
               }});
  r.push_back({"replay with a changed static symbol", Kind::guard, {"static symbol bad.B = 3", "captured with 2"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, capacity_bound);
                 return [&c, g] {
                   Bindings z = c.b;
                   z.set(c.B, 3);
                   g->replay(z, c.s);
                 };
               }});
  r.push_back({"replay with an unbound static symbol", Kind::unbound, {"bad.B", "not bound"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, capacity_bound);
                 return [&c, g] { g->replay(Bindings(), c.s); };
               }});
  r.push_back({"replay on a capturing stream", Kind::capture_state, {"replay() on a stream that is capturing"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, capacity_bound);
                 auto cs = std::make_shared<CaptureSession>(c.arena, c.t, c.b);
                 return [&c, g, cs] { g->replay(c.b, c.t); };
               }});
  r.push_back({"replay of a destroyed (moved-from) graph", Kind::capture_state, {"moved from or destroyed"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, capacity_bound);
                 { CapturedGraph sink(std::move(*g)); }  // destroyed
                 return [&c, g] { g->replay(c.b, c.s); };
               }});
  r.push_back({"plan() of a destroyed graph", Kind::capture_state, {"moved from or destroyed"},
               [graph](Ctx& c) -> F {
                 auto g = graph(c, capacity_bound);
                 { CapturedGraph sink(std::move(*g)); }
                 return [g] { (void)g->plan(); };
               }});
  // ---- HostBackend ----
  r.push_back({"HostBackend with a null stream", Kind::invalid, {"null stream"},
               [](Ctx& c) -> F { return [&c] { (void)c.backend.capture_info(Stream(static_cast<cudaStream_t>(nullptr))); }; }});
  r.push_back({"HostBackend::begin_capture twice", Kind::capture_state, {"already capturing"},
               [](Ctx& c) -> F {
                 c.backend.begin_capture(c.t, CaptureMode::global);
                 return [&c] {
                   struct End {
                     Ctx& c;
                     ~End() { c.backend.abort_capture(c.t); }
                   } end{c};
                   c.backend.begin_capture(c.t, CaptureMode::global);
                 };
               }});
  r.push_back({"HostBackend::end_capture when not capturing", Kind::capture_state, {"not capturing"},
               [](Ctx& c) -> F { return [&c] { c.backend.end_capture(c.t); }; }});
  r.push_back({"HostBackend::allocate_slab above its limit", Kind::oom, {"536870912", "268435456-byte limit", "limit_bytes"},
               [](Ctx& c) -> F { return [&c] { c.backend.allocate_slab(512 * kMiB, c.t); }; }});
  r.push_back({"HostBackend::allocate_slab UINT64_MAX", Kind::oom, {"18446744073709551615"},
               [](Ctx& c) -> F { return [&c] { c.backend.allocate_slab(~0ull, c.t); }; }});
  return r;
}

// The arena still serves and its books balance.
void check_serving(Ctx& c) {
  const ArenaStats st = c.arena.stats();
  CHECK(st.free_bytes + st.eager_bytes + st.region_bytes == st.slab_bytes);
  CHECK(st.slab_bytes <= c.backend.bytes_in_use());  // other arenas of a row may share the backend
  CHECK_FALSE(c.s.capturing());
  auto w = c.arena.request(c.s, "after", Extent(c.n), 4, capacity_bound, c.b);
  CHECK(w.bytes() == 512 * 4);
  void* p = c.arena.allocate(c.s, 100);
  c.arena.deallocate(c.s, p, 100);
  auto g = capture(c.arena, c.s, c.b, [&](const Bindings& bb) { c.arena.request(c.s, "cap", Extent(c.n), 4, capacity_bound, bb); });
  g.replay(c.b, c.s);
}

}  // namespace

TEST_CASE("bad input: every entry point refuses with a typed error naming the value and the limit", "[errors][bad_input]") {
  int n = 0;
  for (const Row& row : rows()) {
    INFO("row " << n << ": " << row.entry << " (expects " << kind_name(row.kind) << ")");
    ++n;
    Ctx c;
    std::function<void()> call;
    std::optional<ArenaStats> before;
    {
      call = row.call(c);
      before = c.target->stats();
      try {
        call();
        FAIL("no exception");
      } catch (const std::exception& e) {
        const std::string what = e.what();
        INFO("threw " << typeid(e).name() << ": " << what);
        CHECK(is_kind(e, row.kind));
        for (const std::string& f : row.fragments) {
          INFO("fragment: " << f);
          CHECK(what.find(f) != std::string::npos);
        }
      }
      CHECK(same_stats(*before, c.target->stats()));  // the failing call changed nothing
      if (c.target != &c.arena) {  // and the arena it was made on still serves
        auto w = c.target->request(c.s, "after", Extent(c.n), 4, capacity_bound, c.b);
        CHECK(w.bytes() == 512 * 4);
      }
    }
    call = nullptr;  // releases what the row set up (sessions, graphs, workspaces)
    check_serving(c);
  }
  CHECK(n >= 60);
}

#ifdef GRAPHSAFE_TEST_DS4
TEST_CASE("bad input: DS4 reference inputs with indices out of range", "[errors][bad_input][ds4]") {
  namespace ref = graphsafe::ds4::ref;
  const ds4::LayerConfig cfg{.ratio = 4, .window = 4, .topk = 8, .heads = 4, .max_model_len = 512, .swa_block_tokens = 16};
  const ds4::DecodeProblem good = ds4::make_problem(cfg, {17, 40}, 1);
  std::vector<float> out(2 * 4 * 512);
  struct DsRow {
    const char* what;
    std::vector<std::string> fragments;
    std::function<void()> call;
  };
  auto with = [&](std::function<void(ds4::DecodeProblem&)> edit) {
    return [&good, edit, &out] {
      ds4::DecodeProblem p = good;
      edit(p);
      ref::validate(p);
      ref::sparse_attention(p, out.data());
    };
  };
  const std::vector<DsRow> ds = {
      {"seq_len above max_model_len", {"600", "max_model_len = 512"}, with([](auto& p) { p.seq_lens[1] = 600; })},
      {"negative seq_len", {"-1", ">= 0"}, with([](auto& p) { p.seq_lens[0] = -1; })},
      {"topk index = n_c", {"topk_local[1][0] = 10", "n_c = 10"}, with([](auto& p) { p.topk_local[8] = 10; })},
      {"topk index negative among the valid ones", {"topk_local[0][2] = -1"}, with([](auto& p) { p.topk_local[2] = -1; })},
      {"topk index huge", {"2147483647"}, with([](auto& p) { p.topk_local[0] = 2147483647; })},
      {"swa block table too short", {"swa_block_table", "63"}, with([](auto& p) { p.swa_block_table.pop_back(); })},
      {"swa block id out of range", {"swa_block_table", "999"}, with([](auto& p) { p.swa_block_table[0] = 999; })},
      {"compressed block id out of range", {"cmp_block_table", "-7"}, with([](auto& p) { p.cmp_block_table[0] = -7; })},
      {"batch larger than seq_lens", {"seq_lens.size() = 2", "expected 3"}, with([](auto& p) { p.batch = 3; })},
      {"sink of the wrong length", {"sink", "5", "4"}, with([](auto& p) { p.sink.push_back(0.0f); })},
      {"ratio not 1/4/128", {"ratio = 8"}, with([](auto& p) { p.cfg.ratio = 8; })},
      {"make_problem seq_len above max_model_len", {"513", "max_model_len = 512"},
       [&] { ds4::make_problem(cfg, {5, 513}, 1); }},
      {"grow beyond fill_to", {"fill_to"}, [&] {
         ds4::DecodeProblem p = good;
         ds4::grow(p, {17, 200}, 1);
       }},
      {"gather with N below n_c", {"n_c = 10"}, [&] {
         std::vector<float> ws(2 * 9 * 512);
         ref::gather_workspace(good, 5, 9, ws.data());
       }},
      {"gather with M below N", {"M = 3", "N = 5"}, [&] {
         std::vector<float> ws(2 * 5 * 512);
         ref::gather_workspace(good, 5, 3, ws.data());
       }},
      {"attention lens above width", {"lens[0] = 300", "width = 256"}, [&] {
         std::vector<std::int32_t> idx(2 * 256, -1), lens = {300, 0};
         std::vector<float> ws(512);
         ref::attention_over_workspace(good, ws.data(), 1, idx.data(), lens.data(), 256, out.data());
       }},
      {"quantize_insert slot out of range", {"slot = ", "outside"}, [&] {
         ds4::DecodeProblem p = good;
         std::vector<float> row(512, 0.0f);
         ref::quantize_insert(row.data(), p.swa_view(), p.swa_num_blocks * 16);
       }},
      {"swa_slot of a position past max_model_len", {"512", "max_model_len = 512"},
       [&] { (void)ref::swa_slot(good, 0, 512); }},
      {"compressed_slot of request b out of range", {"b = 2", "batch = 2"}, [&] { (void)ref::compressed_slot(good, 2, 0); }},
  };
  for (const DsRow& row : ds) {
    INFO(row.what);
    try {
      row.call();
      FAIL("no exception");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      INFO("what(): " << what);
      for (const std::string& f : row.fragments) {
        INFO("fragment: " << f);
        CHECK(what.find(f) != std::string::npos);
      }
    }
  }
  // The good problem is still valid and computes.
  ref::validate(good);
  ref::sparse_attention(good, out.data());
}
#endif
