// The lightning indexer on the GPU against its CPU reference (graphsafe/ds4/indexer.hpp), and the
// whole C4 attention step (indexer scores + top-k + index combine + paged attention, or the top-k
// writing the index lists itself) captured in a CUDA Graph: replays equal eager execution bit for
// bit as sequences grow past their capture lengths, across the short-context (n_c <= K) to
// long-context transition; the logits stride sized at capture time is refused at replay.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/indexer_step.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "../support/ds4_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

namespace {

constexpr int kMaxLen = 512;
using test::Device;

template <class T>
std::vector<T> to_host(const void* d, std::size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  return h;
}
template <class T>
cuda::DeviceBytes to_device(const std::vector<T>& h) {
  cuda::DeviceBytes d = cuda::device_alloc(std::max<std::size_t>(16, h.size() * sizeof(T)));
  GRAPHSAFE_CUDA(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The scores' engine: the run's environment picks it (the library reads none), so one binary checks
// both: GRAPHSAFE_DS4_INDEXER=mma_sync (ctest's test_ds4_indexer_gpu_mma_sync) runs the portable
// kernel on this GPU.
cuda::IndexerEngine score_engine() {
  const char* e = std::getenv("GRAPHSAFE_DS4_INDEXER");
  return e != nullptr && std::string(e) == "mma_sync" ? cuda::IndexerEngine::mma_sync : cuda::IndexerEngine::automatic;
}

// K = 8 keeps the short-context path (n_c <= 8, lengths < 36) and the scored path in one tiny problem.
LayerConfig c4() { return test::tiny_layer(4, kMaxLen); }

// Random indexer inputs of B requests with `bpr` blocks of `block_rows` rows each, on the host and
// the device: fp8 keys and queries (no NaN encodings), row scales in [0.001, 0.02), a shuffled block
// table, head weights in [-0.5, 0.5).
struct RandomIndexer {
  int B, bpr;
  IndexerCache cache;  // base: the host bytes
  std::vector<std::uint8_t> bytes, q;
  std::vector<std::int32_t> table;
  std::vector<float> weights;
  cuda::DeviceBytes dbytes, dtable, dq, dw;

  RandomIndexer(int batch, int blocks_per_req, int block_rows, std::mt19937& rng) : B(batch), bpr(blocks_per_req) {
    cache.block_rows = block_rows;
    cache.stride = indexer_block_stride_bytes(block_rows);
    cache.num_blocks = B * bpr;
    bytes.resize(static_cast<std::size_t>(cache.num_blocks) * cache.stride);
    for (auto& v : bytes) { v = static_cast<std::uint8_t>(rng()); if ((v & 0x7F) == 0x7F) v ^= 1; }
    std::uniform_real_distribution<float> u(0.001f, 0.02f), w(-0.5f, 0.5f);
    for (int blk = 0; blk < cache.num_blocks; ++blk)
      for (int t = 0; t < block_rows; ++t) {
        const float sc = u(rng);
        std::memcpy(bytes.data() + static_cast<std::size_t>(blk) * cache.stride + block_rows * 128 + t * 4, &sc, 4);
      }
    cache.base = bytes.data();
    table.resize(static_cast<std::size_t>(cache.num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    q.resize(static_cast<std::size_t>(B) * kIndexerHeads * kIndexerDim);
    for (auto& v : q) { v = static_cast<std::uint8_t>(rng()); if ((v & 0x7F) == 0x7F) v ^= 1; }
    weights.resize(static_cast<std::size_t>(B) * kIndexerHeads);
    for (auto& v : weights) v = w(rng);
    dbytes = to_device(bytes); dtable = to_device(table); dq = to_device(q); dw = to_device(weights);
  }
  // The scores launch over these inputs (engine: automatic unless the caller sets it).
  cuda::IndexerScoreArgs args(std::int64_t N, const void* seq_lens, void* logits) const {
    cuda::IndexerScoreArgs sa;
    sa.batch = B; sa.N = N; sa.seq_lens = static_cast<const std::int32_t*>(seq_lens);
    sa.q = dq.get(); sa.weights = reinterpret_cast<const float*>(dw.get());
    sa.cache = cache; sa.cache.base = dbytes.get();
    sa.block_table = reinterpret_cast<const std::int32_t*>(dtable.get()); sa.blocks_per_req = bpr;
    sa.logits = static_cast<float*>(logits);
    return sa;
  }
  // Request b's scores in gl (stride N, n_c rows) against the reference: {rows that differ, rows
  // past n_c that were written (not the NaN sentinel)}.
  std::pair<int, int> mismatches(const std::vector<float>& gl, int b, int n_c, std::int64_t N) const {
    std::vector<float> qf(kIndexerHeads * kIndexerDim);
    for (std::size_t i = 0; i < qf.size(); ++i) qf[i] = ref::fp8_e4m3_to_float(q[b * qf.size() + i]);
    const auto want = ref::indexer_scores(cache, table.data() + static_cast<std::size_t>(b) * bpr, n_c, qf.data(),
                                          weights.data() + static_cast<std::size_t>(b) * kIndexerHeads);
    double scale = 0;
    for (float v : want) scale = std::max(scale, double(std::fabs(v)));
    int bad = 0, written_past = 0;
    for (int s = 0; s < n_c; ++s) bad += !(std::fabs(gl[b * N + s] - want[s]) <= 1e-5 * scale + 1e-6);
    for (std::int64_t s = n_c; s < N; ++s) written_past += !std::isnan(gl[b * N + s]);
    return {bad, written_past};
  }
};

}  // namespace

TEST_CASE("indexer_compress_insert writes the reference's rows within one fp8 step", "[ds4][indexer]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int tokens = 64, rows = tokens / 4;
  std::vector<float> kv(tokens * 256), score(tokens * 256), norm(128);
  for (float& v : kv) v = nd(rng) * 2.f;
  for (float& v : score) v = nd(rng);
  for (float& v : norm) v = 0.5f + std::fabs(nd(rng));
  IndexerCache host;
  host.num_blocks = 1;
  std::vector<std::uint8_t> want(host.stride, 0);
  host.base = want.data();
  std::vector<std::int64_t> base(rows, 0);
  std::vector<std::int32_t> row_index(rows), slots(rows);
  std::vector<float> x(128);
  for (int j = 0; j < rows; ++j) {
    row_index[j] = j;
    slots[j] = (j * 7) % 64;
    ref::indexer_compress_row(j, kv.data(), score.data(), norm.data(), 10000.f, 1e-6f, x.data());
    ref::indexer_insert(host, slots[j], x.data());
  }
  slots[3] = -1;  // skipped: its bytes stay zero
  const auto dkv = to_device(kv), dscore = to_device(score), dnorm = to_device(norm), dbase = to_device(base),
             drow = to_device(row_index), dslots = to_device(slots);
  auto dcache = cuda::device_alloc(host.stride);
  GRAPHSAFE_CUDA(cudaMemset(dcache.get(), 0, host.stride));
  IndexerCache dc = host;
  dc.base = dcache.get();
  cuda::indexer_compress_insert(reinterpret_cast<const float*>(dkv.get()), reinterpret_cast<const float*>(dscore.get()),
                                reinterpret_cast<const std::int64_t*>(dbase.get()),
                                reinterpret_cast<const std::int32_t*>(drow.get()),
                                reinterpret_cast<const std::int32_t*>(dslots.get()), rows,
                                reinterpret_cast<const float*>(dnorm.get()), 10000.f, 1e-6f, dc, nullptr);
  const auto got = to_host<std::uint8_t>(dcache.get(), host.stride, nullptr);
  int differing = 0;
  for (int j = 0; j < rows; ++j) {
    const int t = (j * 7) % 64;
    float ws = 0, gs = 0;
    std::memcpy(&ws, want.data() + 64 * 128 + t * 4, 4);
    std::memcpy(&gs, got.data() + 64 * 128 + t * 4, 4);
    if (j == 3) {
      CHECK(gs == 0.f);
      continue;
    }
    CHECK(gs == Approx(ws).epsilon(1e-5));
    for (int d = 0; d < 128; ++d) {
      const std::uint8_t a = want[t * 128 + d], b = got[t * 128 + d];
      if (a == b) continue;
      ++differing;  // the RMSNorm sum's order differs: a value may round to the neighbouring code
      CHECK(std::abs(int(a & 0x7F) - int(b & 0x7F)) <= 1);
      CHECK((a & 0x80) == (b & 0x80));
    }
  }
  CHECK(differing <= rows * 128 / 50);
}

TEST_CASE("indexer scores equal the reference and top-k selects as the reference on the same scores",
          "[ds4][indexer][topk]") {
  Device dev;
  const LayerConfig cfg = c4();
  // Zero, tiny (n_c = 0), short context (n_c < K, = K), long context, capacity.
  const std::vector<std::int32_t> lens = {0, 3, 17, 32, 36, 255, 400, 512};
  DecodeProblem p = make_problem(cfg, lens, 11, Picks::random, kMaxLen);
  const int B = p.batch, K = cfg.topk;
  const ref::IndexerInputs in = ref::make_indexer_inputs(p, 21, /*tie_every=*/5);
  auto d = cuda::upload(p);
  auto di = cuda::upload(in);
  const std::int64_t N = cfg.compressed_capacity();
  const std::size_t items = static_cast<std::size_t>(B) * N;
  auto logits = cuda::device_alloc(items * 4), topk = cuda::device_alloc(static_cast<std::size_t>(B) * K * 4);
  GRAPHSAFE_CUDA(cudaMemset(logits.get(), 0xFF, items * 4));  // NaN: rows the kernel must not write stay NaN

  cuda::IndexerScoreArgs sa;
  sa.batch = B; sa.N = N; sa.seq_lens = d.seq_lens; sa.q = di.q; sa.weights = di.weights; sa.cache = di.cache;
  sa.block_table = d.cmp_block_table; sa.blocks_per_req = d.cmp_blocks_per_req;
  sa.logits = reinterpret_cast<float*>(logits.get());
  sa.engine = score_engine();
  cuda::indexer_score(sa, dev.s);
  cuda::IndexerTopkArgs ta;
  ta.batch = B; ta.N = N; ta.k = K; ta.seq_lens = d.seq_lens; ta.logits = sa.logits;
  ta.topk_local = reinterpret_cast<std::int32_t*>(topk.get());
  cuda::indexer_topk(ta, dev.s);

  const auto gl = to_host<float>(logits.get(), items, dev.s);
  const auto gt = to_host<std::int32_t>(topk.get(), static_cast<std::size_t>(B) * K, dev.s);
  std::vector<float> q(kIndexerHeads * kIndexerDim);
  int ties = 0;
  for (int b = 0; b < B; ++b) {
    INFO("request " << b << " seq_len " << lens[b]);
    const int n_c = lens[b] / 4;
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = ref::fp8_e4m3_to_float(in.q[b * q.size() + i]);
    const auto want = ref::indexer_scores(in.cache, p.cmp_block_table.data() + b * p.cmp_blocks_per_req, n_c,
                                          q.data(), in.weights.data() + b * kIndexerHeads);
    double scale = 0;
    for (float v : want) scale = std::max(scale, double(std::fabs(v)));
    for (int s = 0; s < n_c; ++s) {
      CHECK(std::fabs(gl[b * N + s] - want[s]) <= 1e-5 * scale + 1e-6);
      ties += s > 0 && gl[b * N + s] == gl[b * N + s - 1];
    }
    for (std::int64_t s = n_c; s < N; ++s) CHECK(std::isnan(gl[b * N + s]));
    // Selection: the reference rule applied to the GPU's own scores, bit for bit.
    const auto sel = ref::indexer_topk(gl.data() + b * N, n_c, K);
    CHECK(std::vector<std::int32_t>(gt.begin() + b * K, gt.begin() + (b + 1) * K) == sel);
  }
  CHECK(ties > 0);  // the tie-break was exercised
}

// The scores at an engine-sized row count: enough 16-row tiles that every warp's copy ring wraps
// around several times, requests of length zero, short, mid and at capacity (n_c = N), keys in
// shuffled paged blocks. Against the reference scores; rows past n_c are never written.
TEST_CASE("indexer scores at engine row counts equal the reference", "[ds4][indexer][scores]") {
  Device dev;
  const int B = 24, block_rows = 64;
  const std::int64_t N = 8192;
  const int bpr = static_cast<int>(N / block_rows);
  std::vector<std::int32_t> lens(B);
  for (int b = 0; b < B; ++b) lens[b] = b == 0 ? 0 : b == 1 ? 7 : b == 2 ? 4 * 100 + 3 : b < 12 ? 4 * static_cast<int>(N) : 4 * (8000 - b);
  std::mt19937 rng(99);
  const RandomIndexer in(B, bpr, block_rows, rng);
  const auto dlen = to_device(lens);
  auto logits = cuda::device_alloc(static_cast<std::size_t>(B) * N * 4);
  GRAPHSAFE_CUDA(cudaMemset(logits.get(), 0xFF, static_cast<std::size_t>(B) * N * 4));
  cuda::IndexerScoreArgs sa = in.args(N, dlen.get(), logits.get());
  sa.engine = score_engine();
  cuda::indexer_score(sa, dev.s);
  const auto gl = to_host<float>(logits.get(), static_cast<std::size_t>(B) * N, dev.s);
  for (int b = 0; b < B; ++b) {
    INFO("request " << b << " seq_len " << lens[b]);
    const auto [bad, written_past] = in.mismatches(gl, b, lens[b] / 4, N);
    CHECK(bad == 0);
    CHECK(written_past == 0);
  }
}

// engine = wgmma copies 64-row tiles that must lie in one cache block, so a cache whose block_rows is
// not a multiple of 64 must be refused before launch, naming the value and the limit: launched, its
// tiles would straddle blocks and read another request's keys. The same cache is scored as the
// reference does by the automatic engine (mma_sync for it; at 40 rows a block its 16-row tiles
// straddle blocks too, so it must look each row's block up), and multiples of 64 other than 64 are
// taken by wgmma and scored as the reference does, so the refusal is the limit and nothing wider.
TEST_CASE("indexer scores: engine = wgmma refuses block_rows not a multiple of 64 before launch", "[ds4][indexer]") {
  Device dev;
  int device = 0, major = 0;
  GRAPHSAFE_CUDA(cudaGetDevice(&device));
  GRAPHSAFE_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const int B = 4;
  const std::int64_t N = 384;
  const std::size_t items = static_cast<std::size_t>(B) * N;
  // n_c = 0, 5, 200 (mid-block at every size) and N (capacity).
  const std::vector<std::int32_t> lens = {0, 4 * 5 + 3, 4 * 200 + 1, 4 * static_cast<std::int32_t>(N)};
  const auto dlen = to_device(lens);
  for (const int block_rows : {40, 48, 96, 64, 128}) {
    INFO("block_rows " << block_rows);
    const int bpr = static_cast<int>((N + block_rows - 1) / block_rows);
    std::mt19937 rng(static_cast<std::uint32_t>(block_rows));
    const RandomIndexer in(B, bpr, block_rows, rng);
    auto logits = cuda::device_alloc(items * 4);
    cuda::IndexerScoreArgs sa = in.args(N, dlen.get(), logits.get());
    // Rows the reference scores that differ, plus rows past n_c that were written (NaN sentinel).
    auto mismatches = [&](const std::vector<float>& gl) {
      int bad = 0;
      for (int b = 0; b < B; ++b) {
        const auto [differ, written_past] = in.mismatches(gl, b, lens[b] / 4, N);
        bad += differ + written_past;
      }
      return bad;
    };
    auto reset_logits = [&] { GRAPHSAFE_CUDA(cudaMemsetAsync(logits.get(), 0xFF, items * 4, dev.s)); };

    reset_logits();
    sa.engine = cuda::IndexerEngine::automatic;
    cuda::indexer_score(sa, dev.s);
    CHECK(mismatches(to_host<float>(logits.get(), items, dev.s)) == 0);

    reset_logits();
    sa.engine = cuda::IndexerEngine::wgmma;
    if (major == 9 && block_rows % 64 == 0) {
      cuda::indexer_score(sa, dev.s);
      CHECK(mismatches(to_host<float>(logits.get(), items, dev.s)) == 0);
      continue;
    }
    std::string what;
    CHECK_THROWS_AS(cuda::indexer_score(sa, dev.s), invalid_argument_error);
    try {
      cuda::indexer_score(sa, dev.s);
    } catch (const invalid_argument_error& e) {
      what = e.what();
    }
    CHECK_THAT(what, Catch::Contains("indexer_score") && Catch::Contains("engine = wgmma"));
    if (major == 9)
      CHECK_THAT(what, Catch::Contains("cache.block_rows = " + std::to_string(block_rows)) &&
                           Catch::Contains("a multiple of 64"));
    else  // no sm_90a code for this GPU: that refusal comes first
      CHECK_THAT(what, Catch::Contains("compute capability"));
    // Refused before launch: no kernel wrote the logits and no launch error is pending.
    const auto after = to_host<std::uint32_t>(logits.get(), items, dev.s);
    CHECK(std::count(after.begin(), after.end(), 0xFFFFFFFFu) == static_cast<std::ptrdiff_t>(items));
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}

// The top-k at engine shapes (K up to 2048, row strides on both sides of the shared-memory staging
// limit) against the selection rule on the same scores: zero length, n_c < K, n_c = K (the short
// path), n_c = K + 1, mid, capacity (n_c = N) and beyond it (rows past N never read); ties across
// the cut, -0.0 next to +0.0, negative scores, and one request whose scores all tie (more ties
// than the candidate list holds: the passes over every row). The same launch with the paged
// attention's index lists asked for writes exactly what combine_paged builds from the picks.
TEST_CASE("indexer top-k at engine shapes selects as the reference rule", "[ds4][indexer][topk]") {
  Device dev;
  struct Shape { int k; std::int64_t N; };
  for (const Shape sh : {Shape{512, 2048}, Shape{512, 16384}, Shape{512, 40000}, Shape{2048, 4096}, Shape{1024, 40000}}) {
    const int K = sh.k;
    const std::int64_t N = sh.N;
    INFO("K " << K << " N " << N);
    const std::vector<std::int32_t> n_cs = {0, 1, K - 1, K, K + 1, static_cast<std::int32_t>((N + K) / 2),
                                            static_cast<std::int32_t>(N), static_cast<std::int32_t>(N + 5),
                                            static_cast<std::int32_t>(N)};
    const int B = static_cast<int>(n_cs.size());
    std::vector<std::int32_t> lens(B);
    for (int b = 0; b < B; ++b) lens[b] = n_cs[b] * 4 + b % 4;  // L % 4 != 0 too: n_c = L / 4
    std::mt19937 rng(static_cast<unsigned>(K * 7 + N));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> logits(static_cast<std::size_t>(B) * N);
    for (int b = 0; b < B; ++b) {
      float* row = logits.data() + static_cast<std::size_t>(b) * N;
      for (std::int64_t s = 0; s < N; ++s) {
        // Coarse values (many ties, some across the K-th score), both signs, signed zeros.
        float v = std::round(nd(rng) * 64.f) / 8.f;
        if (v == 0.f && (s & 1)) v = -0.f;
        row[s] = v;
      }
      if (b == B - 1) std::fill(row, row + N, 0.25f);  // everything ties
    }
    const auto dl = to_device(logits), dlen = to_device(lens);
    auto top = cuda::device_alloc(static_cast<std::size_t>(B) * K * 4);
    GRAPHSAFE_CUDA(cudaMemset(top.get(), 0x7F, static_cast<std::size_t>(B) * K * 4));
    cuda::IndexerTopkArgs ta;
    ta.batch = B; ta.N = N; ta.k = K; ta.seq_lens = reinterpret_cast<const std::int32_t*>(dlen.get());
    ta.logits = reinterpret_cast<const float*>(dl.get());
    ta.topk_local = reinterpret_cast<std::int32_t*>(top.get());
    cuda::indexer_topk(ta, dev.s);
    const auto got = to_host<std::int32_t>(top.get(), static_cast<std::size_t>(B) * K, dev.s);
    for (int b = 0; b < B; ++b) {
      INFO("request " << b << " n_c " << n_cs[b]);
      const int n_c = n_cs[b];
      const int n = n_c <= K ? n_c : static_cast<int>(std::min<std::int64_t>(n_c, N));
      const auto want = ref::indexer_topk(logits.data() + static_cast<std::size_t>(b) * N, n, K);
      CHECK(std::vector<std::int32_t>(got.begin() + static_cast<std::ptrdiff_t>(b) * K,
                                      got.begin() + static_cast<std::ptrdiff_t>(b + 1) * K) == want);
    }

    // The index lists: block tables with shuffled blocks and unmapped (-1) entries, a window of 100
    // in 64-token blocks; combine_paged over the picks above is the reference.
    const int E = 64, W = 100, sbt = 64;
    const int cbpr = static_cast<int>((N + 5 + E - 1) / E), sbpr = static_cast<int>((4 * (N + 5) + 3 + sbt - 1) / sbt);
    std::vector<std::int32_t> ctab(static_cast<std::size_t>(B) * cbpr), stab(static_cast<std::size_t>(B) * sbpr);
    std::iota(ctab.begin(), ctab.end(), 0);
    std::iota(stab.begin(), stab.end(), 0);
    std::shuffle(ctab.begin(), ctab.end(), rng);
    std::shuffle(stab.begin(), stab.end(), rng);
    for (std::size_t i = 0; i < ctab.size(); i += 7) ctab[i] = -1;
    for (std::size_t i = 3; i < stab.size(); i += 5) stab[i] = -1;
    const auto dctab = to_device(ctab), dstab = to_device(stab);
    const int cw = K + 3;  // wider than K: the tail is padded too
    const std::size_t nc = static_cast<std::size_t>(B) * cw, ns = static_cast<std::size_t>(B) * W;
    auto lists = cuda::device_alloc((2 * (nc + ns) + 4 * B) * 4);
    auto* words = reinterpret_cast<std::int32_t*>(lists.get());
    GRAPHSAFE_CUDA(cudaMemset(words, 0x7F, (2 * (nc + ns) + 4 * B) * 4));
    cuda::PagedIndexArgs ia;
    ia.batch = B; ia.ratio = 4; ia.window = W; ia.topk = K; ia.cmp_width = cw;
    ia.seq_lens = reinterpret_cast<const std::int32_t*>(dlen.get());
    ia.swa_block_table = reinterpret_cast<const std::int32_t*>(dstab.get()); ia.swa_blocks_per_req = sbpr; ia.swa_block_tokens = sbt;
    ia.cmp_block_table = reinterpret_cast<const std::int32_t*>(dctab.get()); ia.cmp_blocks_per_req = cbpr; ia.cmp_block_entries = E;
    cuda::PagedIndexArgs want_lists = ia;  // combine_paged from topk_local
    want_lists.topk_local = reinterpret_cast<const std::int32_t*>(top.get());
    want_lists.cmp_idx = words; want_lists.swa_idx = words + nc; want_lists.cmp_lens = words + nc + ns;
    want_lists.swa_lens = words + nc + ns + B;
    cuda::combine_paged(want_lists, dev.s);
    ia.cmp_idx = words + nc + ns + 2 * B; ia.swa_idx = ia.cmp_idx + nc; ia.cmp_lens = ia.swa_idx + ns;
    ia.swa_lens = ia.cmp_lens + B;
    cuda::IndexerTopkArgs tl = ta;
    tl.topk_local = nullptr;  // the lists alone
    tl.lists = ia;
    cuda::indexer_topk(tl, dev.s);
    const auto all = to_host<std::int32_t>(words, 2 * (nc + ns) + 4 * B, dev.s);
    const std::size_t half = nc + ns + 2 * static_cast<std::size_t>(B);
    CHECK(std::equal(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(half), all.begin() + static_cast<std::ptrdiff_t>(half)));
    int mapped = 0;
    for (std::size_t i = 0; i < nc; ++i) mapped += all[i] >= 0;
    CHECK(mapped > 0);
  }
}

TEST_CASE("indexer top-k refuses index lists it cannot write, naming the field", "[ds4][indexer][topk]") {
  Device dev;
  auto buf = cuda::device_alloc(1 << 16);
  auto* w = reinterpret_cast<std::int32_t*>(buf.get());
  GRAPHSAFE_CUDA(cudaMemset(w, 0x7F, 1 << 16));
  cuda::IndexerTopkArgs ta;
  ta.batch = 2; ta.N = 16; ta.k = 8; ta.seq_lens = w; ta.logits = reinterpret_cast<const float*>(w + 64);
  ta.lists.batch = 2; ta.lists.ratio = 4; ta.lists.window = 4; ta.lists.topk = 8; ta.lists.cmp_width = 8;
  ta.lists.seq_lens = w; ta.lists.swa_block_table = w; ta.lists.swa_blocks_per_req = 1;
  ta.lists.cmp_block_table = w; ta.lists.cmp_blocks_per_req = 1; ta.lists.cmp_block_entries = 64;
  ta.lists.cmp_idx = w + 128; ta.lists.cmp_lens = w + 256; ta.lists.swa_idx = w + 384; ta.lists.swa_lens = w + 512;
  auto with = [&](auto f) { cuda::IndexerTopkArgs x = ta; f(x); return x; };
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.query_tokens = 2; }), dev.s),
                    Catch::Contains("lists.query_tokens = 2") && Catch::Contains("1 (the indexer"));
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.batch = 3; }), dev.s),
                    Catch::Contains("lists.batch = 3") && Catch::Contains("batch = 2"));
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.topk = 16; }), dev.s),
                    Catch::Contains("lists.topk = 16") && Catch::Contains("k = 8"));
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.cmp_width = 7; }), dev.s),
                    Catch::Contains("cmp_width = 7"));
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.ratio = 128; }), dev.s),
                    Catch::Contains("lists.ratio = 128"));
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists.swa_lens = nullptr; }), dev.s),
                    Catch::Contains("swa_lens is null"));
  // A row stride past the row bitmaps' capacity.
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.batch = 1; x.lists.batch = 1; x.N = 524289; }), dev.s),
                    Catch::Contains("N = 524289") && Catch::Contains("<= 524288"));
  // Without lists the picks' buffer is required.
  CHECK_THROWS_WITH(cuda::indexer_topk(with([](auto& x) { x.lists = {}; }), dev.s), Catch::Contains("topk_local is null"));
  // Nothing was launched: the outputs keep their fill.
  const auto h = to_host<std::int32_t>(w, 1 << 14, dev.s);
  CHECK(std::all_of(h.begin(), h.end(), [](std::int32_t v) { return v == 0x7F7F7F7F; }));
}

