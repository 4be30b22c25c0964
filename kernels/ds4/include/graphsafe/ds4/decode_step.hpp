// One DS4 decode step of one attention layer with every workspace sized through graphsafe.
//
// This is the client the seed broke: the gather path dequantizes a request's compressed rows and
// its SWA rows into one bf16 workspace [R, M, 512], the SWA part at row offset N, and attends over
// combined indices b*M + ... . N and M become kernel arguments frozen by capture; the rows written
// come from device lengths that keep growing. Here N and G are graphsafe dimensions (recorded and
// guarded, "an offset is a request boundary") and the workspace, index buffers and split-K scratch
// are graphsafe requests, so the policy decides (docs/ds4_model.md §4.4):
//   Sizing::safe     -> N: capacity_bound (floor(max_model_len / r)), G: static_query_bound(W)
//   Sizing::capacity -> capacity_bound for both (G: min(max_model_len, W) -- for one query token per
//                       request this equals the static query bound; it differs once q_len > 1)
//   Sizing::exact    -> exact_at_capture for both: the seed's behaviour, reported and refused by guards
// The workspace has two layouts of the same rows (GatherLayout, kernels.hpp): strided (the seed's
// [R, M, 512], request b at row b*M) and ragged (request b's rows right after request b-1's). Both
// reserve R*M rows; in virtual-growth mode (ArenaOptions::virtual_memory) only the rows written are
// mapped, and with the ragged layout those are one prefix of the workspace (docs/virtual_growth.md).
// The paged-direct path needs no gather workspace; PagedDecode runs the PagedAttention operator
// (paged_attention.hpp), whose index lists and split-K partials are static requests.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/policies/static_query_bound.hpp>

#include <cstdint>
#include <vector>

namespace graphsafe::ds4 {

namespace cuda {
struct DeviceIndexerInputs;  // graphsafe/ds4/indexer_kernels.hpp
}

enum class Sizing { safe, exact, capacity };

// Layout of GatherDecode's kv workspace (cuda::GatherArgs::ragged). The rows, their order and so the
// attention output are the same in both; what differs is where a request's rows sit.
//   strided:   request b at rows [b*M, b*M + M), SWA rows at b*M + N (the seed's layout). In virtual
//              mode its footprint is two ranges per request (Footprint::per_request_ranges), each
//              ending inside a partly used granule: committed memory cannot go below one to three
//              granules per request.
//   ragged:    request b at row0(b) = sum_{j<b} (n_c(j) + min(L_j, W)), computed by the kernels from
//              device seq_lens. In virtual mode the footprint is one prefix,
//              sum_over(L, n_c(l) + min(l, W)) rows: committed <= need + one granule.
//   automatic: ragged when the arena runs in virtual-growth mode, strided otherwise (without virtual
//              memory the whole R*M reservation is backed either way, and strided keeps the seed's
//              shape that the overlap tests rely on).
enum class GatherLayout { strided, ragged, automatic };

// The policies GatherDecode sizes N (compressed rows) and G (SWA rows) with. `swa_bound` is the
// static query bound for G (Sizing::safe). Shared with host-side mirrors (examples/ds4_decode_demo).
const SizingPolicy& compressed_rows_policy(Sizing sizing);
const SizingPolicy& swa_rows_policy(Sizing sizing, const StaticQueryBound& swa_bound);

// The symbols a DS4 layer's sizes are written in.
struct Ds4Symbols {
  Symbol requests;   // R: padded batch of the graph (static)
  Symbol window;     // W (static)
  Symbol seq_lens;   // L[b] (dynamic, capacity max_model_len)
  explicit Ds4Symbols(const LayerConfig& cfg);
  Bindings bind(int batch, const LayerConfig& cfg, const std::vector<std::int32_t>& lens) const;
};

// What one step reserved (element counts as the policy chose them).
struct StepSizes {
  std::int64_t N = 0, G = 0, M = 0;  // compressed rows, SWA rows, row stride per request
  std::uint64_t workspace_bytes = 0;  // every request of the step
};

class GatherDecode {
 public:
  GatherDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms, Sizing sizing,
               GatherLayout layout = GatherLayout::automatic);
  // Enqueue the step on `s` (capturable): sizes through the arena, then combine, gather, attend.
  StepSizes run(Stream s, const cuda::DeviceProblem& d, const Bindings& b, std::uint16_t* out);
  // The layout in use: strided or ragged (automatic is resolved against the arena at construction).
  GatherLayout layout() const { return layout_; }

 private:
  Arena& arena_;
  LayerConfig cfg_;
  const Ds4Symbols& syms_;
  Sizing sizing_;
  StaticQueryBound swa_bound_;
  GatherLayout layout_;
};

class IndexerDecode;  // graphsafe/ds4/indexer_step.hpp

class PagedDecode {
 public:
  PagedDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms);
  // Index build from d.topk_local (C4) or the layer's rows (C1, C128), then the attention.
  StepSizes run(Stream s, const cuda::DeviceProblem& d, const Bindings& b, std::uint16_t* out);
  // A C4 layer with its indexer: scores, then a top-k that writes the attention's index lists
  // itself (one launch fewer than indexer.run into topk_local + run above; the same lists, so the
  // same output bit for bit), then the attention. workspace_bytes counts the indexer's logits too.
  StepSizes run(Stream s, const cuda::DeviceProblem& d, IndexerDecode& indexer,
                const cuda::DeviceIndexerInputs& inputs, const Bindings& b, std::uint16_t* out);

 private:
  Arena& arena_;
  LayerConfig cfg_;
  const Ds4Symbols& syms_;
};

}  // namespace graphsafe::ds4
