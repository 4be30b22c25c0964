// Host-callable launchers for the DS4 sparse decode CUDA kernels (target sm_90a).
//
// Every launcher takes plain device pointers and a stream, performs no host synchronisation and no
// allocation (so each is capturable in a CUDA Graph), checks its launch with cudaGetLastError
// (graphsafe::cuda_error naming the kernel and the CUDA error) and rejects bad arguments with
// graphsafe::invalid_argument_error naming the value and the allowed values (graphsafe/error.hpp). Lengths that change between graph
// replays (seq_lens, lens) are read from DEVICE memory; only static quantities (B, H, widths,
// workspace row counts N and M, capacities) are launch arguments.
//
// Each kernel has a CPU twin in graphsafe/ds4/reference.hpp (namespace graphsafe::ds4::ref).
#pragma once

#include <graphsafe/ds4/layout.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace graphsafe::ds4::cuda {

// ------------------------------------------------------------------------------------------------
// quantize_insert.cu: rows [n, 512] -> fp8_ds_mla bytes at `slots[i]` of a paged cache (docs/ds4_model.md §3.1).
// Bit-identical to ref::quantize_insert. slots[i] < 0 skips row i. `cache.base` is a device pointer.
void quantize_insert_bf16(const std::uint16_t* rows_bf16, const std::int32_t* slots, int n,
                          PagedCache cache, cudaStream_t stream);
