// The lightning indexer on the GPU (graphsafe/ds4/indexer.hpp): the key compressor, the scores on
// tensor cores and the top-k selection (a radix select with CUB's block scan).
//
// Scores, portable kernel (mma.sync): one warp takes 16 key rows at a time and computes
// S = K8 (16 x 128) * Q8^T (128 x 64 heads) with mma.sync m16n8k32 e4m3 (fp32 accumulate); the 64 x
// 128 query bytes stay in registers as B fragments for the whole row range. Because a dot product
// does not care in which order its k terms are summed, each thread loads the 32 contiguous key bytes
// [t*32, t*32+32) of its two rows (two 16-byte loads) and feeds them to the four k-steps; the query
// fragments use the same permutation of k. Each thread then holds 2 rows x 16 heads of S; ReLU, the
// head weights and a sum over the quad (fixed shuffle order: replays reproduce eager results bit for
// bit) give the score. The sm_90a kernel (wgmma) keeps the loads, the permutation and the epilogue.
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"
#include "paged_index.cuh"

#include <cub/block/block_scan.cuh>

#include <cuda_fp8.h>

namespace graphsafe::ds4::cuda {
namespace attention {
int device_cc_major();  // sparse_attention.cu
}
namespace {

using namespace detail;

// ---------------------------------------------------------------------------------- compressor
constexpr int kCompressThreads = kIndexerDim;  // one thread per channel

__device__ __forceinline__ float block_sum_128(float v, float* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  const float tot = part[0] + part[1] + part[2] + part[3];
  __syncthreads();
  return tot;
}
__device__ __forceinline__ float block_max_128(float v, float* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  const float m = fmaxf(fmaxf(part[0], part[1]), fmaxf(part[2], part[3]));
  __syncthreads();
  return m;
}

__global__ void __launch_bounds__(kCompressThreads) indexer_compress_kernel(
    const float* kv, const float* score, const std::int64_t* state_base, const std::int32_t* row_index,
    const std::int32_t* slots, const float* norm_w, float theta, float eps, IndexerCache cache) {
  __shared__ float x[kIndexerDim];
  __shared__ float part[kCompressThreads / 32];
  const int i = blockIdx.x, d = threadIdx.x;
  const long long slot = slots[i];
  const int j = row_index[i];
  if (slot < 0 || slot >= static_cast<long long>(cache.num_blocks) * cache.block_rows || j < 0) return;
  const long long base = state_base[i];
  constexpr long long rowlen = 2LL * kIndexerDim;
  // The reference's slot order: the previous group's first channels (unless j == 0), then this
  // group's second channels; unfused multiply/add as the reference.
  auto at = [&](int s) -> long long {
    if (j > 0) {
      if (s < 4) return (base + 4LL * j - 4 + s) * rowlen + d;
      return (base + 4LL * j + (s - 4)) * rowlen + kIndexerDim + d;
    }
    return (base + 4LL * j + s) * rowlen + kIndexerDim + d;
  };
  const int nslots = j > 0 ? 8 : 4;
  float m = -INFINITY;
  for (int s = 0; s < nslots; ++s) m = fmaxf(m, score[at(s)]);
  float den = 0.f, num = 0.f;
  for (int s = 0; s < nslots; ++s) {
    const long long a = at(s);
    const float w = expf(__fsub_rn(score[a], m));
    den = __fadd_rn(den, w);
    num = __fadd_rn(num, __fmul_rn(w, kv[a]));
  }
  const float v = __fdiv_rn(num, den);
  const float ss = block_sum_128(__fmul_rn(v, v), part);
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(kIndexerDim)), eps)));
  x[d] = __fmul_rn(__fmul_rn(v, inv_rms), norm_w[d]);
  __syncthreads();
  if (d < kIndexerRopeDim / 2) {
    const double inv_freq = pow(static_cast<double>(theta), -2.0 * d / kIndexerRopeDim);
    const double angle = static_cast<double>(j) * kIndexerRatio * inv_freq;
    const float cs = static_cast<float>(cos(angle));
    const float sn = static_cast<float>(sin(angle));
    constexpr int r0 = kIndexerDim - kIndexerRopeDim;
    const float a = x[r0 + 2 * d], b = x[r0 + 2 * d + 1];
    x[r0 + 2 * d] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
    x[r0 + 2 * d + 1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  }
  __syncthreads();
  const float y = x[d];
  const float amax = block_max_128(fabsf(y), part);
  const float scale = __fdiv_rn(fmaxf(amax, kAmaxFloor), kFp8Max);
  const long long blk = slot / cache.block_rows, t = slot % cache.block_rows;
  std::uint8_t* row = cache.base + blk * static_cast<long long>(cache.stride);
  row[t * kIndexerRowBytes + d] =
      static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(y, scale), __NV_SATFINITE, __NV_E4M3));
  if (d == 0)
    *reinterpret_cast<float*>(row + static_cast<long long>(cache.block_rows) * kIndexerRowBytes +
                              t * kIndexerScaleBytes) = scale;
}

// -------------------------------------------------------------------------------------- scores
// The rows of all requests form one list of 16-row tiles (request by request); each warp of a grid
// sized to the GPU takes one contiguous run of it, so long and short requests balance and a warp's
// copy pipeline stays full for its whole run. Query fragments are reloaded when the run crosses
// into the next request.
constexpr int kScoreWarps = 4;
constexpr int kStages = 4;  // cp.async ring depth per warp (8 stages measured no faster)
constexpr int kHeadTiles = kIndexerHeads / 8;            // n-tiles of 8 heads
constexpr int kMaxScoreBatch = 1024;                     // requests one launch can index

// D += A(16x32 e4m3, row) * B(32x8 e4m3, col), fp32 accumulate (sm_89+).
__device__ __forceinline__ void mma_e4m3(float (&d)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2,
                                         std::uint32_t a3, std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One warp's ring of key tiles. Each thread copies and later reads back only its own bytes (rows g
// and g+8, bytes [t*32, t*32+32)), so cp.async.wait_group alone orders a stage's copy before its use.
struct ScoreSmem {
  uint4 keys[kScoreWarps][kStages][32][4];   // [lane][row g lo, row g hi, row g+8 lo, row g+8 hi]
  float scales[kScoreWarps][kStages][32][2];
  float weights[kScoreWarps][kIndexerHeads];
  int tile_start[kMaxScoreBatch + 1];        // first tile of each request in the list
};

// The tile list of a launch: tile_start[b] = the first `rows_per_tile`-row tile of request b (its
// rows min(n_c, N) in order, the last tile partial), tile_start[batch] = the total; rows[b] (when
// given) = request b's row count. A serial prefix over the requests by warp 0 (a few hundred cycles
// for 64 requests); the caller synchronizes before reading it.
__device__ __forceinline__ void build_tile_list(const IndexerScoreArgs& a, int rows_per_tile, int* tile_start, int* rows) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int base = 0;
  for (int b0 = 0; b0 < a.batch; b0 += 32) {
    const int b = b0 + lane;
    int n = 0;
    if (b < a.batch) {
      const long long n_c = max(a.seq_lens[b], 0) / kIndexerRatio;
      n = static_cast<int>(n_c < a.N ? n_c : a.N);
      if (rows != nullptr) rows[b] = n;
    }
    const int tiles = (n + rows_per_tile - 1) / rows_per_tile;
    int incl = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (b < a.batch) tile_start[b] = base + incl - tiles;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) tile_start[a.batch] = base;
}

