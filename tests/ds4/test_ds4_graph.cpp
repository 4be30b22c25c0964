// The seed regression on real kernels: DS4 sparse decode (quantized caches, combine, gather,
// tensor-core sparse attention) whose workspaces go through graphsafe, captured in a CUDA Graph at
// sequence lengths [3,5] and replayed after the sequences grow to [15,17], [255,257] and up to the
// capacity. For C1, C4 and C128:
//  - safe sizing (capacity-bound compressed rows, static-query-bound SWA rows): replay == eager bit
//    for bit, and both match the CPU reference within the stated bf16 tolerance;
//  - exact-at-capture (the seed's sizing): reported at capture, the guard refuses the replay, and
//    with the guard bypassed the replay differs from eager -- proof the test can fail;
//  - the two gather workspace layouts (GatherLayout): on a ragged batch (padded slots, mixed lengths)
//    the ragged layout's output equals the strided one's bit for bit, eager and replayed after growth.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "../support/ds4_test_support.hpp"

#include <cmath>
#include <cstring>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

namespace {

constexpr int kMaxLen = 512;
using test::Device;
using test::download;
using test::kTolerance;
using test::rel_error;
LayerConfig tiny(int ratio) { return test::tiny_layer(ratio, kMaxLen); }

}  // namespace

TEST_CASE("DS4 seed regression: safe sizing replays equal eager after growth, C1/C4/C128", "[ds4][graph]") {
  Device dev;
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, dev.s);
  for (int ratio : {1, 4, 128}) {
    for (bool gather : {true, false}) {
      INFO("ratio " << ratio << (gather ? " gather path" : " paged-direct path"));
      const LayerConfig cfg = tiny(ratio);
      DecodeProblem p = make_problem(cfg, {3, 5}, 1234 + ratio, Picks::last8, kMaxLen);
      auto d = cuda::upload(p);
      const Ds4Symbols syms(cfg);
      GatherDecode gd(arena, cfg, syms, Sizing::safe);
      PagedDecode pd(arena, cfg, syms);
      const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
      auto out_graph = cuda::device_alloc(n_out * 2);
      auto out_eager = cuda::device_alloc(n_out * 2);
      auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
      auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
      auto step = [&](Stream s, const Bindings& b, std::uint16_t* out) {
        if (gather)
          gd.run(s, d, b, out);
        else
          pd.run(s, d, b, out);
      };
      Bindings b = syms.bind(2, cfg, p.seq_lens);
      auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { step(dev.s, bb, og); });
      CHECK(graph.plan().findings().empty());
      CHECK(graph.plan().guard_count() == 0);
      for (std::vector<std::int32_t> lens : {std::vector<std::int32_t>{3, 5}, {15, 17}, {255, 257}, {511, 512}}) {
        INFO("lengths " << lens[0] << "," << lens[1]);
        grow(p, lens, 99 + lens[0], Picks::last8);
        cuda::upload_lengths(d, p, dev.s);
        b = syms.bind(2, cfg, lens);
        GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));  // poison: unwritten output shows
        graph.replay(b, dev.s);
        step(dev.s, b, oe);
        const auto hg = download(og, n_out, dev.s);
        const auto he = download(oe, n_out, dev.s);
        CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);  // replay == eager, bit for bit
        std::vector<float> r(n_out);
        ref::sparse_attention(p, r.data());
        const double err = rel_error(hg, r);
        INFO("relative error vs CPU reference " << err);
        CHECK(err < kTolerance);
      }
    }
  }
}

TEST_CASE("DS4 seed regression: exact-at-capture is refused by the guard and really corrupts without it",
          "[ds4][graph]") {
  Device dev;
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  arena.reserve(64ull << 20, dev.s);
  for (int ratio : {4, 128}) {
    INFO("ratio " << ratio);
    const LayerConfig cfg = tiny(ratio);
    DecodeProblem p = make_problem(cfg, {3, 5}, 77 + ratio, Picks::last8, kMaxLen);
    auto d = cuda::upload(p);
    const Ds4Symbols syms(cfg);
    GatherDecode exact(arena, cfg, syms, Sizing::exact);
    GatherDecode safe(arena, cfg, syms, Sizing::safe);
    const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
    auto out_graph = cuda::device_alloc(n_out * 2);
    auto out_eager = cuda::device_alloc(n_out * 2);
    auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
    auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
    Bindings b = syms.bind(2, cfg, p.seq_lens);
    auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { exact.run(dev.s, d, bb, og); });
    // Detected at capture time, with the symbol and its capture-time value.
    REQUIRE(!graph.plan().findings().empty());
    CHECK_THAT(graph.plan().findings()[0].message, Catch::Contains("seq_lens = [3, 5]"));
    const std::vector<std::int32_t> grown = ratio == 4 ? std::vector<std::int32_t>{15, 17} : std::vector<std::int32_t>{255, 257};
    grow(p, grown, 5, Picks::last8);
    cuda::upload_lengths(d, p, dev.s);
    b = syms.bind(2, cfg, grown);
    GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0x7F, n_out * 2, dev.s));
    const auto before = download(og, n_out, dev.s);
    CHECK_THROWS_AS(graph.replay(b, dev.s), guard_failure);
    CHECK(download(og, n_out, dev.s) == before);  // refused before launch: nothing ran
    // Eager under the safe sizing is the truth; the unguarded replay of the exact graph is wrong.
    safe.run(dev.s, d, b, oe);
    graph.replay_unguarded_for_testing(dev.s);
    const auto hg = download(og, n_out, dev.s);
    const auto he = download(oe, n_out, dev.s);
    CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) != 0);
  }
}

