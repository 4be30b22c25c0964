// graphsafe._graphsafe.ds4: one DS4 layer's paged decode attention and a C4 layer's indexer top-k,
// with their workspaces from an arena (graphsafe/ds4.py registers them as torch custom ops), and the
// CPU reference problem, indexer inputs, attention and top-k they are checked against. Built when
// the DS4 kernels are (GRAPHSAFE_BUILD_DS4).
#include "common.hpp"

#include <graphsafe/ds4/indexer.hpp>
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

#include <nanobind/ndarray.h>
#include <nanobind/stl/vector.h>

#include <string>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

namespace graphsafe::python {
namespace {

using namespace nb::literals;

ds4::LayerConfig layer(int ratio, int window, int topk, int heads, int max_model_len) {
  ds4::LayerConfig c;
  c.ratio = ratio;
  c.window = window;
  c.topk = topk;
  c.heads = heads;
  c.max_model_len = max_model_len;
  return c;
}

// One operator and its symbols per layer shape, for the life of the process: a plan captured with
// the op names the same symbols at every call, and the split count is computed once.
struct Op {
  ds4::PagedAttention attention;
  ds4::Ds4Symbols symbols;
};
Op& op_for(const ds4::LayerConfig& c, int query_tokens) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int, int, int, int>, std::unique_ptr<Op>> ops;
  std::lock_guard lock(mutex);
  auto& slot = ops[{c.ratio, c.window, c.topk, c.heads, c.max_model_len, query_tokens}];
  if (!slot) slot.reset(new Op{ds4::PagedAttention(ds4::AttentionProblem{.cfg = c, .query_tokens = query_tokens}),
                               ds4::Ds4Symbols(c)});
  return *slot;
}

template <class T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// A host array handed to NumPy without a copy: the vector moves into the capsule that owns it.
template <class T>
nb::object array(std::vector<T> v, std::initializer_list<std::size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), owner), nb::rv_policy::reference);
}

struct Problem {
  ds4::DecodeProblem p;
  std::uint64_t seed = 0;
};

struct IndexerInputs {
  ds4::ref::IndexerInputs in;
  int batch = 0;
};

}  // namespace

