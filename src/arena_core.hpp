// Private state behind Arena, CaptureSession and CapturedGraph.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/captured_graph.hpp>
#include <graphsafe/debug.hpp>
#include <graphsafe/plan.hpp>

#include "arena_observer.hpp"
#include "capture_planner.hpp"
#include "placement.hpp"
#include "region_provider.hpp"
#include "free_list.hpp"

#include <atomic>
#include <map>
#include <mutex>
#include <source_location>
#include <unordered_map>
#include <string>
#include <thread>
#include <vector>

namespace graphsafe::detail {

// Virtual growth (src/virtual_commit.hpp), used only when ArenaOptions::virtual_memory is set.
struct VirtualFamily;
struct VirtualPlan;
struct VirtualRegistry;

// Uncontended lock/unlock is a few ns; the arena's critical sections are short tree operations.
class SpinLock {
 public:
  void lock() noexcept {
    while (flag_.test_and_set(std::memory_order_acquire)) {
      while (flag_.test(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { flag_.clear(std::memory_order_release); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

std::string site_of(const std::source_location& loc);

// Stream tags (free blocks, workspaces, families): a null tag means "ready for any stream", so the
// default stream (handle 0, legacy or per-thread) gets a tag of its own and is ordered like any other.
inline char default_stream_tag_object;
inline void* stream_tag(Stream s) noexcept { return s.handle() ? s.handle() : &default_stream_tag_object; }
inline Stream tagged_stream(void* tag) noexcept {
  return Stream(static_cast<cudaStream_t>(tag == &default_stream_tag_object ? nullptr : tag));
}

// x rounded up to a multiple of a; throws overflow_error naming both rather than wrap to a small size.
[[noreturn]] void align_overflow(std::uint64_t x, std::uint64_t a);
inline std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  if (x > ~std::uint64_t{0} - (a - 1)) [[unlikely]] align_overflow(x, a);
  return (x + a - 1) / a * a;
}
// Refuses options out of range (invalid_argument_error naming the option, its value and the limit).
void check_options(const ArenaOptions& o);
// count * element_bytes, refusing negative counts, element size 0 and byte counts above 2^62 (the
// check is inline: it runs on every request; the throwing part is not).
[[noreturn]] void bad_byte_count(std::int64_t count, std::uint64_t element_bytes, std::string_view name);
inline std::uint64_t checked_bytes(std::int64_t count, std::uint64_t element_bytes, std::string_view name) {
  std::uint64_t bytes;
  if (count < 0 || element_bytes == 0 ||
      __builtin_mul_overflow(static_cast<std::uint64_t>(count), element_bytes, &bytes) || bytes > (1ull << 62))
      [[unlikely]]
    bad_byte_count(count, element_bytes, name);
  return bytes;
}

struct Family {
  std::string name;
  // The arena that made the family (Arena::family, or a graph's own family): set at creation, never
  // changed. A capture through another arena is refused (its region lives in this arena's slabs).
  std::uint64_t arena_id = 0;      // ArenaCore::id
  std::weak_ptr<ArenaCore> arena;  // its lock guards the fields below
  Block* region = nullptr;  // state region while any graph of the family lives
  std::uint64_t graphs = 0;
  bool capturing = false;
  void* last_stream = nullptr;  // tag of the last replay's stream (under the arena's lock)
  std::mutex replay_mutex;        // serializes the family's replays (launch_in_family)
  std::uint64_t largest_plan = 0;
  std::uint64_t sum_plans = 0;
  std::uint64_t peak_live = 0;  // largest lower bound of a capture of the family
  // Placements of earlier captures (the better of the one made and an offline packing), which
  // later captures of the same request sizes follow: re-captures, siblings, estimated captures.
  std::vector<std::shared_ptr<const LayoutProposal>> layouts;
  std::shared_ptr<VirtualFamily> virt;  // virtual growth: the family's address range
  // Debug mode (under the arena's lock or the family's serialized replays).
  GraphState* dbg_last_graph = nullptr;  // graph replayed last (its guards are the live ones)
  GraphState* nvtx_owner = nullptr;      // graph whose workspaces are registered with NVTX
};

// One eager release parked per thread and arena (the lock-free half of a request/release pair).
// Only the owning thread stores a block, and only into an empty slot; whoever holds the arena's
// lock may take the block out (and store nullptr). So neither side needs an atomic read-modify-write:
// the owner's store is a plain release store, the taker's a plain store under the lock.
struct DeferredSlot {
  std::atomic<Block*> pending{nullptr};  // released by its owner, not yet back in the free list
  ArenaCore* core = nullptr;             // under deferred_registry_mutex(); nullptr once the arena died
};
std::mutex& deferred_registry_mutex();

// Debug mode: an address the captured work uses (a kernel argument, a copy's source, a pointer the
// program declared with debug::captured_pointer), and how the graph holds it.
struct CapturedPointer {
  std::uintptr_t addr = 0;
  std::string how;  // "argument 0 of node #2 (kernel fill)", "pointer 'x' declared at file:line"
};
// Base of an estimate's placements: no memory, and far from any (a launch would fault).
inline constexpr std::uintptr_t kPlanningBase = 1ull << 56;

struct SessionState {
  std::shared_ptr<ArenaCore> core;
  Stream stream{static_cast<cudaStream_t>(nullptr)};
  CaptureOptions opts;
  std::shared_ptr<Family> family;
  std::uint64_t capture_id = 0;
  bool registered = false;
  bool begun = false;
  bool done = false;
  Block* provisional = nullptr;  // family had no region: the block taken to capture into
  Block* next_held = nullptr;    // family had a region: the free block after it, held for growth
  std::uintptr_t base = 0;
  std::uint64_t limit = 0;
  std::uint64_t bump = 0;
  // Where requests go inside the region (src/placement.hpp): made once the region is set up.
  std::unique_ptr<Placement> placement;
  bool planning = false;  // an estimate: nothing is taken from the arena, the capture is discarded
  Plan plan;
  std::size_t report_mark = 0;  // debug: findings made before this capture began
  std::shared_ptr<VirtualPlan> virt;  // virtual growth: footprints recorded by this capture
  std::vector<CapturedPointer> dbg_pointers;  // debug: declared with debug::captured_pointer
};

struct GraphState {
  std::shared_ptr<ArenaCore> core;
  std::shared_ptr<Family> family;
  GraphHandle handle;
  Plan plan;
  std::uint64_t recaptures = 0;
  std::function<void(const Bindings&)> fn;  // kept only when the graph may re-capture
  Stream stream{static_cast<cudaStream_t>(nullptr)};
  CaptureOptions opts;
  // Debug mode.
  std::uintptr_t base = 0;          // region base: plan offsets are relative to it
  std::uint64_t dbg_id = 0;         // "graph #id" in findings
  std::uint64_t replays = 0;        // replays launched
  std::uint64_t unchecked = 0;      // replays since the guards were last checked
  bool armed = false;               // guards hold the pattern (filled before a replay)
  bool nvtx_registered = false;
  void* dbg_stream = nullptr;       // stream of the last replay
  std::shared_ptr<VirtualPlan> virt;  // virtual growth: committed before each launch
  std::vector<debug::Finding> last_overwrites;  // found by the last canary check
  std::vector<CapturedPointer> dbg_pointers;    // declared during its capture (read at creation)
};

std::string graph_label(const GraphState& g);
// Destroys the graph's executable and gives its family's region back when it was the last graph
// (src/captured_graph.cpp). No-op for a graph already destroyed.
void destroy_graph(GraphState& g) noexcept;
// Order after the family's last replay and launch `g` on `s` (src/captured_graph.cpp).
void launch_in_family(GraphState& g, Stream s, const std::source_location& loc);

class ArenaCore : public std::enable_shared_from_this<ArenaCore> {
 public:
  ArenaCore(Backend& b, ArenaOptions o);
  ~ArenaCore();

  Backend& backend;
  ArenaOptions opts;
  mutable SpinLock lock;
  FreeList fl;
  std::atomic<int> active_sessions{0};
  const std::uint64_t id;  // unique over the process: keys the threads' deferred-release slots
  std::vector<std::shared_ptr<DeferredSlot>> deferred_slots;  // under lock
  std::vector<SessionState*> sessions;  // under lock
  std::uint64_t eager_bytes = 0;
  std::uint64_t eager_blocks = 0;
  std::uint64_t live_graphs = 0;
  std::uint64_t region_bytes = 0;
  std::uint64_t region_peak_live = 0;  // sum of the lower bounds of families holding a region
  std::uint64_t families_with_region = 0;
  std::shared_ptr<VirtualRegistry> virt;  // virtual growth: families with an address range
  // Under lock: entries of the last capture's plan. The next capture reserves as many: a plan of
  // thousands of entries is not grown by doubling (whose freed chunks the C heap may return to
  // the system, so that every capture faults its pages in again).
  std::size_t plan_entries_hint = 0;
  PlannerStorage spare_planner;  // under lock: the vectors of the largest ended capture's planner
  // Bytes of guard placed behind every workspace (debug mode's canaries; 0 otherwise).
  std::uint64_t guard_bytes = 0;
  // Told of every event (src/arena_observer.hpp); nullptr when nobody watches. Set by attach()
  // before the arena serves anything, read without the lock.
  ArenaObserver* observer = nullptr;
  DebugObserver* debug = nullptr;  // debug mode's observer (also in `observer`), for debug:: calls
  void attach(std::unique_ptr<ArenaObserver> o);

  // The session capturing on `s`, nullptr when `s` is not capturing. Throws capture_state_error
  // for a stream captured outside graphsafe. With no graphsafe capture under way (and
  // always_check_capture off) it is one load and asks the backend nothing.
  SessionState* session_for(Stream s) {
    if (active_sessions.load(std::memory_order_acquire) == 0 && !opts.always_check_capture) [[likely]]
      return nullptr;
    return session_for_query(s);
  }

  Workspace request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                    const SizingPolicy& policy, const Bindings& b, const std::source_location& loc,
                    const Footprint* touched = nullptr);
  std::int64_t dimension(Stream s, std::string_view name, const Extent& need, const SizingPolicy& policy,
                         const Bindings& b, const std::source_location& loc);
  void* allocate(Stream s, std::uint64_t bytes, std::uint64_t alignment, const std::source_location& loc);
  void deallocate(Stream s, void* p, std::uint64_t bytes);
  void release(Workspace& w) noexcept;
  void reserve(std::uint64_t bytes, Stream s);
  void trim(Stream s);
  // Under lock: put every thread's parked release back into the free list (its cache). Done
  // wherever the whole free state matters (stats, reserve, trim, capture, a request that found
  // nothing), so a parked block is never lost to anyone but the one thread that would reuse it.
  void collect_deferred();
  // A thread that owns a slot exits: its parked block goes back and the slot is dropped.
  void detach_slot(DeferredSlot& s) noexcept;
  // Wait for the (non-capturing) streams that released free blocks, then coalesce across them.
  void make_free_blocks_ready(Stream s);

  // Capture lifecycle (used by CaptureSession / CapturedGraph): where a family's region comes from
  // and goes back to is the region provider's (src/region_provider.hpp).
  std::unique_ptr<RegionProvider> regions;
  // SlabRegions: the region in this arena's slabs (src/arena.cpp).
  void begin_slab_capture(SessionState& st);
  void end_slab_capture(SessionState& st, bool success);
  void graph_destroyed(Family& f, void* stream) noexcept;
  // A workspace requested in a capture was released (handle reset or destroyed): its range may be
  // reused by later requests of that capture. No-op once the capture has ended.
  void release_captured(std::uint64_t serial, void* stream) noexcept;

 private:
  ObserverList observers_;  // owns what attach() was given
  static std::uint64_t next_id();
  // This thread's slot in this arena (created on first use); nullptr when none can be had (no
  // memory for one, or the thread is exiting): the caller then releases under the lock.
  DeferredSlot* my_slot() noexcept;
  DeferredSlot* my_slot_slow() noexcept;
  void finish_release(Block* b);    // under lock: a released eager block goes back
  Block* take_eager(std::uint64_t bytes, Stream s, bool index = false);
  void* new_slab(std::uint64_t bytes, Stream s);  // backend slab (synchronized in debug mode)
  SessionState* session_for_query(Stream s);
  // The capture paths of request / allocate, out of line so the eager paths stay small.
  [[gnu::noinline]] Workspace request_captured(SessionState& st, Stream s, std::string_view name, const Extent& need,
                                               std::uint64_t element_bytes, const SizingPolicy& policy,
                                               const Bindings& b, const std::source_location& loc,
                                               const Footprint* touched, SizingDecision& d, std::uint64_t bytes);
  [[gnu::noinline]] void* allocate_captured(SessionState& st, Stream s, std::uint64_t bytes, std::uint64_t alignment,
                                            const std::source_location& loc);
  Workspace make_workspace(Block* b, void* ptr, std::uint64_t bytes, std::int64_t count, Stream s, bool captured) {
    Workspace w;
    w.core_ = this;
    w.block_ = b;
    w.ptr_ = ptr;
    w.bytes_ = bytes;
    w.count_ = count;
    w.stream_ = stream_tag(s);
    w.captured_ = captured;
    return w;
  }
  void record(SessionState& st, PlanEntry e, SizingDecision& d, const Extent* need, const Bindings& b);
};

}  // namespace graphsafe::detail