__global__ void __launch_bounds__(kScoreWarps * 32, 2) indexer_score_kernel(IndexerScoreArgs a) {
  extern __shared__ uint4 score_smem[];  // dynamic: the ring is larger than the 48 KiB static limit
  ScoreSmem& sm = *reinterpret_cast<ScoreSmem*>(score_smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  auto rows_of = [&](int b) {
    const long long n_c = max(a.seq_lens[b], 0) / kIndexerRatio;
    return static_cast<int>(n_c < a.N ? n_c : a.N);
  };
  build_tile_list(a, 16, sm.tile_start, nullptr);
  __syncthreads();
  const int total = sm.tile_start[a.batch];
  const int warps = gridDim.x * kScoreWarps, gw = blockIdx.x * kScoreWarps + warp;
  const int per_warp = (total + warps - 1) / warps;
  const int first = gw * per_warp, last = min(first + per_warp, total);
  if (first >= last) return;  // warp-uniform

  // Request of a tile (tiles are visited in order, so the search only moves forward).
  auto request_of = [&](int tile, int b) {
    while (sm.tile_start[b + 1] <= tile) ++b;
    return b;
  };
  // The issuing side: tile `it` of the run into stage it % kStages (past the run: an empty group).
  int ib = request_of(first, 0);
  auto issue = [&](int it) {
    const int tile = first + it;
    if (tile < last) {
      ib = request_of(tile, ib);
      const int n_rows = rows_of(ib);
      const int row0 = (tile - sm.tile_start[ib]) * 16;
      const std::int32_t* req_table = a.block_table + static_cast<long long>(ib) * a.blocks_per_req;
      // A 16-row tile lies in one block when block_rows is a multiple of 16; otherwise each row
      // looks its block up (uniform over the launch).
      const bool one_block = a.cache.block_rows % 16 == 0;
      const std::int32_t tile_blk = one_block ? __ldg(req_table + row0 / a.cache.block_rows) : 0;
      const int st = it % kStages;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int s = row0 + g + half * 8;
        const bool valid = s < n_rows;
        const std::int32_t blk = one_block ? tile_blk : (valid ? __ldg(req_table + s / a.cache.block_rows) : 0);
        const long long off = valid ? s % a.cache.block_rows : 0;
        const std::uint8_t* base = a.cache.base + (valid ? static_cast<long long>(blk) * static_cast<long long>(a.cache.stride) : 0);
        const std::uint8_t* row = base + off * kIndexerRowBytes + t * 32;
        cp_async16(&sm.keys[warp][st][lane][2 * half], row, valid);
        cp_async16(&sm.keys[warp][st][lane][2 * half + 1], row + 16, valid);
        if (t == 0) {
          const std::uint8_t* sc = base + static_cast<long long>(a.cache.block_rows) * kIndexerRowBytes +
                                   off * kIndexerScaleBytes;
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(&sm.scales[warp][st][lane][half])),
                       "l"(sc), "r"(valid ? 4 : 0));
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int it = 0; it < kStages - 1; ++it) issue(it);

  std::uint32_t qf[kHeadTiles][8];
  float* w = sm.weights[warp];
  int qb = -1;  // request whose query fragments and weights are loaded
  int cb = request_of(first, 0);
  for (int it = 0; first + it < last; ++it) {
    const int tile = first + it;
    cb = request_of(tile, cb);
    if (cb != qb) {
      // Query fragments: head nt*8 + g, bytes [t*32, t*32+32) as 8 words (k-step i: words 2i, 2i+1).
      const std::uint8_t* qp = a.q + static_cast<long long>(cb) * kIndexerHeads * kIndexerDim;
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        const uint4* p = reinterpret_cast<const uint4*>(qp + (nt * 8 + g) * kIndexerDim + t * 32);
        const uint4 v0 = __ldg(p), v1 = __ldg(p + 1);
        qf[nt][0] = v0.x; qf[nt][1] = v0.y; qf[nt][2] = v0.z; qf[nt][3] = v0.w;
        qf[nt][4] = v1.x; qf[nt][5] = v1.y; qf[nt][6] = v1.z; qf[nt][7] = v1.w;
      }
      // Head weights in shared memory (registers go to the query fragments); each warp reads only
      // what it wrote itself.
      __syncwarp();
      for (int h = lane; h < kIndexerHeads; h += 32) w[h] = __ldg(a.weights + cb * kIndexerHeads + h);
      __syncwarp();
      qb = cb;
    }
    issue(it + kStages - 1);
    cp_async_wait<kStages - 1>();
    const int st = it % kStages;
    const uint4 k0lo = sm.keys[warp][st][lane][0], k0hi = sm.keys[warp][st][lane][1];
    const uint4 k1lo = sm.keys[warp][st][lane][2], k1hi = sm.keys[warp][st][lane][3];
    const std::uint32_t ka0[8] = {k0lo.x, k0lo.y, k0lo.z, k0lo.w, k0hi.x, k0hi.y, k0hi.z, k0hi.w};
    const std::uint32_t ka1[8] = {k1lo.x, k1lo.y, k1lo.z, k1lo.w, k1hi.x, k1hi.y, k1hi.z, k1hi.w};
    float part[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        mma_e4m3(acc, ka0[2 * i], ka1[2 * i], ka0[2 * i + 1], ka1[2 * i + 1], qf[nt][2 * i], qf[nt][2 * i + 1]);
      const float w0 = w[nt * 8 + 2 * t], w1 = w[nt * 8 + 2 * t + 1];
      part[0] = __fadd_rn(part[0], __fadd_rn(__fmul_rn(w0, fmaxf(acc[0], 0.f)), __fmul_rn(w1, fmaxf(acc[1], 0.f))));
      part[1] = __fadd_rn(part[1], __fadd_rn(__fmul_rn(w0, fmaxf(acc[2], 0.f)), __fmul_rn(w1, fmaxf(acc[3], 0.f))));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 1));
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 2));
    }
    if (t == 0) {
      const int n_rows = rows_of(cb);
      const int row0 = (tile - sm.tile_start[cb]) * 16;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int s = row0 + g + half * 8;
        if (s < n_rows)
          a.logits[static_cast<long long>(cb) * a.N + s] =
              __fadd_rn(__fmul_rn(part[half], sm.scales[warp][st][lane][half]), 0.0f);  // -0.0 -> +0.0
      }
    }
  }
  cp_async_wait<0>();  // no copy may land after the CTA's shared memory is gone
}

