// DS4 sparse decode attention with per-head sinks (SPEC.md 2.5, 7.1), on tensor cores.
//
// One CTA = (split, request b, group of 64 heads). The CTA keeps the 64 heads' queries (64 x 512
// bf16) in shared memory and streams the request's attended rows in tiles of 64 rows (bf16 in shared
// memory), computing per tile
//     S = Q K^T   (64 heads x 64 rows, k = 512)
//     online softmax per head (base-2 exponentials)
//     O += P V    (64 heads x 512 dims, k = 64 rows), V = K (all 512 dims)
// bf16 operands, fp32 accumulation, bf16 P, fp32 (m, l) per head, bf16 output.
//
// Two tile engines with the same numerics, chosen by GRAPHSAFE_DS4_ATTENTION (once per process):
//  * ws (default, sm_90a): warp-specialized, 384 threads -- a producer warpgroup gathers and
//    dequantizes the rows into a double-buffered bf16 tile; of two consumer warpgroups the math
//    one runs S (one chain of 32 wgmma m64n64k16) and the softmax and hands P to the PV one, and
//    each runs PV for its 256 dims (wgmma m64n128k16 pairs). See the kernel.
//  * mma_sync: m16n8k16 + ldmatrix; warp w computes S for heads 16*(w%4).., rows 16*(w/4).. and O
//    for heads 32*(w/8).., dims 64*(w%8)... SASS: HMMA. Runs on GPUs without sm_90a (and is tested
//    on the H200 through GRAPHSAFE_DS4_ATTENTION=mma_sync: ctest test_ds4_kernels_mma_sync).
//
// Split-K (flash-decoding): the request's tiles are split evenly over `splits` CTAs so that a single
// request still fills the GPU. With 2 or 4 splits (ws) the splits of one (request, head group) form
// a thread-block cluster and merge over distributed shared memory (heads dealt to the ranks,
// pushed); otherwise (or with GRAPHSAFE_DS4_CLUSTER=0) partials go to the caller's scratch and a
// combine kernel merges them. Every merge runs in split order with the combine kernel's arithmetic:
// results are deterministic run to run.
//
// Variant A (paged-direct) reads each row's 576 data bytes + 8 scale bytes from the fp8 paged caches
// and dequantizes them into bf16 (exact: e4m3 * 2^k fits bf16). Variant B (workspace) copies bf16
// rows from the gather workspace. Both feed the same tile computation, so for the same rows in the
// same order they produce bitwise identical output (checked by the tests and the benchmark).
//
// Measured on one H200 (bench/ds4_attention_bench.cu, B=64, H=64, 43 layers, graph replay; see
// docs/benchmarks.md): ws C4 23.9-24.1 us/layer, C128 22.5-22.8, C1 11.8-11.9 -- 2.97-2.98x the
// physical bound at C4 (session 11, three runs). Where the time goes at C4 (timeline build,
// -DGRAPHSAFE_DS4_TIMELINE, CTAs with 5 tiles; bench/results/ds4_ws_session11_h200.txt): ~2.9 us
// before the first tile (queries and the first rows come from HBM, all CTAs at once), ~2.4 us per
// 64-row tile set by the math warpgroup (S 1.2, softmax + PV 0.9; the producer waits for EMPTY),
// then the split merge (a cluster barrier, the 64 KB st.async push into the peer in 4 chunks, each
// merged and stored while the next is in flight). S runs at about half the tensor pipe's rate
// while the producer stores the next tile (bench/wgmma_probe.cu's pipeline probe reproduces it).
// The named barriers use the unaligned PTX forms (barrier.sync / barrier.arrive): the roles reach
// one barrier generation from different code (see bar_sync).

#include <graphsafe/ds4/detail/timeline.hpp>
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;
namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kRowGroups = 4;  // S warps per head group (16 rows each)
constexpr int kTileRows = 64;
constexpr int kGroupHeads = 64;
constexpr int kQStride = kHeadDim + 8;        // bf16 elements per smem row (1040 B: conflict-free ldmatrix)
constexpr int kPStride = kTileRows + 8;       // 144 B
constexpr int kRawStride = 592;               // 576 data + 8 scales + 8 pad (16-B multiple)
constexpr int kQBytes = kGroupHeads * kQStride * 2;        // 66560
constexpr int kKBytes = kTileRows * kQStride * 2;          // 66560
constexpr int kPBytes = kGroupHeads * kPStride * 2;        // 9216
constexpr int kRawBytes = kTileRows * kRawStride;          // 37888
constexpr int kMiscBytes = (2 * kRowGroups + 2) * 64 * 4;   // red[4][64], lsum[4][64], vld[2][64]
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
  int cluster;       // wgmma kernel: 1 = the splits of a (request, head group) form a cluster
  int probe;         // ws kernel, diagnostics only (GRAPHSAFE_DS4_WS_PROBE=1: no cache rows; the
                     // paged producer reads its zero row instead, L1 hits, since session 7; the
                     // workspace producer skips the loads). No MMA-skip probe any more: a runtime
                     // branch around wgmma made ptxas inject a warpgroup.arrive before every wgmma
                     // (C7519), serializing the shipped kernel.
};

