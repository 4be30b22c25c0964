// The lightning indexer of one C4 layer with its workspaces sized through graphsafe: the step that
// turns the indexer's keys into the top-k rows the attention reads (graphsafe/ds4/indexer.hpp).
//
//   IndexerDecode ix(arena, cfg, syms, Sizing::safe);
//   PagedDecode attn(arena, cfg, syms);
//   auto graph = capture(arena, s, b, [&](const Bindings& bb) {
//     ix.run(s, d, inputs, bb, d.topk_local);   // scores + top-k into the attention's picks
//     attn.run(s, d, bb, out);                  // combine + paged-direct attention
//   });
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

 private:
  Arena& arena_;
  LayerConfig cfg_;
  const Ds4Symbols& syms_;
  Sizing sizing_;
};

}  // namespace graphsafe::ds4
