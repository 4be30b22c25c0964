// Shared by the DS4 GPU tests (seed regression, virtual growth): the tiny layer shape of docs/ds4_model.md §7.3,
// a stream that outlives the arena and graphs declared after it, bf16 download, relative error.
#pragma once

#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace graphsafe::ds4::test {

// W = 4, K = 8 (C4), H = 64 (FlashMLA-style head count), SWA blocks of 16 tokens.
inline LayerConfig tiny_layer(int ratio, int max_model_len) {
  LayerConfig c;
  c.ratio = ratio;
  c.window = 4;
  c.topk = 8;
  c.heads = 64;
  c.max_model_len = max_model_len;
  c.swa_block_tokens = 16;
  return c;
}

// Declare first in a test so it is destroyed after the graphs and arenas ordered on it.
struct Device {
  cudaStream_t s{};
  Device() { GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Device() { cudaStreamDestroy(s); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
};

inline std::vector<std::uint16_t> download(const std::uint16_t* d, std::size_t n, cudaStream_t s) {
  std::vector<std::uint16_t> h(n);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(h.data(), d, n * 2, cudaMemcpyDeviceToHost, s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  return h;
}

// ||gpu - ref|| / ||ref|| over the whole output (bf16 operands: expect ~1e-3..1e-2).
inline double rel_error(const std::vector<std::uint16_t>& gpu, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = ref::bf16_to_float(gpu[i]);
    num += (g - ref[i]) * (g - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline constexpr double kTolerance = 2e-2;  // bf16 MMA operands + bf16 output vs the fp32 reference

}  // namespace graphsafe::ds4::test