// ------------------------------------------------------------------------------ scores on wgmma
// sm_90 has no fp8 mma.sync datapath (ptxas widens each operand to f16 with F2FP and issues HMMA:
// 12 conversions per m16n8k32, the cost of the kernel above), so this one widens each key byte
// once, in registers, and runs wgmma m64n64k16 (f16 in, fp32 accumulate) with the keys as the
// register A operand (64 rows: one warpgroup tile) and the request's queries as B, widened to f16
// once per request into shared memory. Thread (g, t) of a warp holds bytes [t*32, t*32+32) of the
// warp's rows g and g+8, as in the kernel above, so the k order is permuted the same way: A
// register word i of a row takes its bytes 4i .. 4i+3 (k-step i: bytes 4i, 4i+1 at k = 2t, 2t+1 and
// bytes 4i+2, 4i+3 at k = 2t+8, 2t+9), and the query tile stores byte d of head h at the k that the
// key byte d meets (q_perm_k). The accumulator is the mma.sync layout per warp, and the ReLU,
// head-weight and quad-sum epilogue is the one above, in the same order.
//
// Warp-specialized: a tile is 64 rows of one request, which (block_rows a multiple of 64) lie in
// one cache block: 8 KiB of key bytes and 256 bytes of scales, two bulk copies. A producer warp
// issues them into a ring of stages (an mbarrier with the byte count per stage fills it, one
// arrival of every consumer thread empties it), so the copies of several tiles stay in flight
// whatever the consumers are doing; kWsConsumers consumer warpgroups take the CTA's tiles in turn
// (tile i: stage i % kWsStages, warpgroup i % kWsConsumers). A consumer reads its rows into
// registers, frees the stage, widens, runs the 8-step wgmma chain and the epilogue. Each
// consumer has its own query tile, since two consumers can be on different requests. The CTAs
// (a persistent grid) split the tile list into contiguous runs.
constexpr int kWsRows = 64;  // rows of one tile

template <int kWsConsumers, int kWsStages>
struct WsScoreSmem {
  static constexpr int kThreads = kWsConsumers * 128 + 32;  // + the producer warp
  std::uint32_t q[kWsConsumers][kIndexerHeads * kIndexerDim / 2];  // f16 pairs, canonical K-major (SBO 2048)
  struct Stage {
    std::uint8_t keys[kWsRows * kIndexerRowBytes];
    float scales[kWsRows];
  } ring[kWsStages];
  std::uint64_t full[kWsStages];
  std::uint64_t empty[kWsStages];
  float weights[kWsConsumers][kIndexerHeads];
  int rows[kMaxScoreBatch];                 // min(n_c, N) of each request
  int tile_start[kMaxScoreBatch + 1];
};
static_assert((kWsRows * (kIndexerRowBytes + kIndexerScaleBytes)) % 16 == 0, "bulk copies need 16-byte aligned stages");
constexpr std::uint32_t kWgQSbo = (kIndexerDim / 8) * 128;  // 2048: the next 8 heads

// The k (0..127) of wgmma's B that query byte d meets: the A permutation above.
__device__ __forceinline__ int q_perm_k(int d) {
  const int t = d >> 5, i = (d >> 2) & 7, j = d & 3;
  return 16 * i + 2 * t + (j & 1) + ((j & 2) ? 8 : 0);
}
__device__ __forceinline__ std::uint32_t fp8x2_to_f16x2(std::uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xFFFFu), __NV_E4M3);
  return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
}