TEST_CASE("DS4 C4 step with the indexer: replay equals eager bit for bit as sequences grow", "[ds4][indexer][graph]") {
  Device dev;
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, dev.s);
  const LayerConfig cfg = c4();
  const Ds4Symbols syms(cfg);
  // Captured at short context (n_c <= K for both), replayed through the transition to long context.
  DecodeProblem p = make_problem(cfg, {3, 5}, 7, Picks::random, kMaxLen);
  const ref::IndexerInputs in = ref::make_indexer_inputs(p, 8, /*tie_every=*/7);
  auto d = cuda::upload(p);
  auto di = cuda::upload(in);
  IndexerDecode ix(arena, cfg, syms, Sizing::safe);
  PagedDecode attn(arena, cfg, syms);
  const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
  auto out_graph = cuda::device_alloc(n_out * 2), out_eager = cuda::device_alloc(n_out * 2);
  auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
  auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
  auto out_fused = cuda::device_alloc(n_out * 2);
  auto* of = reinterpret_cast<std::uint16_t*>(out_fused.get());
  auto step = [&](const Bindings& b, std::uint16_t* out) {
    ix.run(dev.s, d, di, b, d.topk_local);
    attn.run(dev.s, d, b, out);
  };
  Bindings b = syms.bind(2, cfg, p.seq_lens);
  auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { step(bb, og); });
  CHECK(graph.plan().findings().empty());
  // The same step with the top-k writing the attention's index lists itself (no combine launch).
  auto fused = capture(arena, dev.s, b, [&](const Bindings& bb) { attn.run(dev.s, d, ix, di, bb, of); });
  CHECK(fused.plan().findings().empty());
  for (std::vector<std::int32_t> lens : {std::vector<std::int32_t>{3, 5}, {15, 33}, {36, 40}, {255, 257}, {511, 512}}) {
    INFO("lengths " << lens[0] << "," << lens[1]);
    grow(p, lens, 1, Picks::random);
    cuda::upload_lengths(d, p, dev.s);  // also overwrites d.topk_local with random picks: the step must replace them
    b = syms.bind(2, cfg, lens);
    GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));
    graph.replay(b, dev.s);
    const auto top_graph = to_host<std::int32_t>(d.topk_local, 2 * cfg.topk, dev.s);
    step(b, oe);
    const auto top_eager = to_host<std::int32_t>(d.topk_local, 2 * cfg.topk, dev.s);
    CHECK(top_graph == top_eager);
    CHECK(top_graph == ref::indexer_topk_all(p, in));
    const auto hg = to_host<std::uint16_t>(og, n_out, dev.s), he = to_host<std::uint16_t>(oe, n_out, dev.s);
    CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);
    GRAPHSAFE_CUDA(cudaMemsetAsync(of, 0xFF, n_out * 2, dev.s));
    fused.replay(b, dev.s);
    const auto hf = to_host<std::uint16_t>(of, n_out, dev.s);
    CHECK(std::memcmp(hf.data(), he.data(), n_out * 2) == 0);
    // And the attention over the indexer's picks matches the CPU reference.
    std::copy(top_eager.begin(), top_eager.end(), p.topk_local.begin());
    std::vector<float> r(n_out);
    ref::sparse_attention(p, r.data());
    CHECK(test::rel_error(hg, r) < test::kTolerance);
  }
}

TEST_CASE("DS4 indexer: a logits stride sized at capture time is reported and the grown replay refused",
          "[ds4][indexer][graph]") {
  Device dev;
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  arena.reserve(16ull << 20, dev.s);
  const LayerConfig cfg = c4();
  const Ds4Symbols syms(cfg);
  DecodeProblem p = make_problem(cfg, {40, 44}, 3, Picks::random, kMaxLen);
  const ref::IndexerInputs in = ref::make_indexer_inputs(p, 4);
  auto d = cuda::upload(p);
  auto di = cuda::upload(in);
  IndexerDecode ix(arena, cfg, syms, Sizing::exact);
  Bindings b = syms.bind(2, cfg, p.seq_lens);
  IndexerSizes z;
  auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { z = ix.run(dev.s, d, di, bb, d.topk_local); });
  CHECK(z.N == 11);  // max(40 / 4, 44 / 4)
  CHECK_FALSE(graph.plan().findings().empty());
  CHECK_NOTHROW(graph.replay(b, dev.s));  // same lengths: fits
  const Bindings grown = syms.bind(2, cfg, {100, 44});
  CHECK_THROWS_AS(graph.replay(grown, dev.s), guard_failure);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
}
