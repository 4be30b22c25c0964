#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/indexer_step.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/footprint.hpp>
#include <graphsafe/policies/capacity_bound.hpp>
#include <graphsafe/policies/exact_at_capture.hpp>

namespace graphsafe::ds4 {

Ds4Symbols::Ds4Symbols(const LayerConfig& cfg)
    : requests(Symbol::fixed("requests")),
      window(Symbol::fixed("window")),
      seq_lens(Symbol::batch("seq_lens", requests, cfg.max_model_len)) {}

Bindings Ds4Symbols::bind(int batch, const LayerConfig& cfg, const std::vector<std::int32_t>& lens) const {
  Bindings b;
  b.set(requests, batch).set(window, cfg.window).set(seq_lens, std::span<const std::int32_t>(lens));
  return b;
}

const SizingPolicy& compressed_rows_policy(Sizing sizing) {
  if (sizing == Sizing::exact) return exact_at_capture;
  return capacity_bound;  // safe and capacity
}

const SizingPolicy& swa_rows_policy(Sizing sizing, const StaticQueryBound& swa_bound) {
  switch (sizing) {
    case Sizing::safe: return swa_bound;
    case Sizing::capacity: return capacity_bound;
    case Sizing::exact: break;
  }
  return exact_at_capture;
}

namespace {
// Split-K scratch of the attention kernel: a static size (batch, heads, splits), shared by both paths.
Workspace attention_scratch(Arena& arena, Stream s, const LayerConfig& cfg, int batch, std::int64_t splits,
                            const Bindings& b) {
  const auto bytes = cuda::sparse_attention_scratch_bytes(batch, cfg.heads, static_cast<int>(splits));
  return arena.request(s, "ds4.attention_scratch", static_cast<std::int64_t>(bytes), 1, capacity_bound, b);
}

std::int64_t splits_for(const LayerConfig& cfg, int batch) {
  const int rows = cfg.combined_width();
  return cuda::choose_splits(batch, cfg.heads, rows, cuda::device_sm_count());
}
}  // namespace

namespace {
GatherLayout resolve_layout(GatherLayout layout, const Arena& arena) {
  if (layout != GatherLayout::automatic) return layout;
  return arena.options().virtual_memory ? GatherLayout::ragged : GatherLayout::strided;
}
}  // namespace

GatherDecode::GatherDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms, Sizing sizing,
                           GatherLayout layout)
    : arena_(arena),
      cfg_(cfg),
      syms_(syms),
      sizing_(sizing),
      swa_bound_(Extent(syms.window)),
      layout_(resolve_layout(layout, arena)) {}