// D[64x64] (+)= A[64x16] * B[16x64]: A f16 in registers, B f16 K-major in shared memory, its
// descriptor as two 32-bit halves (the k-steps only move the low one: no 64-bit adds per step).
__device__ __forceinline__ void wgmma_m64n64k16_f16_rs(float (&d)[32], std::uint32_t a0, std::uint32_t a1,
                                                       std::uint32_t a2, std::uint32_t a3, std::uint32_t db_lo,
                                                       std::uint32_t db_hi, int accumulate) {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile(
      "{\n.reg .pred p;\n.reg .b64 db;\nmov.b64 db, {%36, %37};\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, db, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(db_lo), "r"(db_hi), "r"(accumulate));
#else
  (void)d; (void)a0; (void)a1; (void)a2; (void)a3; (void)db_lo; (void)db_hi; (void)accumulate;
  __trap();
#endif
}

// A named barrier of one consumer warpgroup (id 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

template <int kWsConsumers, int kWsStages, int kMinCtas>
__global__ void __launch_bounds__(kWsConsumers * 128 + 32, kMinCtas) indexer_score_wgmma_kernel(IndexerScoreArgs a) {
  extern __shared__ uint4 score_smem[];
  using Smem = WsScoreSmem<kWsConsumers, kWsStages>;
  Smem& sm = *reinterpret_cast<Smem*>(score_smem);
  const int tid = threadIdx.x, lane = tid & 31;
  if (tid == 0)
    for (int s = 0; s < kWsStages; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 128);
    }
  grid_dependency_sync();
  build_tile_list(a, kWsRows, sm.tile_start, sm.rows);
  __syncthreads();
  const int total = sm.tile_start[a.batch];
  const int per_cta = (total + gridDim.x - 1) / gridDim.x;
  const int first = blockIdx.x * per_cta, last = min(first + per_cta, total);
  if (first >= last) return;  // CTA-uniform
  const int count = last - first;

  if (tid >= kWsConsumers * 128) {
    // Producer warp: each lane locates one of the next 32 tiles (request, block, rows: one table
    // read per lane, all in flight together), then lane 0 issues them in order as stages free up.
    int b = 0;
    for (int base = 0; base < count; base += 32) {
      const int tile = first + base + lane;
      int blk = 0, off = 0, nrows = 0;
      if (tile < last) {
        while (sm.tile_start[b + 1] <= tile) ++b;
        const int row0 = (tile - sm.tile_start[b]) * kWsRows;
        nrows = min(kWsRows, sm.rows[b] - row0);
        blk = __ldg(a.block_table + static_cast<long long>(b) * a.blocks_per_req + row0 / a.cache.block_rows);
        off = row0 % a.cache.block_rows;
      }
      const int n = min(32, count - base);
      for (int j = 0; j < n; ++j) {
        const int it = base + j, st = it % kWsStages;
        const int jblk = __shfl_sync(0xffffffffu, blk, j), joff = __shfl_sync(0xffffffffu, off, j);
        const int jrows = __shfl_sync(0xffffffffu, nrows, j);
        if (lane == 0) {
          if (it >= kWsStages) mbar_wait(&sm.empty[st], ((it / kWsStages) - 1) & 1);
          const std::uint8_t* blkp = a.cache.base + static_cast<long long>(jblk) * static_cast<long long>(a.cache.stride);
          const unsigned key_bytes = static_cast<unsigned>(jrows) * kIndexerRowBytes;
          const unsigned scale_bytes = static_cast<unsigned>((jrows + 3) & ~3) * kIndexerScaleBytes;
          mbar_arrive_expect_tx(&sm.full[st], key_bytes + scale_bytes);
          bulk_copy_g2s(sm.ring[st].keys, blkp + static_cast<long long>(joff) * kIndexerRowBytes, key_bytes, &sm.full[st]);
          bulk_copy_g2s(sm.ring[st].scales,
                        blkp + static_cast<long long>(a.cache.block_rows) * kIndexerRowBytes + joff * kIndexerScaleBytes,
                        scale_bytes, &sm.full[st]);
        }
      }
    }
    return;
  }

  // Consumer warpgroup wg, thread (warp w, g, t): rows 16w + g and 16w + g + 8 of each tile.
  const int wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5;
  const int g = lane >> 2, t = lane & 3;
  std::uint32_t* q_tile = sm.q[wg];
  float* weights = sm.weights[wg];
  const std::uint64_t q_desc = wgmma_desc(q_tile, 128, kWgQSbo);
  const std::uint32_t q_lo = static_cast<std::uint32_t>(q_desc), q_hi = static_cast<std::uint32_t>(q_desc >> 32);
  int qb = -1, cb = 0;
  float w_reg[kHeadTiles][2];  // the head weights this thread's accumulator columns meet
  for (int it = wg; it < count; it += kWsConsumers) {
    const int tile = first + it;
    while (sm.tile_start[cb + 1] <= tile) ++cb;
    if (cb != qb) {  // warpgroup-uniform: the request's queries, widened to f16, and its head weights
      warpgroup_sync(wg);  // every warp's wgmma of the previous request has completed (waited below)
      const uint4* qp = reinterpret_cast<const uint4*>(a.q + static_cast<long long>(cb) * kIndexerHeads * kIndexerDim);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int chunk = c * 128 + wtid;  // 16-byte chunk: head chunk / 8, bytes (chunk % 8) * 16 ..
        const uint4 v = __ldg(qp + chunk);
        const int h = chunk >> 3, d0 = (chunk & 7) * 16;
        const std::uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int wi = 0; wi < 4; ++wi)
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const int d = d0 + 4 * wi + 2 * p;
            const int k = q_perm_k(d);  // even: the pair (d, d + 1) lands on (k, k + 1)
            const int byte = (h >> 3) * static_cast<int>(kWgQSbo) + (k >> 3) * 128 + (h & 7) * 16 + (k & 7) * 2;
            q_tile[byte >> 2] = fp8x2_to_f16x2(words[wi] >> (16 * p));
          }
      }
      if (wtid < kIndexerHeads) weights[wtid] = __ldg(a.weights + cb * kIndexerHeads + wtid);
      fence_proxy_async();  // the generic-proxy stores above -> wgmma's reads
      warpgroup_sync(wg);
#pragma unroll
      for (int nt = 0; nt < kHeadTiles; ++nt) {
        w_reg[nt][0] = weights[nt * 8 + 2 * t];
        w_reg[nt][1] = weights[nt * 8 + 2 * t + 1];
      }
      qb = cb;
    }
    const int st = it % kWsStages;
    mbar_wait(&sm.full[st], (it / kWsStages) & 1);
    const uint4* krow = reinterpret_cast<const uint4*>(sm.ring[st].keys + (warp * 16 + g) * kIndexerRowBytes + t * 32);
    const uint4 k0lo = krow[0], k0hi = krow[1];
    const uint4 k1lo = krow[8 * kIndexerRowBytes / 16], k1hi = krow[8 * kIndexerRowBytes / 16 + 1];
    const float sc0 = sm.ring[st].scales[warp * 16 + g], sc1 = sm.ring[st].scales[warp * 16 + g + 8];
    mbar_arrive(&sm.empty[st]);  // this thread's reads of the stage are done
    const std::uint32_t r0[8] = {k0lo.x, k0lo.y, k0lo.z, k0lo.w, k0hi.x, k0hi.y, k0hi.z, k0hi.w};
    const std::uint32_t r1[8] = {k1lo.x, k1lo.y, k1lo.z, k1lo.w, k1hi.x, k1hi.y, k1hi.z, k1hi.w};
    std::uint32_t af[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      af[i][0] = fp8x2_to_f16x2(r0[i]);
      af[i][1] = fp8x2_to_f16x2(r1[i]);
      af[i][2] = fp8x2_to_f16x2(r0[i] >> 16);
      af[i][3] = fp8x2_to_f16x2(r1[i] >> 16);
    }
    float acc[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) acc[e] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < 8; ++i)
      wgmma_m64n64k16_f16_rs(acc, af[i][0], af[i][1], af[i][2], af[i][3], q_lo + 16 * i, q_hi, i > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 32; ++e) asm volatile("" : "+f"(acc[e])::"memory");  // no read before the wait
    float part[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kHeadTiles; ++nt) {
      const float w0 = w_reg[nt][0], w1 = w_reg[nt][1];
      part[0] = __fadd_rn(part[0], __fadd_rn(__fmul_rn(w0, fmaxf(acc[4 * nt], 0.f)), __fmul_rn(w1, fmaxf(acc[4 * nt + 1], 0.f))));
      part[1] = __fadd_rn(part[1], __fadd_rn(__fmul_rn(w0, fmaxf(acc[4 * nt + 2], 0.f)), __fmul_rn(w1, fmaxf(acc[4 * nt + 3], 0.f))));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 1));
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 2));
    }
    if (t == 0) {
      const int n_rows = sm.rows[cb];
      const int row0 = (tile - sm.tile_start[cb]) * kWsRows + warp * 16 + g;
      float* out = a.logits + static_cast<long long>(cb) * a.N;
      if (row0 < n_rows) out[row0] = __fadd_rn(__fmul_rn(part[0], sc0), 0.0f);  // -0.0 -> +0.0
      if (row0 + 8 < n_rows) out[row0 + 8] = __fadd_rn(__fmul_rn(part[1], sc1), 0.0f);
    }
  }
}