template <bool kPaged>
__global__ void __launch_bounds__(kThreads, 1) sparse_attention_kernel(const KParams p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  std::uint16_t* Qs = reinterpret_cast<std::uint16_t*>(smem);
  std::uint16_t* Ks = reinterpret_cast<std::uint16_t*>(smem + kQBytes);
  constexpr int kKTotal = kPaged ? kKBytes : 2 * kKBytes;
  std::uint16_t* Ps = reinterpret_cast<std::uint16_t*>(smem + kQBytes + kKTotal);
  std::uint8_t* Raw = smem + kQBytes + kKTotal + kPBytes;  // paged only
  float* red = reinterpret_cast<float*>(smem + smem_bytes<kPaged>() - kMiscBytes);  // [4][64]
  float* lsum = red + kRowGroups * 64;                                              // [4][64]
  int* vld = reinterpret_cast<int*>(lsum + kRowGroups * 64);                        // [2][64]

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

  // ---- tile loader: warp w loads rows 4w .. 4w+3 of tile t into stage st
  auto issue_tile = [&](int t, int st) {
    const int r = warp * 4 + (lane & 3);
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
      if (lane < 4) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint8_t* raw = Raw + st * kRawBytes;
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const std::uint8_t* d = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dptr), rr));
        const std::uint8_t* s = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(sptr), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint8_t* dst = raw + (warp * 4 + rr) * kRawStride;
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
      if (lane < 4) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint16_t* kt = Ks + st * (kTileRows * kQStride);
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint16_t* dst = kt + (warp * 4 + rr) * kQStride;
        cp_async16(dst + lane * 8, s + lane * 8, v);
        cp_async16(dst + (lane + 32) * 8, s + (lane + 32) * 8, v);
      }
    }
  };

  issue_tile(t_begin, 0);
  cp_async_commit();

  const int sh = (warp & 3) * 16;   // S: heads sh .. sh+15
  const int rg = warp >> 2;         // S: row group, tile rows sr .. sr+15
  const int sr = rg * 16;
  const int ph = (warp >> 3) * 32;  // PV: heads ph .. ph+31
  const int pd = (warp & 7) * 64;   // PV: dims pd .. pd+63
  const int qr = lane >> 2, qc = 2 * (lane & 3);

  float m_s[2] = {-INFINITY, -INFINITY}, l_s[2] = {0.f, 0.f};
  float m_pv[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float o[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int n = 0; n < 8; ++n)
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
#pragma unroll 1
      for (int item = tid; item < kTileRows * 36; item += kThreads) {
        const int r = item / 36, c = item - r * 36;
        const uint4 w = *reinterpret_cast<const uint4*>(raw + r * kRawStride + c * 16);
        if (c < 28) {
          uint4 lo, hi;
          dequant16(w, raw[r * kRawStride + kTokenDataBytes + (c >> 2)], lo, hi);
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
    float sacc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[n][e] = 0.f;
    {
      const std::uint16_t* qa = Qs + (sh + (lane & 15)) * kQStride + (lane >> 4) * 8;
      const std::uint16_t* kb = Kt + (sr + (lane & 7) + ((lane >> 4) << 3)) * kQStride + ((lane >> 3) & 1) * 8;
#pragma unroll 4
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        std::uint32_t a[4], b0[4];
        ldmatrix_x4(a, qa + kk * 16);
        ldmatrix_x4(b0, kb + kk * 16);
        mma_bf16(sacc[0], a, b0[0], b0[1]);
        mma_bf16(sacc[1], a, b0[2], b0[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
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
      red[rg * 64 + sh + qr] = mx[0];
      red[rg * 64 + sh + qr + 8] = mx[1];
    }
    __syncthreads();

    // ---- softmax numerators -> P (bf16, smem); running sums
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = sh + qr + 8 * j;
      const float mn = fmaxf(m_s[j], fmaxf(fmaxf(red[h], red[64 + h]), fmaxf(red[128 + h], red[192 + h])));
      const float mu = mn == -INFINITY ? 0.f : mn;
      l_s[j] *= exp2f(m_s[j] - mu);
      m_s[j] = mn;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
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
        const float mn = fmaxf(m_pv[2 * a + j], fmaxf(fmaxf(red[h], red[64 + h]), fmaxf(red[128 + h], red[192 + h])));
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m_pv[2 * a + j] - mu);
        m_pv[2 * a + j] = mn;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
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
      for (int np = 0; np < 4; ++np) {
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
    if ((lane & 3) == 0) lsum[rg * 64 + sh + qr + 8 * j] = l;
  }
  __syncthreads();

#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = ph + a * 16 + qr + 8 * j;
      const float l = (lsum[h] + lsum[64 + h]) + (lsum[128 + h] + lsum[192 + h]);
      const float m = m_pv[2 * a + j];
      if (p.splits == 1) {
        float inv = 0.f;
        if (l > 0.f) {
          const float sterm = p.sink != nullptr ? exp2f(p.sink[head0 + h] * kLog2e - m) : 0.f;
          inv = 1.f / (l + sterm);
        }
        std::uint16_t* orow = p.out + (static_cast<long long>(b) * p.H + head0 + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<std::uint32_t*>(orow + n * 8) =
              pack_bf16x2(o[a][n][2 * j] * inv, o[a][n][2 * j + 1] * inv);
      } else {
        float* orow = p.part_o + (part + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[a][n][2 * j], o[a][n][2 * j + 1]);
        if ((warp & 7) == 0 && (lane & 3) == 0) {
          p.part_ml[(part + h) * 2 + 0] = m;
          p.part_ml[(part + h) * 2 + 1] = l;
        }
      }
    }
}

// ================================================================================================
// Shared-memory layout of the wgmma kernel below: Q, K and P live in the no-swizzle canonical layout,
// 8-row x 16-byte core matrices, element (r, k) at (r/8)*SBO + (k/8)*128 + (r%8)*16 + (k%8)*2. The K
// tile is read K-major for S = Q K^T and MN-major for O += P V.
constexpr int kWgQBytes = kGroupHeads * kHeadDim * 2;  // 65536
constexpr int kWgKBytes = kTileRows * kHeadDim * 2;    // 65536
constexpr int kWgRowSbo = (kHeadDim / 8) * 128;        // 8192: next 8 rows of Q / K

__device__ __forceinline__ int blk16(int r, int kc) {  // byte offset of 16-byte chunk kc of row r
  return (r >> 3) * kWgRowSbo + kc * 128 + (r & 7) * 16;
}

// ================================================================================================
// Warp-specialized wgmma variant (default on sm_90a). 384 threads = 3 warpgroups:
//   warpgroup 2 (producer) gathers the tile's rows (fp8 data + scales, or bf16 workspace rows),
//     dequantizes them into a double-buffered bf16 K tile and signals FULL[stage];
//   warpgroup 0 (math): S (32 x wgmma m64n64k16, A = Q, B = K, both K-major), the online softmax
//     (it owns m and l), P (bf16) and the rescale factors handed to warpgroup 1 through shared
//     memory, and O[:, 0 .. 255] += P V (wgmma m64n128k16 pairs, A = P from registers, B = the K
//     tile read MN-major).
//   warpgroup 1 (PV): O[:, 256 .. 511] += P V with P from shared memory (SS wgmma); it releases
//     the stage (EMPTY[stage]) and the P buffer (P_FREE). Its PV of tile j - 1 overlaps the math
//     warpgroup's S of tile j.
//   Why this split (FlashMLA's sm90 sparse decode kernel gives warpgroup 0 the softmax and
//   warpgroup 1 half of PV the same way): session 5 ran S over half the dims and the softmax in
//   both warpgroups (32 KB of fp32 partials exchanged per tile); sessions 6-9 ran S split over
//   both (16 KB of partials one way, the softmax once); since session 10 S is one chain in the
//   math warpgroup, ~1 us per C4 layer faster than the split (see s_chain).
// Same numerics as the mma.sync engine (bf16 operands, fp32 accumulation, bf16 P, base-2 online
// softmax); the split merge has the same arithmetic in split order.
constexpr int kWsConsumers = 256;
constexpr int kWsThreads = kWsConsumers + 128;
// Registers per thread after setmaxnreg: the CTA holds 384 x 168; the producer gives back what the
// consumers take: 128 x (168 - P) = 256 x (C - 168). The math warpgroup holds O (128 fp32) + S (32)
// + P (16) + addressing, the PV warpgroup O; they share the count because they
// share the epilogue's code (ptxas allocates each region's code within the count its setmaxnreg
// grants: checked in session 5, a 200-float live set after setmaxnreg.inc 240 compiles without
// spills at 168 for the kernel). C = 192 leaves the producer 120: two rows x 9 loads in flight
// (76 registers) plus addressing. (C = 200, producer 104: 2 us slower per layer on the H200.)
#ifndef GRAPHSAFE_WS_CONSUMER_REGS
#define GRAPHSAFE_WS_CONSUMER_REGS 192
#endif
constexpr int kWsConsumerRegs = GRAPHSAFE_WS_CONSUMER_REGS;
constexpr int kWsProducerRegs = 168 - 2 * (kWsConsumerRegs - 168);
static_assert(kWsProducerRegs >= 24 && kWsProducerRegs % 8 == 0 && kWsConsumerRegs % 8 == 0, "setmaxnreg counts");
constexpr int kWsPBytes = kGroupHeads * kTileRows * 2;  // 8192: P (bf16), canonical K-major layout
constexpr int kWsPSbo = (kTileRows / 8) * 128;          // 1024: next 8 heads of P
constexpr int kWsMiscBytes = 128 * 8 + 128 * 16 + 2 * 64 * 4;  // alpha[128] float2, (m, l)[128] float4, vld[2][64]
constexpr int kWsSmemBytes = kWgQBytes + 2 * kWgKBytes + kWsPBytes + kWsMiscBytes;
static_assert(kWsSmemBytes <= 227 * 1024, "warp-specialized attention smem over the sm_90 limit");

// Named barriers (0 is __syncthreads): FULL[s] producer -> consumers, EMPTY[s] consumers ->
// producer, Q (queries stored; (m, l) handed over) among the consumers, P_FREE (the PV
// warpgroup's PV of tile j - 1 done: P and the rescale factors may be overwritten) PV -> math,
// P_READY (P and the rescale factors of tile j written) math -> PV, OUT among the consumers of a
// cluster merge, OWNERS among the 128 threads that merge a rank's heads (two-rank merge). Each
// handoff buffer is released by the next handoff the other way.
enum : int { kBarFull0 = 1, kBarEmpty0 = 3, kBarQ = 5, kBarPReady = 6, kBarPFree = 7, kBarOut = 8, kBarOwners = 9 };
// The paged producer's stand-in for rows it does not load from a cache (invalid slots, rows past
// the request's length): 576 zero data bytes and zero scales, so such rows dequantize to zeros.
__device__ __align__(16) std::uint8_t g_zero_row[kRawStride];
constexpr int kWsOutStride = kHeadDim * 2 + 16;  // bytes per head row of the staged output
// The two-rank cluster merge receives the peer's O in this many chunks, each counted by its own
// mbarrier, so merging overlaps the push (see the merge). 1, 2 or 4 (a merge batch is 8 float4).
#ifndef GRAPHSAFE_DS4_MERGE_CHUNKS
#define GRAPHSAFE_DS4_MERGE_CHUNKS 4
#endif
constexpr int kMergeChunks = GRAPHSAFE_DS4_MERGE_CHUNKS;
// Comparison builds only (-DGRAPHSAFE_DS4_MERGE_GENERIC): two ranks through the generic merge too.
// The producer's barrier count follows it (before session 11 it did not: one cluster barrier short).
#ifdef GRAPHSAFE_DS4_MERGE_GENERIC
constexpr bool kMergeGeneric = true;
#else
constexpr bool kMergeGeneric = false;
#endif
static_assert(kMergeChunks == 1 || kMergeChunks == 2 || kMergeChunks == 4, "GRAPHSAFE_DS4_MERGE_CHUNKS: 1, 2 or 4");
// Named barriers in their unaligned forms (barrier.sync / barrier.arrive, no .aligned): one
// generation of FULL, EMPTY, Q or P_FREE is reached from different static sites (the producer, the
// math and the PV warpgroups each have their own code), and the aligned forms (bar.sync, bar.arrive)
// promise that every thread of a generation executes the same instruction. compute-sanitizer
// synccheck reports the aligned forms here as divergent barriers.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Diagnostics only (a build with -DGRAPHSAFE_DS4_TIMELINE; bench/ds4_attention_bench prints the
// breakdown): per CTA, clock64 stamps at the phase edges of the ws kernel, so the per-layer time can
// be split into launch gap, prologue, per-tile producer / consumer time and merge. The record
// layout is graphsafe/ds4/detail/timeline.hpp. Compiled out otherwise (TL(...) expands to nothing).
// TLDEP names a register the stamp follows in program order; it does not make the stamp wait for
// that register's load to land.
namespace tl = timeline;
#ifdef GRAPHSAFE_DS4_TIMELINE
constexpr int kTlSlots = tl::kSlots;
__device__ unsigned long long g_tl[kTlSlots * tl::kMaxRecords];
__device__ unsigned int g_tl_count;
__device__ __forceinline__ unsigned long long tl_clock() { return clock64(); }
__device__ __forceinline__ unsigned long long tl_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define TL(slot, cond) do { if ((cond) && tl_rec < tl::kMaxRecords) g_tl[tl_rec * kTlSlots + (slot)] = tl_clock(); } while (0)
#define TLDEP(slot, cond, reg) do { asm volatile("" ::"r"(reg) : "memory"); TL(slot, cond); } while (0)
#else
#define TL(slot, cond) do { } while (0)
#define TLDEP(slot, cond, reg) do { } while (0)
#endif

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

template <bool kPaged>
__global__ void __launch_bounds__(kWsThreads, 1) sparse_attention_ws_kernel(const KParams p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  std::uint8_t* Qs = smem;
  std::uint8_t* Ks = smem + kWgQBytes;  // [2][64 rows x 512] bf16, canonical layout
  std::uint8_t* Ps = Ks + 2 * kWgKBytes;                                  // P of the tile, bf16, canonical
  float2* As = reinterpret_cast<float2*>(Ps + kWsPBytes);                 // [128]: rescale factors, math -> PV
  float4* MLs = reinterpret_cast<float4*>(As + 128);                      // [128]: (m, l), math -> PV
  int* vld = reinterpret_cast<int*>(MLs + 128);                           // [2 stages][64]

  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kGroupHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Programmatic dependent launch (launch() sets the attribute): this grid may start while the
  // previous kernel of the stream is still running; every global read below waits for it to finish
  // and flush here. Then the next kernel may be launched: its CTAs take the SMs ours free and run
  // up to their own wait, which hides the launch gap between back-to-back kernels (~1 us). Both are
  // no-ops without the attribute.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  // Queries first (consumer threads): their loads do not depend on the lengths, so they overlap
  // the length and index loads instead of following them (timeline: ~0.7 us of the prologue).
  // Consumer warp cw loads heads 8 cw + lane % 8, 16-byte chunks lane / 8 + 4 i; stored into the
  // canonical layout once the consumers own their registers. Plain loads + st.shared, no cp.async:
  // every shared-memory write of this kernel is an ordinary store, which compute-sanitizer
  // racecheck orders across the cluster barriers.
  const int qh = warp * 8 + (lane & 7);
  uint4 qv[16];
  if (tid < kWsConsumers) {
    const std::uint16_t* qrow = p.q + (static_cast<long long>(b) * p.H + head0 + qh) * kHeadDim;
#pragma unroll
    for (int i = 0; i < 16; ++i) qv[i] = __ldg(reinterpret_cast<const uint4*>(qrow + ((lane >> 3) + 4 * i) * 8));
  }
  // The slot of row `row` of tile t for a request with nc compressed and TT attended rows whose
  // split ends at tile te; -1: no row. One predicated load (ld_nc_or): nothing waits for it before
  // the slot's first use.
  auto slot_of = [&](int t, int row, int nc, int TT, int te) -> int {
    const int i = t * kTileRows + row;
    const std::int32_t* src;
    if constexpr (kPaged) {
      src = i < nc ? p.cmp_idx + (static_cast<long long>(b) * p.cmp_width + i)
                   : p.swa_idx + (static_cast<long long>(b) * p.swa_width + (i - nc));
    } else {
      src = p.idx + (static_cast<long long>(b) * p.width + i);
    }
    return ld_nc_or(src, t < te && i < TT, -1);
  };
  // Producer thread ptid owns rows r0 and r0 + 8 of every tile (see the producer). Before the
  // lengths are in, it fetches its slots of the split's first three tiles as if the request were at
  // full width (every compressed and window slot attended: any request longer than the window
  // and, at C4, 4 x top-k tokens), so that these index loads overlap the length loads: lengths ->
  // indices -> rows were three dependent round trips before the first tile. Checked against the
  // lengths below; a request below full width fetches again.
  const int ptid = tid - kWsConsumers;
  const int r0 = 16 * (ptid >> 5) + (ptid & 7);
  const int nc_full = kPaged ? (p.cmp_idx != nullptr ? p.cmp_width : 0) : 0;
  const int T_full = kPaged ? nc_full + p.swa_width : p.width;
  const int nt_full = (T_full + kTileRows - 1) / kTileRows;
  const int tps_full = (nt_full + p.splits - 1) / p.splits;
  const int tb_full = split * tps_full, te_full = min(nt_full, tb_full + tps_full);
  int sl_full[3][2];
  if (tid >= kWsConsumers) {
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl_full[k][rr] = slot_of(tb_full + k, r0 + 8 * rr, nc_full, T_full, te_full);
  }
#ifdef GRAPHSAFE_DS4_TIMELINE
  __shared__ unsigned int tl_shared;
  const unsigned long long tl_t0 = tl_clock(), tl_g0 = tl_gtime();
  if (tid == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    tl_shared = atomicAdd(&g_tl_count, 1u);
    if (tl_shared < tl::kMaxRecords) {
      unsigned long long* r = g_tl + tl_shared * kTlSlots;
      r[tl::gtime_entry] = tl_g0;
      r[tl::clock_entry] = tl_t0;
      r[tl::cta_id] = (static_cast<unsigned long long>(sm) << 32) | (blockIdx.x | (blockIdx.y << 8) | (blockIdx.z << 24));
    }
  }
  __syncthreads();
  const unsigned tl_rec = tl_shared;
#endif
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
  const int n = max(0, t_end - t_begin);
#ifdef GRAPHSAFE_DS4_TIMELINE
  if (tid == 0 && tl_rec < tl::kMaxRecords) g_tl[tl_rec * kTlSlots + tl::tiles] = n;
#endif
  const long long part = (static_cast<long long>(b) * p.splits + split) * p.H + head0;

  if (n == 0 && !p.cluster) {
    if (p.splits == 1) {
      uint4* o = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0) * kHeadDim);
      for (int i = tid; i < kGroupHeads * kHeadDim / 8; i += kWsThreads) o[i] = make_uint4(0, 0, 0, 0);
    } else if (tid < kGroupHeads) {
      p.part_ml[(part + tid) * 2 + 0] = -INFINITY;
      p.part_ml[(part + tid) * 2 + 1] = 0.f;
    }
    return;
  }

  float o[128];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // 0: math warpgroup, 1: PV warpgroup, 2: producer. Through a shuffle so that ptxas knows it is
  // warp-uniform: otherwise it treats the role branches as divergent and serializes every wgmma
  // behind a warpgroup.arrive it inserts (C7520).
  const int c = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int w4 = warp & 3;
  const int qr = lane >> 2, qc = 2 * (lane & 3);
  const int hrow[2] = {16 * w4 + qr, 16 * w4 + qr + 8};

  if (c == 2) {
    // ================================ producer ================================
    setmaxnreg_dec<kWsProducerRegs>();  // gives the consumers their 2 x (consumer - launch) x 128
    // Thread (producer warp pw, lane l) owns rows r0 = 16 pw + l % 8 (row A) and r0 + 8 (row B) of
    // every tile and their 16-byte chunks q + 4m (q = l / 8). It fetches its rows' slots and
    // computes their addresses itself (4 threads share a row: redundant index loads hit L1), so no
    // row pointers go through shared memory and no producer-wide barrier sits in the loop. Every
    // chunk's global offset and shared-memory offset is a compile-time constant from two bases. A
    // warp's load covers 8 rows x 64 contiguous bytes (8 L1 wavefronts), and each 8-lane phase of a
    // 128-bit shared store covers 8 consecutive rows of one core-matrix column (conflict-free).
    // Paged rows are software-pipelined across tiles (session 6): a row's registers are refilled
    // with the same row of the next tile as soon as that row is stored, so the next tile's loads
    // are in flight while this tile is dequantized, stored and published and while the producer
    // waits for the next stage. Before, all 18 loads of tile t + 1 were issued only after tile t was
    // stored: one L2 latency per tile on the critical path (timeline: ~3 us per tile, producer-bound;
    // the consumers waited for FULL).
    const int q = (ptid >> 3) & 3;
    auto fetch_slot = [&](int t, int row) { return slot_of(t, row, n_cmp, T, t_end); };
    // Slots of tiles t (sl0), t + 1 (sl1), t + 2 (sl2) and t + 3 (sl3, fetched at the top of an
    // iteration). The L2 prefetch of tile t + 2 after the FULL arrive reads slots fetched one
    // iteration earlier (with the pipelined loads an iteration is ~1 us, about one index-load
    // latency: prefetching from slots fetched in the same iteration waited for them, 2 us per tile
    // in the timeline), so a tile's own loads are L2 hits. The index load is one predicated
    // instruction (ld_nc_or) so that nothing waits for it before that first read.
    // The first three come from the full-width fetch above when the request is at full width
    // (then t_begin, t_end and every row's source are the same).
    if (n_cmp != nc_full || T != T_full) {
#pragma unroll
      for (int k = 0; k < 3; ++k)
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) sl_full[k][rr] = fetch_slot(t_begin + k, r0 + 8 * rr);
    }
    int sl0[2], sl1[2], sl2[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      sl0[rr] = sl_full[0][rr];
      sl1[rr] = sl_full[1][rr];
      sl2[rr] = sl_full[2][rr];
    }
    [[maybe_unused]] const bool tl0 = ptid == 0;
    if constexpr (kPaged) {
      // fp8 chunk c = q + 4m (m < 7): scale byte m, bf16 chunks 2c, 2c + 1 -> kr + 256 q + 1024 m
      // (+ 128). Rope chunk c = 28 + q + 4m' (m' < 2): bf16 chunk 56 + q + 4m' -> kr + 7168 +
      // 128 q + 512 m'. w[rr] / sc[rr] hold row rr's 9 chunks and scales of the tile being stored.
      uint4 w[2][9];
      uint2 sc[2];
      // Addresses of a row of tile t: the cache row, or the zero row (an invalid slot, a row past
      // T or past t_end, the probe). The loads are then unconditional: no zeroing of w[] and no
      // branch per row (44 register-zeroing instructions per tile in session 6's SASS).
      const std::uint8_t* const zero = g_zero_row;
      auto row_addr = [&](int t, int row, int slot, const std::uint8_t*& d, const std::uint8_t*& scp) {
        const CacheView& cv = t * kTileRows + row < n_cmp ? p.cmp : p.swa;
        d = zero;
        scp = zero + kTokenDataBytes;
        if (cv.valid(slot) && !(p.probe & 1)) cv.locate(slot, d, scp);
      };
      auto issue_row = [&](int rr, const std::uint8_t* d, const std::uint8_t* scp) {  // row rr's loads into w[rr]
        const uint4* src = reinterpret_cast<const uint4*>(d) + q;
#pragma unroll
        for (int mm = 0; mm < 9; ++mm) w[rr][mm] = __ldg(src + 4 * mm);
        sc[rr] = __ldg(reinterpret_cast<const uint2*>(scp));  // 7 scales + pad
      };
      auto prefetch_row = [&](const std::uint8_t* d, const std::uint8_t* scp) {  // this thread's quarter
        if (d == zero) return;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(d + q * 128));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(q == 0 ? d + 512 : scp));
      };
      auto store_row = [&](std::uint8_t* kr, int rr) {  // dequantize w[rr] into the stage
        std::uint8_t* kf = kr + rr * kWgRowSbo + 256 * q;
        const uint2 sr = sc[rr];
        // Rows with a scale byte >= 128 (never real KV scales) take the general dequant16 (a
        // branch, not hot-path code); both loops unrolled: a rolled one would index w[] dynamically.
        if (((sr.x | sr.y) & 0x80808080u) == 0) {
#pragma unroll
          for (int mm = 0; mm < 7; ++mm) {
            uint4 lo, hi;
            dequant16_small(w[rr][mm], ue8m0_factor(((mm < 4 ? sr.x : sr.y) >> (8 * (mm & 3))) & 0xFFu), lo, hi);
            *reinterpret_cast<uint4*>(kf + 1024 * mm) = lo;
            *reinterpret_cast<uint4*>(kf + 1024 * mm + 128) = hi;
          }
        } else {
#pragma unroll
          for (int mm = 0; mm < 7; ++mm) {
            uint4 lo, hi;
            dequant16(w[rr][mm], ((mm < 4 ? sr.x : sr.y) >> (8 * (mm & 3))) & 0xFFu, lo, hi);
            *reinterpret_cast<uint4*>(kf + 1024 * mm) = lo;
            *reinterpret_cast<uint4*>(kf + 1024 * mm + 128) = hi;
          }
        }
        std::uint8_t* kp = kr + rr * kWgRowSbo + 56 * 128 + 128 * q;
        *reinterpret_cast<uint4*>(kp) = w[rr][7];
        *reinterpret_cast<uint4*>(kp + 512) = w[rr][8];
      };
      // Each row is located once, when its L2 prefetch is issued (one tile ahead of its loads);
      // pd / ps keep the addresses of tile t + 1's rows until their loads are issued.
      const std::uint8_t *pd[2], *ps[2];
      bool ok[2];  // rows of the tile in w[] are cache rows (vld)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        row_addr(t_begin, r0 + 8 * rr, sl0[rr], pd[rr], ps[rr]);
        ok[rr] = pd[rr] != zero;
        issue_row(rr, pd[rr], ps[rr]);
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        row_addr(t_begin + 1, r0 + 8 * rr, sl1[rr], pd[rr], ps[rr]);
        prefetch_row(pd[rr], ps[rr]);
      }
      for (int j = 0; j < n; ++j) {
        const int t = t_begin + j, st = j & 1;
        int sl3[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) sl3[rr] = fetch_slot(t + 3, r0 + 8 * rr);
        std::uint8_t* kr = Ks + st * kWgKBytes + (r0 >> 3) * kWgRowSbo + (r0 & 7) * 16;
        TL(tl::p_loads_start + (j & 7), tl0);
        if (j >= 2) bar_sync(kBarEmpty0 + st, kWsThreads);  // consumers are done with tile t-2
        TL(tl::p_empty_ok + (j & 7), tl0);
        if (q == 0) {
          vld[st * 64 + r0] = ok[0] ? 1 : 0;
          vld[st * 64 + r0 + 8] = ok[1] ? 1 : 0;
        }
        TLDEP(tl::p_loads_issued + (j & 7), tl0, w[0][8].w);
        store_row(kr, 0);
        ok[0] = pd[0] != zero;
        issue_row(0, pd[0], ps[0]);  // row A of the next tile (the zero row past t_end)
        store_row(kr, 1);
        TL(tl::p_stores_done + (j & 7), tl0);
        fence_proxy_async();
        TL(tl::p_full_arrive + (j & 7), tl0);
        bar_arrive(kBarFull0 + st, kWsThreads);
        ok[1] = pd[1] != zero;
        issue_row(1, pd[1], ps[1]);  // row B of the next tile
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          row_addr(t + 2, r0 + 8 * rr, sl2[rr], pd[rr], ps[rr]);
          prefetch_row(pd[rr], ps[rr]);
        }
        TL(tl::p_prefetched + (j & 7), tl0);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) sl2[rr] = sl3[rr];
      }
    } else {
      // Workspace rows (bf16): chunk c = q + 4m (m < 16) -> kr + 128 q + 512 m; 16 loads per row,
      // the first row's issued before the stage wait (both rows' would take 128 registers).
      auto row_ptr = [&](long long slot) -> const std::uint8_t* {  // null: invalid row or no tile -> zeros
        if (slot < 0 || slot >= p.ws_rows || (p.probe & 1)) return nullptr;
        return reinterpret_cast<const std::uint8_t*>(p.ws + slot * kHeadDim);
      };
      // L2 prefetch of this thread's quarter of its two rows (the 4 threads of a row split its lines).
      auto l2_prefetch = [&](const int* slot) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const std::uint8_t* d = row_ptr(slot[rr]);
          if (d == nullptr) continue;
          asm volatile("prefetch.global.L2 [%0];" ::"l"(d + q * 128));
          asm volatile("prefetch.global.L2 [%0];" ::"l"(d + 512 + q * 128));
        }
      };
      l2_prefetch(sl1);
      for (int j = 0; j < n; ++j) {
        const int t = t_begin + j, st = j & 1;
        int sl3[2];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) sl3[rr] = fetch_slot(t + 3, r0 + 8 * rr);
        const std::uint8_t* d[2] = {row_ptr(sl0[0]), row_ptr(sl0[1])};
        std::uint8_t* kr = Ks + st * kWgKBytes + (r0 >> 3) * kWgRowSbo + (r0 & 7) * 16;
        TL(tl::p_loads_start + (j & 7), tl0);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const uint4* src = reinterpret_cast<const uint4*>(d[rr]) + q;
          uint4 v[16];
