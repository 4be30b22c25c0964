// The lightning indexer on the GPU (graphsafe/ds4/indexer.hpp): the key compressor, the scores on
// fp8 tensor cores and the top-k selection through CUB's segmented radix sort.
//
// Scores: one warp takes 16 key rows at a time and computes S = K8 (16 x 128) * Q8^T (128 x 64
// heads) with mma.sync m16n8k32 e4m3 (fp32 accumulate); the 64 x 128 query bytes stay in registers
// as B fragments for the whole row range. Because a dot product does not care in which order its
// k terms are summed, each thread loads the 32 contiguous key bytes [t*32, t*32+32) of its two rows
// (two 16-byte loads) and feeds them to the four k-steps; the query fragments use the same
// permutation of k. Each thread then holds 2 rows x 16 heads of S; ReLU, the head weights and a sum
// over the quad (fixed shuffle order: replays reproduce eager results bit for bit) give the score.
#include <graphsafe/ds4/indexer_kernels.hpp>

#include "cuda_support.cuh"

#include <cub/device/device_segmented_radix_sort.cuh>

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
constexpr int kScoreWarps = 4;
constexpr int kTilesPerWarp = 16;                        // 16-row tiles per warp (one after another)
constexpr int kStages = 4;                               // cp.async ring depth per warp
constexpr int kRowsPerCta = kScoreWarps * kTilesPerWarp * 16;
constexpr int kHeadTiles = kIndexerHeads / 8;            // n-tiles of 8 heads

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
};

__global__ void __launch_bounds__(kScoreWarps * 32, 3) indexer_score_kernel(IndexerScoreArgs a) {
  __shared__ ScoreSmem sm;
  const int b = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_c = max(a.seq_lens[b], 0) / kIndexerRatio;
  const long long n_rows = min(static_cast<long long>(n_c), static_cast<long long>(a.N));
  const long long warp_row0 = static_cast<long long>(blockIdx.x) * kRowsPerCta +
                              static_cast<long long>(warp) * kTilesPerWarp * 16;
  if (warp_row0 >= n_rows) return;  // warp-uniform

  const std::int32_t* table = a.block_table + static_cast<long long>(b) * a.blocks_per_req;
  // Copies tile `tile` of this warp into stage `tile % kStages` (rows past n_rows: zeros).
  auto issue = [&](int tile) {
    if (tile < kTilesPerWarp) {
      const int st = tile % kStages;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long s = warp_row0 + tile * 16 + g + half * 8;
        const bool valid = s < n_rows;
        const std::uint8_t* base = a.cache.base;
        long long off = 0;
        if (valid) {
          base += static_cast<long long>(__ldg(table + s / a.cache.block_rows)) * static_cast<long long>(a.cache.stride);
          off = s % a.cache.block_rows;
        }
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
  for (int tile = 0; tile < kStages - 1; ++tile) issue(tile);

  // Query fragments: head nt*8 + g, bytes [t*32, t*32+32) as 8 words (k-step i: words 2i, 2i+1).
  std::uint32_t qf[kHeadTiles][8];
  const std::uint8_t* qb = a.q + static_cast<long long>(b) * kIndexerHeads * kIndexerDim;
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    const uint4* p = reinterpret_cast<const uint4*>(qb + (nt * 8 + g) * kIndexerDim + t * 32);
    const uint4 v0 = __ldg(p), v1 = __ldg(p + 1);
    qf[nt][0] = v0.x; qf[nt][1] = v0.y; qf[nt][2] = v0.z; qf[nt][3] = v0.w;
    qf[nt][4] = v1.x; qf[nt][5] = v1.y; qf[nt][6] = v1.z; qf[nt][7] = v1.w;
  }
  // Weights of the heads this thread's accumulators hold: nt*8 + 2t, nt*8 + 2t + 1.
  float w[kHeadTiles][2];
#pragma unroll
  for (int nt = 0; nt < kHeadTiles; ++nt) {
    w[nt][0] = __ldg(a.weights + b * kIndexerHeads + nt * 8 + 2 * t);
    w[nt][1] = __ldg(a.weights + b * kIndexerHeads + nt * 8 + 2 * t + 1);
  }

  for (int tile = 0; tile < kTilesPerWarp; ++tile) {
    const long long r0 = warp_row0 + tile * 16;
    if (r0 >= n_rows) break;  // warp-uniform
    issue(tile + kStages - 1);
    cp_async_wait<kStages - 1>();
    const int st = tile % kStages;
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
      part[0] = __fadd_rn(part[0], __fadd_rn(__fmul_rn(w[nt][0], fmaxf(acc[0], 0.f)), __fmul_rn(w[nt][1], fmaxf(acc[1], 0.f))));
      part[1] = __fadd_rn(part[1], __fadd_rn(__fmul_rn(w[nt][0], fmaxf(acc[2], 0.f)), __fmul_rn(w[nt][1], fmaxf(acc[3], 0.f))));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 1));
      part[half] = __fadd_rn(part[half], __shfl_xor_sync(0xffffffffu, part[half], 2));
    }
    if (t == 0) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const long long s = r0 + g + half * 8;
        if (s < n_rows) {
          const long long at = static_cast<long long>(b) * a.N + s;
          a.logits[at] = __fadd_rn(__fmul_rn(part[half], sm.scales[warp][st][lane][half]), 0.0f);  // -0.0 -> +0.0
          a.ids[at] = static_cast<std::int32_t>(s);
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy may land after the CTA's shared memory is gone
}

