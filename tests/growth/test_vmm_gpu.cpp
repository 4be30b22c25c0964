// Virtual growth on the GPU (CudaVirtualMemory: cuMemAddressReserve / cuMemCreate / cuMemMap /
// cuMemSetAccess): the DS4 seed regression with the gather workspace reserved at its capacity bound
// as address space and mapped only behind the rows the gather writes.
//  - C1/C4/C128, gather path in both workspace layouts (ragged: the default in virtual mode, one
//    prefix footprint; strided: per-request ranges) and paged path, capture at [3,5], replay growing
//    to capacity: replay == eager bit for bit, and within the bf16 tolerance of the CPU reference;
//  - max_model_len 64K: device memory in use (cudaMemGetInfo) grows with the lengths instead of
//    jumping to the capacity bound at capture, and (ragged layout) the committed bytes meet the
//    target at every step: <= 1.10 x exact need + one granule per workspace;
//  - exact-at-capture sizing: the guard still refuses before anything is mapped or launched;
//  - debug mode (canaries checked after every replay) and NVTX registration together with virtual
//    growth, shrink and regrow: replay == eager, canaries intact, no findings;
//  - a capture family (buckets of 4 and 2 requests) in one address range and one mapping.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "../support/ds4_test_support.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

namespace {

LayerConfig config(int ratio, int max_len) { return test::tiny_layer(ratio, max_len); }
using test::Device;
using test::download;
using test::kTolerance;
using test::rel_error;

std::uint64_t used_bytes() {
  std::size_t free_b = 0, total = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free_b, &total));
  return total - free_b;
}

// Device bytes that one mapped byte costs in cudaMemGetInfo: 1, but 2 under compute-sanitizer's
// initcheck, which shadows every mapped byte with one of its own (seen on the H200: 28 MiB used for
// 14 MiB of chunks). bench/run_gpu_suite.sh names the tool in GRAPHSAFE_SANITIZER_TOOL.
std::uint64_t bytes_per_mapped_byte() {
  const char* tool = std::getenv("GRAPHSAFE_SANITIZER_TOOL");
  return tool && std::string_view(tool) == "initcheck" ? 2 : 1;
}

}  // namespace

TEST_CASE("VMM: DS4 seed regression in virtual mode, replay == eager after growth, C1/C4/C128", "[ds4][vmm]") {
  constexpr int kMaxLen = 512;
  Device dev;
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  INFO("granularity " << vm->granularity());
  Arena arena(backend, ArenaOptions{.virtual_memory = vm, .virtual_reserve_bytes = 1ull << 34});
  arena.reserve(64ull << 20, dev.s);  // eager steps
  for (int ratio : {1, 4, 128}) {
    for (int path : {0, 1, 2}) {  // gather (automatic layout: ragged in virtual mode), gather strided, paged
      const bool gather = path < 2;
      INFO("ratio " << ratio << (path == 0 ? " gather path, ragged" : path == 1 ? " gather path, strided" : " paged-direct path"));
      const LayerConfig cfg = config(ratio, kMaxLen);
      DecodeProblem p = make_problem(cfg, {3, 5}, 1234 + ratio, Picks::last8, kMaxLen);
      auto d = cuda::upload(p);
      const Ds4Symbols syms(cfg);
      GatherDecode gd(arena, cfg, syms, Sizing::safe, path == 1 ? GatherLayout::strided : GatherLayout::automatic);
      CHECK(gd.layout() == (path == 1 ? GatherLayout::strided : GatherLayout::ragged));
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
      REQUIRE(graph.virtual_stats().virtual_mode);
      for (std::vector<std::int32_t> lens : {std::vector<std::int32_t>{3, 5}, {15, 17}, {255, 257}, {511, 512}}) {
        INFO("lengths " << lens[0] << "," << lens[1]);
        grow(p, lens, 99 + lens[0], Picks::last8);
        cuda::upload_lengths(d, p, dev.s);
        b = syms.bind(2, cfg, lens);
        GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));
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
        const auto vs = graph.virtual_stats(&b);
        CHECK(vs.committed_bytes >= vs.granule_need_bytes);
      }
      GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
      GRAPHSAFE_CUDA(cudaGetLastError());
    }
  }
}