#pragma unroll
          for (int mm = 0; mm < 16; ++mm) v[mm] = d[rr] != nullptr ? __ldg(src + 4 * mm) : make_uint4(0, 0, 0, 0);
          if (rr == 0) {
            if (j >= 2) bar_sync(kBarEmpty0 + st, kWsThreads);  // consumers are done with tile t-2
            TL(tl::p_empty_ok + (j & 7), tl0);
            if (q == 0) {
              vld[st * 64 + r0] = d[0] != nullptr ? 1 : 0;
              vld[st * 64 + r0 + 8] = d[1] != nullptr ? 1 : 0;
            }
          }
#pragma unroll
          for (int mm = 0; mm < 16; ++mm) *reinterpret_cast<uint4*>(kr + rr * kWgRowSbo + 128 * q + 512 * mm) = v[mm];
        }
        TL(tl::p_stores_done + (j & 7), tl0);
        fence_proxy_async();
        TL(tl::p_full_arrive + (j & 7), tl0);
        bar_arrive(kBarFull0 + st, kWsThreads);
        l2_prefetch(sl2);
        TL(tl::p_prefetched + (j & 7), tl0);
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          sl0[rr] = sl1[rr];
          sl1[rr] = sl2[rr];
          sl2[rr] = sl3[rr];
        }
      }
    }
    // The producers never rejoin the consumers' code (their register budget is smaller): they take
    // part in the cluster merge's barriers here and leave.
    if (p.cluster) {  // barriers A and B of the merge
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();
      if (cluster.num_blocks() != 2 || kMergeGeneric) cluster.sync();  // the two-rank merge has no barrier B
    }
    return;
  }
  {
    // ================================ consumers ================================
    setmaxnreg_inc<kWsConsumerRegs>();
    if (n > 0) {
      TLDEP(tl::q_landed, tid == 0, qv[15].w);
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<uint4*>(Qs + blk16(qh, (lane >> 3) + 4 * i)) = qv[i];
      fence_proxy_async();
      bar_sync(kBarQ, kWsConsumers);
      TL(tl::q_ready, tid == 0);
    }
#pragma unroll
    for (int e = 0; e < 128; ++e) o[e] = 0.f;
    const int ct = tid & 127;  // thread index within the consumer warpgroup
    // PV as two m64n128k16 per k step (o_lo: dims +0 .. 127 of the warpgroup's 256, o_hi: +128 ..):
    // with two producer warpgroups the launch bound is 128 registers, and ptxas checks an
    // instruction's operands against that count (an m64n256k16 has 128 accumulators).
    float (&o_lo)[64] = *reinterpret_cast<float(*)[64]>(o);
    float (&o_hi)[64] = *reinterpret_cast<float(*)[64]>(o + 64);
    constexpr std::uint64_t kPvHalf = (16 * 128) >> 4;  // descriptor step: 128 dims = 16 core-matrix columns
    // S = Q K^T of the tile: all 64 rows over all 512 dims in one chain of 32 wgmma m64n64k16 (A =
    // Q, B = K rows, both K-major) in the math warpgroup; running descriptors (laundered each step:
    // all 32 precomputed would take 64 registers).
    // Why one chain (session 10): sessions 5-9 split S over both consumer warpgroups (16 steps
    // each, the PV warpgroup's fp32 partial handed over through 16 KB of shared memory) because
    // one chain had measured 1.9 us per tile. On the H200 the single chain is faster per layer:
    // C4 25.48-25.71 us vs 26.43-26.67 for the split, C128 24.22-24.26 vs 25.24-25.26 (same runs;
    // bench/results/ds4_ws_session10_h200.txt). The split's two chains contend for the same
    // tensor and shared-memory pipes, and the exchange was on the math warpgroup's critical path;
    // alone, one warpgroup's chain runs at 37-39 cycles a step (bench/wgmma_probe.cu).
    // Issued and committed; wait<0> ends it. The first step ignores the accumulators (scale-d 0),
    // so they are not zeroed per tile (the session 9 loop did: 32 moves on the math warpgroup's
    // critical path; with them gone the paged producer's spills went too).
    auto s_issue = [&](float (&sp)[32], const std::uint8_t* Kt) {
#ifdef GRAPHSAFE_DS4_TL_NO_S
#pragma unroll
      for (int e = 0; e < 32; ++e) sp[e] = 0.f;
#endif
      std::uint64_t k_desc = wgmma_desc(Kt, 128, kWgRowSbo);
      std::uint64_t q_desc = wgmma_desc(Qs, 128, kWgRowSbo);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
#ifndef GRAPHSAFE_DS4_TL_NO_S  // diagnostics build only: time the tile loop without S
        wgmma_m64n64k16(sp, q_desc, k_desc, kk > 0 ? 1 : 0);
#endif
        q_desc = launder(q_desc + 16);
        k_desc = launder(k_desc + 16);
      }
      wgmma_commit();
    };
    // The side that hands a buffer over waits too (bar.sync, not bar.arrive): with bar.arrive,
    // compute-sanitizer racecheck reported hazards on the rescale factors (As) handed from the math
    // warpgroup to the PV warpgroup (session 6); with bar.sync on both sides racecheck is clean
    // and the layer time is the same within noise (H200, session 7: C4 27.70 vs 27.59 us).
    auto handoff = [&](int bar) { bar_sync(bar, kWsConsumers); };
    // O *= the rescale factors of the thread's two heads (both consumer warpgroups, each tile).
    // Skipping it for warps whose factors are all exactly 1 gained nothing on the H200 (session 10:
    // C4 25.15 vs 24.93 us).
    auto rescale_o = [&](float a0, float a1) {
#pragma unroll
      for (int nb = 0; nb < 32; ++nb) {
        o[4 * nb + 0] *= a0;
        o[4 * nb + 1] *= a0;
        o[4 * nb + 2] *= a1;
        o[4 * nb + 3] *= a1;
      }
    };
    if (c == 0) {
      // ---- math warpgroup: S, softmax, P -> PV warpgroup, O[:, 0 .. 255]
      // P (head h, tile row k) lives at (h / 8) kWsPSbo + (k / 8) 128 + (h % 8) 16 + (k % 8) 2: the
      // thread's pair (hrow[jj], 8 nb + qc) at pst + jj kWsPSbo + 128 nb (a warp's 4-byte stores
      // fall in 32 distinct banks).
      std::uint8_t* pst = Ps + 2 * w4 * kWsPSbo + qr * 16 + qc * 2;
      float s[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) s[e] = 0.f;  // defined once; each chain overwrites them
      for (int j = 0; j < n; ++j) {
        const int st = j & 1;
        bar_sync(kBarFull0 + st, kWsThreads);
        TL(tl::full + (j & 7), tid == 0);
        const std::uint8_t* Kt = Ks + st * kWgKBytes;
        // Valid-row bits of the thread's 16 score columns (8 nb + qc + e1: bit 2 nb + e1), read
        // before the MMAs so their latency hides behind S.
        unsigned vmask = 0;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1) vmask |= (vld[st * 64 + nb * 8 + qc + e1] != 0 ? 1u : 0u) << (2 * nb + e1);
        s_issue(s, Kt);
        wgmma_wait<0>();
        TL(tl::s_done + (j & 7), tid == 0);
        bar_sync(kBarPFree, kWsConsumers);
        TL(tl::c_x_bar + (j & 3), tid == 0 && j < 4);

        // Online softmax over the tile's 64 rows (thread: heads hrow[0] / hrow[1], rows 8 nb + qc, + 1).
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float sv = (vmask >> (2 * nb + (e & 1))) & 1u ? s[4 * nb + e] * p.scale_log2 : -INFINITY;
            s[4 * nb + e] = sv;
            mx[e >> 1] = fmaxf(mx[e >> 1], sv);
          }
        float mu[2], alpha[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          mx[jj] = fmaxf(mx[jj], __shfl_xor_sync(0xffffffffu, mx[jj], 1));
          mx[jj] = fmaxf(mx[jj], __shfl_xor_sync(0xffffffffu, mx[jj], 2));
          const float mn = fmaxf(m[jj], mx[jj]);
          mu[jj] = mn == -INFINITY ? 0.f : mn;
          alpha[jj] = exp2_ftz(m[jj] - mu[jj]);
          l[jj] *= alpha[jj];
          m[jj] = mn;
        }
        // P in the A-operand layout of m64nNk16: k step ks takes rows 16 ks .. 16 ks + 15, i.e. the
        // accumulator pairs of column blocks 2 ks and 2 ks + 1.
        std::uint32_t pa[16];
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          const float p0 = exp2_ftz(s[4 * nb] - mu[0]), p1 = exp2_ftz(s[4 * nb + 1] - mu[0]);
          const float p2 = exp2_ftz(s[4 * nb + 2] - mu[1]), p3 = exp2_ftz(s[4 * nb + 3] - mu[1]);
          sum[0] += p0 + p1;
          sum[1] += p2 + p3;
          pa[2 * nb] = pack_bf16x2(p0, p1);
          pa[2 * nb + 1] = pack_bf16x2(p2, p3);
        }
        l[0] += sum[0];
        l[1] += sum[1];
        // Hand P and the rescale factors to the PV warpgroup. Free to overwrite: P_FREE of tile j
        // above came after the PV warpgroup's PV of tile j - 1, the last reader of P and alpha.
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
          *reinterpret_cast<std::uint32_t*>(pst + 128 * nb) = pa[2 * nb];
          *reinterpret_cast<std::uint32_t*>(pst + kWsPSbo + 128 * nb) = pa[2 * nb + 1];
        }
        fence_proxy_async();  // P is read by wgmma (async proxy); alpha by plain loads, stored after
        As[ct] = make_float2(alpha[0], alpha[1]);
        handoff(kBarPReady);
        rescale_o(alpha[0], alpha[1]);
        TL(tl::c_pv_start + (j & 3), tid == 0 && j < 4);
        {
          // O[:, 0 .. 255] += P V (4 x wgmma m64n256k16, A = P from registers, B = the K tile read
          // MN-major).
          const std::uint64_t v_desc = launder(wgmma_desc(Kt, kWgRowSbo, 128));
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < kTileRows / 16; ++ks) {
#ifndef GRAPHSAFE_DS4_TL_NO_PV  // diagnostics build only: time the tile loop without PV
            const std::uint64_t vd = v_desc + ks * ((2 * kWgRowSbo) >> 4);
            wgmma_m64n128k16_rs_tb(o_lo, pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3], vd);
            wgmma_m64n128k16_rs_tb(o_hi, pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3], vd + kPvHalf);
