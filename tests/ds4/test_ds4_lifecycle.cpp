// The paged-direct attention operator's lifecycle (graphsafe/ds4/paged_attention.hpp):
//   can_implement refuses what the kernels do not support, naming the field, its value and the limit;
//   workspaces() are Extents in the layer's symbols that equal the kernels' own sizing
//   (cuda::choose_splits, cuda::sparse_attention_scratch_bytes) at every batch;
//   run() on arena workspaces matches the CPU reference for one and two query tokens per request,
//   replays a graphsafe capture bit for bit like eager execution, and allocates nothing per call
//   (the arena's slabs stay as reserved); workspaces too small for the call are refused.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "../support/ds4_test_support.hpp"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

namespace {

LayerConfig layer(int ratio, int heads = 64) {
  LayerConfig c;
  c.ratio = ratio; c.window = 128; c.topk = 512; c.heads = heads; c.max_model_len = 4096;
  return c;
}

}  // namespace

TEST_CASE("can_implement refuses unsupported problems, naming the value and the limit", "[ds4][lifecycle]") {
  struct Case {
    const char* what;
    std::function<void(AttentionProblem&)> edit;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"96 heads", [](AttentionProblem& p) { p.cfg.heads = 96; }, {"cfg.heads = 96", "64 or 128"}},
      {"ratio 3", [](AttentionProblem& p) { p.cfg.ratio = 3; }, {"cfg.ratio = 3", "1 (C1), 4 (C4) or 128 (C128)"}},
      {"no query token", [](AttentionProblem& p) { p.query_tokens = 0; }, {"query_tokens = 0", "1 .. 16"}},
      {"too many query tokens", [](AttentionProblem& p) { p.query_tokens = kMaxQueryTokens + 1; },
       {"query_tokens = " + std::to_string(kMaxQueryTokens + 1), "1 .. " + std::to_string(kMaxQueryTokens)}},
      {"empty window", [](AttentionProblem& p) { p.cfg.window = 0; }, {"cfg.window = 0", ">= 1"}},
      {"C4 without picks", [](AttentionProblem& p) { p.cfg.topk = 0; }, {"cfg.topk = 0", ">= 1 for C4"}},
      {"no context", [](AttentionProblem& p) { p.cfg.max_model_len = 0; }, {"cfg.max_model_len = 0", ">= 1"}},
      {"empty SWA blocks", [](AttentionProblem& p) { p.cfg.swa_block_tokens = 0; }, {"cfg.swa_block_tokens = 0", ">= 1"}},
      {"negative SM count", [](AttentionProblem& p) { p.num_sms = -4; }, {"num_sms = -4", ">= 0"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    AttentionProblem p{layer(4)};
    REQUIRE(PagedAttention::can_implement(p));  // the unedited problem is supported
    c.edit(p);
    const Implementable why = PagedAttention::can_implement(p);
    REQUIRE_FALSE(why);
    for (const std::string& s : c.says) CHECK_THAT(why.error, Catch::Contains(s));
    // The constructor and the client refuse with the same words, in graphsafe's error hierarchy.
    CHECK_THROWS_AS(PagedAttention(p), invalid_argument_error);
    CHECK_THROWS_WITH(PagedAttention(p), why.error);
    if (p.query_tokens == 1 && p.num_sms == 0) {
      const Ds4Symbols syms(p.cfg.max_model_len >= 1 ? p.cfg : layer(4));
      CudaBackend backend;
      Arena arena(backend);
      CHECK_THROWS_WITH(PagedDecode(arena, p.cfg, syms), why.error);
    }
  }
  // Supported corners: both head counts, every layer type, the largest query-token count.
  for (const int ratio : {1, 4, 128})
    for (const int heads : {64, 128}) CHECK(PagedAttention::can_implement({layer(ratio, heads), kMaxQueryTokens}));
}

TEST_CASE("workspace extents are the kernels' own sizes at every batch, from static symbols only", "[ds4][lifecycle]") {
  for (const int ratio : {1, 4, 128})
    for (const int heads : {64, 128})
      for (const int s_q : {1, 2}) {
        const LayerConfig cfg = layer(ratio, heads);
        const PagedAttention op({cfg, s_q, 132});
        const Ds4Symbols syms(cfg);
        const AttentionWorkspaceExtents e = op.workspaces(syms);
        // Pure: the same symbols give the same expressions; none depends on the growing lengths, so
        // capacity_bound sizes them exactly and a capture needs no guard for them.
        const AttentionWorkspaceExtents again = op.workspaces(syms);
        CHECK(same_expression(e.partial_o, again.partial_o));
        CHECK(same_expression(e.splits, again.splits));
        for (const Extent* x : {&e.cmp_idx, &e.cmp_lens, &e.swa_idx, &e.swa_lens, &e.partial_o, &e.partial_ml})
          CHECK(x->is_static());
        for (const int R : {1, 2, 3, 8, 33, 64, 200}) {
          INFO("ratio " << ratio << " H " << heads << " s_q " << s_q << " R " << R);
          const Bindings b = syms.bind(R, cfg, std::vector<std::int32_t>(static_cast<std::size_t>(R), 1));
          const int rows = R * s_q;
          const int splits = cuda::choose_splits(rows, heads, cfg.combined_width(), 132);
          CHECK(e.splits.evaluate(b) == splits);
          CHECK(op.splits(R) == splits);
          CHECK(e.query_rows.evaluate(b) == rows);
          CHECK(static_cast<std::uint64_t>(e.partial_o.evaluate(b) + e.partial_ml.evaluate(b)) * 4 ==
                cuda::sparse_attention_scratch_bytes(rows, heads, splits));
          CHECK(e.cmp_idx.evaluate(b) == static_cast<std::int64_t>(rows) * std::max(cfg.compressed_width(), 1));
          CHECK(e.swa_idx.evaluate(b) == static_cast<std::int64_t>(rows) * cfg.window);
          CHECK(e.swa_lens.evaluate(b) == rows);
        }
      }
}

TEST_CASE("run on arena workspaces: reference, graph replay == eager, no allocation per call", "[ds4][lifecycle][graph]") {
  test::Device dev;
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, dev.s);
  for (const int ratio : {4, 128})
    for (const int s_q : {1, 2}) {
      INFO("ratio " << ratio << " s_q " << s_q);
      const LayerConfig cfg = layer(ratio);
      DecodeProblem p = make_problem(cfg, {3, 5, 130}, 70 + ratio + s_q, Picks::random, 4096);
      DecodeProblem rows = query_rows_problem(p, s_q, 80 + ratio);
      auto dreq = cuda::upload(p);
      auto drows = cuda::upload(rows);
      const Ds4Symbols syms(cfg);
      const PagedAttention op({cfg, s_q});
      const std::size_t n_out = static_cast<std::size_t>(rows.batch) * cfg.heads * kHeadDim;
      auto out_graph = cuda::device_alloc(n_out * 2), out_eager = cuda::device_alloc(n_out * 2);
      auto args = [&](void* out) {
        AttentionArguments a = arguments_of(dreq, static_cast<std::uint16_t*>(out));
        a.q = drows.q;  // R * s_q query rows and their picks
        a.topk_local = drows.topk_local;
        return a;
      };
      auto step = [&](const Bindings& b, void* out) {
        const AttentionWorkspaces w = op.request(arena, dev.s, syms, b);
        op.run(args(out), w, dev.s);
      };
      Bindings b = syms.bind(p.batch, cfg, p.seq_lens);
      step(b, out_eager.get());  // warm: one-time kernel attributes, the eager blocks
      auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { step(bb, out_graph.get()); });
      CHECK(graph.plan().guard_count() == 0);  // every extent is static
      const std::uint64_t slabs = arena.stats().slabs;
      for (const auto& L : std::vector<std::vector<std::int32_t>>{{17, 300, 2049}, {4095, 1, 4096}}) {
        grow(p, L, 5);
        rows = query_rows_problem(p, s_q, 90 + L[0]);
        GRAPHSAFE_CUDA(cudaMemcpyAsync(dreq.seq_lens, p.seq_lens.data(), p.seq_lens.size() * 4, cudaMemcpyHostToDevice, dev.s));
        GRAPHSAFE_CUDA(cudaMemcpyAsync(drows.q, rows.q.data(), rows.q.size() * 2, cudaMemcpyHostToDevice, dev.s));
        if (!rows.topk_local.empty())
          GRAPHSAFE_CUDA(cudaMemcpyAsync(drows.topk_local, rows.topk_local.data(), rows.topk_local.size() * 4,
                                         cudaMemcpyHostToDevice, dev.s));
        b = syms.bind(p.batch, cfg, p.seq_lens);
        graph.replay(b, dev.s);
        step(b, out_eager.get());
        const auto hg = test::download(static_cast<std::uint16_t*>(static_cast<void*>(out_graph.get())), n_out, dev.s);
        const auto he = test::download(static_cast<std::uint16_t*>(static_cast<void*>(out_eager.get())), n_out, dev.s);
        CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);
        std::vector<float> want(n_out);
        ref::sparse_attention(rows, want.data());
        CHECK(test::rel_error(hg, want) < 1e-2);
      }
      CHECK(arena.stats().slabs == slabs);  // the calls allocated no device memory
    }
}

