// DS4 sparse decode attention with per-head sinks (SPEC.md 2.5, 7.1), on tensor cores.
//
// One CTA = (split, request b, group of 64 heads); 256 threads = 8 warps. The CTA keeps the 64
// heads' queries (64 x 512 bf16) in shared memory and streams the request's attended rows in tiles
// of 64 rows (bf16 in shared memory), computing per tile
//     S = Q K^T   (64 heads x 64 rows, k = 512)       warp w: heads 16*(w%4).., rows 32*(w/4)..
//     online softmax per head (row max exchanged through shared memory, base-2 exponentials)
//     O += P V    (64 heads x 512 dims, k = 64 rows)  warp w: heads 32*(w/4).., dims 128*(w%4)..
// with mma.sync m16n8k16 bf16 x bf16 -> fp32 and ldmatrix fragments; V = K (all 512 dims).
// The request's tiles are split evenly over `splits` CTAs (flash-decoding) so that a single request
// still fills the GPU; a combine kernel merges the partial (m, l, O) in split order (deterministic).
//
// Variant A (paged-direct) loads each row's 576 data bytes + 8 scale bytes from the fp8 paged caches
// with cp.async into a double-buffered raw stage, then all threads dequantize the tile into bf16
// (exact: e4m3 * 2^k fits bf16). Variant B (workspace) cp.asyncs bf16 rows from the gather
// workspace straight into a double-buffered K tile. Both feed the same tile computation, so for the
// same rows in the same order they produce bitwise identical output.
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kTileRows = 64;
constexpr int kGroupHeads = 64;
constexpr int kQStride = kHeadDim + 8;        // bf16 elements per smem row (1040 B: conflict-free ldmatrix)
constexpr int kPStride = kTileRows + 8;       // 144 B
constexpr int kRawStride = 592;               // 576 data + 8 scales + 8 pad (16-B multiple)
constexpr int kQBytes = kGroupHeads * kQStride * 2;        // 66560
constexpr int kKBytes = kTileRows * kQStride * 2;          // 66560
constexpr int kPBytes = kGroupHeads * kPStride * 2;        // 9216
constexpr int kRawBytes = kTileRows * kRawStride;          // 37888
constexpr int kMiscBytes = 3 * 2 * 64 * 4;                 // red, lsum, vld
constexpr float kLog2e = 1.4426950408889634f;

template <bool kPaged>
__host__ __device__ constexpr int smem_bytes() {
  return kQBytes + (kPaged ? kKBytes + 2 * kRawBytes : 2 * kKBytes) + kPBytes + kMiscBytes;
}
static_assert(smem_bytes<true>() <= 227 * 1024, "paged attention smem over the sm_90 limit");
static_assert(smem_bytes<false>() <= 227 * 1024, "workspace attention smem over the sm_90 limit");

struct KParams {
  int B, H, splits;
  float scale_log2;  // scale * log2(e)
  const std::uint16_t* q;
  const float* sink;
  std::uint16_t* out;
  float* part_o;     // [B, splits, H, 512]
  float* part_ml;    // [B, splits, H, 2]
  // paged
  CacheView swa, cmp;
  const std::int32_t *swa_idx, *swa_lens, *cmp_idx, *cmp_lens;
  int swa_width, cmp_width;
  // workspace
  const std::uint16_t* ws;
  long long ws_rows;
  const std::int32_t *idx, *lens;
  int width;
};

