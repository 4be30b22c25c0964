// libFuzzer harness: the arena on the host backend driven by arbitrary operation sequences.
//
// Each input is decoded into a configuration (upstream cap, growth, number of streams and arenas,
// the host backend's execution: synchronous or seeded with a seed from the input) and a list of
// operations, each for one of the arenas (they share the backend): reserve, eager request / release, raw allocate / deallocate (including wrong sizes,
// double and foreign releases), dimension, begin capture (a CaptureSession left open across
// operations, so requests interleave with it), end or abandon a capture, replay (guarded, on any
// stream, also on a capturing one), destroy a graph, trim, a burst of eager traffic from several
// threads on their own streams. After every operation the arena is
// compared with a simple model (a map of live ranges, the families' regions and the open sessions'
// held ranges): bytes add up, nothing overlaps, blocks tile their slabs, the backend holds exactly
// the slab bytes, live eager contents are intact. graphsafe::error is an expected outcome of many
// operations; which type is thrown is checked where the model can predict it, and the arena must be
// consistent afterwards either way. Anything else (a crash, a sanitizer report, a model mismatch,
// a race the seeded backend's checker reports: every write is a stream launch declaring its bytes)
// aborts, at the operation that made it. Each input chooses synchronous or seeded execution;
// GRAPHSAFE_HOST_EXECUTION=seeded:<n> makes every input run seeded (the corpus replay, label async).
//
//   build: cmake -DGRAPHSAFE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ ...; run: arena_fuzzer corpus/ -max_total_time=60
#include <graphsafe/graphsafe.hpp>

#include "arena_core.hpp"  // FreeList::for_each_block and the open sessions, to check invariants
#include "internal_access.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace graphsafe;
using detail::Block;
using detail::BlockState;
using detail::Slab;