// --------------------------------------------------------------------------------------- top-k
// One CTA of 1024 threads per request. The request's scores are read once into shared memory as
// order keys (when the row stride N fits kTopkSmemRows; otherwise every pass reads them from global
// memory / L2). A radix select finds the K-th largest key: a histogram of the top 12 bits over every
// row (4096 bins in shared memory), a block scan from the top bin finds the bin holding the K-th
// key; one pass compacts the rows of that bin (a few hundred at decode shapes) into a candidate
// list, and two 10-bit passes over the candidates alone find the exact K-th key and how many of
// its ties are taken (the lowest rows). Only when the threshold bin overflows the candidate list
// (massive ties) do those two passes read every row again.
// The output needs no sort: the compaction pass also records, as a bitmap of the rows (one 32-bit
// word per warp and 32 rows: its ballot), the rows of higher bins; the candidates above the K-th
// key join it and its ties go to a second bitmap. One block scan of the words' bit counts then
// gives every picked row its place in ascending row order (the selection rule of indexer.hpp).
constexpr int kTopkThreads = 1024;
constexpr int kTopkSmemRows = 32768;   // 128 KiB of staged keys
constexpr int kTopkMaxRows = 1 << 19;  // row stride limit: the two row bitmaps take 128 KiB
constexpr int kTopkBins = 4096;        // first digit: key bits 31..20
constexpr int kTopkCandCap = 4096;     // rows of the threshold bin kept for the 10-bit passes
constexpr int kTopkTableCap = 1024;    // block-table entries staged for the paged lists