template <bool kPaged>
__global__ void __launch_bounds__(kThreads, 1) sparse_attention_kernel(const KParams p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  std::uint16_t* Qs = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* Ks = reinterpret_cast<std::uint16_t*>(smem + kQBytes);
  constexpr int kKTotal = kPaged ? kKBytes : 2 * kKBytes;
  std::uint16_t* Ps = reinterpret_cast<std::uint16_t*>(smem + kQBytes + kKTotal);
  std::uint8_t* Raw = smem + kQBytes + kKTotal + kPBytes;  // paged only
  float* red = reinterpret_cast<float*>(smem + smem_bytes<kPaged>() - kMiscBytes);  // [2][64]
  float* lsum = red + 128;                                                          // [2][64]
  int* vld = reinterpret_cast<int*>(lsum + 128);                                    // [2][64]

  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kGroupHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  int n_cmp = 0, T = 0;
  if constexpr (kPaged) {
    if (p.cmp_idx != nullptr) n_cmp = min(max(p.cmp_lens[b], 0), p.cmp_width);
    T = n_cmp + min(max(p.swa_lens[b], 0), p.swa_width);
  } else {
    T = min(max(p.lens[b], 0), p.width);
  }
  const int ntiles = (T + kTileRows - 1) / kTileRows;
  const int tps = (ntiles + p.splits - 1) / p.splits;
  const int t_begin = split * tps, t_end = min(ntiles, t_begin + tps);
  const long long part = (static_cast<long long>(b) * p.splits + split) * p.H + head0;

  if (t_begin >= t_end) {  // nothing to attend in this split
    if (p.splits == 1) {
      uint4* o = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0) * kHeadDim);
      for (int i = tid; i < kGroupHeads * kHeadDim / 8; i += kThreads) o[i] = make_uint4(0, 0, 0, 0);
    } else if (tid < kGroupHeads) {
      p.part_ml[(part + tid) * 2 + 0] = -INFINITY;
      p.part_ml[(part + tid) * 2 + 1] = 0.f;
    }
    return;
  }

  // ---- queries: 64 heads x 64 chunks of 16 B
  {
    const std::uint16_t* qg = p.q + (static_cast<long long>(b) * p.H + head0) * kHeadDim;
    for (int c = tid; c < kGroupHeads * 64; c += kThreads) {
      const int r = c >> 6, ch = c & 63;
      cp_async16(Qs + r * kQStride + ch * 8, qg + r * kHeadDim + ch * 8, true);
    }
  }

  // ---- tile loader: warp w loads rows 8w .. 8w+7 of tile t into stage st
  auto issue_tile = [&](int t, int st) {
    const int r = warp * 8 + (lane & 7);
    const int i = t * kTileRows + r;
    bool valid = false;
    if constexpr (kPaged) {
      const std::uint8_t* dptr = p.swa.base;
      const std::uint8_t* sptr = p.swa.base;
      if (i < n_cmp) {
        const long long slot = p.cmp_idx[static_cast<long long>(b) * p.cmp_width + i];
        valid = p.cmp.valid(slot);
        if (valid) { dptr = p.cmp.data(slot); sptr = p.cmp.scales(slot); }
      } else if (i < T) {
        const long long slot = p.swa_idx[static_cast<long long>(b) * p.swa_width + (i - n_cmp)];
        valid = p.swa.valid(slot);
        if (valid) { dptr = p.swa.data(slot); sptr = p.swa.scales(slot); }
      }
      if (lane < 8) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint8_t* raw = Raw + st * kRawBytes;
#pragma unroll
      for (int rr = 0; rr < 8; ++rr) {
        const std::uint8_t* d = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dptr), rr));
        const std::uint8_t* s = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(sptr), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint8_t* dst = raw + (warp * 8 + rr) * kRawStride;
        cp_async16(dst + lane * 16, d + lane * 16, v);
        if (lane < 4) cp_async16(dst + (32 + lane) * 16, d + (32 + lane) * 16, v);
        else if (lane == 4) cp_async8(dst + kTokenDataBytes, s, v);
      }
    } else {
      const std::uint16_t* src = p.ws;
      if (i < T) {
        const long long ix = p.idx[static_cast<long long>(b) * p.width + i];
        valid = ix >= 0 && ix < p.ws_rows;
        if (valid) src = p.ws + ix * kHeadDim;
      }
      if (lane < 8) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint16_t* kt = Ks + st * (kTileRows * kQStride);
#pragma unroll
      for (int rr = 0; rr < 8; ++rr) {
        const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint16_t* dst = kt + (warp * 8 + rr) * kQStride;
        cp_async16(dst + lane * 8, s + lane * 8, v);
        cp_async16(dst + (lane + 32) * 8, s + (lane + 32) * 8, v);
      }
    }
  };

  issue_tile(t_begin, 0);
  cp_async_commit();

  const int sh = (warp & 3) * 16;   // S: heads sh .. sh+15
  const int sr = (warp >> 2) * 32;  // S: tile rows sr .. sr+31
  const int ph = (warp >> 2) * 32;  // PV: heads ph .. ph+31
  const int pd = (warp & 3) * 128;  // PV: dims pd .. pd+127
  const int qr = lane >> 2, qc = 2 * (lane & 3);

  float m_s[2] = {-INFINITY, -INFINITY}, l_s[2] = {0.f, 0.f};
  float m_pv[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float o[2][16][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[a][n][e] = 0.f;

  for (int t = t_begin; t < t_end; ++t) {
    const int st = (t - t_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile t landed everywhere; every warp is done with tile t-1
    if (t + 1 < t_end) {
      issue_tile(t + 1, st ^ 1);
      cp_async_commit();
    }
    const std::uint16_t* Kt;
    if constexpr (kPaged) {
      const std::uint8_t* raw = Raw + st * kRawBytes;
      for (int item = tid; item < kTileRows * 36; item += kThreads) {
        const int r = item / 36, c = item - r * 36;
        const uint4 w = *reinterpret_cast<const uint4*>(raw + r * kRawStride + c * 16);
        if (c < 28) {
          const float sc = ue8m0_to_float(raw[r * kRawStride + kTokenDataBytes + (c >> 2)]);
          uint4 lo, hi;
          dequant4(w.x, sc, lo.x, lo.y);
          dequant4(w.y, sc, lo.z, lo.w);
          dequant4(w.z, sc, hi.x, hi.y);
          dequant4(w.w, sc, hi.z, hi.w);
          uint4* dst = reinterpret_cast<uint4*>(Ks + r * kQStride + c * 16);
          dst[0] = lo;
          dst[1] = hi;
        } else {
          *reinterpret_cast<uint4*>(Ks + r * kQStride + kNopeDim + (c - 28) * 8) = w;
        }
      }
      __syncthreads();
      Kt = Ks;
    } else {
      Kt = Ks + st * (kTileRows * kQStride);
    }
    const int* vt = vld + st * 64;

    // ---- S = Q K^T for heads sh.., rows sr..
    float sacc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[n][e] = 0.f;
    {
      const std::uint16_t* qa = Qs + (sh + (lane & 15)) * kQStride + (lane >> 4) * 8;
      const std::uint16_t* kb = Kt + (sr + (lane & 7) + ((lane >> 4) << 3)) * kQStride + ((lane >> 3) & 1) * 8;
#pragma unroll 8
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        std::uint32_t a[4], b0[4], b1[4];
        ldmatrix_x4(a, qa + kk * 16);
        ldmatrix_x4(b0, kb + kk * 16);
        ldmatrix_x4(b1, kb + 16 * kQStride + kk * 16);
        mma_bf16(sacc[0], a, b0[0], b0[1]);
        mma_bf16(sacc[1], a, b0[2], b0[3]);
        mma_bf16(sacc[2], a, b1[0], b1[1]);
        mma_bf16(sacc[3], a, b1[2], b1[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = sr + n * 8 + qc + (e & 1);
        const float s = vt[col] ? sacc[n][e] * p.scale_log2 : -INFINITY;
        sacc[n][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
    }
    if ((lane & 3) == 0) {
      red[(warp >> 2) * 64 + sh + qr] = mx[0];
      red[(warp >> 2) * 64 + sh + qr + 8] = mx[1];
    }
    __syncthreads();

    // ---- softmax numerators -> P (bf16, smem); running sums
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = sh + qr + 8 * j;
      const float mn = fmaxf(m_s[j], fmaxf(red[h], red[64 + h]));
      const float mu = mn == -INFINITY ? 0.f : mn;
      l_s[j] *= exp2f(m_s[j] - mu);
      m_s[j] = mn;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float p0 = exp2f(sacc[n][2 * j] - mu), p1 = exp2f(sacc[n][2 * j + 1] - mu);
        sum += p0 + p1;
        *reinterpret_cast<std::uint32_t*>(Ps + h * kPStride + sr + n * 8 + qc) = pack_bf16x2(p0, p1);
      }
      l_s[j] += sum;
    }
    // ---- rescale O for the PV rows
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = ph + a * 16 + qr + 8 * j;
        const float mn = fmaxf(m_pv[2 * a + j], fmaxf(red[h], red[64 + h]));
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m_pv[2 * a + j] - mu);
        m_pv[2 * a + j] = mn;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          o[a][n][2 * j] *= alpha;
          o[a][n][2 * j + 1] *= alpha;
        }
      }
    __syncthreads();

    // ---- O += P V
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks) {
      std::uint32_t a0[4], a1[4];
      ldmatrix_x4(a0, Ps + (ph + (lane & 15)) * kPStride + ks * 16 + (lane >> 4) * 8);
      ldmatrix_x4(a1, Ps + (ph + 16 + (lane & 15)) * kPStride + ks * 16 + (lane >> 4) * 8);
      const std::uint16_t* vb = Kt + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kQStride + pd + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < 8; ++np) {
        std::uint32_t bb[4];
        ldmatrix_x4_trans(bb, vb + np * 16);
        mma_bf16(o[0][2 * np], a0, bb[0], bb[1]);
        mma_bf16(o[0][2 * np + 1], a0, bb[2], bb[3]);
        mma_bf16(o[1][2 * np], a1, bb[0], bb[1]);
        mma_bf16(o[1][2 * np + 1], a1, bb[2], bb[3]);
      }
    }
  }

  // ---- row sums of the S warps -> smem
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float l = l_s[j];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((lane & 3) == 0) lsum[(warp >> 2) * 64 + sh + qr + 8 * j] = l;
  }
  __syncthreads();

