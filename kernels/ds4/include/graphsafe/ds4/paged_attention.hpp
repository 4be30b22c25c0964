// One layer's paged-direct sparse attention as an operator with a CUTLASS-style lifecycle:
//
//   AttentionProblem problem{.cfg = cfg, .query_tokens = 2};
//   if (auto why = PagedAttention::can_implement(problem); !why) throw ...;  // why.error names value + limit
//   PagedAttention op(problem);                                   // throws invalid_argument_error likewise
//   AttentionWorkspaceExtents ext = op.workspaces(syms);          // pure: Extents in the layer's symbols
//   AttentionWorkspaces ws = op.request(arena, stream, syms, bindings);  // one arena request per extent
//   op.run(args, ws, stream);                                     // index build + attention; no allocation
//
// The workspaces are the per-query-row index lists the index build writes and the split-K partials
// (O and the softmax's running max and sum per split) the scratch merge reads. Every extent depends
// only on static symbols (requests R, window W) and the problem, so the capacity_bound policy sizes
// them exactly and a captured graph needs no guard for them. The split count is the kernels'
// cuda::choose_splits for R * s_q query rows written as an Extent in R (min(max(1, sms / CTAs), tiles)).
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/layer_config.hpp>
#include <graphsafe/extent.hpp>

#include <cstdint>
#include <string>

namespace graphsafe::ds4 {

// The static problem of one layer: its configuration and the query tokens per request (s_q).
struct AttentionProblem {
  LayerConfig cfg;
  int query_tokens = 1;
  int num_sms = 0;  // multiprocessors the split count fills; 0: the current device's (cuda::device_sm_count)
};

// can_implement's answer: empty `error` when the operator supports the problem, else why not (the
// field, its value and the allowed values).
struct Implementable {
  std::string error;
  explicit operator bool() const { return error.empty(); }
};

// Element counts of the workspaces, in the symbols of Ds4Symbols.
struct AttentionWorkspaceExtents {
  Extent query_rows = 0;  // R * s_q
  Extent splits = 0;      // split-K CTAs per (query row, 64 heads)
  Extent cmp_idx = 0;     // int32 [R * s_q, max(compressed_width, 1)]
  Extent cmp_lens = 0;    // int32 [R * s_q]
  Extent swa_idx = 0;     // int32 [R * s_q, W]
  Extent swa_lens = 0;    // int32 [R * s_q]
  Extent partial_o = 0;   // fp32 [R * s_q, splits, H, 512] (0 when splits == 1)
  Extent partial_ml = 0;  // fp32 [R * s_q, splits, H, 2]   (0 when splits == 1)
};

struct AttentionWorkspaces {
  Workspace cmp_idx, cmp_lens, swa_idx, swa_lens, partial_o, partial_ml;
  std::uint64_t bytes() const {
    return cmp_idx.bytes() + cmp_lens.bytes() + swa_idx.bytes() + swa_lens.bytes() + partial_o.bytes() +
           partial_ml.bytes();
  }
};

// Per-call device data. q and out hold R * s_q query rows (row b*s_q + t); topk_local [R * s_q, K]
// (C4); seq_lens, the block tables and the caches are per request (seq_lens counts all s_q tokens).
struct AttentionArguments {
  int batch = 0;                              // R requests (the binding of Ds4Symbols::requests)
  const std::int32_t* seq_lens = nullptr;
  const std::int32_t* topk_local = nullptr;
  PagedCache swa;
  const std::int32_t* swa_block_table = nullptr;
  int swa_blocks_per_req = 0;
  PagedCache cmp;
  const std::int32_t* cmp_block_table = nullptr;
  int cmp_blocks_per_req = 0;
  const std::uint16_t* q = nullptr;
  const float* sink = nullptr;
  std::uint16_t* out = nullptr;
  cuda::AttentionOptions options;
};
// The arguments of an uploaded problem (one query token per request unless its q and picks hold
// R * s_q rows, e.g. an upload of query_rows_problem's q and picks: the caller then sets q/topk_local).
AttentionArguments arguments_of(const cuda::DeviceProblem& d, std::uint16_t* out);

class PagedAttention {
 public:
  // Throws invalid_argument_error with can_implement's message when the problem is not supported.
  explicit PagedAttention(const AttentionProblem& problem);
  static Implementable can_implement(const AttentionProblem& problem);

  const AttentionProblem& problem() const { return problem_; }
  // The split count for `batch` requests (what splits evaluates to with requests = batch).
  int splits(int batch) const;
  // A pure function of the problem and the symbols: the same symbols give the same expressions.
  AttentionWorkspaceExtents workspaces(const Ds4Symbols& syms) const;
  // Requests every extent from the arena (capacity_bound: they are static), stream-ordered on s.
  AttentionWorkspaces request(Arena& arena, Stream s, const Ds4Symbols& syms, const Bindings& b) const;
  // request() in two parts, for a step that runs a producer of the index lists in between: the
  // lists (cmp/swa idx and lens), then the split-K partials, so the producer's own workspaces (the
  // C4 indexer's logits) are released before the partials are requested and the two share bytes.
  AttentionWorkspaces request_lists(Arena& arena, Stream s, const Ds4Symbols& syms, const Bindings& b) const;
  void request_partials(AttentionWorkspaces& w, Arena& arena, Stream s, const Ds4Symbols& syms, const Bindings& b) const;
  // Enqueues the index build and the attention on `stream`. Checks the arguments and that each
  // workspace holds what `a.batch` needs (invalid_argument_error naming the workspace, its bytes and
  // the bytes needed); kernel launch failures throw cuda_error. Allocates nothing.
  void run(const AttentionArguments& a, const AttentionWorkspaces& w, cudaStream_t stream) const;
  // The two halves of run. index_args: the index build's arguments (the lists in w, their sizes
  // checked), for a producer that writes the same lists itself -- the C4 indexer's top-k
  // (cuda::IndexerTopkArgs::lists) does, saving the build's launch. attend: the attention alone,
  // over lists already written in w (checks every workspace, as run does).
  cuda::PagedIndexArgs index_args(const AttentionArguments& a, const AttentionWorkspaces& w) const;
  void attend(const AttentionArguments& a, const AttentionWorkspaces& w, cudaStream_t stream) const;

 private:
  void check_partials(const AttentionArguments& a, const AttentionWorkspaces& w, int splits) const;
  // The attention launch over checked arguments (run and attend check, then call this).
  void launch_attention(const AttentionArguments& a, const AttentionWorkspaces& w, const cuda::PagedIndexArgs& ia,
                        int splits, cudaStream_t stream) const;
  AttentionProblem problem_;
};

}  // namespace graphsafe::ds4