TEST_CASE("VMM: device memory grows with the lengths, not to the capacity bound at capture", "[ds4][vmm]") {
  constexpr int kMaxLen = 65536;
  Device dev;
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  const std::uint64_t G = vm->granularity();
  Arena arena(backend, ArenaOptions{.virtual_memory = vm, .virtual_reserve_bytes = 1ull << 34});
  arena.reserve(256ull << 20, dev.s);  // eager steps: from this slab, never from new device memory
  for (int ratio : {4, 128}) {
    INFO("ratio " << ratio);
    const LayerConfig cfg = config(ratio, kMaxLen);
    DecodeProblem p = make_problem(cfg, {3, 5}, 4321 + ratio, Picks::last8, kMaxLen);
    auto d = cuda::upload(p);
    const Ds4Symbols syms(cfg);
    GatherDecode gd(arena, cfg, syms, Sizing::safe);
    REQUIRE(gd.layout() == GatherLayout::ragged);  // automatic in virtual mode: the kv need is one prefix
    const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
    auto out_graph = cuda::device_alloc(n_out * 2);
    auto out_eager = cuda::device_alloc(n_out * 2);
    auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
    auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
    // The target of docs/virtual_growth.md: committed <= 1.10 x exact need + one
    // granule per workspace. The step's workspaces are its four requests (kv, combined indices,
    // combined lengths, split-K scratch); a request of 0 bytes (the scratch when one split suffices)
    // can hold no granule, so it gets no allowance.
    const int splits = cuda::choose_splits(2, cfg.heads, cfg.combined_width(), cuda::device_sm_count());
    const std::uint64_t with_memory = 3 + (cuda::sparse_attention_scratch_bytes(2, cfg.heads, splits) > 0 ? 1 : 0);
    auto target = [&](const VirtualGraphStats& vs) {
      return static_cast<std::uint64_t>(1.10 * static_cast<double>(vs.exact_need_bytes)) + with_memory * vs.granularity;
    };
    // Warm the eager path at capacity once so its slab use is settled before measuring.
    {
      std::vector<std::int32_t> full{kMaxLen - 1, kMaxLen};
      grow(p, full, 1, Picks::last8);
      cuda::upload_lengths(d, p, dev.s);
      gd.run(dev.s, d, syms.bind(2, cfg, full), oe);
      grow(p, {3, 5}, 2, Picks::last8);
      cuda::upload_lengths(d, p, dev.s);
      GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
    }
    const std::int64_t N = (kMaxLen + ratio - 1) / ratio, M = N + cfg.window;
    const std::uint64_t kv_capacity = 2ull * M * kHeadDim * 2;  // what the capacity bound holds

    const std::uint64_t created0 = vm->stats().chunks_created;
    const std::uint64_t used0 = used_bytes();
    Bindings b = syms.bind(2, cfg, p.seq_lens);
    auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { gd.run(dev.s, d, bb, og); });
    GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
    const std::uint64_t used_capture = used_bytes() - used0;
    const auto at_capture = graph.virtual_stats(&b);
    std::printf("C%d max_model_len %d: kv capacity bound %.1f MiB, plan %.1f MiB, granularity %.1f MiB\n", ratio,
                kMaxLen, kv_capacity / 1048576.0, at_capture.reserved_bytes / 1048576.0, G / 1048576.0);
    std::printf("  %-16s %12s %12s %12s %14s\n", "lengths", "exact MiB", "granule MiB", "mapped MiB",
                "cudaMemGetInfo+");
    std::printf("  %-16s %12.2f %12.2f %12.2f %14.2f\n", "capture [3,5]", at_capture.exact_need_bytes / 1048576.0,
                at_capture.granule_need_bytes / 1048576.0, at_capture.committed_bytes / 1048576.0,
                used_capture / 1048576.0);
    CHECK(at_capture.reserved_bytes >= kv_capacity);
    REQUIRE(at_capture.workspaces == 4);
    CHECK(at_capture.committed_bytes >= at_capture.granule_need_bytes);
    CHECK(at_capture.committed_bytes <= target(at_capture));
    if (kv_capacity >= 16 * G) {  // C4 (32 MiB); C128's 1 MiB workspace is below one granule
      CHECK(at_capture.committed_bytes < kv_capacity / 2);
      CHECK(used_capture < kv_capacity / 2);  // no jump to the capacity bound at capture
    }
    std::uint64_t prev = at_capture.committed_bytes;
    std::uint64_t first_growth_committed = 0, last_used = 0;
    const std::vector<std::vector<std::int32_t>> trace{{3, 5}, {4096, 8192}, {20000, 16384}, {40000, 50000},
                                                       {65535, 65536}};
    for (const auto& lens : trace) {
      INFO("lengths " << lens[0] << "," << lens[1]);
      grow(p, lens, 7 + lens[0], Picks::last8);
      cuda::upload_lengths(d, p, dev.s);
      b = syms.bind(2, cfg, lens);
      GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));
      graph.replay(b, dev.s);
      GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
      const std::uint64_t used = used_bytes() - used0;
      const auto vs = graph.virtual_stats(&b);
      std::printf("  [%6d,%6d]  %12.2f %12.2f %12.2f %14.2f\n", lens[0], lens[1], vs.exact_need_bytes / 1048576.0,
                  vs.granule_need_bytes / 1048576.0, vs.committed_bytes / 1048576.0, used / 1048576.0);
      CHECK(vs.committed_bytes >= prev);
      CHECK(vs.committed_bytes >= vs.granule_need_bytes);
      // The trace only grows, so no shrink is needed: the ragged kv need is one prefix starting on a
      // granule boundary (ceil(need / G) granules), the static workspaces share granules.
      INFO("committed " << vs.committed_bytes << " exact " << vs.exact_need_bytes << " target " << target(vs));
      CHECK(vs.committed_bytes <= target(vs));
      // Device memory follows the chunks created (page tables may add a little).
      const std::uint64_t chunk_bytes = (vm->stats().chunks_created - created0) * G;
      CHECK(used + (8ull << 20) >= chunk_bytes);
      CHECK(used <= chunk_bytes * bytes_per_mapped_byte() + (8ull << 20));
      if (lens[0] == 4096) first_growth_committed = vs.committed_bytes;
      last_used = used;
      prev = vs.committed_bytes;
      // Bit for bit against eager at every length.
      gd.run(dev.s, d, b, oe);
      const auto hg = download(og, n_out, dev.s);
      const auto he = download(oe, n_out, dev.s);
      CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);
    }
    if (ratio == 4) {
      CHECK(prev > at_capture.committed_bytes + 8 * G);  // grew with the lengths ...
      CHECK(first_growth_committed < prev);              // ... step by step
      CHECK(last_used > used_capture + 8 * G);           // and so did the device memory in use
    }
    CHECK(prev <= at_capture.reserved_bytes + 2 * G);
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
}

