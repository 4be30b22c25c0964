// DS4 CPU reference: plain C++20, fp32, no CUDA. The ground truth the CUDA kernels (paged-direct
// and gather-to-workspace) are compared against. docs/ds4_model.md §2-§4 and §7.
//
// Conventions shared by every function here:
//  * A "row" is one 512-wide latent vector (448 nope + 64 rope dims); K and V are the same row.
//  * seq_len L includes the current token, p = L - 1; L == 0 marks an invalid/padded token.
//  * Bad input throws std::invalid_argument whose message names the offending value and its limit.
#pragma once

#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/ds4/problem.hpp>

#include <cstdint>
#include <vector>

namespace graphsafe::ds4::ref {

// ---- scalar conversions (reference/fp8.cpp) --------------------------------------------------

// fp8 e4m3fn (bias 7, no inf, 0x7F/0xFF = NaN, max 448). Round-to-nearest-even; |x| > 464 (448 +
// half an ulp, incl. inf) saturates to +-448 (0x7E/0xFE); |x| <= 2^-10 gives +-0 (0x00/0x80);
// subnormals m * 2^-9; NaN of either sign -> 0x7F. Bit-identical to CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (host path and sm_89+ cvt.rn.satfinite).
std::uint8_t fp8_e4m3_from_float(float x);
float fp8_e4m3_to_float(std::uint8_t v);  // exact; 0x7F/0xFF -> quiet NaN

// bf16, round-to-nearest-even like __float2bfloat16_rn (overflow -> inf, NaN -> 0x7FFF).
std::uint16_t bf16_from_float(float x);
float bf16_to_float(std::uint16_t v);     // exact

// ---- fp8_ds_mla quantize / dequantize (reference/kv_quant.cpp), docs/ds4_model.md §3.1 -----------------

// UE8M0 exponent of one 64-wide tile, vLLM flavour: e = ceil(log2(max(amax, 1e-4) / 448)), computed
// EXACTLY on the fp32 quotient fl(max(amax,1e-4f) / 448.0f) (frexp, not log2f: log2f can round a
// quotient just above a power of two down onto it). NaN amax counts as the floor; inf gives 128.
// The stored byte is clamp(e + 127, 0, 255) and the scale actually applied is 2^(byte - 127).
int ue8m0_exponent(float amax);

// Quantize one fp32 row and write it to `slot` (= block * block_tokens + offset) of `cache`:
//  * data at block*stride + t*576: bytes 0..447 fp8 of clamp(x / 2^e, +-448) per 64-wide tile
//    (NaN elements are ignored by amax and stored as 0x7F); bytes 448..575 = 64 bf16 (RNE) of the
//    rope dims 448..511, little endian;
//  * scales at block*stride + block_tokens*576 + t*8: 7 UE8M0 bytes, then the pad byte written as 0.
// Nothing else is touched (stride padding, other tokens). Throws on slot outside
// [0, num_blocks*block_tokens), null base, or stride < block_tokens*584.
void quantize_insert(const float* row512, const PagedCache& cache, std::int64_t slot);

// Inverse: x = fp8(q) * 2^(byte - 127) for dims 0..447, bf16 for 448..511. For rows written by
// quantize_insert (bytes >= 105 because amax >= 1e-4) every dequantized value is exactly
// representable in bf16 (fp8 has 3 mantissa bits), so a bf16 workspace loses nothing.
void dequantize_row(const PagedCache& cache, std::int64_t slot, float* out512);

// ---- compressor (reference/compressor.cpp), docs/ds4_model.md §2.2 -------------------------------------

inline constexpr float kRmsNormEps = 1e-6f;

// State channels per token: 2 for the overlapping C4 compressor, 1 otherwise.
inline int compressor_channels(int ratio) { return ratio == 4 ? 2 : 1; }

// Compressed row j (before norm/rope/quant) from the fp32 per-token state of ONE request:
// kv_state[t * c*512 + ch], score_state[t * c*512 + ch] for absolute token t (score already includes
// ape), c = compressor_channels(ratio). Both arrays must hold at least (j+1)*ratio tokens.
//  * ratio 4: 8 slots = tokens 4j-4..4j-1 with channels [0,512) plus tokens 4j..4j+3 with channels
//    [512,1024); for j = 0 the previous half is masked (excluded: score -inf, kv 0).
//  * other ratios (128): tokens ratio*j .. ratio*j+ratio-1, channels [0,512).
// out[d] = sum_s softmax_s(score[s,d]) * kv[s,d] (per-channel softmax over the slots).
// Throws for ratio < 2 or j < 0.
void compress_row(int ratio, int j, const float* kv_state, const float* score_state, float* out512);

// In place: RMSNorm with weight norm_w[512] (eps 1e-6, x * w / sqrt(mean(x^2) + eps)), then GPT-J
// interleaved rope on dims 448..511: pair i = (448+2i, 449+2i), angle = position * theta^(-2i/64),
// (a, b) -> (a cos - b sin, a sin + b cos). Angles/cos/sin are computed in double (vLLM uses an
// fp32 cos/sin cache; identical for small positions). position = j * ratio for compressed row j.
// Plain rope (no YaRN) as the brief asks; the caller quantizes the result.
void compress_finalize(float* row512, const float* norm_w, int position, float rope_theta);

// ---- problem checks and index mapping (reference/problem.cpp, reference/combine_indices.cpp) --

// Full consistency check of a problem (config, every size, seq_len in [0, max_model_len], the first
// min(n_c, K) C4 picks in [0, n_c)). Throws std::invalid_argument. All functions below that take a
// DecodeProblem call it first.
void validate(const DecodeProblem& p);

// Read-only views of the problem's caches (the member functions in problem.hpp are non-const).
PagedCache swa_view(const DecodeProblem& p);
PagedCache cmp_view(const DecodeProblem& p);

// Global slot of SWA position `pos` / compressed entry `j` of request b through the block tables
// (throws if the table entry is not a valid physical block, e.g. -1 = unallocated).
std::int64_t swa_slot(const DecodeProblem& p, int b, int pos);
std::int64_t compressed_slot(const DecodeProblem& p, int b, int j);

// Local compressed ids attended by request b, in attention order (docs/ds4_model.md §2.4):
// C4: the first min(n_c, K) entries of topk_local[b]; C128: 0 .. min(n_c, compressed_width)-1;
// C1 and seq_len 0: none.
std::vector<int> compressed_picks(const DecodeProblem& p, int b);

// Paged-direct indices (FlashMLA flash_mla_with_kvcache style). The compressed rows and the SWA rows
// live in two different caches, so this produces TWO index lists, each left-compacted with a length
// (FlashMLA's "extra cache" convention; entries past the length are -1):
//  * cmp_idx [B, cfg.compressed_width()]: global compressed-cache slots of compressed_picks(b);
//    cmp_lens[b] = topk_len. For C1 compressed_width() == 0 and cmp_idx may be null.
//  * swa_idx [B, cfg.window]: global SWA-cache slots of positions p-swa_len+1 .. p (ascending),
//    swa_lens[b] = swa_len = min(L, W).
// seq_len 0: both lengths 0, both rows all -1. Total attended rows = cmp_lens[b] + swa_lens[b].
void combine_paged(const DecodeProblem& p, std::int32_t* cmp_idx, std::int32_t* cmp_lens,
                   std::int32_t* swa_idx, std::int32_t* swa_lens);

// Gather path (docs/ds4_model.md §4.2 steps 5-8): the kv workspace is [B, M, 512], request b owns rows
// [b*M, b*M + M): compressed rows 0..n_c-1 at offset 0 (ALL n_c rows, also for C4) and SWA rows at
// offset N (N = compressed rows reserved per request, M = N + G).
// gather_workspace fills ws[B*M*512] (fp32 holding bf16-exact values; rows not written are 0).
// combine_gather writes idx [B, cfg.combined_width()] (one combined, left-compacted list):
//   [b*M + c for c in compressed_picks(b)] ++ [b*M + N + i for i < swa_len], then -1;
//   lens[b] = topk_len + swa_len (0 and all -1 for seq_len 0).
// Both throw std::invalid_argument when the sizes cannot hold the problem -- n_c > N or
// swa_len > M - N (exactly the capture-time-sizing bug of docs/ds4_model.md §4.3) -- or B*M overflows int32.
void gather_workspace(const DecodeProblem& p, int N, int M, float* ws);
void combine_gather(const DecodeProblem& p, int N, int M, std::int32_t* idx, std::int32_t* lens);

// The same rows in the ragged layout (cuda::GatherArgs::ragged; what GatherDecode uses in
// virtual-growth mode): request b's rows follow request b-1's, from
//   ragged_row0(p, b) = sum_{j<b} (n_c(j) + swa_len(j))   (b in [0, batch]; ragged_row0(p, batch) =
//                                                          ragged_rows(p), the rows written),
// compressed rows 0..n_c-1 at row0 (ALL n_c rows), SWA rows at row0 + n_c. The workspace is still
// ws[B*M*512] (rows from ragged_rows(p) on are 0) and the same checks apply (n_c <= N,
// swa_len <= M - N, B*M within int32), so the ragged rows always fit it. combine_gather_ragged:
//   [row0 + c for c in compressed_picks(b)] ++ [row0 + n_c + i for i < swa_len], then -1.
// Request b attends the same rows in the same order as with the strided layout.
std::int64_t ragged_row0(const DecodeProblem& p, int b);
std::int64_t ragged_rows(const DecodeProblem& p);
void gather_workspace_ragged(const DecodeProblem& p, int N, int M, float* ws);
void combine_gather_ragged(const DecodeProblem& p, int N, int M, std::int32_t* idx, std::int32_t* lens);

// ---- attention with sink (reference/sparse_attention.cpp), docs/ds4_model.md §2.5, §7.4 -----------------

inline constexpr float kSoftmaxScale = 0.044194173824159216f;  // 512^-0.5

// out [B, H, 512] fp32. Per request b, head h, over the rows of compressed_picks(b) (dequantized from
// the compressed cache) followed by the SWA rows (dequantized from the SWA cache):
//   s_i = scale * <q_bh, k_i>, lse = log sum exp s_i, o = sum softmax(s)_i k_i,
//   o *= 1 / (1 + exp(sink_h - lse))   (sink -inf: no-op; +inf: zero output).
// No rows (seq_len 0): o = 0. fp32 arithmetic throughout; computed from the caches and block tables
// directly, independent of the combine/gather code.
void sparse_attention(const DecodeProblem& p, float* out);

// The gather path's attention (flash_mla_sparse_fwd semantics) over a workspace of `ws_rows` rows of
// 512 floats: request b attends the rows named by the first lens[b] entries of idx[b*width ...];
// entries < 0 or >= ws_rows are skipped (invalid). q and sink come from p. out [B, H, 512].
// Throws if lens[b] is outside [0, width].
void attention_over_workspace(const DecodeProblem& p, const float* ws, std::int64_t ws_rows,
                              const std::int32_t* idx, const std::int32_t* lens, int width,
                              float* out);

}  // namespace graphsafe::ds4::ref
