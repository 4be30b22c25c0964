#include <graphsafe/ds4/indexer_step.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

#include <string>

namespace graphsafe::ds4 {

IndexerDecode::IndexerDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms, Sizing sizing)
    : arena_(arena), cfg_(cfg), syms_(syms), sizing_(sizing) {
  if (cfg.ratio != kIndexerRatio)
    throw invalid_argument_error("ds4::IndexerDecode: ratio = " + std::to_string(cfg.ratio) +
                                 " has no indexer; only C4 layers (ratio 4) do");
}

IndexerSizes IndexerDecode::run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in,
                                const Bindings& b, std::int32_t* topk_local) {
  return run(s, d, in, b, topk_local, nullptr);
}

IndexerSizes IndexerDecode::run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in,
                                const Bindings& b, const cuda::PagedIndexArgs& lists) {
  if (lists.cmp_idx == nullptr)
    throw invalid_argument_error("ds4::IndexerDecode::run: lists.cmp_idx is null; the index lists to write are required");
  return run(s, d, in, b, nullptr, &lists);
}

IndexerSizes IndexerDecode::run(Stream s, const cuda::DeviceProblem& d, const cuda::DeviceIndexerInputs& in,
                                const Bindings& b, std::int32_t* topk_local, const cuda::PagedIndexArgs* lists) {
  const int R = d.batch;
  const Extent rows = max_over(syms_.seq_lens, [](const Extent& l) { return floor_div(l, kIndexerRatio); });
  IndexerSizes z;
  z.N = arena_.dimension(s, "ds4.indexer.rows", rows, compressed_rows_policy(sizing_), b);
  // Static once N is fixed: the guard lives on the dimension.
  auto logits = arena_.request(s, "ds4.indexer.logits", static_cast<std::int64_t>(R) * z.N, sizeof(float),
                               capacity_bound, b);
  z.workspace_bytes = logits.bytes();

  cudaStream_t cs = s.cuda();
  cuda::IndexerScoreArgs sa;
  sa.batch = R; sa.N = z.N; sa.seq_lens = d.seq_lens; sa.q = in.q; sa.weights = in.weights; sa.cache = in.cache;
  sa.block_table = d.cmp_block_table; sa.blocks_per_req = d.cmp_blocks_per_req;
  sa.logits = logits.as<float>();
  cuda::indexer_score(sa, cs);
  cuda::IndexerTopkArgs ta;
  ta.batch = R; ta.N = z.N; ta.k = cfg_.topk; ta.seq_lens = d.seq_lens; ta.logits = logits.as<float>();
  ta.topk_local = topk_local;
  if (lists != nullptr) ta.lists = *lists;
  cuda::indexer_topk(ta, cs);
  return z;
}

}  // namespace graphsafe::ds4
