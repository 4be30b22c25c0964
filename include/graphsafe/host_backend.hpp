// HostBackend: the arena's logic on the CPU, with the same semantics as CUDA.
//
// Memory is host memory. A HostStream runs work in order; while it is capturing, work is *recorded*
// instead of run, into a host "graph" that replays the recorded closures in order. Closures copy the
// sizes and addresses they were given at capture, exactly as kernel arguments are frozen in a CUDA
// Graph, so the seed's bug (a workspace sized from capture-time lengths) reproduces on the CPU.
#pragma once

#include <graphsafe/backend.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace graphsafe {

class HostStream {
 public:
  HostStream() = default;
  HostStream(const HostStream&) = delete;
  HostStream& operator=(const HostStream&) = delete;

  // Run `work` in stream order: now when eager, at every replay when capturing.
  void launch(std::function<void()> work);
  bool capturing() const { return capture_id_ != 0; }

 private:
  friend class HostBackend;
  std::uint64_t capture_id_ = 0;
  std::vector<std::function<void()>>* recording_ = nullptr;
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