TEST_CASE("DS4 gather layouts: ragged equals strided bit for bit on a ragged batch, eager and replayed, C1/C4/C128",
          "[ds4][graph][ragged]") {
  Device dev;
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, dev.s);
  // Six slots, two padded at capture; every step changes the ragged row offsets of the later slots.
  const std::vector<std::vector<std::int32_t>> trace{
      {3, 0, 5, 1, 17, 0}, {15, 0, 130, 2, 17, 4}, {255, 9, 0, 511, 200, 64}, {512, 511, 0, 512, 1, 300}};
  const int B = static_cast<int>(trace[0].size());
  for (int ratio : {1, 4, 128}) {
    INFO("ratio " << ratio);
    const LayerConfig cfg = tiny(ratio);
    DecodeProblem p = make_problem(cfg, trace[0], 555 + ratio, Picks::last8, kMaxLen);
    auto d = cuda::upload(p);
    const Ds4Symbols syms(cfg);
    GatherDecode strided(arena, cfg, syms, Sizing::safe, GatherLayout::strided);
    GatherDecode ragged(arena, cfg, syms, Sizing::safe, GatherLayout::ragged);
    CHECK(strided.layout() == GatherLayout::strided);
    CHECK(ragged.layout() == GatherLayout::ragged);
    CHECK(GatherDecode(arena, cfg, syms, Sizing::safe).layout() == GatherLayout::strided);  // no virtual memory
    const std::size_t n_out = std::size_t(B) * cfg.heads * kHeadDim;
    auto out_graph = cuda::device_alloc(n_out * 2);
    auto out_ragged = cuda::device_alloc(n_out * 2);
    auto out_strided = cuda::device_alloc(n_out * 2);
    auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
    auto* orr = reinterpret_cast<std::uint16_t*>(out_ragged.get());
    auto* os = reinterpret_cast<std::uint16_t*>(out_strided.get());
    Bindings b = syms.bind(B, cfg, p.seq_lens);
    auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { ragged.run(dev.s, d, bb, og); });
    CHECK(graph.plan().findings().empty());
    CHECK(graph.plan().guard_count() == 0);
    for (const auto& lens : trace) {
      INFO("lengths " << lens[0] << "," << lens[1] << "," << lens[2] << "," << lens[3] << "," << lens[4] << ","
                      << lens[5]);
      grow(p, lens, 77 + lens[0], Picks::last8);
      cuda::upload_lengths(d, p, dev.s);
      b = syms.bind(B, cfg, lens);
      for (auto* o : {og, orr, os}) GRAPHSAFE_CUDA(cudaMemsetAsync(o, 0xFF, n_out * 2, dev.s));  // poison
      graph.replay(b, dev.s);
      const StepSizes zr = ragged.run(dev.s, d, b, orr);
      const StepSizes zs = strided.run(dev.s, d, b, os);
      CHECK(zr.N == zs.N);  // same sizes, same reservation: only the row offsets differ
      CHECK(zr.M == zs.M);
      CHECK(zr.workspace_bytes == zs.workspace_bytes);
      const auto hg = download(og, n_out, dev.s);
      const auto hr = download(orr, n_out, dev.s);
      const auto hs = download(os, n_out, dev.s);
      CHECK(std::memcmp(hr.data(), hs.data(), n_out * 2) == 0);  // ragged == strided, bit for bit
      CHECK(std::memcmp(hg.data(), hr.data(), n_out * 2) == 0);  // replay == eager, bit for bit
      std::vector<float> r(n_out);
      ref::sparse_attention(p, r.data());
      const double err = rel_error(hr, r);
      INFO("relative error vs CPU reference " << err);
      CHECK(err < kTolerance);
    }
    GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
}
