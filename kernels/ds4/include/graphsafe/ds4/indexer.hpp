// The lightning indexer of a DS4 C4 layer (docs/ds4_model.md §2.3): which compressed rows the
// attention reads. This header: the cache layout, the selection rule and the CPU reference (no CUDA);
// graphsafe/ds4/indexer_kernels.hpp: the GPU launchers.
//
//   // once per step, per C4 layer, all on `stream`, nothing read back to the host:
//   cuda::indexer_compress_insert(kv_state, score_state, base, rows, slots, n, norm_w, theta, eps,
//                                 icache, stream);                  // the new indexer key rows
//   cuda::indexer_score({B, N, seq_lens, q, weights, icache, block_table, bpr, logits}, stream);
//   cuda::indexer_topk({B, N, K, seq_lens, logits, topk_local}, stream);  // what combine_paged reads
//
// Indexer keys are 128-wide rows made by a second compressor with the C4 overlap rule (§2.2),
// RMSNorm and rope on their last 64 dims, then quantized to fp8 e4m3 with one fp32 scale per row:
// the indexer cache (IndexerCache below). The score of compressed row s of request b is
//   I(s) = scale_s * sum_h w_h * ReLU(q8_h . k8_s)        (64 heads of 128 fp8 values),
// where q8 / k8 are the stored fp8 values, scale_s the row's scale and w_h the query token's head
// weights (the query's own scale folded in). Top-k keeps the K best rows of each request:
//  * n_c <= K (the short-context path engines take): rows 0 .. n_c-1 in order, then -1;
//  * n_c > K: the rows of the K highest scores, ties broken by the lower row first, so the
//    selection is a pure function of the scores; -0.0 counts as +0.0. They are listed in ascending
//    row order (no sort by score: the attention's result does not depend on a score order, and
//    row order reads the paged cache block by block).
// The scores of request b live at logits[b * N + s], s < n_c(b): N is the row stride, a value a
// captured graph freezes, so it is a graphsafe dimension sized by a policy (capacity: ceil(max_len/4)).
// With N < n_c(b) the rows of request b run into request b+1's: the capture-time sizing bug again.
#pragma once

#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/ds4/problem.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace graphsafe::ds4 {

inline constexpr int kIndexerHeads = 64;     // index heads
inline constexpr int kIndexerDim = 128;      // index head dim = indexer key width
inline constexpr int kIndexerRopeDim = 64;   // rope on dims 64..127
inline constexpr int kIndexerRatio = 4;      // indexer keys exist for C4 layers only
// Bytes of one indexer key row: 128 fp8 values, then (in the block's scale area) one fp32 scale.
inline constexpr int kIndexerRowBytes = kIndexerDim;
inline constexpr int kIndexerScaleBytes = 4;

// Block of `block_rows` rows: [0, bs*128) fp8 data (row t at t*128), then [bs*128, bs*132) fp32
// scales (row t at bs*128 + t*4). The stride is a multiple of 16 bytes.
constexpr std::size_t indexer_block_stride_bytes(int block_rows) {
  const std::size_t raw = static_cast<std::size_t>(block_rows) * (kIndexerRowBytes + kIndexerScaleBytes);
  return (raw + 15) / 16 * 16;
}

// The indexer cache of one C4 layer: paged like its compressed cache (256 / 4 = 64 rows a block, the
// same block table).
struct IndexerCache {
  std::uint8_t* base = nullptr;
  int block_rows = kCompressedBlockSpan / kIndexerRatio;
  int num_blocks = 0;
  std::size_t stride = indexer_block_stride_bytes(kCompressedBlockSpan / kIndexerRatio);
};

namespace ref {

// fp8 of one 128-wide row: scale = max(amax, 1e-4) / 448, q = e4m3(x / scale) (round to nearest even,
// saturating). Dequantized value = q * scale.
void indexer_quantize_row(const float* x128, std::uint8_t* q128, float* scale);
void indexer_dequantize_row(const std::uint8_t* q128, float scale, float* out128);
void indexer_insert(const IndexerCache& cache, std::int64_t slot, const float* x128);
// Stored fp8 values (as floats) and scale of one cached row.
void indexer_read(const IndexerCache& cache, std::int64_t slot, float* q128, float* scale);

// Indexer key row j before quantization, from one request's fp32 state: kv_state / score_state hold
// 2 * 128 floats per token (the C4 overlap: channels [0,128) for the next group, [128,256) for this
// one); the pooling, RMSNorm (weight norm_w[128]) and rope (GPT-J pairs on dims 64..127 at position
// 4j) of the attention compressor at width 128.
void indexer_compress_row(int j, const float* kv_state, const float* score_state, const float* norm_w,
                          float rope_theta, float eps, float* out128);

// Scores of request b's rows 0 .. n_c-1: q8 [64, 128] (fp8 values as floats), weights [64], rows
// through block_table (the request's row of the compressed block table). Summation in fp32, heads
// in order.
std::vector<float> indexer_scores(const IndexerCache& cache, const std::int32_t* block_table, int n_c,
                                  const float* q8, const float* weights);

// The selection rule above, on given scores (`scores.size() >= n_c`): K entries, -1 padded.
std::vector<std::int32_t> indexer_topk(const float* scores, int n_c, int k);

// A C4 problem's indexer inputs: the key cache paged like p's compressed cache (same block table),
// a row for every compressed entry up to p.fill_to tokens; fp8 queries [B, 64, 128] and head weights
// [B, 64]. Deterministic in `seed`. With `tie_every` > 0, every tie_every-th row repeats the row
// before it, so scores tie (the selection rule's tie-break is then exercised).
struct IndexerInputs {
  std::vector<std::uint8_t> cache_bytes;
  IndexerCache cache;                 // base points into cache_bytes
  std::vector<std::uint8_t> q;        // fp8 e4m3
  std::vector<float> weights;
};
IndexerInputs make_indexer_inputs(const DecodeProblem& p, std::uint64_t seed, int tie_every = 0);
// Scores and top-k of every request of p (its current seq_lens) with these inputs.
std::vector<std::int32_t> indexer_topk_all(const DecodeProblem& p, const IndexerInputs& in);

}  // namespace ref

}  // namespace graphsafe::ds4
