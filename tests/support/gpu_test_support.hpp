// RAII for the GPU tests' own CUDA objects (streams, events, device buffers), shared by the arena,
// debug-mode and reliability tests. Include after <catch2/catch.hpp> and <graphsafe/graphsafe.hpp>.
//
// Every test stream is non-blocking, so nothing here may use the legacy default stream without
// waiting for it: a cudaMemset on the legacy stream is asynchronous and unordered with the test's
// streams (on the H200, under compute-sanitizer's slower launches, a buffer's zero fill landed after
// the kernels that wrote it and the eager reference read back zeros).
#pragma once

#include <graphsafe/cuda_backend.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace graphsafe_test {

struct StreamHolder {
  cudaStream_t s = nullptr;
  StreamHolder() { GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamHolder() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  StreamHolder(const StreamHolder&) = delete;
  StreamHolder& operator=(const StreamHolder&) = delete;
};

struct EventHolder {
  cudaEvent_t e = nullptr;
  EventHolder() { GRAPHSAFE_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)); }
  ~EventHolder() { cudaEventDestroy(e); }
  EventHolder(const EventHolder&) = delete;
  EventHolder& operator=(const EventHolder&) = delete;
};

// cudaMalloc'd buffer, zero-filled and complete before the constructor returns.
template <class T>
struct DevBuf {
  T* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : n(count) {
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(n, 1) * sizeof(T)));
    GRAPHSAFE_CUDA(cudaMemset(p, 0, std::max<std::size_t>(n, 1) * sizeof(T)));
    GRAPHSAFE_CUDA(cudaDeviceSynchronize());  // the legacy-stream memset is not ordered with our streams
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  std::size_t bytes() const { return n * sizeof(T); }
  void upload(const std::vector<T>& v, cudaStream_t s) {
    REQUIRE(v.size() <= n);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, s));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  }
  std::vector<T> download(cudaStream_t s, std::size_t count) const {
    std::vector<T> v(count);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost, s));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
    return v;
  }
  std::vector<T> download(cudaStream_t s) const { return download(s, n); }
  void fill_bytes(int byte, cudaStream_t s) { GRAPHSAFE_CUDA(cudaMemsetAsync(p, byte, bytes(), s)); }
};

}  // namespace graphsafe_test