#endif
          }
          wgmma_commit();
          wgmma_wait<0>();
        }
        TL(tl::pv_done + (j & 7), tid == 0);
        if (j + 2 < n) bar_arrive(kBarEmpty0 + st, kWsThreads);  // the producers refill this stage
      }
      // The row sum is a quad sum; (m, l) go to the PV warpgroup's thread with the same rows.
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        l[jj] += __shfl_xor_sync(0xffffffffu, l[jj], 1);
        l[jj] += __shfl_xor_sync(0xffffffffu, l[jj], 2);
      }
      MLs[ct] = make_float4(m[0], m[1], l[0], l[1]);
      bar_sync(kBarQ, kWsConsumers);
    } else {
      // ---- PV warpgroup: O[:, 256 .. 511] += P V, P and the rescale factors from the math warpgroup
      const std::uint64_t p_desc = wgmma_desc(Ps, 128, kWsPSbo);
      for (int j = 0; j < n; ++j) {
        const int st = j & 1;
        bar_sync(kBarFull0 + st, kWsThreads);
        const std::uint8_t* Kt = Ks + st * kWgKBytes;
        handoff(kBarPFree);  // this warpgroup's PV of tile j - 1 is done
        bar_sync(kBarPReady, kWsConsumers);
        const float2 a = As[ct];
        rescale_o(a.x, a.y);
        {
          const std::uint64_t v_desc = launder(wgmma_desc(Kt + 32 * 128, kWgRowSbo, 128));
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < kTileRows / 16; ++ks) {
#ifndef GRAPHSAFE_DS4_TL_NO_PV
            const std::uint64_t vd = v_desc + ks * ((2 * kWgRowSbo) >> 4);
            wgmma_m64n128k16_tb(o_lo, p_desc + ks * 16, vd);
            wgmma_m64n128k16_tb(o_hi, p_desc + ks * 16, vd + kPvHalf);
#endif
          }
          wgmma_commit();
          wgmma_wait<0>();
        }
        if (j + 2 < n) bar_arrive(kBarEmpty0 + st, kWsThreads);  // the producers refill this stage
      }
      bar_sync(kBarQ, kWsConsumers);
      const float4 ml = MLs[ct];
      m[0] = ml.x;
      m[1] = ml.y;
      l[0] = ml.z;
      l[1] = ml.w;
    }
    TL(tl::loop_end, tid == 0);
  }

  if (p.cluster) {
    // Split-K merge inside the cluster (the splits of one (request, head group); launch() uses a
    // cluster only for 2 or 4 splits). Heads are dealt to ranks by consumer warp (2 ranks: warps
    // 0-1 / 2-3 of each consumer warpgroup; 4 ranks: one warp each). After barrier A (every rank
    // is done with its Q / K area, which becomes the receive area) each thread stores its O and
    // (m, l) into slot `rank` of the owner's receive area (remote stores: no round trips; the
    // owner's own threads store locally), barrier B, then all 256 consumer threads of each rank
    // merge its heads from local shared memory, ranks in split order (combine_splits_kernel's
    // arithmetic), into a bf16 stage written out with 16-byte coalesced stores. No global
    // scratch, no second kernel.
    // Why this shape: the previous merge kept the owner's O in registers, so only the owner
    // threads merged and every step selected between a register and a received value for each
    // of up to 4 ranks -- ~1,900 instructions per warp, run once and cold in the instruction
    // cache, 5.0 us of a 35 us layer (timeline build, GRAPHSAFE_DS4_TIMELINE). With every
    // rank's O in shared memory the merge is a short rolled loop over all consumer threads.
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = static_cast<int>(cluster.block_rank());
    const int nr = static_cast<int>(cluster.num_blocks());
    const int per = 4 / nr;                                          // warps per warpgroup per owner
    const int owner = w4 / per;
    const int nthr = kWsConsumers / nr;                              // threads per owner
    const int li = c * (per * 32) + (w4 % per) * 32 + lane;           // index among them
    const int heads = 64 / nr;                                       // heads per owner
    float4* recv = reinterpret_cast<float4*>(smem);                  // [nr][32][nthr]: 128 KB
    float* mlr = reinterpret_cast<float*>(smem + 128 * 1024);        // [nr][64][2]
    std::uint8_t* stage = smem + 132 * 1024;                         // [heads][1040 B]: <= 33 KB
    static_assert(132 * 1024 + 32 * kWsOutStride <= kWsSmemBytes, "cluster merge areas exceed the smem");
    // This rank's heads [rank * heads, +heads) are one contiguous block of the output: once every
    // consumer has staged its merged values, 16-byte coalesced stores (direct 4-byte stores touched
    // 8 heads x 16 bytes per warp store; ncu showed them as a quarter of the epilogue's stalls, "LG
    // throttle"). The generic merge ends here; the two-rank merge stores batch by batch.
    auto store_staged = [&](int heads) {
      bar_sync(kBarOut, kWsConsumers);
      TL(tl::staged, tid == 0);
      uint4* gout = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0 + rank * heads) * kHeadDim);