// Float bits mapped so that unsigned order is float order (the scores carry no NaN; -0 is +0).
__device__ __forceinline__ std::uint32_t order_key(float f) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(f, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Followed in dynamic shared memory by the bitmaps above[words] and equal[words] (words =
// ceil(N / 32)) and, when staged, the keys [N].
struct TopkSmem {
  using Scan = cub::BlockScan<int, kTopkThreads>;
  typename Scan::TempStorage scan;
  int hist[kTopkBins];
  std::uint32_t cand_key[kTopkCandCap];
  std::int32_t cand_row[kTopkCandCap];
  std::int32_t picked[kIndexerMaxTopk];  // the picks in row order, before they are written out
  std::int32_t table[kTopkTableCap];     // the request's first compressed blocks (start_lists)
  int table_blocks;                      // how many of them
  int cand;       // rows of the threshold bin (may exceed kTopkCandCap)
  int bin;        // the threshold digit of the last find
  int remaining;  // rows still to take from that digit
};
__host__ __device__ constexpr int topk_smem_base() { return static_cast<int>((sizeof(TopkSmem) + 15) / 16 * 16); }
__host__ __device__ constexpr long long topk_bitmap_words(long long N) { return (N + 127) / 128 * 4; }  // 16-byte multiple

// The digit (of `bins`, from the top) holding the `need`-th largest key, from a histogram in
// sm.hist: sm.bin = the digit, sm.remaining = how many keys of that digit the selection takes.
__device__ __forceinline__ void find_threshold(TopkSmem& sm, int bins, int need) {
  const int per = bins / kTopkThreads;  // 4 or 1 bins per thread, thread 0 the highest
  int c[4] = {0, 0, 0, 0}, sum = 0;
  for (int j = 0; j < per; ++j) { c[j] = sm.hist[bins - 1 - threadIdx.x * per - j]; sum += c[j]; }
  int above = 0;
  TopkSmem::Scan(sm.scan).ExclusiveSum(sum, above);
  if (above < need && above + sum >= need) {
    for (int j = 0; j < per; ++j) {
      if (above + c[j] >= need) {
        sm.bin = bins - 1 - threadIdx.x * per - j;
        sm.remaining = need - above;
        break;
      }
      above += c[j];
    }
  }
  __syncthreads();
}

// The start of request b's paged lists, when the args carry them: the window list (it does not
// depend on the selection) and the first `rows` compressed entries' blocks from the block table
// into sm.table (up to kTopkTableCap blocks; later ones are read at the end), so their load
// latency passes during the selection instead of after it.
__device__ __forceinline__ void start_lists(const IndexerTopkArgs& a, TopkSmem& sm, int b, long long rows, int L) {
  if (a.lists.cmp_idx == nullptr) return;
  write_swa_list(a.lists, b, b, L);
  const long long blocks = (rows + a.lists.cmp_block_entries - 1) / a.lists.cmp_block_entries;
  const int staged = static_cast<int>(min(blocks, static_cast<long long>(min(kTopkTableCap, a.lists.cmp_blocks_per_req))));
  for (int j = threadIdx.x; j < staged; j += blockDim.x)
    sm.table[j] = a.lists.cmp_block_table[static_cast<long long>(b) * a.lists.cmp_blocks_per_req + j];
  if (threadIdx.x == 0) sm.table_blocks = staged;
}

// Writes the `count` picks of request b (pick i: row picked(i)), then -1 up to K, to topk_local
// and, when the args carry them, the compressed list as combine_paged would build it from
// topk_local (the block's slot base + offset, -1 for an unmapped block) and its length
// min(n_c, K). Needs start_lists and a block barrier after it.
template <class Picked>
__device__ __forceinline__ void write_picks(const IndexerTopkArgs& a, const TopkSmem& sm, int b, int count,
                                            long long n_c, Picked picked) {
  if (a.topk_local != nullptr)
    for (int i = threadIdx.x; i < a.k; i += blockDim.x)
      a.topk_local[static_cast<long long>(b) * a.k + i] = i < count ? picked(i) : -1;
  if (a.lists.cmp_idx != nullptr) {
    for (int i = threadIdx.x; i < a.lists.cmp_width; i += blockDim.x) {
      int v = -1;
      if (i < count) {
        const int c = picked(i), j = c / a.lists.cmp_block_entries;
        v = j < sm.table_blocks ? cmp_slot_in_block(a.lists, sm.table[j], c) : paged_cmp_slot(a.lists, b, c);
      }
      a.lists.cmp_idx[static_cast<long long>(b) * a.lists.cmp_width + i] = v;
    }
    if (threadIdx.x == 0) a.lists.cmp_lens[b] = static_cast<int>(n_c < a.k ? n_c : a.k);
  }
}

// The lowest `take` set bits of x (take <= popc(x)).
__device__ __forceinline__ std::uint32_t lowest_bits(std::uint32_t x, int take) {
  std::uint32_t r = 0;
  for (int t = 0; t < take; ++t) {
    r |= x & (0u - x);
    x &= x - 1u;
  }
  return r;
}

template <bool kStaged>
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(IndexerTopkArgs a) {
  extern __shared__ uint4 topk_smem[];
  TopkSmem& sm = *reinterpret_cast<TopkSmem*>(topk_smem);
  const long long words_n = topk_bitmap_words(a.N);
  std::uint32_t* above_bits = reinterpret_cast<std::uint32_t*>(topk_smem) + topk_smem_base() / 4;
  std::uint32_t* equal_bits = above_bits + words_n;
  std::uint32_t* staged = equal_bits + words_n;  // [min(N, kTopkSmemRows)] when kStaged
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  grid_dependency_sync();
  const int L = max(a.seq_lens[b], 0);
  const long long n_c = L / kIndexerRatio;
  if (n_c <= a.k) {  // short context: every row in order
    start_lists(a, sm, b, n_c, L);
    __syncthreads();
    write_picks(a, sm, b, static_cast<int>(n_c), n_c, [](int i) { return i; });
    return;
  }
  const int n = static_cast<int>(n_c < a.N ? n_c : a.N);  // rows past the stride were never scored
  const int kk = n < a.k ? n : a.k;
  start_lists(a, sm, b, n, L);
  if (kk == 0) {  // N = 0: nothing was scored
    __syncthreads();
    write_picks(a, sm, b, 0, n_c, [](int i) { return i; });
    return;
  }
  const int words = (n + 31) / 32;
  const float* scores = a.logits + static_cast<long long>(b) * a.N;
  auto key_at = [&](int i) -> std::uint32_t {
    if constexpr (kStaged) return staged[i];
    else return order_key(__ldg(scores + i));
  };
  for (int i = tid; i < kTopkBins; i += kTopkThreads) sm.hist[i] = 0;
  for (int i = tid; i < words; i += kTopkThreads) equal_bits[i] = 0;
  if (tid == 0) sm.cand = 0;
  __syncthreads();
  // The first histogram while the keys are staged (one read of the scores): each thread's loads
  // of a batch are all in flight before its first atomic.
  constexpr int kLoadBatch = 8;
  for (int i0 = 0; i0 < n; i0 += kLoadBatch * kTopkThreads) {
    std::uint32_t u[kLoadBatch];
#pragma unroll
    for (int c = 0; c < kLoadBatch; ++c) {
      const int i = i0 + c * kTopkThreads + tid;
      u[c] = i < n ? order_key(__ldg(scores + i)) : 0u;
    }
#pragma unroll
    for (int c = 0; c < kLoadBatch; ++c) {
      const int i = i0 + c * kTopkThreads + tid;
      if (i < n) {
        if constexpr (kStaged) staged[i] = u[c];
        atomicAdd(&sm.hist[u[c] >> 20], 1);
      }
    }
  }
  __syncthreads();
  find_threshold(sm, kTopkBins, kk);
  const std::uint32_t d1 = static_cast<std::uint32_t>(sm.bin);
  // The rows of higher bins into the bitmap (each warp's ballot over 32 consecutive rows is one
  // word), the threshold bin's rows into the candidate list (room reserved with one atomic per
  // warp and step of 4 x 32 rows).
  constexpr int kChunks = 4;
  const unsigned lower = (1u << lane) - 1u;
  for (int i0 = 0; i0 < n; i0 += kChunks * kTopkThreads) {  // warp-uniform trip count for the ballots
    std::uint32_t u[kChunks];
    unsigned me[kChunks];
    int ne = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {  // every load before the first bitmap store (which may alias)
      const int i = i0 + c * kTopkThreads + tid;
      u[c] = i < n ? key_at(i) : 0u;
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int i = i0 + c * kTopkThreads + tid;
      const std::uint32_t d = u[c] >> 20;
      const unsigned mg = __ballot_sync(0xffffffffu, i < n && d > d1);
      me[c] = __ballot_sync(0xffffffffu, i < n && d == d1);
      const int word = (i0 + c * kTopkThreads + warp * 32) >> 5;
      if (lane == 0 && word < words) above_bits[word] = mg;
      ne += __popc(me[c]);
    }
    int pe = 0;
    if (lane == 0 && ne) pe = atomicAdd(&sm.cand, ne);
    pe = __shfl_sync(0xffffffffu, pe, 0);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int at = pe + __popc(me[c] & lower);
      if (((me[c] >> lane) & 1u) && at < kTopkCandCap) { sm.cand_key[at] = u[c]; sm.cand_row[at] = i0 + c * kTopkThreads + tid; }
      pe += __popc(me[c]);
    }
  }
  __syncthreads();
  // Two 10-bit passes over the threshold bin's rows: the candidate list, or every row when it
  // overflowed (then filtered by the first digit).
  const bool listed = sm.cand <= kTopkCandCap;
  const int m = listed ? sm.cand : n;
  std::uint32_t prefix = d1 << 20;
  int need = sm.remaining;
  for (int shift = 10; shift >= 0; shift -= 10) {
    __syncthreads();  // sm.bin / sm.remaining / the histogram are rewritten next
    for (int i = tid; i < 1024; i += kTopkThreads) sm.hist[i] = 0;
    __syncthreads();
    const std::uint32_t pmask = ~((1u << (shift + 10)) - 1u);
    for (int j = tid; j < m; j += kTopkThreads) {
      const std::uint32_t u = listed ? sm.cand_key[j] : key_at(j);
      if ((u & pmask) == prefix) atomicAdd(&sm.hist[(u >> shift) & 1023u], 1);
    }
    __syncthreads();
    find_threshold(sm, 1024, need);
    prefix |= static_cast<std::uint32_t>(sm.bin) << shift;
    need = sm.remaining;
  }
  const std::uint32_t kth = prefix;  // the kk-th largest key
  const int ties = need;             // rows equal to it that are taken (the lowest ids)
  if (listed) {  // the threshold bin's rows above the K-th key join the bitmap; its ties their own
    for (int j = tid; j < m; j += kTopkThreads) {
      const std::uint32_t u = sm.cand_key[j];
      const int r = sm.cand_row[j];
      if (u > kth) atomicOr(&above_bits[r >> 5], 1u << (r & 31));
      else if (u == kth) atomicOr(&equal_bits[r >> 5], 1u << (r & 31));
    }
  } else {  // every row again, word by word
    for (int base = warp * 32; base < n; base += kTopkThreads) {
      const int i = base + lane;
      const std::uint32_t u = i < n ? key_at(i) : 0u;
      const unsigned ga = __ballot_sync(0xffffffffu, i < n && u > kth);
      const unsigned ge = __ballot_sync(0xffffffffu, i < n && u == kth);
      if (lane == 0) { above_bits[base >> 5] = ga; equal_bits[base >> 5] = ge; }
    }
  }
  __syncthreads();
  // Thread t owns words [w0, w1); a scan of the above and the equal counts places every pick: a row's
  // place = rows above before it + min(ties before it, ties taken).
  const int per = (words + kTopkThreads - 1) / kTopkThreads;
  const int w0 = min(tid * per, words), w1 = min(w0 + per, words);
  unsigned n_above = 0, n_equal = 0;
  for (int w = w0; w < w1; ++w) { n_above += __popc(above_bits[w]); n_equal += __popc(equal_bits[w]); }
  int above_before = 0, equal_before = 0;
  if (n < 32768) {  // both counts in one int, 15 bits each (a 64-bit pair scan spills at 64 registers)
    int before = 0;
    TopkSmem::Scan(sm.scan).ExclusiveSum(static_cast<int>(n_equal << 16 | n_above), before);
    above_before = before & 0xFFFF;
    equal_before = before >> 16;
  } else {
    TopkSmem::Scan(sm.scan).ExclusiveSum(static_cast<int>(n_above), above_before);
    __syncthreads();
    TopkSmem::Scan(sm.scan).ExclusiveSum(static_cast<int>(n_equal), equal_before);
  }
  for (int w = w0; w < w1; ++w) {
    const std::uint32_t ab = above_bits[w], eb = equal_bits[w];
    std::uint32_t chosen = ab | lowest_bits(eb, max(0, min(__popc(eb), ties - equal_before)));
    int pos = above_before + min(equal_before, ties);
    while (chosen != 0u) {
      sm.picked[pos++] = w * 32 + __ffs(chosen) - 1;
      chosen &= chosen - 1u;
    }
    above_before += __popc(ab);
    equal_before += __popc(eb);
  }
  __syncthreads();
  write_picks(a, sm, b, kk, n_c, [&](int i) { return sm.picked[i]; });
}

// Launches with programmatic dependent launch allowed (the kernels call grid_dependency_sync()
// before their first global access).
template <class Kernel, class Args>
void launch_pdl(Kernel k, dim3 grid, dim3 block, int smem, cudaStream_t stream, const Args& args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = static_cast<std::size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = attention::device_cc_major() >= 9 ? 1 : 0;  // the attribute needs sm_90
  check_cuda(cudaLaunchKernelEx(&cfg, k, args), "cudaLaunchKernelEx(indexer)");
}

// Raises a kernel's dynamic shared memory limit once per device (kernel attributes are per device).
template <class Kernel>
void allow_dynamic_smem(Kernel k, int bytes, bool (&done)[64], const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (done[dev & 63]) return;
  check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  // The whole unified L1 as shared memory: otherwise the driver may pick a carveout that fits fewer
  // CTAs per multiprocessor than the grid below is sized for (a second wave doubles the time).
  check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared), what);
  done[dev & 63] = true;
}
// CTAs of `k` that fit on one multiprocessor (at least 1): a persistent grid is that times the SMs.
template <class Kernel>
int resident_ctas(Kernel k, int threads, int smem) {
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, threads, smem), "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return n > 0 ? n : 1;
}

