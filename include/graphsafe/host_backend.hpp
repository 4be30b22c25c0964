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
#pragma once

#include <graphsafe/backend.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace graphsafe {

namespace detail {
struct HostCapture;
}
class HostEvent;

class HostStream {
 public:
  HostStream() = default;
  ~HostStream();  // a stream that joined a capture leaves it (its captured work stays in the graph)
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Run `work` in stream order: now when eager, at every replay when capturing.
  void launch(std::function<void()> work);
  bool capturing() const { return capture_id_ != 0; }
  // cudaEventRecord: the event marks this stream's current position (in its capture, when capturing).
  void record(HostEvent& e);
  // cudaStreamWaitEvent: later work on this stream follows the event's position. An event recorded
  // in a capture makes a stream that is not capturing join that capture; waiting on an event of
  // another capture throws capture_state_error (CUDA invalidates such a capture).
  void wait(const HostEvent& e);

 private:
  friend class HostBackend;
  std::uint64_t capture_id_ = 0;
  std::shared_ptr<detail::HostCapture> capture_;
  std::vector<std::uint32_t> deps_;  // capture nodes the next captured work depends on
};

// An event for HostStream::record / wait (a cudaEvent_t twin). Eager host streams run work at once,
// so an event recorded outside capture orders nothing further.
class HostEvent {
 private:
  friend class HostStream;
  std::shared_ptr<detail::HostCapture> capture_;  // capture it was recorded in (null: eager)
  std::uint64_t capture_id_ = 0;
  std::vector<std::uint32_t> nodes_;
};

struct HostBackendOptions {
  // Upper bound on bytes held in slabs at once; allocations above it throw out_of_memory_error
  // (lets tests model a capped upstream pool). 0 = unlimited.
  std::uint64_t limit_bytes = 0;
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(HostBackendOptions o = {}) : opts_(o) {}
  std::string_view name() const override { return "host"; }
  void* allocate_slab(std::uint64_t bytes, Stream s) override;
  void free_slab(void* p, std::uint64_t bytes, Stream s) override;
  CaptureInfo capture_info(Stream s) const override;
  void begin_capture(Stream s, CaptureMode mode) override;
  GraphHandle end_capture(Stream s) override;
  void abort_capture(Stream s) noexcept override;
  bool capture_dependencies(Stream s, std::vector<const void*>& out) const override;
  bool capture_ordered_after(Stream s, const std::vector<const void*>& before) const override;
  void launch(const GraphHandle& g, Stream s) override;
  void destroy(GraphHandle& g) noexcept override;
  void order_after(Stream, Stream) override {}  // host streams run synchronously
  void synchronize(Stream) override {}
  void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s) override;
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) override;

  std::uint64_t bytes_in_use() const { return in_use_.load(); }
  std::uint64_t slab_allocations() const { return slab_allocations_.load(); }

 private:
  HostBackendOptions opts_;
  // Atomic: the arena grows outside its lock, so several threads may allocate slabs at once.
  std::atomic<std::uint64_t> in_use_{0};
  std::atomic<std::uint64_t> slab_allocations_{0};
};

}  // namespace graphsafe