#pragma unroll 4
      for (int i = tid; i < heads * kHeadDim / 8; i += kWsConsumers)
        gout[i] = *reinterpret_cast<const uint4*>(stage + (i >> 6) * kWsOutStride + (i & 63) * 16);
#ifdef GRAPHSAFE_DS4_TIMELINE
      if (tid == 0 && tl_rec < tl::kMaxRecords) {
        g_tl[tl_rec * kTlSlots + tl::clock_exit] = tl_clock();
        g_tl[tl_rec * kTlSlots + tl::gtime_exit] = tl_gtime();
      }
#endif
    };
    // Thread tid will merge float4 column lm = tid % nthr of this rank's slots, rows e = tid / nthr +
    // 256 / nthr * k: the values pushed by the threads with index lm, i.e. heads g[0], g[1] and
    // dims d, d + 1 (o[]'s mapping for warp mw of a warpgroup mc). The sinks are loaded now, so
    // their latency is spent in the barriers.
    if (nr == 2 && !kMergeGeneric) {
      // Two ranks (the C4 / C128 / C1 default): rank r owns heads [32 r, 32 r + 32), i.e. warps
      // 2r, 2r + 1 of each consumer warpgroup, which keep their O in registers; only the other
      // warps push (64 KB per CTA, into the peer's single receive slot), and each owner thread
      // merges its own values with the peer thread's of the same layout (same li). Compared with
      // every rank storing all of O into shared memory and all threads merging from there, this
      // drops 64 KB of local stores and 64 KB of loads per CTA. Same arithmetic as
      // combine_splits_kernel, ranks in split order.
      const bool mine = owner == rank;
      float sk[2] = {-INFINITY, -INFINITY};
      if (mine && p.sink != nullptr) {
        sk[0] = p.sink[head0 + hrow[0]] * kLog2e;
        sk[1] = p.sink[head0 + hrow[1]] * kLog2e;
      }
      // The push is st.async into the peer, counted by the peer's merge barriers (one arrival, the
      // expect_tx, + the pushed bytes): no barrier B with its release fence and its wait for every
      // thread of both CTAs; only the owners wait, for their own bytes (timeline, session 7: push
      // 2.08 -> 1.74 us; C4 26.8 -> 26.6 us per layer). The barriers are initialized before
      // barrier A, which orders them before every other use (the peer's st.async, the expect_tx,
      // the waits; a transaction count may go below zero before the expect_tx).
      // The 64 KB arrive in kMergeChunks chunks of 32 / kMergeChunks float4 per thread, each with
      // its own barrier, (m, l) first on chunk 0's: the owners compute the merge weights and merge
      // chunk k while chunks k + 1.. are still in flight and store each merged batch at once, so
      // only the last chunk's merge and stores follow the push (session 10's timeline: push 1.75
      // us, then weights 0.32 + merge 0.8 + stores 0.5 us; session 11: C4 24.74 -> 24.07 us).
      constexpr int kChunkE = 32 / kMergeChunks;
      __shared__ alignas(8) std::uint64_t merge_bar[kMergeChunks];
      if (tid < kMergeChunks) mbar_init(&merge_bar[tid], 1);
      cluster.sync();  // A: the peer is done with its Q / K area (and its barriers are initialized)
      TL(tl::cluster_a, tid == 0);
      if (tid < kMergeChunks) mbar_arrive_expect_tx(&merge_bar[tid], kChunkE * 128 * 16 + (tid == 0 ? 16 * 2 * 8 : 0));
      if (!mine) {
        std::uint32_t rbar[kMergeChunks];
#pragma unroll
        for (int k = 0; k < kMergeChunks; ++k) rbar[k] = mapa_u32(&merge_bar[k], owner);
        if (c == 0 && (lane & 3) == 0) {
          const std::uint32_t dml = mapa_u32(mlr, owner);
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) st_async_v2(dml + hrow[jj] * 8, m[jj], l[jj], rbar[0]);
        }
        const std::uint32_t dst = mapa_u32(recv + li, owner);
#pragma unroll
        for (int e = 0; e < 32; ++e)
          st_async_v4(dst + e * 128 * 16, make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]), rbar[e / kChunkE]);
      } else {
        mbar_wait_cluster(&merge_bar[0], 0);
      }
      TL(tl::cluster_b, tid == 0);
      if (mine) {
        float w0[2], w1[2], inv[2];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const float mp = mlr[hrow[jj] * 2], lp = mlr[hrow[jj] * 2 + 1];
          const float m0 = rank == 0 ? m[jj] : mp, l0 = rank == 0 ? l[jj] : lp;
          const float m1 = rank == 0 ? mp : m[jj], l1 = rank == 0 ? lp : l[jj];
          float M = -INFINITY, L = 0.f;
          if (l0 > 0.f) M = fmaxf(M, m0);
          if (l1 > 0.f) M = fmaxf(M, m1);
          w0[jj] = l0 > 0.f ? exp2f(m0 - M) : 0.f;
          w1[jj] = l1 > 0.f ? exp2f(m1 - M) : 0.f;
          if (l0 > 0.f) L = __fmaf_rn(l0, w0[jj], L);
          if (l1 > 0.f) L = __fmaf_rn(l1, w1[jj], L);
          inv[jj] = 0.f;
          if (L > 0.f) inv[jj] = 1.f / (L + exp2f(sk[jj] - M));  // no sink: exp2(-inf) = 0
        }
        TLDEP(tl::merge_weights, tid == 0, __float_as_uint(inv[1]));
        // Stage row stride 1040 B: a warp's 4-byte stores (8 heads x 4 column pairs) fall in
        // distinct banks.
        std::uint8_t* s0 = stage + (hrow[0] - rank * 32) * kWsOutStride + (c * 256 + qc) * 2;
        std::uint8_t* s1 = s0 + 8 * kWsOutStride;
        uint4* gout = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0 + rank * 32) * kHeadDim);
        // Batches of 8 received values, all loaded before the batch's first stage store (the
        // compiler does not move shared loads above shared stores it cannot disambiguate: one
        // load latency per value otherwise, 1.6 us for the loop in session 7's timeline), and the
        // rank as a compile-time value (no selects in the loop). Fully unrolled: o[] is indexed
        // by e (a rolled loop would put O in local memory).
        auto merge = [&](auto rank_is_0) {
#pragma unroll
          for (int e0 = 0; e0 < 32; e0 += 8) {
            if (e0 > 0 && e0 % kChunkE == 0) mbar_wait_cluster(&merge_bar[e0 / kChunkE], 0);
            float4 v[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = recv[(e0 + k) * 128 + li];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              const int e = e0 + k;
              const float4 own = make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]);
              const float4 x0 = decltype(rank_is_0)::value ? own : v[k], x1 = decltype(rank_is_0)::value ? v[k] : own;
              float4 a;
              a.x = __fmaf_rn(x1.x, w1[0], __fmaf_rn(x0.x, w0[0], 0.f));
              a.y = __fmaf_rn(x1.y, w1[0], __fmaf_rn(x0.y, w0[0], 0.f));
              a.z = __fmaf_rn(x1.z, w1[1], __fmaf_rn(x0.z, w0[1], 0.f));
              a.w = __fmaf_rn(x1.w, w1[1], __fmaf_rn(x0.w, w0[1], 0.f));
              *reinterpret_cast<std::uint32_t*>(s0 + e * 16) = pack_bf16x2(a.x * inv[0], a.y * inv[0]);
              *reinterpret_cast<std::uint32_t*>(s1 + e * 16) = pack_bf16x2(a.z * inv[1], a.w * inv[1]);
            }
            // Batch e0 / 8 is dims [64 k, 64 k + 64) of each warpgroup's 256, i.e. two 128-byte
            // segments per head (bytes 128 k and 512 + 128 k of its output row): once every owner
            // has staged it, 512 16-byte stores, 4 per owner, 8 lanes per segment.
            bar_sync(kBarOwners, 128);
            const int k = e0 / 8;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              const int i = li + 128 * u, h = i >> 4, sg = (i >> 3) & 1, col = i & 7;
              gout[h * 64 + sg * 32 + k * 8 + col] =
                  *reinterpret_cast<const uint4*>(stage + h * kWsOutStride + sg * 512 + k * 128 + col * 16);
            }
          }
        };
        if (rank == 0)
          merge(std::true_type{});
        else
          merge(std::false_type{});
      }
      TL(tl::merged, tid == 0);