StepSizes GatherDecode::run(Stream s, const cuda::DeviceProblem& d, const Bindings& b, std::uint16_t* out) {
  const int r = cfg_.ratio;
  const int R = d.batch;
  const Symbol W = syms_.window;
  // Needs, written in the symbols they depend on (docs/ds4_model.md §4.2 step 3).
  const Extent n_c = r > 1 ? max_over(syms_.seq_lens, [&](const Extent& l) { return floor_div(l, r); }) : Extent(0);
  const Extent g = max_over(syms_.seq_lens, [&](const Extent& l) { return min(l, Extent(W)); });
  const SizingPolicy& cmp_policy = compressed_rows_policy(sizing_);
  const SizingPolicy& swa_policy = swa_rows_policy(sizing_, swa_bound_);
  StepSizes z;
  z.N = arena_.dimension(s, "ds4.kv.compressed_rows", n_c, cmp_policy, b);
  z.G = arena_.dimension(s, "ds4.kv.swa_rows", g, swa_policy, b);
  z.M = z.N + z.G;
  const int width = cfg_.combined_width();
  const std::int64_t splits = splits_for(cfg_, R);
  // Every extent below is static once N and G are fixed: the guards live on the dimensions. Both
  // layouts reserve R*M rows: n_c(b) <= N and min(L_b, W) <= G for every b (what the guards keep)
  // put the ragged rows below R*M too.
  const Extent kv_need = Extent(syms_.requests) * z.M * kHeadDim;
  const bool ragged = layout_ == GatherLayout::ragged;
  // Virtual growth (ArenaOptions::virtual_memory): only the rows the gather writes are mapped.
  //  ragged:  one prefix, sum_b (n_c(b) + min(L_b, W)) rows;
  //  strided: per request b, compressed rows [b*M, b*M + n_c) and SWA rows [b*M + N, b*M + N + min(L, W)).
  auto footprint = [&]() -> Footprint {
    if (ragged)
      return Footprint::prefix(sum_over(syms_.seq_lens, [&](const Extent& l) {
                                 return (r > 1 ? floor_div(l, r) : Extent(0)) + min(l, Extent(W));
                               }) *
                               kHeadDim);
    return Footprint::per_request_ranges(syms_.seq_lens, z.M * kHeadDim, [&](const Extent& l) {
      return std::vector<FootprintRange>{{0, r > 1 ? floor_div(l, r) * kHeadDim : Extent(0)},
                                         {z.N * kHeadDim, min(l, Extent(W)) * kHeadDim}};
    });
  };
  auto kv = !arena_.options().virtual_memory ? arena_.request(s, "ds4.kv", kv_need, 2, capacity_bound, b)
                                             : arena_.request(s, "ds4.kv", kv_need, 2, capacity_bound, b, footprint());
  auto idx = arena_.request(s, "ds4.combined_indices", Extent(syms_.requests) * width, 4, capacity_bound, b);
  auto lens = arena_.request(s, "ds4.combined_lens", Extent(syms_.requests), 4, capacity_bound, b);
  auto scratch = attention_scratch(arena_, s, cfg_, R, splits, b);
  z.workspace_bytes = kv.bytes() + idx.bytes() + lens.bytes() + scratch.bytes();

  cuda::GatherIndexArgs ia;
  ia.batch = R;
  ia.ratio = r;
  ia.window = cfg_.window;
  ia.topk = r == 4 ? cfg_.topk : cfg_.compressed_width();
  ia.width = width;
  ia.N = z.N;
  ia.M = z.M;
  ia.seq_lens = d.seq_lens;
  ia.topk_local = d.topk_local;
  ia.idx = idx.as<std::int32_t>();
  ia.lens = lens.as<std::int32_t>();
  ia.ragged = ragged;
  cuda::combine_gather(ia, s.cuda());

  cuda::GatherArgs ga;
  ga.batch = R;
  ga.ratio = r;
  ga.window = cfg_.window;
  ga.N = z.N;
  ga.M = z.M;
  ga.seq_lens = d.seq_lens;
  ga.swa = d.swa;
  ga.swa_block_table = d.swa_block_table;
  ga.swa_blocks_per_req = d.swa_blocks_per_req;
  ga.cmp = d.cmp;
  ga.cmp_block_table = d.cmp_block_table;
  ga.cmp_blocks_per_req = d.cmp_blocks_per_req;
  ga.ws = kv.as<std::uint16_t>();
  ga.ragged = ragged;
  cuda::gather_workspace(ga, s.cuda());

  cuda::WorkspaceAttentionArgs aa;
  aa.c.batch = R;
  aa.c.heads = cfg_.heads;
  aa.c.q = d.q;
  aa.c.sink = d.sink;
  aa.c.out = out;
  aa.c.splits = static_cast<int>(splits);
  aa.c.scratch = scratch.data();
  aa.ws = kv.as<std::uint16_t>();
  aa.ws_rows = static_cast<std::int64_t>(R) * z.M;
  aa.idx = idx.as<std::int32_t>();
  aa.width = width;
  aa.lens = lens.as<std::int32_t>();
  cuda::sparse_attention_workspace(aa, s.cuda());
  // The layer is done with its workspaces: they return here, stream-ordered after the kernels (while
  // capturing, to the capture, so the next layer reuses the range: a step's region is one layer's).
  return z;
}

PagedDecode::PagedDecode(Arena& arena, const LayerConfig& cfg, const Ds4Symbols& syms)
    : arena_(arena), cfg_(cfg), syms_(syms) {
  (void)PagedAttention(AttentionProblem{cfg});  // refuses an unsupported layer here, not at the first step
}

StepSizes PagedDecode::run(Stream s, const cuda::DeviceProblem& d, const Bindings& b, std::uint16_t* out) {
  const PagedAttention op(AttentionProblem{cfg_});
  const AttentionWorkspaces w = op.request(arena_, s, syms_, b);
  op.run(arguments_of(d, out), w, s.cuda());
  StepSizes z;
  z.workspace_bytes = w.bytes();
  return z;  // as GatherDecode::run: the workspaces go back (to the capture when capturing)
}

StepSizes PagedDecode::run(Stream s, const cuda::DeviceProblem& d, IndexerDecode& indexer,
                           const cuda::DeviceIndexerInputs& inputs, const Bindings& b, std::uint16_t* out) {
  if (cfg_.ratio != kIndexerRatio)
    throw invalid_argument_error("ds4::PagedDecode::run: ratio = " + std::to_string(cfg_.ratio) +
                                 " has no indexer; only C4 layers (ratio 4) do");
  const PagedAttention op(AttentionProblem{cfg_});
  AttentionWorkspaces w = op.request_lists(arena_, s, syms_, b);
  const AttentionArguments args = arguments_of(d, out);
  const IndexerSizes ix = indexer.run(s, d, inputs, b, op.index_args(args, w));  // its logits go back here
  op.request_partials(w, arena_, s, syms_, b);
  op.attend(args, w, s.cuda());
  StepSizes z;
  z.workspace_bytes = w.bytes() + ix.workspace_bytes;
  return z;
}

}  // namespace graphsafe::ds4
