// HostBackend: the arena's logic on the CPU, with the same semantics as CUDA.
//
// Memory is host memory. A HostStream runs work in order; while it is capturing, work is *recorded*
// instead of run, into a host "graph" of nodes and dependency edges. Closures copy the sizes and
// addresses they were given at capture, exactly as kernel arguments are frozen in a CUDA Graph, so
// the seed's bug (a workspace sized from capture-time lengths) reproduces on the CPU.
//
// Multi-stream capture follows CUDA (cudaEventRecord / cudaStreamWaitEvent):
//
//   HostStream main, side;  HostEvent fork, join;
//   backend.begin_capture(main, CaptureMode::global);
//   main.record(fork);  side.wait(fork);     // side joins main's capture (a fork)
//   side.launch(a);     main.launch(b);      // a and b are concurrent branches
//   side.record(join);  main.wait(join);     // join: main's next work follows a and b
//   GraphHandle g = backend.end_capture(main);  // throws if a stream that joined was not joined back
//
// A replay runs the nodes in a topological order that, among ready nodes, takes the most recently
// captured first: branches run in an order other than capture order, so a missing join shows up
// as wrong results in tests instead of passing by luck.
//
// Execution. By default every stream runs its work at once, on the calling thread (synchronous:
// order_after and synchronize have nothing to do). The seeded mode makes stream ordering visible:
//
//   HostBackend backend(HostBackendOptions{.execution = HostExecution::seeded, .seed = 7});
//   HostStream s(backend), t(backend);
//   s.launch([p] { std::memset(p, 1, 64); }, {HostAccess::writes(p, 64)});
//   t.launch([p] { std::memset(p, 2, 64); }, {HostAccess::writes(p, 64)});  // no order_after(t, s)
//   backend.take_races();  // one race: both launch sites, the overlapping bytes, both streams
//
// Each stream's work is queued; a scheduler seeded by `seed` runs queued work of all streams in an
// interleaving of its choice (only order_after / synchronize constrain it), so a missing edge can
// change what memory holds. A race checker keeps a vector clock per stream (order_after joins the
// producer's clock into the waiter's; synchronize joins the stream's clock into the host's, which
// every later launch inherits) and records the byte ranges every queued operation touches: slab
// allocation and free, fill_bytes, copy_to_host, graph launches (each recorded piece of work with
// the ranges it declared) and launches that declare their ranges. Two accesses to overlapping
// bytes, one a write, neither ordered before the other, are a race: it names both sites. Races
// are collected (take_races); a backend destroyed with races nobody took prints them and aborts,
// as a sanitizer would. Setting GRAPHSAFE_HOST_EXECUTION=seeded:<seed> in the environment switches
// every backend whose options keep the default execution (the tests' `async` label runs whole
// suites that way, as CUDA_LAUNCH_BLOCKING switches CUDA's).
#pragma once

#include <graphsafe/backend.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

namespace graphsafe {

class HostBackend;
class HostEvent;
namespace detail {
struct HostScheduler;
struct HostCapture;
}

// A byte range a launched piece of work reads or writes (the race checker's input).
struct HostAccess {
  const void* p = nullptr;
  std::uint64_t bytes = 0;
  bool write = false;
  static HostAccess reads(const void* p, std::uint64_t bytes) { return {p, bytes, false}; }
  static HostAccess writes(const void* p, std::uint64_t bytes) { return {p, bytes, true}; }
};

// Work queued on a host stream (or recorded into a host graph) with the ranges it touches.
struct HostWork {
  std::function<void()> run;
  std::vector<HostAccess> touches;
  std::string site;
};

class HostStream {
 public:
  HostStream() = default;
  // Bound to `backend` now rather than at its first use by it (a launch before that runs at once).
  explicit HostStream(HostBackend& backend);
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;
  // Waits for the stream's queued work (seeded mode); a stream that joined a capture leaves it (its
  // captured work stays in the graph).
  ~HostStream();

  // Run `work` in stream order: when eager, now (synchronous mode) or queued (seeded mode); at
  // every replay when capturing. `touches`: the bytes it reads and writes, checked for races in
  // seeded mode (work that declares none is not checked).
  void launch(std::function<void()> work, std::vector<HostAccess> touches = {},
              std::source_location loc = std::source_location::current());
  bool capturing() const { return capture_id_ != 0; }
  // cudaEventRecord: the event marks this stream's current position (in its capture, when capturing).
  void record(HostEvent& e);
  // cudaStreamWaitEvent: later work on this stream follows the event's position. An event recorded
  // in a capture makes a stream that is not capturing join that capture; waiting on an event of
  // another capture throws capture_state_error (CUDA invalidates such a capture). Outside capture,
  // in seeded mode, it orders this stream after the recording stream's work.
  void wait(const HostEvent& e);