#ifdef GRAPHSAFE_DS4_TIMELINE  // the owners stored their heads batch by batch above
      if (mine && li == 0 && tl_rec < tl::kMaxRecords) {
        g_tl[tl_rec * kTlSlots + tl::staged] = tl_clock();
        g_tl[tl_rec * kTlSlots + tl::clock_exit] = tl_clock();
        g_tl[tl_rec * kTlSlots + tl::gtime_exit] = tl_gtime();
      }
#endif
      return;
    }
    const int lm = tid % nthr, e0 = tid / nthr, estep = kWsConsumers / nthr;
    const int mc = lm / (per * 32), mw = rank * per + (lm / 32) % per, ml = lm % 32;
    const int g[2] = {16 * mw + (ml >> 2), 16 * mw + (ml >> 2) + 8};
    const int d = mc * 256 + 2 * (ml & 3);
    float sink_l2[2] = {-INFINITY, -INFINITY};
    if (p.sink != nullptr) {
      sink_l2[0] = p.sink[head0 + g[0]] * kLog2e;
      sink_l2[1] = p.sink[head0 + g[1]] * kLog2e;
    }
    cluster.sync();  // A
    TL(tl::cluster_a, tid == 0);
    {
      float4* dst = (owner == rank ? recv : cluster.map_shared_rank(recv, owner)) + rank * 32 * nthr + li;
#pragma unroll
      for (int e = 0; e < 32; ++e) dst[e * nthr] = make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]);
    }
    if (c == 0 && (lane & 3) == 0) {
      float* dml = (owner == rank ? mlr : cluster.map_shared_rank(mlr, owner)) + rank * 128;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) { dml[hrow[jj] * 2] = m[jj]; dml[hrow[jj] * 2 + 1] = l[jj]; }
    }
    cluster.sync();  // B: every slot landed
    TL(tl::cluster_b, tid == 0);