#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = ph + a * 16 + qr + 8 * j;
      const float l = lsum[h] + lsum[64 + h];
      const float m = m_pv[2 * a + j];
      if (p.splits == 1) {
        float inv = 0.f;
        if (l > 0.f) {
          const float sterm = p.sink != nullptr ? exp2f(p.sink[head0 + h] * kLog2e - m) : 0.f;
          inv = 1.f / (l + sterm);
        }
        std::uint16_t* orow = p.out + (static_cast<long long>(b) * p.H + head0 + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<std::uint32_t*>(orow + n * 8) =
              pack_bf16x2(o[a][n][2 * j] * inv, o[a][n][2 * j + 1] * inv);
      } else {
        float* orow = p.part_o + (part + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[a][n][2 * j], o[a][n][2 * j + 1]);
        if ((warp & 3) == 0 && (lane & 3) == 0) {
          p.part_ml[(part + h) * 2 + 0] = m;
          p.part_ml[(part + h) * 2 + 1] = l;
        }
      }
    }
}

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
    L += l * w;
    const float4 v = reinterpret_cast<const float4*>(part_o + k * kHeadDim)[threadIdx.x];
    acc.x += v.x * w;
    acc.y += v.y * w;
    acc.z += v.z * w;
    acc.w += v.w * w;
  }
  float inv = 0.f;
  if (L > 0.f) inv = 1.f / (L + (sink != nullptr ? exp2f(sink[h] * kLog2e - M) : 0.f));
  uint2 r;
  r.x = pack_bf16x2(acc.x * inv, acc.y * inv);
  r.y = pack_bf16x2(acc.z * inv, acc.w * inv);
  reinterpret_cast<uint2*>(out + (static_cast<long long>(b) * H + h) * kHeadDim)[threadIdx.x] = r;
}