TEST_CASE("run refuses workspaces smaller than the call needs and a batch below 1", "[ds4][lifecycle]") {
  test::Device dev;
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(16ull << 20, dev.s);
  const LayerConfig cfg = layer(4);
  const DecodeProblem p = make_problem(cfg, {3, 5}, 11);
  auto d = cuda::upload(p);
  auto out = cuda::device_alloc(std::size_t(8) * cfg.heads * kHeadDim * 2);
  const Ds4Symbols syms(cfg);
  const PagedAttention op({cfg, 1, 132});
  const AttentionWorkspaces w = op.request(arena, dev.s, syms, syms.bind(2, cfg, p.seq_lens));
  AttentionArguments a = arguments_of(d, reinterpret_cast<std::uint16_t*>(out.get()));
  a.batch = 8;  // workspaces sized for 2 requests
  CHECK_THROWS_AS(op.run(a, w, dev.s), invalid_argument_error);
  CHECK_THROWS_WITH(op.run(a, w, dev.s), Catch::Contains("workspace cmp_idx holds " + std::to_string(w.cmp_idx.bytes())) &&
                                              Catch::Contains("need " + std::to_string(8ull * 512 * 4)));
  a.batch = 0;
  CHECK_THROWS_WITH(op.run(a, w, dev.s), Catch::Contains("batch = 0") && Catch::Contains(">= 1"));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
}