TEST_CASE("VMM: exact-at-capture in virtual mode is refused by the guard before anything is mapped", "[ds4][vmm]") {
  Device dev;
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  Arena arena(backend, ArenaOptions{.report_findings = false, .virtual_memory = vm});
  arena.reserve(64ull << 20, dev.s);
  const LayerConfig cfg = config(4, 512);
  DecodeProblem p = make_problem(cfg, {3, 5}, 77, Picks::last8, 512);
  auto d = cuda::upload(p);
  const Ds4Symbols syms(cfg);
  GatherDecode exact(arena, cfg, syms, Sizing::exact);
  const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
  auto out_graph = cuda::device_alloc(n_out * 2);
  auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
  Bindings b = syms.bind(2, cfg, p.seq_lens);
  auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { exact.run(dev.s, d, bb, og); });
  REQUIRE(!graph.plan().findings().empty());
  grow(p, {15, 17}, 5, Picks::last8);
  cuda::upload_lengths(d, p, dev.s);
  b = syms.bind(2, cfg, {15, 17});
  GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0x7F, n_out * 2, dev.s));
  const auto before = download(og, n_out, dev.s);
  const auto committed = arena.committed_bytes();
  CHECK_THROWS_AS(graph.replay(b, dev.s), guard_failure);
  CHECK(download(og, n_out, dev.s) == before);
  CHECK(arena.committed_bytes() == committed);
}