// --------------------------------------------------------------------------------------- top-k
// Request b's segment: its n_c scores when it has more than K (empty otherwise: the short-context
// path needs no sort).
__global__ void topk_segments_kernel(const std::int32_t* seq_lens, int batch, long long N, int k,
                                     std::int32_t* begin, std::int32_t* end) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const long long n_c = max(seq_lens[b], 0) / kIndexerRatio;
  const long long n_rows = n_c < N ? n_c : N;
  begin[b] = static_cast<std::int32_t>(b * N);
  end[b] = static_cast<std::int32_t>(b * N + (n_c > k ? n_rows : 0));
}

__global__ void topk_finalize_kernel(const std::int32_t* seq_lens, long long N, int k,
                                     const std::int32_t* sorted_ids, std::int32_t* topk_local) {
  const int b = blockIdx.x;
  const long long n_c = max(seq_lens[b], 0) / kIndexerRatio;
  const long long n_rows = n_c < N ? n_c : N;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    std::int32_t v = -1;
    if (n_c <= k) {
      if (i < n_c) v = i;
    } else if (i < n_rows) {
      v = sorted_ids[b * N + i];
    }
    topk_local[static_cast<long long>(b) * k + i] = v;
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
    bad_arg(fn, "batch * N", static_cast<long long>(batch) * N, "<= 2^31-1 (int32 row ids and CUB item counts)");
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
  require_ptr(fn, "ids", a.ids);
  check_indexer_cache(fn, a.cache);
  if (reinterpret_cast<std::uintptr_t>(a.q) % 16 != 0)
    bad_arg(fn, "q % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.q) % 16), "0 (16-byte aligned)");
  if (a.blocks_per_req * static_cast<long long>(a.cache.block_rows) < a.N)
    bad_arg(fn, "blocks_per_req * block_rows", a.blocks_per_req * static_cast<long long>(a.cache.block_rows),
            ">= N (the block table must cover every row the logits can hold)");
  if (a.N == 0) return;
  const dim3 grid(static_cast<unsigned>((a.N + kRowsPerCta - 1) / kRowsPerCta), static_cast<unsigned>(a.batch));
  indexer_score_kernel<<<grid, kScoreWarps * 32, 0, stream>>>(a);
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

std::size_t indexer_topk_temp_bytes(int batch, std::int64_t N) {
  check_rows("indexer_topk_temp_bytes", batch, N);
  std::size_t bytes = 0;
  check_cuda(cub::DeviceSegmentedRadixSort::SortPairsDescending(
                 nullptr, bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
                 static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
                 static_cast<int>(batch * N), batch, static_cast<const std::int32_t*>(nullptr),
                 static_cast<const std::int32_t*>(nullptr)),
             "cub::DeviceSegmentedRadixSort (temporary storage size)");
  return bytes;
}

void indexer_topk(const IndexerTopkArgs& a, cudaStream_t stream) {
  const char* fn = "indexer_topk";
  check_rows(fn, a.batch, a.N);
  if (a.k <= 0) bad_arg(fn, "k", a.k, "k >= 1");
  require_ptr(fn, "seq_lens", a.seq_lens);
  require_ptr(fn, "topk_local", a.topk_local);
  if (a.N > 0) {
    require_ptr(fn, "logits", a.logits);
    require_ptr(fn, "ids", a.ids);
    require_ptr(fn, "sorted_logits", a.sorted_logits);
    require_ptr(fn, "sorted_ids", a.sorted_ids);
    require_ptr(fn, "segment_offsets", a.segment_offsets);
    const std::size_t need = indexer_topk_temp_bytes(a.batch, a.N);
    if (a.temp_bytes < need)
      bad_arg(fn, "temp_bytes", static_cast<long long>(a.temp_bytes),
              ">= indexer_topk_temp_bytes(batch, N) = " + std::to_string(need));
    require_ptr(fn, "temp", a.temp);
    std::int32_t* begin = a.segment_offsets;
    std::int32_t* end = a.segment_offsets + a.batch;
    topk_segments_kernel<<<(a.batch + 127) / 128, 128, 0, stream>>>(a.seq_lens, a.batch, a.N, a.k, begin, end);
    check_launch("indexer_topk (segments)");
    std::size_t temp_bytes = a.temp_bytes;
    check_cuda(cub::DeviceSegmentedRadixSort::SortPairsDescending(
                   a.temp, temp_bytes, a.logits, a.sorted_logits, a.ids, a.sorted_ids,
                   static_cast<int>(a.batch * a.N), a.batch, begin, end, 0, 32, stream),
               "cub::DeviceSegmentedRadixSort::SortPairsDescending");
  }
  topk_finalize_kernel<<<a.batch, 256, 0, stream>>>(a.seq_lens, a.N, a.k, a.sorted_ids, a.topk_local);
  check_launch("indexer_topk (finalize)");
}

}  // namespace graphsafe::ds4::cuda