template <bool kPaged>
void set_smem_attribute() {
  static std::once_flag once[64];
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::call_once(once[dev & 63], [] {
    check_cuda(cudaFuncSetAttribute(sparse_attention_kernel<kPaged>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<kPaged>()),
               "cudaFuncSetAttribute(sparse_attention, max dynamic smem)");
  });
}

void check_common(const char* fn, const AttentionCommon& c) {
  require_batch(fn, c.batch);
  require_heads(fn, c.heads);
  require_ptr(fn, "q", c.q);
  require_ptr(fn, "out", c.out);
  if (c.splits < 1 || c.splits > 1024) bad_arg(fn, "splits", c.splits, "1 .. 1024");
  if (c.splits > 1) require_ptr(fn, "scratch (splits > 1)", c.scratch);
  if (!(c.scale > 0.f) || !std::isfinite(c.scale)) bad_arg(fn, "scale (x1e6)", static_cast<long long>(c.scale * 1e6), "a finite positive value (512^-0.5)");
}

template <bool kPaged>
void launch(KParams& kp, const AttentionCommon& c, cudaStream_t stream, const char* name) {
  kp.B = c.batch;
  kp.H = c.heads;
  kp.splits = c.splits;
  kp.scale_log2 = c.scale * kLog2e;
  kp.q = c.q;
  kp.sink = c.sink;
  kp.out = c.out;
  kp.part_o = static_cast<float*>(c.scratch);
  kp.part_ml = c.scratch != nullptr
                   ? static_cast<float*>(c.scratch) + static_cast<std::size_t>(c.batch) * c.splits * c.heads * kHeadDim
                   : nullptr;
  set_smem_attribute<kPaged>();
  const dim3 grid(c.splits, c.batch, c.heads / kGroupHeads);
  sparse_attention_kernel<kPaged><<<grid, kThreads, smem_bytes<kPaged>(), stream>>>(kp);
  check_launch(name);
  if (c.splits > 1) {
    combine_splits_kernel<<<c.batch * c.heads, 128, 0, stream>>>(kp.part_o, kp.part_ml, c.sink, c.out,
                                                                 c.heads, c.splits);
    check_launch("combine_splits_kernel");
  }
}

}  // namespace