 private:
  friend class HostBackend;
  friend struct detail::HostScheduler;
  std::uint64_t capture_id_ = 0;
  std::shared_ptr<detail::HostCapture> capture_;
  std::vector<std::uint32_t> deps_;  // capture nodes the next captured work depends on
  HostBackend* backend_ = nullptr;  // the backend that runs its eager work (set on first use)
  std::uint32_t id_ = 0;            // seeded mode: index of the stream's queue and clock entry
};

// An event for HostStream::record / wait (a cudaEvent_t twin).
class HostEvent {
 private:
  friend class HostStream;
  std::shared_ptr<detail::HostCapture> capture_;  // capture it was recorded in (null: eager)
  std::uint64_t capture_id_ = 0;
  std::vector<std::uint32_t> nodes_;
  HostStream* stream_ = nullptr;  // eager: the stream it was recorded on
};

enum class HostExecution : std::uint8_t {
  environment,  // synchronous unless GRAPHSAFE_HOST_EXECUTION=seeded[:<seed>] is set
  synchronous,  // work runs when launched; ordering calls do nothing
  seeded,       // queued per stream, interleaved by a seeded scheduler, races checked
};

// Two accesses to overlapping bytes, at least one a write, neither ordered before the other.
struct HostRace {
  std::uintptr_t begin = 0, end = 0;  // the overlapping bytes
  std::string first_site, second_site;
  bool first_write = false, second_write = false;
  std::uint32_t first_stream = 0, second_stream = 0;  // stream numbers in the backend (0: default stream)
  std::string describe() const;
};

struct HostBackendOptions {
  // Upper bound on bytes held in slabs at once; allocations above it throw out_of_memory_error
  // (lets tests model a capped upstream pool). 0 = unlimited.
  std::uint64_t limit_bytes = 0;
  HostExecution execution = HostExecution::environment;
  std::uint64_t seed = 1;  // seeded mode: the interleaving (the environment's seed wins there)
  // Seeded mode: at most this many operations wait in the queues before the scheduler runs some.
  std::uint32_t max_queued = 8;
  // Accept the null Stream as the host twin of CUDA's default stream (one more stream, with its own
  // order, default_stream()). Off: a null stream is refused (it is almost always a mistake).
  bool default_stream = false;
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(HostBackendOptions o = {});
  ~HostBackend() override;
  std::string_view name() const override { return "host"; }
  void* allocate_slab(std::uint64_t bytes, Stream s) override;
  void free_slab(void* p, std::uint64_t bytes, Stream s) override;
  CaptureInfo capture_info(Stream s) const override;
  void begin_capture(Stream s, CaptureMode mode) override;
  GraphHandle end_capture(Stream s) override;
  void abort_capture(Stream s) noexcept override;
  bool capture_dependencies(Stream s, std::vector<const void*>& out) const override;
  bool capture_ordered_after(Stream s, const std::vector<const void*>& before) const override;
  bool graph_topology(const GraphHandle& g, GraphTopology& out) const override;
  void launch(const GraphHandle& g, Stream s) override;
  void destroy(GraphHandle& g) noexcept override;
  void order_after(Stream waiter, Stream producer) override;
  void synchronize(Stream s) override;
  void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s) override;
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) override;

  std::uint64_t bytes_in_use() const { return in_use_.load(); }
  std::uint64_t slab_allocations() const { return slab_allocations_.load(); }

  bool seeded() const noexcept { return sched_ != nullptr; }
  // The stream a null Stream names (HostBackendOptions::default_stream).
  HostStream& default_stream() noexcept { return default_stream_; }
  // Seeded mode: run every queued operation now, without ordering anything after it (for tests that
  // inspect memory; synchronize is the ordering wait). No-op in synchronous mode.
  void quiesce();
  // Seeded mode: the races found so far (and forget them). Empty in synchronous mode.
  std::vector<HostRace> take_races();

 private:
  friend class HostStream;
  HostStream& host(Stream s) const;  // binds the stream to this backend (seeded mode)
  HostBackendOptions opts_;
  std::unique_ptr<detail::HostScheduler> sched_;  // seeded mode only
  HostStream default_stream_;
  // Atomic: the arena grows outside its lock, so several threads may allocate slabs at once.
  std::atomic<std::uint64_t> in_use_{0};
  std::atomic<std::uint64_t> slab_allocations_{0};
};

}  // namespace graphsafe
