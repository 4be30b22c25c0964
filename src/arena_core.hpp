// Private state behind Arena, CaptureSession and CapturedGraph.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/captured_graph.hpp>
#include <graphsafe/plan.hpp>

#include "free_list.hpp"

#include <atomic>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

namespace graphsafe::detail {

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
inline std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }
std::uint64_t checked_bytes(std::int64_t count, std::uint64_t element_bytes, std::string_view name);

struct Family {
  std::string name;
  Block* region = nullptr;  // state region while any graph of the family lives
  std::uint64_t graphs = 0;
  bool capturing = false;
  void* last_stream = nullptr;
  std::uint64_t largest_plan = 0;
  std::uint64_t sum_plans = 0;
};

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
  Plan plan;
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
};

class ArenaCore : public std::enable_shared_from_this<ArenaCore> {
 public:
  ArenaCore(Backend& b, ArenaOptions o) : backend(b), opts(o) {}
  ~ArenaCore();

  Backend& backend;
  ArenaOptions opts;
  mutable SpinLock lock;
  FreeList fl;
  std::atomic<int> active_sessions{0};
  std::vector<SessionState*> sessions;  // under lock
  std::uint64_t eager_bytes = 0;
  std::uint64_t eager_blocks = 0;
  std::uint64_t live_graphs = 0;
  std::uint64_t region_bytes = 0;
  std::uint64_t families_with_region = 0;

  // The session capturing on `s`, nullptr when `s` is not capturing. Throws capture_state_error
  // for a stream captured outside graphsafe.
  SessionState* session_for(Stream s);

  Workspace request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                    const SizingPolicy& policy, const Bindings& b, const std::source_location& loc);
  std::int64_t dimension(Stream s, std::string_view name, const Extent& need, const SizingPolicy& policy,
                         const Bindings& b, const std::source_location& loc);
  void* allocate(Stream s, std::uint64_t bytes, std::uint64_t alignment, const std::source_location& loc);
  void deallocate(Stream s, void* p, std::uint64_t bytes);
  void release(Workspace& w) noexcept;
  void reserve(std::uint64_t bytes, Stream s);
  void trim(Stream s);

  // Capture lifecycle (used by CaptureSession / CapturedGraph).
  void begin_session(SessionState& st);
  void end_session(SessionState& st, bool success);
  void graph_destroyed(Family& f, void* stream) noexcept;

 private:
  Block* take_eager(std::uint64_t bytes, Stream s);
  std::uint64_t place_in_capture(SessionState& st, std::uint64_t bytes, std::uint64_t alignment,
                                 std::string_view name);
  Workspace make_workspace(Block* b, void* ptr, std::uint64_t bytes, std::int64_t count, Stream s, bool captured);
  void record(SessionState& st, PlanEntry e, const SizingDecision& d, const Extent* need, const Bindings& b);
};

}  // namespace graphsafe::detail
