// The lightning indexer of one C4 layer with its workspaces sized through graphsafe: the step that
// turns the indexer's keys into the top-k rows the attention reads (graphsafe/ds4/indexer.hpp).
//
//   IndexerDecode ix(arena, cfg, syms, Sizing::safe);
//   PagedDecode attn(arena, cfg, syms);
//   auto graph = capture(arena, s, b, [&](const Bindings& bb) {
//     attn.run(s, d, ix, inputs, bb, out);  // scores, top-k into the attention's index lists, attention
//   });
// (or ix.run(s, d, inputs, bb, d.topk_local) then attn.run(s, d, bb, out): the same output, with
// the picks in topk_local and one more launch, combine_paged, to turn them into index lists).
//
// The scores of request b live at logits[b * N + s] for its n_c = L_b / 4 rows: N is a row stride a
// graph freezes, so it is a graphsafe dimension written in the lengths, max_b floor(L_b / 4), sized
// by the policy (Sizing::safe and capacity: ceil(max_model_len / 4); Sizing::exact: the capture-time
// value, reported at capture and refused at replay once a sequence outgrows it). The logits
// workspace [R, N] is the step's only request; it is released when run() returns.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/indexer_kernels.hpp>

#include <cstdint>

namespace graphsafe::ds4 {

struct IndexerSizes {
  std::int64_t N = 0;                 // logits row stride
  std::uint64_t workspace_bytes = 0;  // every request of the step
};

class IndexerDecode {
 public:
  // cfg.ratio must be 4 (the indexer exists for C4 layers only).
  IndexerDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms, Sizing sizing);
  // Enqueue the scores and the top-k on `s` (capturable), writing topk_local [B, cfg.topk].
  IndexerSizes run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in, const Bindings& b,
                   std::int32_t* topk_local);
  // The same, writing the paged attention's index lists instead of topk_local (what combine_paged
  // would build from them: PagedAttention::index_args; PagedDecode::run with an indexer uses this).
  IndexerSizes run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in, const Bindings& b,
                   const cuda::PagedIndexArgs& lists);

 private:
  IndexerSizes run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in, const Bindings& b,
                   std::int32_t* topk_local, const cuda::PagedIndexArgs* lists);
  Arena& arena_;
  LayerConfig cfg_;
  const Ds4Symbols& syms_;
  Sizing sizing_;
};

}  // namespace graphsafe::ds4