void quantize_insert_f32(const float* rows, const std::int32_t* slots, int n, PagedCache cache,
                         cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// compress.cu: the compressor's pooling + RMSNorm + rope + quantize for `n` output rows (docs/ds4_model.md §2.2),
// twin of ref::compress_row + ref::compress_finalize + ref::quantize_insert.
// Token state: kv_state[t, c*512] and score_state[t, c*512] fp32 (c = 2 for ratio 4, 1 for ratio
// 128; score already includes ape). Output row i is compressed row j = row_index[i] of a request
// whose absolute token 0 is state row state_base[i] (the group's tokens are state rows
// state_base + ratio*j .. +ratio-1; for ratio 4 also the previous group, masked when j == 0).
// RMSNorm with norm_weight [512] and eps, rope (GPT-J pairs on dims 448..511, angle
// (j*ratio) * theta^(-2i/64) computed in double), then quantize into `cache` at slots[i] (< 0: skip).
void compress_insert(const float* kv_state, const float* score_state, int ratio,
                     const std::int64_t* state_base, const std::int32_t* row_index,
                     const std::int32_t* slots, int n, const float* norm_weight, float rope_theta,
                     float eps, PagedCache cache, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// combine_indices.cu
// (a) paged-direct index lists (FlashMLA flash_mla_with_kvcache convention, global slots):
//   cmp_idx [B, cmp_width]: C4: slot of topk_local[b, i] for i < min(n_c, K); C128: slot of entry i
//   for i < min(n_c, cmp_width); -1 after. cmp_lens[b] = that count. (ratio 1: cmp_* may be null.)
//   swa_idx [B, window]: slots of positions p-swa_len+1 .. p; swa_lens[b] = swa_len.
//   seq_lens[b] == 0 (padded token) gives empty lists.
//   Several query tokens per request (query_tokens = s_q > 1, MTP): the lists are per query row
//   r = b*s_q + t ([B*s_q, width], topk_local [B*s_q, K]); seq_lens[b] counts all s_q tokens, token t
//   sits at position L_b - s_q + t and gets the lists of a one-token request of length
//   L_b - s_q + 1 + t (empty below position 0). The attention then runs with batch B*s_q.
struct PagedIndexArgs {
  int batch = 0;                              // B requests
  int query_tokens = 1;                       // s_q: 1 .. kMaxQueryTokens
  int ratio = 4;                              // 1, 4 or 128
  int window = kDefaultWindow;                // W
  int topk = 512;                             // K (ratio 4: row stride of topk_local)
  int cmp_width = 0;                          // row stride of cmp_idx (>= K for C4)
  const std::int32_t* seq_lens = nullptr;     // [B] device
  const std::int32_t* topk_local = nullptr;   // [B*s_q, K] (ratio 4 only)
  const std::int32_t* swa_block_table = nullptr;  // [B, swa_blocks_per_req]
  int swa_blocks_per_req = 0;
  int swa_block_tokens = kSwaBlockTokens;
  const std::int32_t* cmp_block_table = nullptr;  // [B, cmp_blocks_per_req]
  int cmp_blocks_per_req = 0;
  int cmp_block_entries = 0;                  // 256 / ratio
  std::int32_t* cmp_idx = nullptr;            // out [B*s_q, cmp_width]
  std::int32_t* cmp_lens = nullptr;           // out [B*s_q]
  std::int32_t* swa_idx = nullptr;            // out [B*s_q, window]
  std::int32_t* swa_lens = nullptr;           // out [B*s_q]
};
void combine_paged(const PagedIndexArgs& a, cudaStream_t stream);

// (b) gather-path combined local indices (docs/ds4_model.md §4.2 step 8, q_len = 1) into the gather workspace,
// in either of its two layouts (see gather_workspace below; `ragged` picks one, as in GatherArgs):
//   strided: idx[b, i] = b*M + c_i for the first topk_len compressed ids (C4: topk_local, C128: 0..),
//            then b*M + N + j for j < swa_len;
//   ragged:  idx[b, i] = row0(b) + c_i, then row0(b) + n_c(b) + j for j < swa_len;
// then -1 up to `width`; lens[b] = topk_len + swa_len. N and M are static launch arguments (exactly
// the seed's convention); nothing is clamped to them. row0(b) is computed on the device from seq_lens.
// Both layouts: B*M must fit int32 (the indices are int32; the ragged rows are < B*M when the sizes
// hold the problem).
struct GatherIndexArgs {
  int batch = 0;
  int ratio = 4;
  int window = kDefaultWindow;
  int topk = 512;                             // C4: K (stride of topk_local); C128: compressed width
  int width = 0;                              // row stride of idx (combined width)
  std::int64_t N = 0;                         // compressed rows per request in the workspace
  std::int64_t M = 0;                         // workspace rows per request (N + G)
  const std::int32_t* seq_lens = nullptr;
  const std::int32_t* topk_local = nullptr;   // [B, K] (ratio 4 only)
  std::int32_t* idx = nullptr;                // out [B, width]
  std::int32_t* lens = nullptr;               // out [B]
  bool ragged = false;                        // workspace layout: false = strided [B, M, 512], true =
                                              // ragged (must match the GatherArgs the rows come from)
};
void combine_gather(const GatherIndexArgs& a, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// gather_workspace.cu: dequantize into the bf16 workspace ws [B*M, 512] (docs/ds4_model.md §4.2 steps 5-6). With
// n_c(b) = L_b / ratio (ratio > 1, else 0; ALL of them, also for C4), swa_len(b) = min(L_b, W) and
// L_b = max(seq_lens[b], 0), two layouts of the same rows in the same order:
//  * strided (ragged = false; the seed's layout, [B, M, 512]): request b owns rows [b*M, b*M + M):
//      ws[b*M + c]     = compressed entry c of request b, c < n_c(b),
//      ws[b*M + N + i] = SWA token p - swa_len + 1 + i, i < swa_len(b).
//    Every request's slice is addressed at a stride of M rows whatever its length.
//  * ragged (ragged = true): request b's rows follow request b-1's, starting at
//      row0(b) = sum_{j<b} (n_c(j) + swa_len(j))   (computed on the device from seq_lens),
//      ws[row0 + c]        = compressed entry c, c < n_c(b),
//      ws[row0 + n_c + i]  = SWA token p - swa_len + 1 + i, i < swa_len(b).
//    The rows written are the prefix [0, row0(B)) of the workspace: what a virtual-growth arena maps
//    (Footprint::prefix, docs/virtual_growth.md). N only bounds n_c; ws is still reserved as B*M rows,
//    and row0(B) <= B*M whenever n_c(b) <= N and swa_len(b) <= M - N for every b.
// n_c and swa_len come from DEVICE seq_lens; N and M are launch arguments. There is deliberately NO
// bound check against N or M: strided, with N < n_c the SWA rows overwrite compressed rows >= N and
// with swa_len > M - N the writes run into request b+1's rows or past the workspace -- the silent
// overwrite of the seed bug, reproduced on purpose so that graphsafe's guards can be shown to catch
// it (ragged, requests never overlap, but rows past B*M run off the workspace's end). The kernel is in
// bounds iff n_c <= N and swa_len <= M - N for every b (strided; ragged: iff row0(B) <= B*M).
struct GatherArgs {
  int batch = 0;
  int ratio = 4;
  int window = kDefaultWindow;
  std::int64_t N = 0;
  std::int64_t M = 0;
  const std::int32_t* seq_lens = nullptr;
  PagedCache swa;                             // device base
  const std::int32_t* swa_block_table = nullptr;
  int swa_blocks_per_req = 0;
  PagedCache cmp;                             // device base (ratio > 1)
  const std::int32_t* cmp_block_table = nullptr;
  int cmp_blocks_per_req = 0;
  std::uint16_t* ws = nullptr;                // bf16 [B*M, 512]
  bool ragged = false;                        // layout: false = strided (b*M, b*M + N), true = ragged
                                              // (row0(b), row0(b) + n_c(b)); see above
};
void gather_workspace(const GatherArgs& a, cudaStream_t stream);

// ------------------------------------------------------------------------------------------------
// sparse_attention.cu: sink attention (docs/ds4_model.md §2.5) with tensor cores (mma.sync bf16, fp32 accumulate),
// online softmax, split over the attended rows (flash-decoding) plus a combine step.
// q [B, H, 512] bf16, sink [H] fp32 (null = no sink), out [B, H, 512] bf16. H in {64, 128}.
// Rows of request b, in order: the compressed list then the SWA list (paged) / the combined list
// (workspace). Negative or out-of-range indices inside the lens are masked. No rows -> zero output.
//
// Split-K scratch: `splits` partial results per (request, head) in `scratch` (fp32), see
// sparse_attention_scratch_bytes. splits == 1 needs no scratch (may be null). choose_splits() picks a
// count that fills the GPU from static shapes only (no host sync). With 2 or 4 splits the default
// engine merges the splits inside a thread-block cluster and leaves the scratch untouched; it is still
// required (the fallback path when a cluster launch is refused or options.cluster_merge is false).
// AttentionOptions picks the tile engine (both tested) and the launch features.
int choose_splits(int batch, int heads, int max_rows_per_request, int num_sms);
std::size_t sparse_attention_scratch_bytes(int batch, int heads, int splits);

// Tile engine of the attention.
enum class AttentionEngine {
  automatic,         // warp_specialized on a compute capability 9.x device, else mma_sync
  warp_specialized,  // wgmma + warp specialization, sm_90a code only (an error on other devices)
  mma_sync,          // the portable mma.sync engine
};
struct AttentionOptions {
  AttentionEngine engine = AttentionEngine::automatic;
  // warp_specialized with 2 or 4 splits: merge the splits inside a thread-block cluster (false: the
  // scratch + combine kernel, as for other split counts).
  bool cluster_merge = true;
  // warp_specialized: programmatic dependent launch -- the kernel may start before the previous
  // kernel of the stream ends, and waits for it before reading any input.
  bool programmatic_launch = true;
};

struct AttentionCommon {
  int batch = 0;
  int heads = 64;                             // 64 or 128
  float scale = 0.04419417382415922f;         // 512^-0.5
  const std::uint16_t* q = nullptr;           // bf16 [B, H, 512]
  const float* sink = nullptr;                // [H] or null
  std::uint16_t* out = nullptr;               // bf16 [B, H, 512]
  int splits = 1;
  void* scratch = nullptr;                    // sparse_attention_scratch_bytes(B, H, splits)
  // Optional: the (max, sum) partials [B, splits, H, 2] fp32 in a buffer of their own; then `scratch`
  // needs only the O partials [B, splits, H, 512] fp32. Null: both in `scratch`, O first.
  void* scratch_ml = nullptr;
};

// (A) paged-direct: fp8 rows read through global slots from the two caches, dequantized in smem.
// Both attention paths may read every entry of their [B, width] index arrays, past a request's
// length too (the first tiles' slots are fetched before the lengths arrive, then discarded if the
// request is shorter): the whole arrays must be allocated; entries past the length are never used.
struct PagedAttentionArgs {
  AttentionCommon c;
  PagedCache swa;                             // device base
  const std::int32_t* swa_idx = nullptr;      // [B, swa_width]
  int swa_width = 0;
  const std::int32_t* swa_lens = nullptr;     // [B]
  PagedCache cmp;                             // device base (may be null when cmp_idx is null)
  const std::int32_t* cmp_idx = nullptr;      // [B, cmp_width] or null (C1)
  int cmp_width = 0;
  const std::int32_t* cmp_lens = nullptr;     // [B]
};
void sparse_attention_paged(const PagedAttentionArgs& a, cudaStream_t stream,
                            const AttentionOptions& options = {});

// (B) over the bf16 gather workspace ws [ws_rows, 512] through combined indices [B, width].
struct WorkspaceAttentionArgs {
  AttentionCommon c;
  const std::uint16_t* ws = nullptr;
  std::int64_t ws_rows = 0;                   // indices >= ws_rows are masked (read bound only)
  const std::int32_t* idx = nullptr;          // [B, width]
  int width = 0;
  const std::int32_t* lens = nullptr;         // [B]
};
void sparse_attention_workspace(const WorkspaceAttentionArgs& a, cudaStream_t stream,
                                const AttentionOptions& options = {});

// Number of multiprocessors of the current device (cached per device; no sync).
int device_sm_count();

}  // namespace graphsafe::ds4::cuda