void bind_ds4(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "ds4", "DS4 decode attention on arena workspaces, and its CPU reference (built with the DS4 kernels)");

  m.def(
      "paged_attention",
      [](Arena& arena, int ratio, int window, int topk, int heads, int max_model_len, int query_tokens, int batch,
         std::uintptr_t seq_lens, std::uintptr_t topk_local, std::uintptr_t swa_cache, int swa_num_blocks,
         std::uintptr_t swa_block_table, int swa_blocks_per_req, std::uintptr_t cmp_cache, int cmp_num_blocks,
         std::uintptr_t cmp_block_table, int cmp_blocks_per_req, std::uintptr_t q, std::uintptr_t sink,
         std::uintptr_t out, nb::handle stream) {
        const ds4::LayerConfig c = layer(ratio, window, topk, heads, max_model_len);
        Op& op = op_for(c, query_tokens);  // throws invalid_argument_error naming the field and its limits
        const Stream s = to_stream(arena.backend(), stream);
        ds4::AttentionArguments a;
        a.batch = batch;
        a.seq_lens = ptr<const std::int32_t>(seq_lens);
        a.topk_local = ptr<const std::int32_t>(topk_local);
        a.swa = {ptr<std::uint8_t>(swa_cache), c.swa_block_tokens, swa_num_blocks,
                 ds4::block_stride_bytes(c.swa_block_tokens)};
        a.swa_block_table = ptr<const std::int32_t>(swa_block_table);
        a.swa_blocks_per_req = swa_blocks_per_req;
        a.cmp = {ptr<std::uint8_t>(cmp_cache), c.compressed_block_entries(), cmp_num_blocks,
                 ds4::block_stride_bytes(c.compressed_block_entries())};
        a.cmp_block_table = ptr<const std::int32_t>(cmp_block_table);
        a.cmp_blocks_per_req = cmp_blocks_per_req;
        a.q = ptr<const std::uint16_t>(q);
        a.sink = ptr<const float>(sink);
        a.out = ptr<std::uint16_t>(out);
        Bindings b;
        b.set(op.symbols.requests, batch).set(op.symbols.window, c.window);
        // Stream-ordered: the workspaces go back to the arena when `w` dies, after the kernels on `s`
        // (inside a capture they stay with the graph).
        ds4::AttentionWorkspaces w = op.attention.request(arena, s, op.symbols, b);
        op.attention.run(a, w, s.cuda());
      },
      "arena"_a, "ratio"_a, "window"_a, "topk"_a, "heads"_a, "max_model_len"_a, "query_tokens"_a, "batch"_a,
      "seq_lens"_a, "topk_local"_a, "swa_cache"_a, "swa_num_blocks"_a, "swa_block_table"_a, "swa_blocks_per_req"_a,
      "cmp_cache"_a, "cmp_num_blocks"_a, "cmp_block_table"_a, "cmp_blocks_per_req"_a, "q"_a, "sink"_a, "out"_a,
      nb::arg("stream").none(),
      "Index build + attention of one layer on `stream` (device pointers as ints), workspaces from `arena`");

  m.def(
      "indexer_topk",
      [](Arena& arena, int topk, int max_model_len, int batch, std::uintptr_t seq_lens, std::uintptr_t q,
         std::uintptr_t weights, std::uintptr_t cache, int cache_num_blocks, std::uintptr_t block_table,
         int blocks_per_req, std::uintptr_t topk_local, nb::handle stream) {
        const ds4::LayerConfig c = layer(4, ds4::kDefaultWindow, topk, 64, max_model_len);
        Op& op = op_for(c, 1);  // the layer's symbols (and its checks of topk and max_model_len)
        const Stream s = to_stream(arena.backend(), stream);
        // The logits' row stride is every request's compressed capacity, ceil(max_model_len / 4): a
        // static extent, so capacity_bound sizes it exactly and a graph needs no guard for it.
        const std::int64_t N = c.compressed_capacity();
        Bindings b;
        b.set(op.symbols.requests, batch);
        Workspace logits =
            arena.request(s, "ds4.indexer.logits", Extent(op.symbols.requests) * N, sizeof(float), capacity_bound, b);
        ds4::cuda::IndexerScoreArgs sa;
        sa.batch = batch;
        sa.N = N;
        sa.seq_lens = ptr<const std::int32_t>(seq_lens);
        sa.q = ptr<const std::uint8_t>(q);
        sa.weights = ptr<const float>(weights);
        sa.cache.base = ptr<std::uint8_t>(cache);
        sa.cache.num_blocks = cache_num_blocks;
        sa.block_table = ptr<const std::int32_t>(block_table);
        sa.blocks_per_req = blocks_per_req;
        sa.logits = logits.as<float>();
        ds4::cuda::indexer_score(sa, s.cuda());
        ds4::cuda::IndexerTopkArgs ta;
        ta.batch = batch;
        ta.N = N;
        ta.k = topk;
        ta.seq_lens = sa.seq_lens;
        ta.logits = logits.as<float>();
        ta.topk_local = ptr<std::int32_t>(topk_local);
        ds4::cuda::indexer_topk(ta, s.cuda());
      },
      "arena"_a, "topk"_a, "max_model_len"_a, "batch"_a, "seq_lens"_a, "q"_a, "weights"_a, "cache"_a,
      "cache_num_blocks"_a, "block_table"_a, "blocks_per_req"_a, "topk_local"_a, nb::arg("stream").none(),
      "Indexer scores + top-k of a C4 layer on `stream` (device pointers as ints), logits from `arena`");

  m.def(
      "workspace_bytes",
      [](int ratio, int window, int topk, int heads, int max_model_len, int query_tokens, int batch) {
        const ds4::LayerConfig c = layer(ratio, window, topk, heads, max_model_len);
        Op& op = op_for(c, query_tokens);
        const ds4::AttentionWorkspaceExtents e = op.attention.workspaces(op.symbols);
        Bindings b;
        b.set(op.symbols.requests, batch).set(op.symbols.window, c.window);
        std::uint64_t bytes = 0;
        for (const Extent* x : {&e.cmp_idx, &e.cmp_lens, &e.swa_idx, &e.swa_lens, &e.partial_o, &e.partial_ml})
          bytes += static_cast<std::uint64_t>(x->evaluate(b)) * 4;
        return bytes;
      },
      "ratio"_a, "window"_a, "topk"_a, "heads"_a, "max_model_len"_a, "query_tokens"_a, "batch"_a,
      "Bytes of the op's workspaces for `batch` requests (before the arena's alignment)");

  nb::class_<Problem>(m, "Problem",
                      "A deterministic DS4 decode problem on the host (paged fp8 caches, block tables, lengths, "
                      "top-k picks, queries, sinks) and its CPU reference attention")
      .def("__init__",
           [](Problem* self, int ratio, int window, int topk, int heads, int max_model_len,
              const std::vector<std::int32_t>& seq_lens, std::uint64_t seed, int fill_to) {
             new (self) Problem{ds4::make_problem(layer(ratio, window, topk, heads, max_model_len), seq_lens, seed,
                                                  ds4::Picks::random, fill_to),
                                seed};
           },
           "ratio"_a, "window"_a, "topk"_a, "heads"_a, "max_model_len"_a, "seq_lens"_a, "seed"_a = 1, "fill_to"_a = 0)
      .def("grow", [](Problem& pr, const std::vector<std::int32_t>& lens) { ds4::grow(pr.p, lens, pr.seed); },
           "seq_lens"_a, "New lengths (each <= fill_to) and the C4 picks that go with them")
      .def("set_topk_local",
           [](Problem& pr, nb::ndarray<const std::int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> picks) {
             if (pr.p.cfg.ratio != 4 || picks.shape(0) != static_cast<std::size_t>(pr.p.batch) ||
                 picks.shape(1) != static_cast<std::size_t>(pr.p.cfg.topk))
               throw invalid_argument_error("graphsafe.ds4.Problem.set_topk_local: picks of shape [" +
                                            std::to_string(picks.shape(0)) + ", " + std::to_string(picks.shape(1)) +
                                            "]; a C4 problem takes [" + std::to_string(pr.p.batch) + ", " +
                                            std::to_string(pr.p.cfg.topk) + "]");
             pr.p.topk_local.assign(picks.data(), picks.data() + picks.size());
           },
           "picks"_a, "C4: replace the top-k picks the reference attends (e.g. with the indexer's)")
      .def_prop_ro("batch", [](const Problem& pr) { return pr.p.batch; })
      .def_prop_ro("swa_num_blocks", [](const Problem& pr) { return pr.p.swa_num_blocks; })
      .def_prop_ro("cmp_num_blocks", [](const Problem& pr) { return pr.p.cmp_num_blocks; })
      .def_prop_ro("seq_lens", [](const Problem& pr) { return array(pr.p.seq_lens, {pr.p.seq_lens.size()}); })
      .def_prop_ro("swa_cache",
                   [](const Problem& pr) {
                     const std::size_t stride = ds4::block_stride_bytes(pr.p.cfg.swa_block_tokens);
                     return array(pr.p.swa_cache, {pr.p.swa_cache.size() / stride, stride});
                   })
      .def_prop_ro("swa_block_table",
                   [](const Problem& pr) {
                     return array(pr.p.swa_block_table, {static_cast<std::size_t>(pr.p.batch),
                                                         static_cast<std::size_t>(pr.p.swa_blocks_per_req)});
                   })
      .def_prop_ro("cmp_cache",
                   [](const Problem& pr) {
                     const std::size_t stride = ds4::block_stride_bytes(pr.p.cfg.compressed_block_entries());
                     return array(pr.p.cmp_cache, {stride ? pr.p.cmp_cache.size() / stride : 0, stride});
                   })
      .def_prop_ro("cmp_block_table",
                   [](const Problem& pr) {
                     return array(pr.p.cmp_block_table, {static_cast<std::size_t>(pr.p.batch),
                                                         static_cast<std::size_t>(pr.p.cmp_blocks_per_req)});
                   })
      .def_prop_ro("topk_local",
                   [](const Problem& pr) {
                     const std::size_t k = pr.p.cfg.ratio == 4 ? static_cast<std::size_t>(pr.p.cfg.topk) : 0;
                     return array(pr.p.topk_local, {static_cast<std::size_t>(pr.p.batch), k});
                   })
      .def_prop_ro("q",
                   [](const Problem& pr) {
                     return array(pr.p.q, {static_cast<std::size_t>(pr.p.batch),
                                           static_cast<std::size_t>(pr.p.cfg.heads), std::size_t{ds4::kHeadDim}});
                   },
                   "bf16 bits as uint16 [B, H, 512]")
      .def_prop_ro("sink", [](const Problem& pr) { return array(pr.p.sink, {pr.p.sink.size()}); })
      .def("reference",
           [](const Problem& pr) {
             std::vector<float> out(static_cast<std::size_t>(pr.p.batch) * pr.p.cfg.heads * ds4::kHeadDim);
             {
               nb::gil_scoped_release nogil;
               ds4::ref::sparse_attention(pr.p, out.data());
             }
             return array(std::move(out), {static_cast<std::size_t>(pr.p.batch),
                                           static_cast<std::size_t>(pr.p.cfg.heads), std::size_t{ds4::kHeadDim}});
           },
           "The CPU reference attention, fp32 [B, H, 512]");

  nb::class_<IndexerInputs>(m, "IndexerInputs",
                            "A C4 problem's indexer inputs on the host: the fp8 key cache (paged like the "
                            "compressed cache, same block table), fp8 queries [B, 64, 128] and head weights [B, 64]")
      .def("__init__",
           [](IndexerInputs* self, const Problem& pr, std::uint64_t seed, int tie_every) {
             if (pr.p.cfg.ratio != 4)
               throw invalid_argument_error("graphsafe.ds4.IndexerInputs: ratio = " + std::to_string(pr.p.cfg.ratio) +
                                            " has no indexer; only C4 problems (ratio 4) do");
             new (self) IndexerInputs{ds4::ref::make_indexer_inputs(pr.p, seed, tie_every), pr.p.batch};
           },
           "problem"_a, "seed"_a = 2, "tie_every"_a = 0)
      .def_prop_ro("cache",
                   [](const IndexerInputs& x) {
                     return array(x.in.cache_bytes, {static_cast<std::size_t>(x.in.cache.num_blocks), x.in.cache.stride});
                   })
      .def_prop_ro("q",
                   [](const IndexerInputs& x) {
                     return array(x.in.q, {static_cast<std::size_t>(x.batch), std::size_t{ds4::kIndexerHeads},
                                           std::size_t{ds4::kIndexerDim}});
                   })
      .def_prop_ro("weights",
                   [](const IndexerInputs& x) {
                     return array(x.in.weights, {static_cast<std::size_t>(x.batch), std::size_t{ds4::kIndexerHeads}});
                   })
      .def("topk",
           [](const IndexerInputs& x, const Problem& pr) {
             std::vector<std::int32_t> t = ds4::ref::indexer_topk_all(pr.p, x.in);
             return array(std::move(t), {static_cast<std::size_t>(pr.p.batch), static_cast<std::size_t>(pr.p.cfg.topk)});
           },
           "problem"_a, "The CPU reference top-k [B, topk] at the problem's current lengths");
}

}  // namespace graphsafe::python