TEST_CASE("VMM: debug mode (canaries, NVTX registration) with virtual growth: grow, shrink, regrow, no findings",
          "[ds4][vmm][debug]") {
  // Debug mode on the CUDA backend registers the plain eager slabs as NVTX heaps and their workspaces
  // as regions (the family's virtual range is left out: compute-sanitizer rejects a heap over a
  // piecewise-mapped reservation), puts a 256-byte guard behind each workspace (mapped with it), fills
  // it before replays and checks it after every replay. Run under compute-sanitizer memcheck too: an
  // NVTX call it rejects counts as an error there.
  constexpr int kMaxLen = 512;
  debug::clear_findings();
  Device dev;
  // Plain (cudaMalloc'd) eager slabs: debug mode registers NVTX heaps only where compute-sanitizer
  // accepts them (not on stream-ordered pool memory, not on virtual reservations).
  CudaBackend backend(CudaBackendOptions{.plain_allocations = true});
  REQUIRE(backend.nvtx_heaps_supported());
  auto vm = std::make_shared<CudaVirtualMemory>();
  Arena arena(backend, ArenaOptions{.report_findings = false,
                                    .debug = true,
                                    .canaries = true,
                                    .canary_check_every = 1,
                                    .nvtx = true,
                                    .virtual_memory = vm,
                                    .virtual_reserve_bytes = 1ull << 34});
  arena.reserve(64ull << 20, dev.s);  // eager steps
  for (int ratio : {4, 128}) {
    INFO("ratio " << ratio);
    const LayerConfig cfg = config(ratio, kMaxLen);
    DecodeProblem p = make_problem(cfg, {3, 5}, 2468 + ratio, Picks::last8, kMaxLen);
    auto d = cuda::upload(p);
    const Ds4Symbols syms(cfg);
    GatherDecode gd(arena, cfg, syms, Sizing::safe);
    const std::size_t n_out = std::size_t(2) * cfg.heads * kHeadDim;
    auto out_graph = cuda::device_alloc(n_out * 2);
    auto out_eager = cuda::device_alloc(n_out * 2);
    auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
    auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
    Bindings b = syms.bind(2, cfg, p.seq_lens);
    auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { gd.run(dev.s, d, bb, og); });
    REQUIRE(graph.virtual_stats().virtual_mode);
    CHECK(graph.plan().findings().empty());
    const std::vector<std::vector<std::int32_t>> trace{{15, 17}, {255, 257}, {511, 512}, {20, 30}, {511, 512}};
    for (std::size_t k = 0; k < trace.size(); ++k) {
      const auto& lens = trace[k];
      INFO("step " << k << ": lengths " << lens[0] << "," << lens[1]);
      grow(p, lens, 31 + lens[0], Picks::last8);
      cuda::upload_lengths(d, p, dev.s);
      b = syms.bind(2, cfg, lens);
      if (k == 3) arena.shrink(dev.s, b);  // unmap what {20, 30} does not need (guards are kept)
      if (k == 4) arena.shrink(dev.s);     // unmap everything: the regrow maps pooled chunks
      GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));
      graph.replay(b, dev.s);  // guards, commit, arm the canaries, launch, check the canaries
      gd.run(dev.s, d, b, oe);
      const auto hg = download(og, n_out, dev.s);
      const auto he = download(oe, n_out, dev.s);
      CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);  // replay == eager, bit for bit
      CHECK(debug::check_canaries(graph, dev.s).empty());
      const auto vs = graph.virtual_stats(&b);
      CHECK(vs.committed_bytes >= vs.granule_need_bytes);
    }
    GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
    GRAPHSAFE_CUDA(cudaGetLastError());
  }
  INFO(debug::report_text());
  CHECK(debug::findings().empty());  // no canary overwrite, no other finding
  debug::clear_findings();
}

