// The shapes FlashMLA's sparse decode is built for, on the paged-direct path against the CPU
// reference (docs/ds4_model.md §7.3 tolerances: relative L2 error <= 1e-2 per (query row, head),
// exactly 0 where the reference is 0; graph replay equal to eager bit for bit):
//   * V4-Pro: H = 128 query heads, C4 top-k K = 1024 (index width 1152), with C128 and C1;
//   * two query tokens per request (MTP, s_q = 2): query row b*s_q + t, token t at position
//     L_b - s_q + t attending causally (ds4::query_token_rows); combine_paged builds the per-row lists
//     from the per-request lengths and block tables, the attention runs over B*s_q query rows.
// The "[sanitize]" cases are the small ones the compute-sanitizer runs use.
#include <catch2/catch.hpp>

#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>
#include <graphsafe/error.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace ds4 = graphsafe::ds4;
namespace gk = graphsafe::ds4::cuda;

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
struct Dev {
  gk::DeviceBytes mem;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : mem(gk::device_alloc(std::max<std::size_t>(1, count) * sizeof(T))), n(count) {}
  T* get() const { return reinterpret_cast<T*>(mem.get()); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    ck(cudaDeviceSynchronize(), "sync");
    ck(cudaMemcpy(h.data(), get(), n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
  void fill_byte(int v) { ck(cudaMemset(get(), v, std::max<std::size_t>(1, n) * sizeof(T)), "memset"); }
};

// Max over (row, head) of ||gpu - ref|| / ||ref||; rows where the reference is 0 must be exactly 0
// (counted in bad_zero otherwise).
struct Err {
  double max_rel = 0;
  int zero_rows = 0, bad_zero = 0;
};
Err compare(const std::vector<std::uint16_t>& gpu, const std::vector<float>& want) {
  Err e;
  for (std::size_t r = 0; r < want.size() / 512; ++r) {
    double dn = 0, rn = 0;
    for (int d = 0; d < 512; ++d) {
      const double g = ds4::ref::bf16_to_float(gpu[r * 512 + d]), x = want[r * 512 + d];
      if (!std::isfinite(g)) dn = 1e30;
      dn += (g - x) * (g - x);
      rn += x * x;
    }
    if (rn == 0) {
      ++e.zero_rows;
      if (dn != 0) ++e.bad_zero;
    } else {
      e.max_rel = std::max(e.max_rel, std::sqrt(dn / rn));
    }
  }
  return e;
}

// The paged-direct path of one layer for B requests with s_q query tokens each: the per-request
// lengths and block tables come from `req` (uploaded as is), the queries and the C4 picks of every
// query row from `rows` (query_rows_problem(req, s_q, ...): its caches are the same bytes).
struct PagedRun {
  const ds4::LayerConfig cfg;
  const int B, s_q, R, cw, splits;
  gk::DeviceProblem req, rows;
  Dev<std::int32_t> cmp_idx, cmp_lens, swa_idx, swa_lens;
  Dev<std::uint8_t> scratch;
  Dev<std::uint16_t> out;
  gk::PagedIndexArgs pi;
  gk::PagedAttentionArgs pa;

  PagedRun(const ds4::DecodeProblem& request_problem, const ds4::DecodeProblem& row_problem, int query_tokens)
      : cfg(request_problem.cfg),
        B(request_problem.batch),
        s_q(query_tokens),
        R(B * query_tokens),
        cw(cfg.compressed_width()),
        splits(gk::choose_splits(R, cfg.heads, cw + cfg.window, gk::device_sm_count())),
        req(gk::upload(request_problem)),
        rows(gk::upload(row_problem)),
        cmp_idx(static_cast<std::size_t>(R) * std::max(cw, 1)),
        cmp_lens(R),
        swa_idx(static_cast<std::size_t>(R) * cfg.window),
        swa_lens(R),
        scratch(std::max<std::size_t>(16, gk::sparse_attention_scratch_bytes(R, cfg.heads, splits))),
        out(static_cast<std::size_t>(R) * cfg.heads * 512) {
    pi.batch = B; pi.query_tokens = s_q; pi.ratio = cfg.ratio; pi.window = cfg.window; pi.topk = cfg.topk;
    pi.cmp_width = cw; pi.seq_lens = req.seq_lens; pi.topk_local = rows.topk_local;
    pi.swa_block_table = req.swa_block_table; pi.swa_blocks_per_req = req.swa_blocks_per_req;
    pi.swa_block_tokens = cfg.swa_block_tokens;
    pi.cmp_block_table = req.cmp_block_table; pi.cmp_blocks_per_req = req.cmp_blocks_per_req;
    pi.cmp_block_entries = cfg.compressed_block_entries();
    pi.cmp_idx = cfg.ratio > 1 ? cmp_idx.get() : nullptr; pi.cmp_lens = cmp_lens.get();
    pi.swa_idx = swa_idx.get(); pi.swa_lens = swa_lens.get();
    pa.c.batch = R; pa.c.heads = cfg.heads; pa.c.q = rows.q; pa.c.sink = rows.sink; pa.c.out = out.get();
    pa.c.splits = splits; pa.c.scratch = scratch.get();
    pa.swa = req.swa; pa.swa_idx = swa_idx.get(); pa.swa_width = cfg.window; pa.swa_lens = swa_lens.get();
    if (cfg.ratio > 1) {
      pa.cmp = req.cmp; pa.cmp_idx = cmp_idx.get(); pa.cmp_width = cw; pa.cmp_lens = cmp_lens.get();
    }
  }
  void enqueue(cudaStream_t st) {
    gk::combine_paged(pi, st);
    gk::sparse_attention_paged(pa, st);
  }
};

// GPU lists == ref::combine_paged of the query-row problem, exactly; output within tolerance.
void check_against_reference(PagedRun& run, const ds4::DecodeProblem& rows, const char* what) {
  const int R = rows.batch, cw = run.cw, W = run.cfg.window;
  std::vector<std::int32_t> ci(static_cast<std::size_t>(R) * std::max(cw, 1), -1), cl(R), si(static_cast<std::size_t>(R) * W), sl(R);
  ds4::ref::combine_paged(rows, run.cfg.ratio > 1 ? ci.data() : nullptr, cl.data(), si.data(), sl.data());
  CHECK(run.swa_idx.download() == si);
  CHECK(run.swa_lens.download() == sl);
  if (run.cfg.ratio > 1) {
    CHECK(run.cmp_idx.download() == ci);
    CHECK(run.cmp_lens.download() == cl);
  }
  std::vector<float> want(static_cast<std::size_t>(R) * run.cfg.heads * 512);
  ds4::ref::sparse_attention(rows, want.data());
  const Err e = compare(run.out.download(), want);
  INFO(what << ": max rel L2 " << e.max_rel << ", zero rows " << e.zero_rows << ", nonzero where the reference is 0 "
            << e.bad_zero);
  CHECK(e.max_rel <= 1e-2);
  CHECK(e.bad_zero == 0);
}

// Captures the layer at the problem's lengths, grows every request to each of `growth` in turn and
// checks that the replay equals eager execution bit for bit and the reference.
void check_graph_replay(ds4::DecodeProblem& req, int s_q, const std::vector<std::vector<std::int32_t>>& growth,
                        std::uint64_t seed) {
  ds4::DecodeProblem rows = ds4::query_rows_problem(req, s_q, seed);
  PagedRun run(req, rows, s_q);
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  run.enqueue(st);  // eager once outside capture (one-time function attributes)
  ck(cudaStreamSynchronize(st), "sync");
  cudaGraph_t g;
  ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
  run.enqueue(st);
  ck(cudaStreamEndCapture(st, &g), "end capture");
  cudaGraphExec_t ge;
  ck(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  for (const auto& L : growth) {
    ds4::grow(req, L, seed);
    rows = ds4::query_rows_problem(req, s_q, seed + 1);
    ck(cudaMemcpyAsync(run.req.seq_lens, req.seq_lens.data(), req.seq_lens.size() * 4, cudaMemcpyHostToDevice, st), "H2D lens");
    if (!rows.topk_local.empty())
      ck(cudaMemcpyAsync(run.rows.topk_local, rows.topk_local.data(), rows.topk_local.size() * 4, cudaMemcpyHostToDevice, st),
         "H2D picks");
    ck(cudaMemcpyAsync(run.rows.q, rows.q.data(), rows.q.size() * 2, cudaMemcpyHostToDevice, st), "H2D q");
    run.out.fill_byte(0xFF);
    ck(cudaGraphLaunch(ge, st), "graph launch");
    ck(cudaStreamSynchronize(st), "sync");
    const auto replay = run.out.download();
    run.out.fill_byte(0xFF);
    run.enqueue(st);
    ck(cudaStreamSynchronize(st), "sync");
    const auto eager = run.out.download();
    CHECK(replay == eager);
    check_against_reference(run, rows, "graph replay after growth");
  }
  ck(cudaGraphExecDestroy(ge), "destroy exec");
  ck(cudaGraphDestroy(g), "destroy graph");
  ck(cudaStreamDestroy(st), "destroy stream");
}

ds4::LayerConfig pro_config(int ratio) {
  ds4::LayerConfig c;
  c.ratio = ratio; c.window = 128; c.topk = 1024; c.heads = 128; c.max_model_len = 8192;
  return c;
}

ds4::LayerConfig flash_config(int ratio) {
  ds4::LayerConfig c;
  c.ratio = ratio; c.window = 128; c.topk = 512; c.heads = 64; c.max_model_len = 4096;
  return c;
}

}  // namespace

TEST_CASE("V4-Pro shape: H = 128, C4 top-k 1024, paged-direct against the reference", "[ds4][shapes][pro]") {
  // n_c > K (8192 / 4 = 2048 > 1024), n_c == K (4096), n_c < K, L < W, a padded request (0).
  const std::vector<std::int32_t> lens = {8192, 4096, 4100, 1000, 100, 0};
  for (const int ratio : {4, 128, 1}) {
    DYNAMIC_SECTION("ratio " << ratio) {
      const ds4::DecodeProblem p = ds4::make_problem(pro_config(ratio), lens, 90 + ratio);
      const ds4::DecodeProblem rows = ds4::query_rows_problem(p, 1, 90 + ratio);
      REQUIRE(rows.q == p.q);  // one query token: the query rows are the requests
      PagedRun run(p, rows, 1);
      run.out.fill_byte(0xFF);
      run.enqueue(nullptr);
      check_against_reference(run, rows, "V4-Pro");
      if (ratio == 4) {  // the full top-k of a Pro layer is attended
        const auto cl = run.cmp_lens.download();
        CHECK(*std::max_element(cl.begin(), cl.end()) == 1024);
      }
    }
  }
}

TEST_CASE("V4-Pro shape: graph replay after growth equals eager bit for bit", "[ds4][shapes][pro][graph][sanitize]") {
  ds4::DecodeProblem p = ds4::make_problem(pro_config(4), {3, 700}, 17, ds4::Picks::random, 8192);
  check_graph_replay(p, 1, {{900, 4500}, {4097, 8192}}, 17);
}

TEST_CASE("two query tokens per request: the query rows and their causal lengths", "[ds4][shapes][mtp]") {
  const std::vector<std::int32_t> lens = {0, 1, 2, 3, 128, 129, 130, 513};
  const ds4::QueryTokenRows q = ds4::query_token_rows(lens, 2);
  REQUIRE(q.seq_lens.size() == 2 * lens.size());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    // the last token is the request's own position; the one before it sees one token less
    CHECK(q.request[2 * b] == static_cast<std::int32_t>(b));
    CHECK(q.request[2 * b + 1] == static_cast<std::int32_t>(b));
    CHECK(q.seq_lens[2 * b + 1] == lens[b]);
    CHECK(q.seq_lens[2 * b] == std::max(lens[b] - 1, 0));
  }
  CHECK(ds4::query_token_rows(lens, 1).seq_lens == lens);
  CHECK_THROWS_WITH(ds4::query_token_rows(lens, 0), Catch::Contains("query_tokens = 0"));
  CHECK_THROWS_WITH(ds4::query_token_rows(lens, ds4::kMaxQueryTokens + 1), Catch::Contains(std::to_string(ds4::kMaxQueryTokens)));
}

TEST_CASE("two query tokens per request (s_q = 2): paged-direct against the reference", "[ds4][shapes][mtp]") {
  // L = 1: token 0 has no position (zero output); window edges 128/129; C4 n_c crossing K at 2048/2049.
  const std::vector<std::int32_t> lens = {1, 2, 129, 130, 2048, 2049, 2052, 4096, 0, 777};
  for (const int ratio : {4, 128, 1})
    for (const int H : {64, 128}) {
      DYNAMIC_SECTION("ratio " << ratio << " H " << H) {
        ds4::LayerConfig cfg = flash_config(ratio);
        cfg.heads = H;
        const ds4::DecodeProblem p = ds4::make_problem(cfg, lens, 300 + ratio + H);
        const ds4::DecodeProblem rows = ds4::query_rows_problem(p, 2, 400 + ratio + H);
        PagedRun run(p, rows, 2);
        run.out.fill_byte(0xFF);
        run.enqueue(nullptr);
        check_against_reference(run, rows, "s_q = 2");
        // The causal shift the feature exists for: token 0 never sees the last token's window row.
        const auto sl = run.swa_lens.download();
        const auto si = run.swa_idx.download();
        for (std::size_t b = 0; b < lens.size(); ++b) {
          if (lens[b] < 2) continue;
          const int n0 = sl[2 * b], n1 = sl[2 * b + 1];
          const std::int32_t last1 = si[(2 * b + 1) * cfg.window + n1 - 1];
          CHECK(std::find(si.begin() + static_cast<std::ptrdiff_t>(2 * b * cfg.window),
                          si.begin() + static_cast<std::ptrdiff_t>(2 * b * cfg.window + n0), last1) ==
                si.begin() + static_cast<std::ptrdiff_t>(2 * b * cfg.window + n0));
        }
      }
    }
}

TEST_CASE("two query tokens per request: graph replay after growth equals eager bit for bit", "[ds4][shapes][mtp][graph][sanitize]") {
  for (const int ratio : {4, 128}) {
    DYNAMIC_SECTION("ratio " << ratio) {
      ds4::DecodeProblem p = ds4::make_problem(flash_config(ratio), {2, 5, 130}, 23 + ratio, ds4::Picks::random, 4096);
      check_graph_replay(p, 2, {{15, 300, 2100}, {255, 4095, 4096}}, 23 + ratio);
    }
  }
}

TEST_CASE("combine_paged refuses a query-token count outside 1 .. kMaxQueryTokens", "[ds4][shapes][mtp][args]") {
  std::int32_t dummy[4] = {};
  gk::PagedIndexArgs a;
  a.batch = 1; a.ratio = 1; a.window = 4; a.seq_lens = dummy; a.swa_block_table = dummy;
  a.swa_idx = dummy; a.swa_lens = dummy;
  for (const int bad : {0, -1, ds4::kMaxQueryTokens + 1}) {
    a.query_tokens = bad;
    CHECK_THROWS_AS(gk::combine_paged(a, nullptr), graphsafe::invalid_argument_error);
    CHECK_THROWS_WITH(gk::combine_paged(a, nullptr), Catch::Contains("query_tokens (s_q) = " + std::to_string(bad)) &&
                                                         Catch::Contains(std::to_string(ds4::kMaxQueryTokens)));
  }
}
