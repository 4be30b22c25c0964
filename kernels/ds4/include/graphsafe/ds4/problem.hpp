// A host-side DS4 decode problem for one attention layer: configuration, paged fp8 caches, block
// tables, lengths, indexer picks, queries and sinks. Shared by the CPU reference, the CUDA kernels'
// tests, the benchmarks and the demo. Everything is plain host memory; the CUDA side uploads it.
#pragma once

#include <graphsafe/ds4/layer_config.hpp>
#include <graphsafe/ds4/layout.hpp>

#include <cstdint>
#include <vector>

namespace graphsafe::ds4 {

// seq_len L includes the current token (p = L - 1). n_c = L / r compressed rows visible.
inline int visible_compressed(int seq_len, int ratio) { return ratio > 1 ? seq_len / ratio : 0; }
inline int swa_len(int seq_len, int window) { return seq_len < window ? seq_len : window; }

struct DecodeProblem {
  LayerConfig cfg;
  int batch = 0;                            // B requests, one query token each
  std::vector<int32_t> seq_lens;            // [B], 0 = invalid/padded token (zero output)
  int fill_to = 0;                          // tokens per request whose cache rows exist (grow() limit)
  // SWA cache: every token of every request (full history kept for simplicity, docs/ds4_model.md §7.2).
  std::vector<uint8_t> swa_cache;           // num_blocks * block_stride_bytes(swa_block_tokens)
  int swa_num_blocks = 0;
  int swa_blocks_per_req = 0;               // ceil(max_model_len / swa_block_tokens)
  std::vector<int32_t> swa_block_table;     // [B, swa_blocks_per_req] physical block ids
  // Compressed cache (C4/C128): entry j of request b lives at slot
  //   cmp_block_table[b, j / E] * E + j % E, E = compressed_block_entries().
  std::vector<uint8_t> cmp_cache;
  int cmp_num_blocks = 0;
  int cmp_blocks_per_req = 0;               // ceil(compressed_capacity / E)
  std::vector<int32_t> cmp_block_table;     // [B, cmp_blocks_per_req]
  std::vector<int32_t> topk_local;          // C4: [B, topk] local compressed ids, valid first, -1 pad
  std::vector<uint16_t> q;                  // [B, H, 512] bf16 bits (normed + roped)
  std::vector<float> sink;                  // [H] fp32, -inf = no sink

  PagedCache swa_view() { return {swa_cache.data(), cfg.swa_block_tokens, swa_num_blocks,
                                  block_stride_bytes(cfg.swa_block_tokens)}; }
  PagedCache cmp_view() { return {cmp_cache.data(), cfg.compressed_block_entries(), cmp_num_blocks,
                                  block_stride_bytes(cfg.compressed_block_entries())}; }
};

// Deterministic random problem: SWA and compressed rows are random vectors quantized through the
// reference quantizer for every token (and compressed entry) of each request up to `fill_to` tokens
// (0 = max(seq_lens)); block tables are shuffled; C4 picks = the last min(n_c, 8) ids when
// `picks == Picks::last8` (the upstream regression) or random distinct valid ids otherwise.
// Details (reference/problem.cpp): only the blocks needed for fill_to tokens are allocated, block
// table entries past them are -1; Picks::last8 = the last min(n_c, K) ids ascending (K = 8 in the
// fork's test, so it equals "last min(n_c, 8)"; with K != 8 the first min(n_c, K) entries must still
// be valid, docs/ds4_model.md §2.3); Picks::random = [0..n_c-1] when n_c <= K (vLLM's short-context path), else
// K distinct random ids in random order. Picks depend only on (cfg, seq_lens, seed), so
// grow(p, lens, seed) reproduces make_problem(cfg, lens, seed)'s picks. Values ~N(0,1) come from a
// 65536-entry quantile table driven by std::mt19937_64 (one stream per request), so the problem is
// bit-identical across platforms and standard libraries.
enum class Picks { last8, random };
DecodeProblem make_problem(const LayerConfig& cfg, const std::vector<int32_t>& seq_lens,
                           std::uint64_t seed, Picks picks = Picks::random, int fill_to = 0);

// New lengths for an existing problem (each must be <= the fill_to it was built with; throws
// std::invalid_argument naming the value and the limit otherwise); recomputes the C4 picks.
void grow(DecodeProblem& p, const std::vector<int32_t>& new_seq_lens, std::uint64_t seed,
          Picks picks = Picks::random);

// ---- several query tokens per request (MTP decode, docs/ds4_model.md §2 with s_q > 1) ------------
// seq_lens[b] counts all s_q query tokens of request b; token t (0 <= t < s_q) sits at position
// L_b - s_q + t, is query row b*s_q + t, and attends causally: exactly like a one-token request of
// length L_b - s_q + 1 + t (its own window, n_c and top-k picks). A padded request (L_b == 0) and
// tokens below position 0 (L_b < s_q - t) get length 0 (zero output).
struct QueryTokenRows {
  int query_tokens = 1;
  std::vector<int32_t> request;   // [B*s_q]: b of query row r
  std::vector<int32_t> seq_lens;  // [B*s_q]: the one-token length of query row r
};
// Throws std::invalid_argument for query_tokens outside [1, kMaxQueryTokens] or a negative length.
QueryTokenRows query_token_rows(const std::vector<int32_t>& seq_lens, int query_tokens);

// The problem whose requests are the query rows of `p` (batch B*s_q): row r reads request
// query_token_rows(...).request[r]'s caches through a copy of its block-table rows, with the row's
// length, a query of its own (seeded, [B*s_q, H, 512]) and C4 picks valid for the row's n_c (`picks`
// as in make_problem). ref::sparse_attention of it is the reference for s_q query tokens; the caches
// are copied unchanged, so request b's block-table rows of `p` address the same bytes.
DecodeProblem query_rows_problem(const DecodeProblem& p, int query_tokens, std::uint64_t seed,
                                 Picks picks = Picks::random);

}  // namespace graphsafe::ds4
