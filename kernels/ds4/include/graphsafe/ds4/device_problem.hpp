// A DecodeProblem (problem.hpp) uploaded to device memory, for the CUDA kernels' tests, benchmarks and
// the demo. Owns its device buffers (cudaMalloc at construction: call it outside graph capture).
// No graphsafe core dependency.
#pragma once

#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/ds4/problem.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace graphsafe::ds4::cuda {

// Owning device allocation (cudaFree on destruction).
struct DeviceFree {
  void operator()(void* p) const noexcept;
};
using DeviceBytes = std::unique_ptr<std::uint8_t, DeviceFree>;
DeviceBytes device_alloc(std::size_t bytes);  // throws graphsafe::cuda_error naming the size on failure

struct DeviceProblem {
  LayerConfig cfg;
  int batch = 0;
  PagedCache swa;                       // device base
  PagedCache cmp;                       // device base (null for C1)
  std::int32_t* seq_lens = nullptr;     // [B]
  std::int32_t* swa_block_table = nullptr;
  int swa_blocks_per_req = 0;
  std::int32_t* cmp_block_table = nullptr;
  int cmp_blocks_per_req = 0;
  std::int32_t* topk_local = nullptr;   // [B, K] (C4)
  std::uint16_t* q = nullptr;           // [B, H, 512] bf16
  float* sink = nullptr;                // [H]

  DeviceBytes storage;                  // one allocation holding everything above
};

// Copies every array of `p` to the device (synchronous cudaMemcpy; not for use under capture).
DeviceProblem upload(const DecodeProblem& p);
// Re-uploads what grow() changes: seq_lens, topk_local (and q/sink), asynchronously on `stream`.
// The host arrays must stay alive until the copy completes.
void upload_lengths(DeviceProblem& d, const DecodeProblem& p, cudaStream_t stream);

}  // namespace graphsafe::ds4::cuda
