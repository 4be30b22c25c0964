// Compressor (docs/ds4_model.md §2.2): per-channel gated pooling of the fp32 token state into one compressed
// row, RMSNorm, rope at position j*ratio, quantize into the compressed cache. One CTA per output row.
// Twin of ref::compress_row + ref::compress_finalize + ref::quantize_insert. The pooling runs in the
// reference's slot order with unfused multiply/add, so it matches the reference up to expf's last
// bit; the RMSNorm sum is a tree reduction (fp32 reduction order differs from the sequential one).
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) compress_kernel(
    const float* kv, const float* score, int ratio, const std::int64_t* state_base,
    const std::int32_t* row_index, const std::int32_t* slots, const float* norm_w, float theta,
    float eps, CacheView cache) {
  __shared__ float x[kHeadDim];
  __shared__ float part[kThreads / 32];
  const int i = blockIdx.x, tid = threadIdx.x;
  const long long slot = slots[i];
  if (!cache.valid(slot)) return;  // whole block agrees
  const int j = row_index[i];
  if (j < 0) return;
  const long long base = state_base[i];
  const int c = ratio == 4 ? 2 : 1;
  const long long rowlen = static_cast<long long>(c) * kHeadDim;

  float ss = 0.f;
  for (int d = tid; d < kHeadDim; d += kThreads) {
    // slot order as the reference: C4 previous group (channels [0,512)) unless j == 0, then the
    // current group (channels [512,1024)); otherwise the current group's ratio tokens.
    auto at = [&](int s) -> long long {
      if (ratio == 4) {
        if (j > 0) {
          if (s < 4) return (base + 4LL * j - 4 + s) * rowlen + d;
          return (base + 4LL * j + (s - 4)) * rowlen + kHeadDim + d;
        }
        return (base + 4LL * j + s) * rowlen + kHeadDim + d;
      }
      return (base + static_cast<long long>(ratio) * j + s) * rowlen + d;
    };
    const int nslots = ratio == 4 ? (j > 0 ? 8 : 4) : ratio;
    float m = -INFINITY;
    for (int s = 0; s < nslots; ++s) {
      const float g = score[at(s)];
      if (g > m) m = g;
    }
    float den = 0.f, num = 0.f;
    for (int s = 0; s < nslots; ++s) {
      const long long a = at(s);
      const float w = expf(__fsub_rn(score[a], m));
      den = __fadd_rn(den, w);
      num = __fadd_rn(num, __fmul_rn(w, kv[a]));
    }
    const float v = __fdiv_rn(num, den);
    x[d] = v;
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((tid & 31) == 0) part[tid >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) tot += part[w];
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(tot, static_cast<float>(kHeadDim)), eps)));
  for (int d = tid; d < kHeadDim; d += kThreads) x[d] = __fmul_rn(__fmul_rn(x[d], inv_rms), norm_w[d]);
  __syncthreads();
  if (tid < kRopeDim / 2) {
    const double inv_freq = pow(static_cast<double>(theta), -2.0 * tid / kRopeDim);
    const double angle = static_cast<double>(j) * ratio * inv_freq;
    const float cs = static_cast<float>(cos(angle));
    const float sn = static_cast<float>(sin(angle));
    const float a = x[kNopeDim + 2 * tid], b = x[kNopeDim + 2 * tid + 1];
    x[kNopeDim + 2 * tid] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    x[kNopeDim + 2 * tid + 1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  }
  __syncthreads();
  if (tid < 32) {
    quantize_row_warp(static_cast<const float*>(x), const_cast<std::uint8_t*>(cache.data(slot)),
                      const_cast<std::uint8_t*>(cache.scales(slot)), tid);
  }
}

}  // namespace

void compress_insert(const float* kv_state, const float* score_state, int ratio,
                     const std::int64_t* state_base, const std::int32_t* row_index,
                     const std::int32_t* slots, int n, const float* norm_weight, float rope_theta,
                     float eps, PagedCache cache, cudaStream_t stream) {
  const char* fn = "compress_insert";
  if (ratio != 4 && ratio != 128) bad_arg(fn, "ratio", ratio, "4 (C4) or 128 (C128); C1 has no compressor");
  if (n < 0) bad_arg(fn, "n", n, "n >= 0");
  if (n == 0) return;
  require_ptr(fn, "kv_state", kv_state);
  require_ptr(fn, "score_state", score_state);
  require_ptr(fn, "state_base", state_base);
  require_ptr(fn, "row_index", row_index);
  require_ptr(fn, "slots", slots);
  require_ptr(fn, "norm_weight", norm_weight);
  require_cache(fn, "cache", cache);
  if (!(rope_theta > 0.f)) bad_arg(fn, "rope_theta", static_cast<long long>(rope_theta), "> 0");
  compress_kernel<<<n, kThreads, 0, stream>>>(kv_state, score_state, ratio, state_base, row_index, slots,
                                              norm_weight, rope_theta, eps, view_of(cache));
  check_launch(fn);
}

}  // namespace graphsafe::ds4::cuda
