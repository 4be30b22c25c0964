// The lightning indexer on the GPU (graphsafe/ds4/indexer.hpp): the key compressor, the scores on
// fp8 tensor cores and the top-k selection (a radix select with CUB's block primitives).
//
// Scores: one warp takes 16 key rows at a time and computes S = K8 (16 x 128) * Q8^T (128 x 64
// heads) with mma.sync m16n8k32 e4m3 (fp32 accumulate); the 64 x 128 query bytes stay in registers
// as B fragments for the whole row range. Because a dot product does not care in which order its
// k terms are summed, each thread loads the 32 contiguous key bytes [t*32, t*32+32) of its two rows
// (two 16-byte loads) and feeds them to the four k-steps; the query fragments use the same
// permutation of k. Each thread then holds 2 rows x 16 heads of S; ReLU, the head weights and a sum
// over the quad (fixed shuffle order: replays reproduce eager results bit for bit) give the score.
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <cuda_fp8.h>

namespace graphsafe::ds4::cuda {
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

__global__ void __launch_bounds__(kScoreWarps * 32, 2) indexer_score_kernel(IndexerScoreArgs a) {
  extern __shared__ uint4 score_smem[];  // dynamic: the ring is larger than the 48 KiB static limit
  ScoreSmem& sm = *reinterpret_cast<ScoreSmem*>(score_smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  auto rows_of = [&](int b) {
    const long long n_c = max(a.seq_lens[b], 0) / kIndexerRatio;
    return static_cast<int>(n_c < a.N ? n_c : a.N);
  };
  // Tile list: a serial prefix over the requests by warp 0 (a few hundred cycles for 64 requests).
  if (warp == 0) {
    int base = 0;
    for (int b0 = 0; b0 < a.batch; b0 += 32) {
      const int b = b0 + lane;
      const int tiles = b < a.batch ? (rows_of(b) + 15) / 16 : 0;
      int incl = tiles;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
      }
      if (b < a.batch) sm.tile_start[b] = base + incl - tiles;
      base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) sm.tile_start[a.batch] = base;
  }
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
      const std::int32_t blk = __ldg(a.block_table + static_cast<long long>(ib) * a.blocks_per_req + row0 / a.cache.block_rows);
      const int st = it % kStages;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int s = row0 + g + half * 8;
        const bool valid = s < n_rows;
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

// --------------------------------------------------------------------------------------- top-k
// One CTA per request. The request's scores are read once into shared memory as order keys (when the
// row stride N fits kTopkSmemRows; otherwise every pass reads them from global memory / L2). A radix
// select finds the K-th largest key (four 8-bit passes, most significant digit first, histograms in
// shared memory with warp-aggregated atomics: scores share their top bits, so plain atomics would
// serialise on a few bins). The rows above it and the rows equal to it are collected in one
// unordered pass; CUB's BlockRadixSort then orders them by (score descending, row ascending), so the
// first K are the selection rule of indexer.hpp, a pure function of the scores. Only when the rows
// equal to the K-th key overflow the sort's capacity (massive ties) are the lowest-id ties taken by
// an ordered block scan instead.
constexpr int kTopkThreads = 512;
constexpr int kTopkSmemRows = 32768;  // 128 KiB of staged keys

// Float bits mapped so that unsigned order is float order (the scores carry no NaN; -0 is +0).
__device__ __forceinline__ std::uint32_t order_key(float f) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(f, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int kItems>
struct TopkSmem {
  using Sort = cub::BlockRadixSort<unsigned long long, kTopkThreads, kItems>;
  using Scan = cub::BlockScan<int, kTopkThreads>;
  union {
    typename Sort::TempStorage sort;
    unsigned long long picked[kTopkThreads * kItems];  // (~key << 32) | row, ascending = the rule's order
  } u;
  typename Scan::TempStorage scan;
  int hist[256];
  // Pass p reads slot p and writes slot p + 1: no slot is read and written in the same pass.
  std::uint32_t prefix[5];
  int remaining[5];
  int count;
  int eq_count;
  int eq_base;
};

template <int kItems, bool kStaged>
__global__ void __launch_bounds__(kTopkThreads) topk_kernel(IndexerTopkArgs a) {
  using S = TopkSmem<kItems>;
  constexpr int kCap = kTopkThreads * kItems;
  __shared__ S sm;
  extern __shared__ std::uint32_t staged[];  // [min(N, kTopkSmemRows)] order keys (kStaged)
  const int b = blockIdx.x, tid = threadIdx.x, lane = tid & 31;
  const long long n_c = max(a.seq_lens[b], 0) / kIndexerRatio;
  std::int32_t* out = a.topk_local + static_cast<long long>(b) * a.k;
  if (n_c <= a.k) {  // short context: every row in order
    for (int i = tid; i < a.k; i += kTopkThreads) out[i] = i < n_c ? i : -1;
    return;
  }
  const int n = static_cast<int>(n_c < a.N ? n_c : a.N);  // rows past the stride were never scored
  const int kk = n < a.k ? n : a.k;
  const float* scores = a.logits + static_cast<long long>(b) * a.N;
  if constexpr (kStaged) {
#pragma unroll 8
    for (int i = tid; i < n; i += kTopkThreads) staged[i] = order_key(__ldg(scores + i));
  }
  auto key_at = [&](int i) -> std::uint32_t {
    if constexpr (kStaged) return staged[i];
    else return order_key(__ldg(scores + i));
  };

  if (tid == 0) { sm.prefix[0] = 0; sm.remaining[0] = kk; }
  std::uint32_t mask = 0;
  for (int pass = 0, shift = 24; shift >= 0; ++pass, shift -= 8) {
    for (int i = tid; i < 256; i += kTopkThreads) sm.hist[i] = 0;
    __syncthreads();  // also orders the staging stores before the first pass
    const std::uint32_t prefix = sm.prefix[pass];
    for (int i0 = 0; i0 < n; i0 += kTopkThreads) {  // warp-uniform trip count: every lane reaches the match
      const int i = i0 + tid;
      const std::uint32_t u = i < n ? key_at(i) : 0u;
      const bool in = i < n && (u & mask) == prefix;
      const unsigned digit = in ? (u >> shift) & 255u : 256u;
      const unsigned same = __match_any_sync(0xffffffffu, digit);
      if (in && lane == __ffs(same) - 1) atomicAdd(&sm.hist[digit], __popc(same));
    }
    __syncthreads();
    if (tid < 32) {  // the digit holding the remaining-th largest key, from the top
      int c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) { c[j] = sm.hist[255 - 8 * tid - j]; sum += c[j]; }
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (tid >= o) incl += v;
      }
      const int remaining = sm.remaining[pass];
      const unsigned hit = __ballot_sync(0xffffffffu, incl >= remaining);
      if (tid == __ffs(hit) - 1) {
        int above = incl - sum;  // keys in higher digits
        int digit = 255 - 8 * tid;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (above + c[j] >= remaining) { digit = 255 - 8 * tid - j; break; }
          above += c[j];
        }
        sm.prefix[pass + 1] = prefix | (static_cast<std::uint32_t>(digit) << shift);
        sm.remaining[pass + 1] = remaining - above;
      }
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  const std::uint32_t kth = sm.prefix[4];   // the kk-th largest key
  const int ties = sm.remaining[4];         // how many rows equal to it are taken (the lowest ids)
  const int above = kk - ties;           // rows with a larger key, exactly
  if (tid == 0) { sm.count = 0; sm.eq_count = 0; sm.eq_base = 0; }
  __syncthreads();
  auto pack = [](std::uint32_t u, int i) {
    return (static_cast<unsigned long long>(~u) << 32) | static_cast<unsigned>(i);
  };
  // Unordered pass: larger keys to [0, above), equal keys after them while they fit.
  for (int i = tid; i < n; i += kTopkThreads) {
    const std::uint32_t u = key_at(i);
    if (u > kth) {
      sm.u.picked[atomicAdd(&sm.count, 1)] = pack(u, i);
    } else if (u == kth) {
      const int at = above + atomicAdd(&sm.eq_count, 1);
      if (at < kCap) sm.u.picked[at] = pack(u, i);
    }
  }
  __syncthreads();
  int total = above + sm.eq_count;
  if (total > kCap) {
    // Too many ties for the sort: take the `ties` lowest-id equal rows in row order (block scan).
    total = kk;
    for (int c0 = 0; c0 < n; c0 += kTopkThreads) {
      const int i = c0 + tid;
      const bool eq = i < n && key_at(i) == kth;
      int eq_rank, eq_total;
      typename S::Scan(sm.scan).ExclusiveSum(eq ? 1 : 0, eq_rank, eq_total);
      const int base = sm.eq_base;
      if (eq && base + eq_rank < ties) sm.u.picked[above + base + eq_rank] = pack(kth, i);
      __syncthreads();
      if (tid == 0) sm.eq_base = base + eq_total;
      if (base + eq_total >= ties) break;  // block-uniform: base and eq_total are
      __syncthreads();
    }
    __syncthreads();
  }
  unsigned long long keys[kItems];
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int at = tid * kItems + j;
    keys[j] = at < total ? sm.u.picked[at] : ~0ull;
  }
  __syncthreads();  // the sort reuses the picked array's storage
  typename S::Sort(sm.u.sort).Sort(keys);
#pragma unroll
  for (int j = 0; j < kItems; ++j) {
    const int at = tid * kItems + j;  // blocked arrangement: thread t holds ranks t*kItems ..
    if (at < a.k) out[at] = at < kk ? static_cast<std::int32_t>(keys[j] & 0xFFFFFFFFull) : -1;
  }
  for (int at = kCap + tid; at < a.k; at += kTopkThreads) out[at] = -1;
}

// Raises a kernel's dynamic shared memory limit once per device (kernel attributes are per device).
template <class Kernel>
void allow_dynamic_smem(Kernel k, int bytes, bool (&done)[64], const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  if (done[dev & 63]) return;
  check_cuda(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  done[dev & 63] = true;
}

template <int kItems>
void launch_topk(const IndexerTopkArgs& a, cudaStream_t stream) {
  if (a.N <= kTopkSmemRows) {
    static bool done[64] = {};
    allow_dynamic_smem(topk_kernel<kItems, true>, kTopkSmemRows * 4, done, "cudaFuncSetAttribute(indexer top-k)");
    const int bytes = static_cast<int>(a.N) * 4;
    topk_kernel<kItems, true><<<a.batch, kTopkThreads, bytes, stream>>>(a);
  } else {
    topk_kernel<kItems, false><<<a.batch, kTopkThreads, 0, stream>>>(a);
  }
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
  // Two CTAs per multiprocessor (what the registers allow): every warp's run is long enough to keep
  // its copy pipeline full.
  static bool done[64] = {};
  allow_dynamic_smem(indexer_score_kernel, static_cast<int>(sizeof(ScoreSmem)), done,
                     "cudaFuncSetAttribute(indexer scores)");
  indexer_score_kernel<<<2 * device_sm_count(), kScoreWarps * 32, sizeof(ScoreSmem), stream>>>(a);
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
  require_ptr(fn, "topk_local", a.topk_local);
  if (a.N > 0) require_ptr(fn, "logits", a.logits);
  if (a.k <= kTopkThreads)
    launch_topk<1>(a, stream);
  else if (a.k <= 2 * kTopkThreads)
    launch_topk<2>(a, stream);
  else
    launch_topk<4>(a, stream);
  check_launch(fn);
}

}  // namespace graphsafe::ds4::cuda