void launch_topk(const IndexerTopkArgs& a, cudaStream_t stream) {
  constexpr int base = topk_smem_base();
  static_assert(base + 2 * topk_bitmap_words(kTopkSmemRows) * 4 + kTopkSmemRows * 4 <= 227 * 1024,
                "top-k shared memory over the sm_90 limit (staged)");
  static_assert(base + 2 * topk_bitmap_words(kTopkMaxRows) * 4 <= 227 * 1024, "top-k shared memory over the sm_90 limit");
  const int bitmaps = static_cast<int>(2 * topk_bitmap_words(a.N) * 4);
  if (a.N <= kTopkSmemRows) {
    static bool done[64] = {};
    allow_dynamic_smem(topk_kernel<true>, base + 2 * static_cast<int>(topk_bitmap_words(kTopkSmemRows)) * 4 + kTopkSmemRows * 4,
                       done, "cudaFuncSetAttribute(indexer top-k)");
    launch_pdl(topk_kernel<true>, dim3(a.batch), dim3(kTopkThreads), base + bitmaps + static_cast<int>(a.N) * 4, stream, a);
  } else {
    static bool done[64] = {};
    allow_dynamic_smem(topk_kernel<false>, base + 2 * static_cast<int>(topk_bitmap_words(kTopkMaxRows)) * 4, done,
                       "cudaFuncSetAttribute(indexer top-k)");
    launch_pdl(topk_kernel<false>, dim3(a.batch), dim3(kTopkThreads), base + bitmaps, stream, a);
  }
}

template <int C, int S, int M>
void launch_score_ws(const IndexerScoreArgs& a, cudaStream_t stream) {
  using Smem = WsScoreSmem<C, S>;
  constexpr int bytes = static_cast<int>(sizeof(Smem));
  static bool done[64] = {};
  allow_dynamic_smem(indexer_score_wgmma_kernel<C, S, M>, bytes, done, "cudaFuncSetAttribute(indexer scores, wgmma)");
  static int ctas[64] = {};  // per device, like the attribute
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (ctas[dev & 63] == 0) ctas[dev & 63] = resident_ctas(indexer_score_wgmma_kernel<C, S, M>, Smem::kThreads, bytes);
  launch_pdl(indexer_score_wgmma_kernel<C, S, M>, dim3(ctas[dev & 63] * device_sm_count()), dim3(Smem::kThreads), bytes, stream, a);
}

void check_indexer_cache(const char* fn, const IndexerCache& c) {
  require_ptr(fn, "cache.base", c.base);
  if (c.block_rows <= 0) bad_arg(fn, "cache.block_rows", c.block_rows, ">= 1");
  if (c.num_blocks < 0 || static_cast<long long>(c.num_blocks) * c.block_rows > 0x7FFFFFFFLL)
    bad_arg(fn, "cache.num_blocks * block_rows", static_cast<long long>(c.num_blocks) * c.block_rows,
            "0 .. 2^31-1 (int32 slots)");
  if (c.stride < indexer_block_stride_bytes(c.block_rows) || c.stride % 16 != 0)
    bad_arg(fn, "cache.stride", static_cast<long long>(c.stride),
            "a multiple of 16 bytes >= indexer_block_stride_bytes(block_rows)");
  if (reinterpret_cast<std::uintptr_t>(c.base) % 16 != 0)
    bad_arg(fn, "cache.base % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(c.base) % 16),
            "0 (16-byte aligned)");
}

void check_rows(const char* fn, int batch, long long N) {
  require_batch(fn, batch);
  if (N < 0) bad_arg(fn, "N", N, "N >= 0");
  if (static_cast<long long>(batch) * N > 0x7FFFFFFFLL)
    bad_arg(fn, "batch * N", static_cast<long long>(batch) * N, "<= 2^31-1 (int32 row ids)");
}

}  // namespace