TEST_CASE("VMM: a capture family (one graph per batch bucket) shares its address range and mapping",
          "[ds4][vmm]") {
  constexpr int kMaxLen = 2048;
  Device dev;
  CudaBackend backend;
  auto vm = std::make_shared<CudaVirtualMemory>();
  Arena arena(backend, ArenaOptions{.report_findings = false, .virtual_memory = vm,
                                    .virtual_reserve_bytes = 1ull << 34});
  arena.reserve(64ull << 20, dev.s);  // eager steps
  const LayerConfig cfg = config(4, kMaxLen);
  const Ds4Symbols syms(cfg);
  GatherDecode gd(arena, cfg, syms, Sizing::safe);
  CaptureFamily fam = arena.family("decode");
  struct Bucket {
    int batch;
    DecodeProblem p;
    cuda::DeviceProblem d;
    cuda::DeviceBytes out_graph, out_eager;
    std::optional<CapturedGraph> graph;
  };
  std::vector<std::unique_ptr<Bucket>> buckets;
  for (int batch : {4, 2}) {  // any order: the family's range holds the bound of every bucket
    std::vector<std::int32_t> lens;
    for (int i = 0; i < batch; ++i) lens.push_back(3 + 2 * i);
    DecodeProblem p = make_problem(cfg, lens, 97 + batch, Picks::last8, kMaxLen);
    auto d = cuda::upload(p);
    const std::size_t n_out = std::size_t(batch) * cfg.heads * kHeadDim;
    auto bk = std::make_unique<Bucket>(
        Bucket{batch, std::move(p), std::move(d), cuda::device_alloc(n_out * 2), cuda::device_alloc(n_out * 2), {}});
    Bucket& k = *bk;
    auto* og = reinterpret_cast<std::uint16_t*>(k.out_graph.get());
    Bindings b = syms.bind(batch, cfg, lens);
    k.graph.emplace(capture(arena, dev.s, b, [&, og](const Bindings& bb) { gd.run(dev.s, k.d, bb, og); },
                            CaptureOptions{.family = fam}));
    REQUIRE(k.graph->virtual_stats().virtual_mode);
    CHECK(k.graph->plan().findings().empty());
    buckets.push_back(std::move(bk));
  }
  CHECK(fam.graphs() == 2);
  // One address range, one mapping: the graphs' stats see the same family.
  CHECK(buckets[0]->graph->virtual_stats().va_bytes == buckets[1]->graph->virtual_stats().va_bytes);
  for (int len : {16, 200, 1024, 2047}) {
    for (auto& bk : buckets) {  // alternate buckets, as an engine does when the batch changes
      Bucket& k = *bk;
      INFO("batch " << k.batch << ", lengths from " << len);
      std::vector<std::int32_t> lens;
      for (int i = 0; i < k.batch; ++i) lens.push_back(std::min(kMaxLen, len + i));
      grow(k.p, lens, 5 + len, Picks::last8);
      cuda::upload_lengths(k.d, k.p, dev.s);
      const Bindings b = syms.bind(k.batch, cfg, lens);
      const std::size_t n_out = std::size_t(k.batch) * cfg.heads * kHeadDim;
      auto* og = reinterpret_cast<std::uint16_t*>(k.out_graph.get());
      auto* oe = reinterpret_cast<std::uint16_t*>(k.out_eager.get());
      GRAPHSAFE_CUDA(cudaMemsetAsync(og, 0xFF, n_out * 2, dev.s));
      k.graph->replay(b, dev.s);
      gd.run(dev.s, k.d, b, oe);
      const auto hg = download(og, n_out, dev.s);
      const auto he = download(oe, n_out, dev.s);
      CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);
      const auto vs = k.graph->virtual_stats(&b);
      CHECK(vs.committed_bytes >= vs.granule_need_bytes);
      CHECK(vs.committed_bytes == arena.committed_bytes());  // the family's one mapping
    }
  }
  // The family outlives one of its graphs: the other still replays (its mapping is kept).
  const auto committed = arena.committed_bytes();
  buckets[0]->graph.reset();
  CHECK(fam.graphs() == 1);
  CHECK(arena.committed_bytes() == committed);
  Bucket& k = *buckets[1];
  const Bindings b = syms.bind(k.batch, cfg, k.p.seq_lens);
  k.graph->replay(b, dev.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
  GRAPHSAFE_CUDA(cudaGetLastError());
  buckets[1]->graph.reset();  // the family's last graph: its chunks go back to the pool
  CHECK(arena.committed_bytes() == 0);
}
