// Stream: the one handle type the arena takes, for both backends. Converts implicitly from a
// cudaStream_t (CUDA backend) and from a HostStream (host backend), so call sites read naturally.
#pragma once

#include <cuda_runtime_api.h>

namespace graphsafe {

class HostStream;

class Stream {
 public:
  Stream(cudaStream_t s) : handle_(static_cast<void*>(s)) {}  // NOLINT(implicit)
  Stream(HostStream& s);                                       // NOLINT(implicit)
  void* handle() const noexcept { return handle_; }
  cudaStream_t cuda() const noexcept { return static_cast<cudaStream_t>(handle_); }
  friend bool operator==(Stream a, Stream b) noexcept { return a.handle_ == b.handle_; }

 private:
  void* handle_;
};

}  // namespace graphsafe
