// DS4 sparse attention: the split merge through the scratch (splits other than a cluster's 2 or 4,
// the mma.sync engine, or a refused cluster launch). Same arithmetic as the cluster merge
// (merge.cuh), splits in index order.
#include "config.cuh"
#include "params.cuh"

namespace graphsafe::ds4::cuda::attention {
namespace {

// Merge the splits of one (request, head): 128 threads x 4 dims, splits in index order.
__global__ void __launch_bounds__(128) combine_splits_kernel(const float* part_o, const float* part_ml,
                                                             const float* sink, std::uint16_t* out,
                                                             int H, int splits) {
  const int b = blockIdx.x / H, h = blockIdx.x % H;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    const long long k = (static_cast<long long>(b) * splits + s) * H + h;
    if (part_ml[k * 2 + 1] > 0.f) M = fmaxf(M, part_ml[k * 2]);
  }
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float L = 0.f;
  for (int s = 0; s < splits; ++s) {
    const long long k = (static_cast<long long>(b) * splits + s) * H + h;
    const float l = part_ml[k * 2 + 1];
    if (!(l > 0.f)) continue;
    const float w = exp2f(part_ml[k * 2] - M);
    L = __fmaf_rn(l, w, L);
    const float4 v = reinterpret_cast<const float4*>(part_o + k * kHeadDim)[threadIdx.x];
    acc.x = __fmaf_rn(v.x, w, acc.x);
    acc.y = __fmaf_rn(v.y, w, acc.y);
    acc.z = __fmaf_rn(v.z, w, acc.z);
    acc.w = __fmaf_rn(v.w, w, acc.w);
  }
  float inv = 0.f;
  if (L > 0.f) inv = 1.f / (L + (sink != nullptr ? exp2f(sink[h] * kLog2e - M) : 0.f));
  uint2 r;
  r.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  r.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(out + (static_cast<long long>(b) * H + h) * kHeadDim)[threadIdx.x] = r;
}

}  // namespace

void launch_combine(const Params& p, const AttentionCommon& c, cudaStream_t stream) {
  combine_splits_kernel<<<c.batch * c.heads, 128, 0, stream>>>(p.part_o, p.part_ml, c.sink, c.out, c.heads, c.splits);
  check_launch("combine_splits_kernel");
}

}  // namespace graphsafe::ds4::cuda::attention