namespace {

[[noreturn]] void fail(const char* what, int line, const std::string& extra = {}) {
  std::fprintf(stderr, "arena_fuzzer: invariant failed at line %d: %s %s\n", line, what, extra.c_str());
  std::abort();
}
#define FZ_CHECK(...)                                   \
  do {                                                  \
    if (!(__VA_ARGS__)) fail(#__VA_ARGS__, __LINE__);   \
  } while (0)

constexpr std::uint64_t kKiB = 1024, kMiB = 1ull << 20;
std::uint64_t align256(std::uint64_t x) { return (x + 255) / 256 * 256; }
std::uintptr_t addr_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

// Little-endian byte reader; reads 0 past the end (the run then stops at the next op byte).
class Reader {
 public:
  Reader(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool done() const { return i_ >= n_; }
  std::uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (static_cast<std::uint32_t>(u16()) << 16); }
  std::uint64_t u64() { return u32() | (static_cast<std::uint64_t>(u32()) << 32); }
  // A size: mostly small, sometimes big, sometimes a boundary value.
  std::uint64_t size() {
    switch (u8() % 8) {
      case 0: return 0;
      case 1: return u8();
      case 2: case 3: return u16();
      case 4: return u32() % (4 * kMiB);
      case 5: return (1ull << (u8() % 64)) + (u8() % 3) - 1;  // powers of two +-1, up to 2^63
      case 6: return u64();
      default: return u16() * 256ull;
    }
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t i_ = 0;
};

// First, middle and last byte: cheap enough to run on every live range after every step.
bool sampled(const void* p, std::uint64_t bytes, unsigned char tag) {
  const auto* c = static_cast<const unsigned char*>(p);
  return bytes == 0 || (c[0] == tag && c[bytes / 2] == tag && c[bytes - 1] == tag);
}

// A "kernel" writing `tag` over [p, p + bytes) on `s`, its bytes declared to the race checker.
void write(HostStream& s, void* p, std::uint64_t bytes, unsigned char tag) {
  if (bytes) s.launch([p, bytes, tag] { std::memset(p, tag, bytes); }, {HostAccess::writes(p, bytes)});
}

// FZ_TRACE=1: print each operation and the eager ranges it hands out (to read a crash input).
bool tracing() {
  static const bool trace = std::getenv("FZ_TRACE") != nullptr;
  return trace;
}

bool filled(const void* p, std::uint64_t bytes, unsigned char tag) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (std::uint64_t i = 0; i < bytes; ++i)
    if (c[i] != tag) return false;
  return true;
}

// What a check expects of an operation.
enum class Expect { ok, oom_ok, error_any, invalid, overflow, capture_state, guard };

template <class F>
bool run_op(Expect expect, F&& f, int line) {
  try {
    f();
  } catch (const out_of_memory_error& e) {
    if (expect == Expect::ok) fail("unexpected out_of_memory_error", line, e.what());
    return false;
  } catch (const guard_failure& e) {
    if (expect != Expect::guard && expect != Expect::error_any) fail("unexpected guard_failure", line, e.what());
    if (e.violations().empty()) fail("guard_failure without violations", line);
    return false;
  } catch (const capture_state_error& e) {
    if (expect != Expect::capture_state && expect != Expect::error_any) fail("unexpected capture_state_error", line, e.what());
    return false;
  } catch (const overflow_error& e) {
    if (expect != Expect::overflow && expect != Expect::error_any) fail("unexpected overflow_error", line, e.what());
    return false;
  } catch (const invalid_argument_error& e) {
    if (expect != Expect::invalid && expect != Expect::error_any) fail("unexpected invalid_argument_error", line, e.what());
    return false;
  } catch (const error& e) {
    if (expect != Expect::error_any) fail("unexpected graphsafe::error", line, e.what());
    return false;
  }
  if (expect != Expect::ok && expect != Expect::oom_ok && expect != Expect::error_any)
    fail("expected an error, got none", line);
  return true;
}
#define OP(expect, ...) run_op(expect, [&] { __VA_ARGS__; }, __LINE__)

struct Eager {
  Workspace ws;
  unsigned char tag;
};
struct Raw {
  void* p;
  std::uint64_t bytes;
  int stream;
  unsigned char tag;
};
struct Fam {
  std::optional<CaptureFamily> fam;
  std::uint64_t region = 0;  // model: largest plan since the region was made
  std::uintptr_t base = 0;
  int graphs = 0;
  bool capturing = false;
};
struct Graph {
  CapturedGraph g;
  std::size_t fam;
  std::int64_t n_at_capture;
  bool exact;
  std::vector<std::pair<unsigned char*, std::uint64_t>> ws;
  unsigned char tag;
};
struct Open {
  std::unique_ptr<CaptureSession> cs;
  int stream;
  std::size_t fam;
  std::int64_t n_at_capture;
  bool exact = false;
  std::vector<std::pair<unsigned char*, std::uint64_t>> ws;
  unsigned char tag;
};

class Fuzz {
 public:
  // `backend` is shared by every arena of the input (each has streams of its own: a stream that one
  // arena captures is not another's to allocate on); `slab_bytes` sums the arenas' slabs.
  Fuzz(Reader& r, HostBackend& backend, ArenaOptions ao, int nstreams, std::uint64_t limit,
       std::function<std::uint64_t()> slab_bytes)
      : r_(r), backend_(backend), arena_(backend_, ao), streams_(static_cast<std::size_t>(nstreams)), limit_(limit),
        all_slab_bytes_(std::move(slab_bytes)) {
    for (int i = 0; i < 3; ++i) {
      fams_.emplace_back();
      fams_.back().fam = arena_.family("fz" + std::to_string(i));
    }
  }

  ~Fuzz() {
    // Tear down in an order that leaves nothing: sessions, graphs, eager, raw, then trim.
    opens_.clear();
    graphs_.clear();
    eager_.clear();
    for (const Raw& x : raws_) arena_.deallocate(streams_[static_cast<std::size_t>(x.stream)], x.p, x.bytes);
    raws_.clear();
    const ArenaStats st = arena_.stats();
    FZ_CHECK(st.eager_bytes == 0 && st.eager_blocks == 0 && st.region_bytes == 0 && st.families == 0);
    FZ_CHECK(st.live_graphs == 0 && st.active_captures == 0);
    FZ_CHECK(st.free_bytes == st.slab_bytes);
    arena_.trim(streams_[0]);
    FZ_CHECK(arena_.stats().slabs == 0);
  }

  void step(std::uint8_t op) {
    run_step(op);
    check();
  }
  const Arena& arena() const { return arena_; }

 private:
  Reader& r_;
  HostBackend& backend_;
  Arena arena_;
  std::deque<HostStream> streams_;
  // The threads' streams: they live as long as the arena (blocks they released are tagged with them).
  std::deque<HostStream> thread_streams_{4};
  std::uint64_t limit_;
  std::function<std::uint64_t()> all_slab_bytes_;
  // Symbols live in a process-wide registry: made once, not once per input.
  static inline const Symbol B_ = Symbol::fixed("fz.batch");
  static inline const Symbol n_ = Symbol::dynamic("fz.n", 4096);
  static inline const Symbol free_ = Symbol::dynamic("fz.unbounded");
  std::vector<Eager> eager_;
  std::vector<Raw> raws_;
  std::vector<Fam> fams_;
  std::vector<Graph> graphs_;
  std::vector<Open> opens_;
  unsigned char tag_ = 0;

  unsigned char tag() { return tag_ = static_cast<unsigned char>(tag_ % 250 + 1); }
  int stream() { return static_cast<int>(r_.u8() % streams_.size()); }
  HostStream& hs(int i) { return streams_[static_cast<std::size_t>(i)]; }
  Open* open_on(int si) {
    for (Open& o : opens_)
      if (o.stream == si) return &o;
    return nullptr;
  }
  Bindings bind(std::int64_t batch, std::int64_t n) {
    Bindings b;
    b.set(B_, batch).set(n_, n);
    return b;
  }

  void run_step(std::uint8_t op) {
    if (tracing()) std::fprintf(stderr, "op %d (opens %zu graphs %zu)\n", op % 17, opens_.size(), graphs_.size());
    switch (op % 17) {
      case 0: reserve(); break;
      case 1: case 2: request(); break;
      case 3: release(); break;
      case 4: allocate(); break;
      case 5: deallocate(); break;
      case 6: begin_capture(); break;
      case 7: end_capture(); break;
      case 8: case 9: replay(); break;
      case 10: destroy(); break;
      case 11: trim(); break;
      case 12: dimension(); break;
      case 13: misuse(); break;
      case 14: request(); break;
      case 16: threads(); break;
      default: if (!opens_.empty()) end_capture(); else begin_capture();
    }
  }

  void reserve() {
    const int si = stream();
    std::uint64_t bytes = r_.u8() % 16 == 0 ? r_.size() : r_.size() % (8 * kMiB);
    const bool capturing = hs(si).capturing();
    const Expect e = bytes > (1ull << 62) ? Expect::overflow : capturing ? Expect::capture_state : Expect::oom_ok;
    if (OP(e, arena_.reserve(bytes, hs(si))))
      FZ_CHECK(arena_.stats().largest_free >= bytes);
  }

  void request() {
    const int si = stream();
    Open* o = open_on(si);
    const std::uint64_t elem = r_.u8() % 9;  // 0 is invalid
    const std::uint8_t kind = r_.u8() % 4;
    std::int64_t count = static_cast<std::int64_t>(r_.size() & 0x7fffffffffffffffull);
    if (kind != 3 && r_.u8() % 4) count %= 300000;  // mostly allocatable
    // Inside a capture the session's bindings are the bindings (the guard is checked against them).
    const std::int64_t nv = o ? o->n_at_capture : static_cast<std::int64_t>(r_.u16() % 4097);
    Workspace w;
    Expect e = Expect::oom_ok;
    std::uint64_t bytes = 0;
    const bool overflow = elem != 0 && (__builtin_mul_overflow(static_cast<std::uint64_t>(count), elem, &bytes) ||
                                        bytes > (1ull << 62));
    bool exact = false;
    std::int64_t expect_count = count;
    switch (kind) {
      case 0:  // constant extent
        e = elem == 0 ? Expect::invalid : overflow ? Expect::overflow : Expect::oom_ok;
        OP(e, w = arena_.request(hs(si), "fz.const", Extent(count), elem, capacity_bound, bind(1, nv)));
        break;
      case 1:  // dynamic, bounded by its capacity
        expect_count = 4096 * (1 + (count % 4));
        e = elem == 0 ? Expect::invalid : Expect::oom_ok;
        OP(e, w = arena_.request(hs(si), "fz.cap", Extent(n_) * (1 + count % 4), elem, capacity_bound,
                                 bind(1 + count % 4, nv)));
        if (w) {
          FZ_CHECK(w.count() == expect_count);
          expect_count = w.count();
        }
        break;
      case 2:  // exact at capture: a finding and a guard when captured
        expect_count = nv;
        exact = true;
        e = elem == 0 ? Expect::invalid : Expect::oom_ok;
        OP(e, w = arena_.request(hs(si), "fz.exact", Extent(n_), elem, exact_at_capture, bind(1, nv)));
        break;
      default: {  // no capacity: capacity_bound refuses, exact serves eagerly
        Bindings b;
        b.set(free_, count);
        OP(Expect::error_any, w = arena_.request(hs(si), "fz.unbounded", Extent(free_), elem ? elem : 1,
                                                 capacity_bound, b));
        FZ_CHECK(!w);
        return;
      }
    }
    if (!w) {
      FZ_CHECK(e != Expect::ok);
      return;
    }
    FZ_CHECK(e == Expect::oom_ok);
    FZ_CHECK(w.count() == expect_count);
    FZ_CHECK(w.bytes() == static_cast<std::uint64_t>(expect_count) * elem);
    FZ_CHECK(w.captured() == (o != nullptr));
    FZ_CHECK(w.bytes() == 0 || addr_of(w.data()) % kAlignment == 0);
    const unsigned char t = tag();
    if (o) {
      o->exact |= exact;
      o->ws.emplace_back(w.as<unsigned char>(), w.bytes());  // 0 bytes too: it has an offset in the plan
      return;  // the handle dying is harmless: the graph owns it
    }
    write(hs(si), w.data(), w.bytes(), t);
    if (tracing()) std::fprintf(stderr, "  eager s%d %p +%llu\n", si, w.data(), (unsigned long long)w.bytes());
    eager_.push_back({std::move(w), t});
  }

  void release() {
    if (eager_.empty()) return;
    const std::size_t i = r_.u8() % eager_.size();
    eager_.erase(eager_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void allocate() {
    const int si = stream();
    Open* o = open_on(si);
    std::uint64_t bytes = r_.size();
    if (r_.u8() % 4) bytes %= 200000;
    const std::uint64_t alignment = r_.u8() % 8 == 0 ? r_.u16() : 1ull << (r_.u8() % 9);
    const bool bad_align = alignment == 0 || (alignment & (alignment - 1)) || alignment > 256;
    Expect e = bad_align ? Expect::invalid : bytes > (1ull << 62) ? Expect::overflow : Expect::oom_ok;
    void* p = nullptr;
    if (!OP(e, p = arena_.allocate(hs(si), bytes, alignment))) return;
    FZ_CHECK(p != nullptr && addr_of(p) % kAlignment == 0);
    if (o) {
      o->ws.emplace_back(static_cast<unsigned char*>(p), bytes);
      if (r_.u8() % 2) OP(Expect::ok, arena_.deallocate(hs(si), p, bytes));  // no-op inside a capture
      return;
    }
    const unsigned char t = tag();
    write(hs(si), p, bytes, t);
    if (tracing()) std::fprintf(stderr, "  raw s%d %p +%llu\n", si, p, (unsigned long long)bytes);
    raws_.push_back({p, bytes, si, t});
  }

  void deallocate() {
    const std::uint8_t how = r_.u8() % 6;
    const int si = stream();
    if (how == 5 || raws_.empty()) {  // foreign pointers: a local, an eager workspace, an interior pointer
      int local = 0;
      void* p = &local;
      if (!eager_.empty() && eager_.front().ws.data()) p = eager_.front().ws.data();
      if (!raws_.empty() && r_.u8() % 2) p = static_cast<char*>(raws_.front().p) + 256;
      // A pointer into an open capture's range is the graph's (accepted as a no-op); the start of
      // another live raw block is not foreign.
      bool skip = false;
      for (const Raw& y : raws_) skip |= y.p == p;
      {
        std::lock_guard g(detail::core_of(arena_).lock);
        for (const detail::SessionState* s : detail::core_of(arena_).sessions)
          skip |= addr_of(p) >= s->base && addr_of(p) < s->base + s->limit;
      }
      const ArenaStats before = arena_.stats();
      if (!skip) {
        OP(Expect::invalid, arena_.deallocate(hs(si), p, 4));
        same(before);
      }
      return;
    }
    const std::size_t i = r_.u8() % raws_.size();
    const Raw x = raws_[i];
    const std::uint64_t block = align256(std::max<std::uint64_t>(x.bytes, 1));
    if (how == 0) {  // too large: refused, nothing changes
      const ArenaStats before = arena_.stats();
      OP(Expect::invalid, arena_.deallocate(hs(si), x.p, block + 1 + r_.u16()));
      same(before);
      return;
    }
    const std::uint64_t bytes = how == 1 ? x.bytes / 2 : x.bytes;  // smaller is accepted
    // The release stream must be ordered after the block's writes. A capturing stream cannot wait for
    // eager work (the event would be part of its graph), so the block is released on the stream that
    // wrote it (which may be capturing itself: its work before the capture is what the block holds).
    const int rs = hs(si).capturing() ? x.stream : si;
    backend_.order_after(hs(rs), hs(x.stream));  // written there: an event (nothing when rs is x.stream)
    OP(Expect::ok, arena_.deallocate(hs(rs), x.p, bytes));
    raws_.erase(raws_.begin() + static_cast<std::ptrdiff_t>(i));
    if (how == 2) {  // double release (unless the range was reused since: then it is another live block)
      bool reused = false;
      for (const Raw& y : raws_) reused |= y.p == x.p;
      const ArenaStats before = arena_.stats();
      if (!reused) {
        OP(Expect::invalid, arena_.deallocate(hs(si), x.p, x.bytes));
        same(before);
      }
    }
  }

  void dimension() {
    const int si = stream();
    Open* o = open_on(si);
    const std::int64_t nv = o ? o->n_at_capture : static_cast<std::int64_t>(r_.u16() % 4097);
    const bool exact = r_.u8() % 2;
    std::int64_t d = -1;
    OP(Expect::ok, d = arena_.dimension(hs(si), "fz.dim", Extent(n_) + 1, exact ? static_cast<const SizingPolicy&>(exact_at_capture)
                                                                               : capacity_bound, bind(1, nv)));
    FZ_CHECK(d == (exact ? nv + 1 : 4097));
    if (o && exact) o->exact = true;
  }

  void begin_capture() {
    const int si = stream();
    std::size_t fi = r_.u8() % (fams_.size() + 1);  // == size: a family of its own
    if (fi < fams_.size() && !fams_[fi].fam) fi = fams_.size();  // an abandoned solo capture's record
    const std::int64_t nv = static_cast<std::int64_t>(r_.u16() % 4097);
    const bool already = hs(si).capturing();
    const bool fam_busy = fi < fams_.size() && fams_[fi].capturing;
    CaptureOptions opts;
    if (fi < fams_.size()) opts.family = *fams_[fi].fam;
    opts.mode = static_cast<CaptureMode>(r_.u8() % 3);
    std::unique_ptr<CaptureSession> cs;
    const ArenaStats before = arena_.stats();
    const Expect e = already ? Expect::capture_state : fam_busy ? Expect::capture_state : Expect::oom_ok;
    if (!OP(e, cs = std::make_unique<CaptureSession>(arena_, hs(si), bind(1, nv), opts))) {
      FZ_CHECK(!hs(si).capturing() || already);
      const ArenaStats after = arena_.stats();
      FZ_CHECK(after.active_captures == before.active_captures && after.region_bytes == before.region_bytes &&
               after.eager_bytes == before.eager_bytes && after.live_graphs == before.live_graphs);
      return;
    }
    FZ_CHECK(hs(si).capturing());
    std::size_t idx = fi;
    if (fi == fams_.size()) {  // solo: a fresh family record (its handle comes with the graph)
      fams_.emplace_back();
      idx = fams_.size() - 1;
    }
    fams_[idx].capturing = true;
    opens_.push_back({std::move(cs), si, idx, nv, false, {}, tag()});
  }

  void end_capture() {
    if (opens_.empty()) return;
    const std::size_t i = r_.u8() % opens_.size();
    Open o = std::move(opens_[i]);
    opens_.erase(opens_.begin() + static_cast<std::ptrdiff_t>(i));
    Fam& f = fams_[o.fam];
    f.capturing = false;
    if (r_.u8() % 4 == 0) {  // abandoned (exception / early return)
      o.cs.reset();
      FZ_CHECK(!hs(o.stream).capturing());
      if (f.graphs == 0) f.region = f.base = 0;
      return;
    }
    for (auto [p, bytes] : o.ws) write(hs(o.stream), p, bytes, o.tag);
    std::optional<CapturedGraph> g;
    OP(Expect::ok, g.emplace(o.cs->finish()));
    o.cs.reset();
    FZ_CHECK(!hs(o.stream).capturing());
    const Plan& plan = g->plan();
    FZ_CHECK(plan.bytes() % kAlignment == 0);
    FZ_CHECK((plan.guard_count() > 0) == o.exact);
    std::optional<std::uintptr_t> base;
    std::size_t wi = 0;
    for (const PlanEntry& e : plan.entries()) {
      FZ_CHECK(e.offset + e.bytes <= plan.bytes());
      if (e.kind == PlanEntry::Kind::dimension) continue;
      FZ_CHECK(wi < o.ws.size());
      FZ_CHECK(e.bytes == o.ws[wi].second);
      const std::uintptr_t b = addr_of(o.ws[wi].first) - e.offset;
      FZ_CHECK(!base || *base == b);
      base = b;
      ++wi;
    }
    if (!f.fam) f.fam = g->family();
    FZ_CHECK(detail::impl_of(g->family()) == detail::impl_of(*f.fam));
    FZ_CHECK(wi == o.ws.size());
    if (plan.bytes() > 0) {
      FZ_CHECK(base.has_value());  // a zero-byte opaque request still takes 256 bytes of the region
      FZ_CHECK(f.region == 0 || f.base == *base);  // a region never moves while a graph lives
      f.base = *base;
      f.region = std::max(f.region, plan.bytes());
    }
    ++f.graphs;
    graphs_.push_back({std::move(*g), o.fam, o.n_at_capture, o.exact, std::move(o.ws), o.tag});
    // Replay once right away: its workspaces get their pattern.
    OP(Expect::ok, graphs_.back().g.replay(bind(1, o.n_at_capture), hs(o.stream)));
    backend_.quiesce();
    for (auto [p, bytes] : graphs_.back().ws) FZ_CHECK(filled(p, bytes, o.tag));
  }

  void replay() {
    if (graphs_.empty()) return;
    Graph& g = graphs_[r_.u8() % graphs_.size()];
    const int si = stream();
    const std::int64_t nv = static_cast<std::int64_t>(r_.u16() % 4097);
    const std::int64_t batch = r_.u8() % 8 == 0 ? 2 : 1;  // static symbol changed: refused if used
    const bool capturing = hs(si).capturing();
    const bool uses_batch = std::find(g.g.plan().symbols().begin(), g.g.plan().symbols().end(), B_) !=
                            g.g.plan().symbols().end();
    Expect e = Expect::ok;
    if (capturing) e = Expect::capture_state;
    else if ((g.exact && nv > g.n_at_capture) || (uses_batch && batch != 1)) e = Expect::guard;
    if (OP(e, g.g.replay(bind(batch, nv), hs(si)))) {
      backend_.quiesce();
      for (auto [p, bytes] : g.ws) FZ_CHECK(sampled(p, bytes, g.tag));
    }
  }

  void destroy() {
    if (graphs_.empty()) return;
    const std::size_t i = r_.u8() % graphs_.size();
    Fam& f = fams_[graphs_[i].fam];
    graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(i));
    if (--f.graphs == 0 && !f.capturing) f.region = f.base = 0;
    // A destroyed graph's handle: replay is refused, the arena is untouched.
  }

  void trim() {
    const int si = stream();
    OP(hs(si).capturing() ? Expect::capture_state : Expect::ok, arena_.trim(hs(si)));
  }

  // Calls that must be refused and change nothing.
  void misuse() {
    const ArenaStats before = arena_.stats();
    const int si = stream();
    switch (r_.u8() % 6) {
      case 0: {  // replay of a moved-from graph
        if (graphs_.empty()) return;
        CapturedGraph& g = graphs_.front().g;
        CapturedGraph moved(std::move(g));
        OP(Expect::capture_state, g.replay(bind(1, 0), hs(si)));
        g = std::move(moved);
        break;
      }
      case 1:  // unbound symbol
        OP(Expect::invalid, arena_.request(hs(si), "fz.unbound", Extent(n_), 4, exact_at_capture, Bindings()));
        break;
      case 2:  // replay with an unbound static symbol (only graphs that use one)
        if (graphs_.empty()) return;
        OP(Expect::error_any, graphs_.front().g.replay(Bindings(), hs(si)));
        break;
      case 3: {  // a capture inside a capture on the same stream
        if (opens_.empty()) return;
        OP(Expect::capture_state, CaptureSession inner(arena_, hs(opens_.front().stream), bind(1, 0)));
        break;
      }
      case 4:  // dynamic divisor under capacity_bound
        OP(Expect::error_any, arena_.request(hs(si), "fz.div", ceil_div(Extent(4096), Extent(n_)), 4, capacity_bound,
                                             bind(1, 1 + r_.u16() % 4096)));
        break;
      default:  // static_query_bound below the need
        OP(Expect::error_any, arena_.request(hs(si), "fz.sqb", Extent(n_), 4, static_query_bound(Extent(B_) * 8), bind(1, 100 + r_.u8())));
        break;
    }
    same(before);
  }

  void same(const ArenaStats& a) {
    const ArenaStats b = arena_.stats();
    FZ_CHECK(a.slab_bytes == b.slab_bytes && a.slabs == b.slabs && a.free_bytes == b.free_bytes &&
             a.largest_free == b.largest_free && a.eager_bytes == b.eager_bytes && a.eager_blocks == b.eager_blocks &&
             a.region_bytes == b.region_bytes && a.families == b.families && a.live_graphs == b.live_graphs &&
             a.active_captures == b.active_captures);
  }

  // Eager traffic from 2..4 threads at once, each on a stream of its own: everything it takes it
  // gives back, so the model is unchanged (the arena may have grown or been trimmed). Some requests
  // are released without waiting for their write, some rounds trim instead.
  void threads() {
    const int n = 2 + r_.u8() % 3;
    const int rounds = 1 + r_.u8() % 16;
    const std::uint64_t seed = r_.u16();
    for (HostStream& h : thread_streams_) (void)backend_.capture_info(h);  // bound before the threads start
    std::vector<std::thread> ts;
    std::atomic<int> wrong{0};
    for (int i = 0; i < n; ++i)
      ts.emplace_back([&, i] {
        HostStream& h = thread_streams_[static_cast<std::size_t>(i)];
        std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i);
        for (int k = 0; k < rounds; ++k) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          const auto count = static_cast<std::int64_t>((x >> 33) % 70000);
          const auto t = static_cast<unsigned char>(251 + i);
          const unsigned what = (x >> 20) % 8;
          if (what == 0) {  // trim while the other threads request and release
            arena_.trim(h);
            continue;
          }
          try {
            Workspace w = arena_.request(h, "fz.thread", Extent(count), 1, capacity_bound, Bindings());
            write(h, w.data(), w.bytes(), t);
            if (tracing()) std::fprintf(stderr, "  thread %d %p +%llu\n", i, w.data(), (unsigned long long)w.bytes());
            if (what == 1) continue;  // released with its write still queued: the next user orders after h
            backend_.synchronize(h);
            if (!filled(w.data(), w.bytes(), t)) ++wrong;
          } catch (const out_of_memory_error&) {
          }
        }
      });
    for (std::thread& t : ts) t.join();
    FZ_CHECK(wrong.load() == 0);
  }

  void check() {
    backend_.quiesce();  // contents are checked below: what the streams were given has run
    // A race is reported at the operation that made it (not at teardown), with both sites.
    if (std::vector<HostRace> races = backend_.take_races(); !races.empty()) {
      std::string d;
      for (const HostRace& x : races) d += "\n  " + x.describe();
      fail("unordered accesses (seeded execution)", __LINE__, d);
    }
    const ArenaStats st = arena_.stats();
    FZ_CHECK(all_slab_bytes_() == backend_.bytes_in_use());
    FZ_CHECK(st.active_captures == opens_.size());
    FZ_CHECK(st.live_graphs == graphs_.size());
    FZ_CHECK(backend_.bytes_in_use() <= limit_);
    std::map<std::uintptr_t, std::pair<std::uint64_t, BlockState>> model;
    std::uint64_t eager_bytes = 0, eager_blocks = 0, region_bytes = 0, families = 0, held = 0;
    auto add = [&](std::uintptr_t a, std::uint64_t size, BlockState s) {
      FZ_CHECK(a % kAlignment == 0);
      FZ_CHECK(model.emplace(a, std::make_pair(size, s)).second);
    };
    for (const Eager& e : eager_) {
      if (e.ws.bytes() == 0) {
        FZ_CHECK(e.ws.data() == nullptr);
        continue;
      }
      add(addr_of(e.ws.data()), align256(e.ws.bytes()), BlockState::used);
      eager_bytes += align256(e.ws.bytes());
      ++eager_blocks;
      FZ_CHECK(sampled(e.ws.data(), e.ws.bytes(), e.tag));
    }
    for (const Raw& x : raws_) {
      add(addr_of(x.p), align256(std::max<std::uint64_t>(x.bytes, 1)), BlockState::used);
      eager_bytes += align256(std::max<std::uint64_t>(x.bytes, 1));
      ++eager_blocks;
      FZ_CHECK(sampled(x.p, x.bytes, x.tag));
    }
    for (const Fam& f : fams_) {
      if (!f.fam) continue;
      FZ_CHECK(f.fam->graphs() == static_cast<std::uint64_t>(f.graphs));
      FZ_CHECK(f.fam->region_bytes() == f.region);
      if (f.region == 0) continue;
      add(f.base, f.region, BlockState::region);
      region_bytes += f.region;
      ++families;
    }
    {  // ranges the open sessions hold (the block they capture into, the block after a region)
      std::lock_guard g(detail::core_of(arena_).lock);
      FZ_CHECK(detail::core_of(arena_).sessions.size() == opens_.size());
      for (const detail::SessionState* s : detail::core_of(arena_).sessions) {
        for (const Block* b : {s->provisional, s->next_held})
          if (b) {
            add(b->addr, b->size, BlockState::held);
            held += b->size;
          }
        FZ_CHECK(s->bump <= s->limit);
      }
    }
    std::uintptr_t end = 0;
    for (const auto& [a, v] : model) {  // no overlap
      FZ_CHECK(a >= end);
      end = a + v.first;
    }
    FZ_CHECK(st.eager_bytes == eager_bytes);
    FZ_CHECK(st.eager_blocks == eager_blocks);
    FZ_CHECK(st.region_bytes == region_bytes);
    FZ_CHECK(st.families == families);
    FZ_CHECK(st.free_bytes + st.eager_bytes + st.region_bytes + held == st.slab_bytes);
    // The blocks tile their slabs and are exactly the model's ranges.
    std::map<std::uintptr_t, std::pair<std::uint64_t, BlockState>> taken;
    std::uint64_t slabs = 0, free_blocks = 0, free_bytes = 0, largest = 0;
    std::uintptr_t at = 0;
    const Block* prev = nullptr;
    detail::core_of(arena_).fl.for_each_block([&](const Slab& s, const Block& b) {
      if (&b == &s.blocks.front()) {
        ++slabs;
        FZ_CHECK(b.addr == s.addr);
        at = s.addr;
        prev = nullptr;
      }
      FZ_CHECK(b.slab == &s && b.addr == at && b.size > 0 && b.size % kAlignment == 0);
      at += b.size;
      if (b.state == BlockState::free) {
        ++free_blocks;
        free_bytes += b.size;
        largest = std::max(largest, b.size);
        if (prev && prev->state == BlockState::free)
          FZ_CHECK(prev->stream && b.stream && prev->stream != b.stream);  // coalesced unless streams differ
      } else {
        taken[b.addr] = {b.size, b.state};
      }
      if (&b == &s.blocks.back()) FZ_CHECK(at == s.addr + s.size);
      prev = &b;
    });
    FZ_CHECK(slabs == st.slabs);
    FZ_CHECK(free_bytes == st.free_bytes);
    FZ_CHECK(largest == st.largest_free);
    FZ_CHECK(free_blocks == detail::core_of(arena_).fl.free_blocks());
    if (taken != model) {
      std::string d;
      for (const auto& [a, v] : taken)
        d += "\n  arena " + std::to_string(a) + " +" + std::to_string(v.first) + " state " + std::to_string(int(v.second));
      for (const auto& [a, v] : model)
        d += "\n  model " + std::to_string(a) + " +" + std::to_string(v.first) + " state " + std::to_string(int(v.second));
      fail("blocks differ from the model", __LINE__, d);
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  const std::uint8_t cfg = r.u8();
  const std::uint8_t cfg2 = r.u8();
  // Always capped: an uncapped huge slab would be a real multi-GiB host allocation (libFuzzer's
  // malloc limit) and slow. 4..10 MiB models a capped upstream pool; 16 MiB is "enough".
  HostBackendOptions bo;
  bo.limit_bytes = (cfg & 1) ? (2 + (cfg >> 4) % 4) * 2 * kMiB : 16 * kMiB;
  ArenaOptions ao;
  ao.growth_bytes = (cfg & 2) ? 64 * kKiB : 2 * kMiB;
  ao.grow_on_demand = (cfg & 4) == 0;
  ao.report_findings = false;
  ao.always_check_capture = (cfg & 8) != 0;
  // Seeded for half the inputs (the interleaving and how much stays queued come from the input), so
  // the timed run explores stream orderings; the others run as the environment says.
  if (cfg2 & 1) {
    bo.execution = HostExecution::seeded;
    bo.seed = cfg2 >> 1;
    bo.max_queued = (cfg2 >> 4) % 9;
  }
  const int nstreams = 1 + (cfg >> 4) % 3 + ((cfg2 >> 1) & 1);
  const int narenas = 1 + ((cfg2 >> 2) & 1);
  HostBackend backend(bo);
  {
    std::deque<Fuzz> arenas;
    auto slab_bytes = [&arenas] {
      std::uint64_t sum = 0;
      for (const Fuzz& f : arenas) sum += f.arena().stats().slab_bytes;
      return sum;
    };
    for (int i = 0; i < narenas; ++i) arenas.emplace_back(r, backend, ao, nstreams, bo.limit_bytes, slab_bytes);
    int steps = 0;
    while (!r.done() && steps++ < 256) {
      const std::uint8_t op = r.u8();
      arenas[static_cast<std::size_t>(op >> 7) % arenas.size()].step(op & 0x7f);
    }
  }  // each arena tears down and trims
  FZ_CHECK(backend.bytes_in_use() == 0);
  return 0;
}
