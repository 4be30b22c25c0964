// CudaBackend: slabs from a dedicated cudaMemPool_t (stream-ordered allocator), capture through
// cudaStreamBeginCapture / cudaStreamGetCaptureInfo, graphs instantiated and launched as usual.
// The pool is private to the arena so graphsafe's reservations never mix with other allocations.
#pragma once

#include <graphsafe/backend.hpp>

#include <cuda_runtime_api.h>

#include <cstdlib>

#include <mutex>
#include <string>
#include <unordered_map>

namespace graphsafe {

struct CudaBackendOptions {
  int device = -1;                     // -1: the current device
  std::uint64_t release_threshold = ~0ull;  // pool keeps freed slabs cached (cudaMemPoolAttrReleaseThreshold)
  std::uint64_t pool_max_bytes = 0;    // 0: no cap; else cudaMemPoolProps::maxSize (tests of OOM)
  // Slabs from cudaMalloc instead of the stream-ordered pool. compute-sanitizer accepts NVTX heap
  // registrations (debug mode's per-workspace regions) only on such allocations. Also on when
  // GRAPHSAFE_DEBUG=1 (read when the backend is made; docs/concepts.md, "Configuration").
  bool plain_allocations = false;
};

// Throws cuda_error naming the call and the CUDA error; used by every CUDA call in graphsafe.
void check_cuda(cudaError_t err, const char* call, const char* file, int line);
#define GRAPHSAFE_CUDA(call) ::graphsafe::check_cuda((call), #call, __FILE__, __LINE__)

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(CudaBackendOptions o = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  bool nvtx_heaps_supported() const override { return plain_; }
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

  cudaMemPool_t pool() const { return pool_; }
  int device() const { return device_; }

 private:
  int device_ = 0;
  cudaMemPool_t pool_ = nullptr;
  cudaEvent_t order_event_ = nullptr;
  bool plain_ = false;
  // Recorded on a stream just before its capture begins: work released on a stream that is now
  // capturing is ordered through this event (recording into the capture would join it).
  std::mutex capture_events_mutex_;
  std::unordered_map<cudaStream_t, cudaEvent_t> pre_capture_events_;
};

}  // namespace graphsafe