void indexer_compress_insert(const float* kv_state, const float* score_state, const std::int64_t* state_base,
                             const std::int32_t* row_index, const std::int32_t* slots, int n,
                             const float* norm_weight, float rope_theta, float eps, IndexerCache cache,
                             cudaStream_t stream) {
  const char* fn = "indexer_compress_insert";
  if (n < 0) bad_arg(fn, "n", n, "n >= 0");
  if (n == 0) return;
  require_ptr(fn, "kv_state", kv_state);
  require_ptr(fn, "score_state", score_state);
  require_ptr(fn, "state_base", state_base);
  require_ptr(fn, "row_index", row_index);
  require_ptr(fn, "slots", slots);
  require_ptr(fn, "norm_weight", norm_weight);
  check_indexer_cache(fn, cache);
  if (!(rope_theta > 0.f)) bad_arg(fn, "rope_theta", static_cast<long long>(rope_theta), "> 0");
  indexer_compress_kernel<<<n, kCompressThreads, 0, stream>>>(kv_state, score_state, state_base, row_index, slots,
                                                              norm_weight, rope_theta, eps, cache);
  check_launch(fn);
}

void indexer_score(const IndexerScoreArgs& a, cudaStream_t stream) {
  const char* fn = "indexer_score";
  check_rows(fn, a.batch, a.N);
  require_ptr(fn, "seq_lens", a.seq_lens);
  require_ptr(fn, "q", a.q);
  require_ptr(fn, "weights", a.weights);
  require_ptr(fn, "block_table", a.block_table);
  require_ptr(fn, "logits", a.logits);
  check_indexer_cache(fn, a.cache);
  if (reinterpret_cast<std::uintptr_t>(a.q) % 16 != 0)
    bad_arg(fn, "q % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.q) % 16), "0 (16-byte aligned)");
  if (a.blocks_per_req * static_cast<long long>(a.cache.block_rows) < a.N)
    bad_arg(fn, "blocks_per_req * block_rows", a.blocks_per_req * static_cast<long long>(a.cache.block_rows),
            ">= N (the block table must cover every row the logits can hold)");
  if (a.batch > kMaxScoreBatch) bad_arg(fn, "batch (B)", a.batch, "1 .. " + std::to_string(kMaxScoreBatch));
  if (a.N == 0) return;
  const int major = attention::device_cc_major();
  // The sm_90a kernel copies 64-row tiles that lie in one cache block.
  bool wgmma = major == 9 && a.cache.block_rows % kWsRows == 0;
  switch (a.engine) {
    case IndexerEngine::automatic: break;
    case IndexerEngine::mma_sync: wgmma = false; break;
    case IndexerEngine::wgmma:
      if (major != 9)
        bad_arg(fn, "engine = wgmma on compute capability major", major, "9 (sm_90a code); use automatic or mma_sync");
      if (a.cache.block_rows % kWsRows != 0)
        bad_arg(fn, "engine = wgmma with cache.block_rows", a.cache.block_rows,
                "a multiple of " + std::to_string(kWsRows) + "; use automatic or mma_sync");
      wgmma = true;
      break;
  }
  if (wgmma) {
    // Two consumer warpgroups and 8 stages, two CTAs per multiprocessor (3 x 12 stages, 4 x 12
    // and 2 x 6 measured within 3 % of it; consumers that keep two tiles in flight, one CTA per
    // multiprocessor for their registers, measured 11 % slower).
    launch_score_ws<2, 8, 2>(a, stream);
  } else {
    // Two CTAs per multiprocessor (what the registers allow): every warp's run is long enough to
    // keep its copy pipeline full.
    static bool done[64] = {};
    allow_dynamic_smem(indexer_score_kernel, static_cast<int>(sizeof(ScoreSmem)), done,
                       "cudaFuncSetAttribute(indexer scores)");
    indexer_score_kernel<<<2 * device_sm_count(), kScoreWarps * 32, sizeof(ScoreSmem), stream>>>(a);
  }
  check_launch(fn);
}

DeviceIndexerInputs upload(const ref::IndexerInputs& in) {
  DeviceIndexerInputs d;
  const std::size_t cache = (in.cache_bytes.size() + 255) / 256 * 256;
  const std::size_t q = (in.q.size() + 255) / 256 * 256;
  d.storage = device_alloc(cache + q + in.weights.size() * sizeof(float));
  std::uint8_t* base = d.storage.get();
  d.cache = in.cache;
  d.cache.base = base;
  d.q = base + cache;
  d.weights = reinterpret_cast<float*>(base + cache + q);
  check_cuda(cudaMemcpy(d.cache.base, in.cache_bytes.data(), in.cache_bytes.size(), cudaMemcpyHostToDevice),
             "upload of the indexer cache");
  check_cuda(cudaMemcpy(d.q, in.q.data(), in.q.size(), cudaMemcpyHostToDevice), "upload of the indexer queries");
  check_cuda(cudaMemcpy(d.weights, in.weights.data(), in.weights.size() * sizeof(float), cudaMemcpyHostToDevice),
             "upload of the indexer weights");
  return d;
}

void indexer_topk(const IndexerTopkArgs& a, cudaStream_t stream) {
  const char* fn = "indexer_topk";
  check_rows(fn, a.batch, a.N);
  if (a.k <= 0 || a.k > kIndexerMaxTopk) bad_arg(fn, "k", a.k, "1 .. " + std::to_string(kIndexerMaxTopk));
  require_ptr(fn, "seq_lens", a.seq_lens);
  if (a.N > 0) require_ptr(fn, "logits", a.logits);
  if (a.N > kTopkMaxRows)
    bad_arg(fn, "N", a.N, "<= " + std::to_string(kTopkMaxRows) + " (compressed rows of a request: contexts up to " +
                              std::to_string(4ll * kTopkMaxRows) + " tokens)");
  if (a.lists.cmp_idx == nullptr) {
    require_ptr(fn, "topk_local", a.topk_local);
  } else {  // the lists combine_paged would build for this C4 layer, one query token per request
    const PagedIndexArgs& l = a.lists;
    if (l.batch != a.batch) bad_arg(fn, "lists.batch", l.batch, "batch = " + std::to_string(a.batch));
    if (l.query_tokens != 1) bad_arg(fn, "lists.query_tokens", l.query_tokens, "1 (the indexer scores one query token per request)");
    if (l.ratio != kIndexerRatio) bad_arg(fn, "lists.ratio", l.ratio, "4 (only C4 layers have an indexer)");
    if (l.topk != a.k) bad_arg(fn, "lists.topk", l.topk, "k = " + std::to_string(a.k));
    check_paged_index_args(fn, l, /*picks_read=*/false);
  }
  launch_topk(a, stream);
  check_launch(fn);
}

}  // namespace graphsafe::ds4::cuda