#ifdef GRAPHSAFE_DS4_TL_MERGE2  // diagnostics: run the merge twice, time the second (warm) pass
    for (int pass = 0; pass < 2; ++pass) {
#endif
    float wr[4][2], inv[2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      float M = -INFINITY, L = 0.f;
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (r < nr && mlr[r * 128 + g[jj] * 2 + 1] > 0.f) M = fmaxf(M, mlr[r * 128 + g[jj] * 2]);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float lr = r < nr ? mlr[r * 128 + g[jj] * 2 + 1] : 0.f;
        wr[r][jj] = lr > 0.f ? exp2f(mlr[r * 128 + g[jj] * 2] - M) : 0.f;
        if (lr > 0.f) L = __fmaf_rn(lr, wr[r][jj], L);
      }
      inv[jj] = 0.f;
      if (L > 0.f) inv[jj] = 1.f / (L + exp2f(sink_l2[jj] - M));  // no sink: exp2(-inf) = 0
    }
    TLDEP(tl::merge_weights, tid == 0, __float_as_uint(inv[1]));
    // Stage row stride 1040 B: the 8 heads of a warp's 4-byte stores fall in distinct banks.
    std::uint8_t* s0 = stage + (g[0] - rank * heads) * kWsOutStride + d * 2;
    std::uint8_t* s1 = stage + (g[1] - rank * heads) * kWsOutStride + d * 2;
    // 32 / nr rows e per thread (16 or 8), in batches of 4: all loads of a batch are issued
    // before its first use (the stage stores would otherwise keep the compiler from hoisting the
    // next row's loads above them: one shared-memory latency per row, 1.5 us in the timeline).
    for (int e = e0; e < 32; e += 4 * estep) {
      float4 v[4][4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (r < nr) v[k][r] = recv[(r * 32 + e + k * estep) * nthr + lm];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        // acc = sum over ranks in order of O_r * w_r; a rank with l = 0 has w = 0 and O = 0, so
        // its fma leaves acc unchanged (bitwise: acc starts at +0), as the combine kernel's
        // skipped term does.
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (r >= nr) break;
          a.x = __fmaf_rn(v[k][r].x, wr[r][0], a.x);
          a.y = __fmaf_rn(v[k][r].y, wr[r][0], a.y);
          a.z = __fmaf_rn(v[k][r].z, wr[r][1], a.z);
          a.w = __fmaf_rn(v[k][r].w, wr[r][1], a.w);
        }
        const int ek = e + k * estep;
        *reinterpret_cast<std::uint32_t*>(s0 + ek * 16) = pack_bf16x2(a.x * inv[0], a.y * inv[0]);
        *reinterpret_cast<std::uint32_t*>(s1 + ek * 16) = pack_bf16x2(a.z * inv[1], a.w * inv[1]);
      }
    }
    TL(tl::merged, tid == 0);