int device_sm_count() {
  static int cached[64] = {};
  int dev = 0;
  detail::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int& v = cached[dev & 63];
  if (v == 0) {
    int n = 0;
    detail::check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
                       "cudaDeviceGetAttribute(MultiProcessorCount)");
    v = n;
  }
  return v;
}

int choose_splits(int batch, int heads, int max_rows_per_request, int num_sms) {
  detail::require_batch("choose_splits", batch);
  detail::require_heads("choose_splits", heads);
  const int ctas = batch * (heads / kGroupHeads);
  const int tiles = std::max(1, (max_rows_per_request + kTileRows - 1) / kTileRows);
  int s = std::max(1, num_sms / ctas);
  return std::min(s, tiles);
}

std::size_t sparse_attention_scratch_bytes(int batch, int heads, int splits) {
  if (splits <= 1) return 0;
  return static_cast<std::size_t>(batch) * splits * heads * (kHeadDim + 2) * sizeof(float);
}

void sparse_attention_paged(const PagedAttentionArgs& a, cudaStream_t stream) {
  const char* fn = "sparse_attention_paged";
  check_common(fn, a.c);
  require_cache(fn, "swa", a.swa);
  require_ptr(fn, "swa_idx", a.swa_idx);
  require_ptr(fn, "swa_lens", a.swa_lens);
  if (a.swa_width < 0) bad_arg(fn, "swa_width", a.swa_width, ">= 0");
  KParams kp{};
  kp.swa = view_of(a.swa);
  kp.swa_idx = a.swa_idx;
  kp.swa_lens = a.swa_lens;
  kp.swa_width = a.swa_width;
  if (a.cmp_idx != nullptr) {
    require_cache(fn, "cmp", a.cmp);
    require_ptr(fn, "cmp_lens", a.cmp_lens);
    if (a.cmp_width < 0) bad_arg(fn, "cmp_width", a.cmp_width, ">= 0");
    kp.cmp = view_of(a.cmp);
    kp.cmp_idx = a.cmp_idx;
    kp.cmp_lens = a.cmp_lens;
    kp.cmp_width = a.cmp_width;
  } else {
    kp.cmp = kp.swa;
  }
  launch<true>(kp, a.c, stream, "sparse_attention_kernel<paged>");
}

void sparse_attention_workspace(const WorkspaceAttentionArgs& a, cudaStream_t stream) {
  const char* fn = "sparse_attention_workspace";
  check_common(fn, a.c);
  require_ptr(fn, "ws", a.ws);
  require_ptr(fn, "idx", a.idx);
  require_ptr(fn, "lens", a.lens);
  if (a.width < 0) bad_arg(fn, "width", a.width, ">= 0");
  if (a.ws_rows < 0) bad_arg(fn, "ws_rows", a.ws_rows, ">= 0");
  if (reinterpret_cast<std::uintptr_t>(a.ws) % 16 != 0) bad_arg(fn, "ws % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.ws) % 16), "0");
  KParams kp{};
  kp.ws = a.ws;
  kp.ws_rows = a.ws_rows;
  kp.idx = a.idx;
  kp.lens = a.lens;
  kp.width = a.width;
  launch<false>(kp, a.c, stream, "sparse_attention_kernel<workspace>");
}

}  // namespace graphsafe::ds4::cuda