#ifdef GRAPHSAFE_DS4_TL_MERGE2
    }
#endif
    store_staged(heads);
    return;
  }

#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const int h = hrow[jj];
    if (p.splits == 1) {
      float inv = 0.f;
      if (l[jj] > 0.f) {
        const float sterm = p.sink != nullptr ? exp2f(p.sink[head0 + h] * kLog2e - m[jj]) : 0.f;
        inv = 1.f / (l[jj] + sterm);
      }
      std::uint16_t* orow = p.out + (static_cast<long long>(b) * p.H + head0 + h) * kHeadDim + c * 256 + qc;
#pragma unroll
      for (int nb = 0; nb < 32; ++nb)
        *reinterpret_cast<std::uint32_t*>(orow + nb * 8) = pack_bf16x2(o[4 * nb + 2 * jj] * inv, o[4 * nb + 2 * jj + 1] * inv);
    } else {
      float* orow = p.part_o + (part + h) * kHeadDim + c * 256 + qc;
#pragma unroll
      for (int nb = 0; nb < 32; ++nb)
        *reinterpret_cast<float2*>(orow + nb * 8) = make_float2(o[4 * nb + 2 * jj], o[4 * nb + 2 * jj + 1]);
      if (c == 0 && (lane & 3) == 0) {
        p.part_ml[(part + h) * 2 + 0] = m[jj];
        p.part_ml[(part + h) * 2 + 1] = l[jj];
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

// Which tile engine runs, chosen once per process by GRAPHSAFE_DS4_ATTENTION:
//   ws (default): the warp-specialized wgmma kernel, on a compute capability 9.x device (sm_90a code);
//   mma_sync: the portable mma.sync kernel (also what runs on a GPU without sm_90a).
// (Session 1's 4-warpgroup lockstep wgmma kernel, "wgmma", was removed once ws was faster at every
// shape: an untested second copy of the tile loop and merge. Its figures stay in bench/results.)
enum class Engine { ws, mma_sync };
Engine engine_from_env() {
  static const Engine e = [] {
    const char* v = std::getenv("GRAPHSAFE_DS4_ATTENTION");
    return v != nullptr && std::string(v) == "mma_sync" ? Engine::mma_sync : Engine::ws;
  }();
  return e;
}
bool use_ws() {
  const bool env_ok = engine_from_env() != Engine::mma_sync;
  static int major[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int& m = major[dev & 63];
  if (m == 0)
    check_cuda(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev),
               "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  return env_ok && m == 9;
}

// Programmatic dependent launch of the ws kernel (default on; GRAPHSAFE_DS4_PDL=0 turns it off,
// e.g. to measure what it hides): see griddepcontrol in the kernel.
bool use_pdl() {
  static const bool v = [] {
    const char* e = std::getenv("GRAPHSAFE_DS4_PDL");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return v;
}

bool& cluster_refused() {
  static bool v = false;
  return v;
}
// Split-K merge through a thread-block cluster (default) or the scratch + combine kernel
// (GRAPHSAFE_DS4_CLUSTER=0, or when a cluster launch was refused).
bool use_cluster() {
  static const bool v = [] {
    const char* e = std::getenv("GRAPHSAFE_DS4_CLUSTER");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return v && !cluster_refused();
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
    check_cuda(cudaFuncSetAttribute(sparse_attention_ws_kernel<kPaged>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmemBytes),
               "cudaFuncSetAttribute(sparse_attention_ws, max dynamic smem)");
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
  static const int probe = [] {
    const char* e = std::getenv("GRAPHSAFE_DS4_WS_PROBE");
    return e != nullptr ? std::atoi(e) & 1 : 0;
  }();
  kp.probe = probe;
  const dim3 grid(c.splits, c.batch, c.heads / kGroupHeads);
  kp.cluster = 0;
  if (use_ws()) {
    const auto kernel = sparse_attention_ws_kernel<kPaged>;
    const unsigned threads = kWsThreads;
    const int smem = kWsSmemBytes;
    // The ws kernel merges in a cluster for 2 or 4 splits (heads dealt evenly to the ranks). Other
    // split counts: scratch + combine kernel.
    const bool cluster_ok = c.splits == 2 || c.splits == 4;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = static_cast<unsigned>(c.splits);
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    const int pdl = use_pdl() ? 1 : 0;
    cfg.attrs = attr + 1 - pdl;
    if (cluster_ok && use_cluster()) {
      // The splits of one (request, head group) form a cluster and merge over DSMEM (no scratch
      // traffic, no second kernel). If the device refuses the cluster shape, fall back for good.
      cfg.numAttrs = 1 + pdl;
      kp.cluster = 1;
      const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, kp);
      if (err == cudaSuccess) {
        check_launch(name);
        return;
      }
      (void)cudaGetLastError();
      cluster_refused() = true;
      kp.cluster = 0;
    }
    cfg.attrs = attr;
    cfg.numAttrs = pdl;
    check_cuda(cudaLaunchKernelEx(&cfg, kernel, kp), name);
  } else {
    sparse_attention_kernel<kPaged><<<grid, kThreads, smem_bytes<kPaged>(), stream>>>(kp);
  }
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

#ifdef GRAPHSAFE_DS4_TIMELINE
// Diagnostics (see TL above and detail/timeline.hpp).
void timeline::timeline_reset() {
  const unsigned zero = 0;
  detail::check_cuda(cudaMemcpyToSymbol(g_tl_count, &zero, sizeof zero), "timeline reset");
}
std::vector<unsigned long long> timeline::timeline_read() {
  unsigned count = 0;
  detail::check_cuda(cudaMemcpyFromSymbol(&count, g_tl_count, sizeof count), "timeline count");
  count = std::min(count, static_cast<unsigned>(tl::kMaxRecords));
  std::vector<unsigned long long> v(static_cast<std::size_t>(count) * kTlSlots);
  if (count > 0)
    detail::check_cuda(cudaMemcpyFromSymbol(v.data(), g_tl, v.size() * sizeof(unsigned long long)), "timeline read");
  return v;
}
#endif
}  // namespace graphsafe::ds4::cuda
