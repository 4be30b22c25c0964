// NCCL inside captured graphs on registered arena memory, with the ranks this machine has (one
// GPU: one rank, ncclGetUniqueId + ncclCommInitRank with nranks = 1).
//   - collectives: all-gather and all-reduce over arena workspaces inside graphs of two buckets of
//     rows; no registration call is made while the stream captures (checked with
//     cudaStreamIsCapturing at every call), each mapped chunk is registered once, the larger
//     bucket's growth registers only its new chunks and replays register nothing, a replay equals
//     the same collectives run eagerly on cudaMalloc buffers (bit for bit) and the values the fill
//     kernel wrote (computed on the host) as the rows change within the bucket, and the plan's
//     guard refuses the replay past it before launch.
//   - tensor-parallel DS4 decode: the attention heads split by rank (rank r attends its H / world
//     heads), the per-rank outputs all-gathered inside the graph and put back in head order; the
//     result equals the single-GPU attention over all heads bit for bit, and replays equal eager
//     as the sequences grow.
#include <catch2/catch.hpp>

#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/nccl.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "../support/ds4_test_support.hpp"
#include "../support/tp_attention.hpp"

using namespace graphsafe;
namespace gn = graphsafe::nccl;

namespace {

__global__ void fill(float* x, const std::int64_t* n_dev, std::int64_t row, std::uint32_t seed) {
  const std::int64_t n = *n_dev * row;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    x[i] = static_cast<float>((i * 2654435761u + seed) % 1000003u) * 0.5f;
}
float fill_value(std::int64_t i, std::uint32_t seed) {
  return static_cast<float>((static_cast<std::uint64_t>(i) * 2654435761u + seed) % 1000003u) * 0.5f;
}

template <class T>
std::vector<T> download(const void* d, std::size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  return h;
}

constexpr std::int64_t kRow = 1024;      // floats per row
constexpr std::int64_t kMaxRows = 2048;  // capacity: 8 MiB per rank's send buffer

struct Collectives {
  void* send = nullptr;
  void* reduced = nullptr;
  void* gathered = nullptr;
};

}  // namespace

TEST_CASE("nccl: all-gather and all-reduce in a graph on registered arena workspaces", "[nccl][gpu]") {
  for (const gn::Registration kind : {gn::Registration::local, gn::Registration::automatic}) {
    INFO("registration " << (kind == gn::Registration::local ? "local" : "automatic"));
    ds4::test::Device dev;
    gn::LocalComms comms(1);
    const ncclComm_t comm = comms[0];
    const int world = comms.size();
    const tp::CheckedRegisteredMemory mem(comm, kind, dev.s);
    const auto& vm = mem.vm;
    const auto& reg = mem.registrar;
    const auto calls = mem.calls;
    const auto while_capturing = mem.while_capturing;
    const std::string& kind_name = mem.kind_name;
    {
      CudaBackend backend;
      ArenaOptions ao = mem.arena_options(1ull << 30);
      ao.report_findings = false;  // the buckets' bounds are reported as frozen sizes: the guards are the point
      Arena arena(backend, ao);
      // The engine's bound on tokens is far above a graph's bucket, which the policy reserves:
      // the plan's guard, not the symbol, refuses more.
      const Symbol rows = Symbol::dynamic("tokens", 1 << 20);
      auto n_dev = ds4::cuda::device_alloc(8);
      Collectives at;
      // One graph per bucket of rows. A captured collective's count is fixed: it covers the whole
      // bucket, so the footprint is the whole reservation (mapped -- and registered -- at capture).
      auto step_for = [&](std::int64_t bucket) {
        return [&, bucket](const Bindings& bb) {
          const StaticQueryBound one{Extent(bucket) * kRow}, all{Extent(bucket) * (kRow * world)};
          const Footprint one_fp = Footprint::prefix(Extent(bucket) * kRow);
          const Footprint all_fp = Footprint::prefix(Extent(bucket) * (kRow * world));
          auto send = arena.request(dev.s, "tp.send", Extent(rows) * kRow, 4, one, bb, one_fp);
          auto reduced = arena.request(dev.s, "tp.reduced", Extent(rows) * kRow, 4, one, bb, one_fp);
          auto gathered = arena.request(dev.s, "tp.gathered", Extent(rows) * (kRow * world), 4, all, bb, all_fp);
          fill<<<264, 256, 0, dev.s>>>(send.as<float>(), reinterpret_cast<std::int64_t*>(n_dev.get()), kRow, 7);
          GRAPHSAFE_CUDA(cudaGetLastError());
          gn::all_reduce(send, reduced, ncclFloat32, ncclSum, comm, dev.s);
          gn::all_gather(send, gathered, ncclFloat32, comm, dev.s);
          at = {send.data(), reduced.data(), gathered.data()};
        };
      };
      auto bind = [&](std::int64_t n) {
        Bindings b;
        b.set(rows, n);
        GRAPHSAFE_CUDA(cudaMemcpyAsync(n_dev.get(), &n, 8, cudaMemcpyHostToDevice, dev.s));
        GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));
        return b;
      };
      // Eager twins on cudaMalloc buffers (unregistered), with the count the bindings need; one
      // eager call first sets up NCCL's connections outside any capture, as engines warm up.
      auto e_send = ds4::cuda::device_alloc(kMaxRows * kRow * 4);
      auto e_red = ds4::cuda::device_alloc(kMaxRows * kRow * 4);
      auto e_gat = ds4::cuda::device_alloc(kMaxRows * kRow * 4 * world);
      gn::check(ncclAllReduce(e_send.get(), e_red.get(), kRow, ncclFloat32, ncclSum, comm, dev.s), "ncclAllReduce");
      gn::check(ncclAllGather(e_send.get(), e_gat.get(), kRow, ncclFloat32, comm, dev.s), "ncclAllGather");
      GRAPHSAFE_CUDA(cudaStreamSynchronize(dev.s));

      constexpr std::int64_t kSmall = kMaxRows / 4;
      CaptureOptions co;
      co.family = arena.family("tp");
      // The small bucket maps its chunks while capturing: deferred, registered by flush().
      auto first_small = capture(arena, dev.s, bind(kSmall), step_for(kSmall), co);
      CHECK(reg->stats().pending > 0);
      CHECK(reg->flush() > 0);
      CHECK(reg->stats().pending == 0);
      CHECK(reg->stats().live == vm->stats().chunks_mapped);  // every mapped chunk, once
      CHECK(*calls == vm->stats().chunks_mapped);
      // The large bucket grows the family's range behind the same addresses: only its new chunks
      // are registered.
      const auto mapped_small = vm->stats().chunks_mapped;
      const auto calls_small = *calls;
      auto first_large = capture(arena, dev.s, bind(kMaxRows), step_for(kMaxRows), co);
      reg->flush();
      CHECK(vm->stats().chunks_mapped > mapped_small);
      CHECK(*calls - calls_small == vm->stats().chunks_mapped - mapped_small);
      CHECK(reg->stats().live == vm->stats().chunks_mapped);
      // Captured again, the buckets find every chunk mapped and registered before their
      // collectives are captured: nothing is deferred, nothing registered.
      const auto calls_before = *calls;
      auto small = capture(arena, dev.s, bind(kSmall), step_for(kSmall), co);
      const Collectives at_small = at;
      auto large = capture(arena, dev.s, bind(kMaxRows), step_for(kMaxRows), co);
      const Collectives at_large = at;
      CHECK(reg->stats().pending == 0);
      CHECK(*calls == calls_before);
      CHECK(reg->registered(at_large.gathered, kMaxRows * kRow * world * 4));
      CHECK(reg->registered(at_large.send, kMaxRows * kRow * 4));
      CHECK(reg->registered(at_small.reduced, kSmall * kRow * 4));
      CHECK(small.plan().guard_count() > 0);

      for (const std::int64_t n : {64, 1, 512, 700, 2048, 300}) {
        INFO("rows " << n << ", " << kind_name);
        CapturedGraph& g = n <= kSmall ? small : large;
        const Collectives& where = n <= kSmall ? at_small : at_large;
        const auto mapped_before = vm->stats().chunks_mapped;
        const auto calls_at = *calls;
        g.replay(bind(n), dev.s);
        CHECK(vm->stats().chunks_mapped == mapped_before);  // the buckets' chunks were all mapped
        CHECK(*calls == calls_at);                           // so a replay registers nothing
        const std::size_t count = static_cast<std::size_t>(n * kRow);
        // A rank's block of the gather is the whole bucket (the captured count).
        const std::size_t block = static_cast<std::size_t>((n <= kSmall ? kSmall : kMaxRows) * kRow);
        const auto g_red = download<float>(where.reduced, count, dev.s);
        const auto g_gat = download<float>(where.gathered, block * world, dev.s);
        fill<<<264, 256, 0, dev.s>>>(static_cast<float*>(static_cast<void*>(e_send.get())),
                                     reinterpret_cast<std::int64_t*>(n_dev.get()), kRow, 7);
        gn::check(ncclAllReduce(e_send.get(), e_red.get(), count, ncclFloat32, ncclSum, comm, dev.s), "ncclAllReduce");
        gn::check(ncclAllGather(e_send.get(), e_gat.get(), count, ncclFloat32, comm, dev.s), "ncclAllGather");
        const auto e_r = download<float>(e_red.get(), count, dev.s);
        const auto e_g = download<float>(e_gat.get(), count * world, dev.s);
        CHECK(std::memcmp(g_red.data(), e_r.data(), count * 4) == 0);
        for (int r = 0; r < world; ++r)
          CHECK(std::memcmp(g_gat.data() + r * block, e_g.data() + r * count, count * 4) == 0);
        // Independent of NCCL: every rank filled the same values, so the sum is world times each
        // and every rank's block of the gather holds them.
        std::size_t bad = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const float v = fill_value(static_cast<std::int64_t>(i), 7);
          if (g_red[i] != v * world) ++bad;
          for (int r = 0; r < world; ++r)
            if (g_gat[r * block + i] != v) ++bad;
        }
        CHECK(bad == 0);
      }
      // Past a bucket: its guard refuses before launch; nothing is mapped or registered.
      for (auto [g, over] : {std::pair<CapturedGraph*, std::int64_t>{&small, kSmall + 1}, {&large, kMaxRows + 1}}) {
        const auto calls_at = *calls;
        const auto mapped_at = vm->stats().chunks_mapped;
        try {
          g->replay(bind(over), dev.s);
          FAIL("a replay past the bucket of " << over - 1 << " rows was not refused");
        } catch (const guard_failure& e) {
          CHECK_THAT(e.what(), Catch::Contains("replay refused before launch") && Catch::Contains("'tp."));
        }
        CHECK(*calls == calls_at);
        CHECK(vm->stats().chunks_mapped == mapped_at);
      }
      CHECK(*while_capturing == 0);
      CHECK(reg->stats().during_capture == 0);
      CHECK(gn::ChunkRegistrar::process_live() == reg->stats().live);
      std::printf("nccl (%s, %d rank): %llu registrations for %llu mapped chunks of %llu bytes, %llu during capture\n",
                  kind_name.c_str(), world, static_cast<unsigned long long>(*calls),
                  static_cast<unsigned long long>(vm->stats().chunks_mapped),
                  static_cast<unsigned long long>(vm->granularity()), static_cast<unsigned long long>(*while_capturing));
    }
    // The arena is gone: its families unmapped every chunk, each deregistered first.
    CHECK(reg->stats().live == 0);
    CHECK(reg->stats().deregistrations == reg->stats().registrations);
    CHECK(reg->stats().deregister_failures == 0);
    vm->set_listener(nullptr);
  }
}

TEST_CASE("nccl: tensor-parallel DS4 attention equals the single-GPU layer bit for bit", "[nccl][gpu][ds4]") {
  ds4::test::Device dev;
  gn::LocalComms comms(1);  // the ranks of this process; one GPU here
  const int world = comms.size(), rank = 0;
  ds4::LayerConfig full;
  full.ratio = 4;
  full.window = 128;
  full.topk = 512;
  full.heads = 64 * world;
  full.max_model_len = 4096;
  ds4::DecodeProblem p = ds4::make_problem(full, {3, 5, 130}, 2026, ds4::Picks::random, 4096);
  auto d = ds4::cuda::upload(p);
  const ds4::Ds4Symbols syms(full);
  const std::size_t n_out = static_cast<std::size_t>(p.batch) * full.heads * ds4::kHeadDim;
  auto out_graph = ds4::cuda::device_alloc(n_out * 2), out_eager = ds4::cuda::device_alloc(n_out * 2),
       out_single = ds4::cuda::device_alloc(n_out * 2);
  auto u16 = [](ds4::cuda::DeviceBytes& b) { return static_cast<std::uint16_t*>(static_cast<void*>(b.get())); };

  // The single-GPU layer: every head in one call, on an ordinary arena.
  CudaBackend backend;
  Arena single_arena(backend);
  single_arena.reserve(64ull << 20, dev.s);
  const ds4::PagedAttention single({full, 1});
  // The rank's arena: virtual memory registered with NCCL.
  auto vm = std::make_shared<CudaVirtualMemory>(CudaVirtualMemoryOptions{.shareable = true});
  auto reg = gn::attach_nccl(*vm, comms[rank], {}, gn::Registration::local);
  {
    ArenaOptions ao;
    ao.virtual_memory = vm;
    ao.virtual_reserve_bytes = 1ull << 30;
    Arena arena(backend, ao);
    const tp::TpAttention layer(full, rank, world);
    CHECK(layer.heads_per_rank() == full.heads / world);
    auto step = [&](Arena& ar, const Bindings& b, std::uint16_t* out) {
      layer.run(ar, dev.s, syms, b, ds4::arguments_of(d, out), out, comms[rank]);
    };
    auto single_step = [&](const Bindings& b) {
      const ds4::AttentionWorkspaces w = single.request(single_arena, dev.s, syms, b);
      single.run(ds4::arguments_of(d, u16(out_single)), w, dev.s);
    };
    Bindings b = syms.bind(p.batch, full, p.seq_lens);
    step(single_arena, b, u16(out_eager));  // warm: kernel attributes, NCCL's connections, outside capture
    CaptureOptions co;
    co.family = arena.family("tp.decode");
    auto warm = capture(arena, dev.s, b, [&](const Bindings& bb) { step(arena, bb, u16(out_graph)); }, co);
    reg->flush();
    auto graph = capture(arena, dev.s, b, [&](const Bindings& bb) { step(arena, bb, u16(out_graph)); }, co);
    CHECK(reg->stats().pending == 0);
    CHECK(reg->stats().during_capture == 0);
    for (const auto& L : std::vector<std::vector<std::int32_t>>{{4, 6, 131}, {17, 300, 2049}, {4095, 301, 4096}}) {
      INFO("lengths " << L[0] << "," << L[1] << "," << L[2]);
      ds4::grow(p, L, 5);
      ds4::cuda::upload_lengths(d, p, dev.s);
      b = syms.bind(p.batch, full, p.seq_lens);
      graph.replay(b, dev.s);
      step(single_arena, b, u16(out_eager));  // the same rank step, eager
      single_step(b);
      const auto hg = ds4::test::download(u16(out_graph), n_out, dev.s);
      const auto he = ds4::test::download(u16(out_eager), n_out, dev.s);
      const auto hs = ds4::test::download(u16(out_single), n_out, dev.s);
      CHECK(std::memcmp(hg.data(), he.data(), n_out * 2) == 0);  // replay == eager
      CHECK(std::memcmp(hg.data(), hs.data(), n_out * 2) == 0);  // tensor-parallel == single GPU
      std::vector<float> want(n_out);
      ds4::ref::sparse_attention(p, want.data());
      CHECK(ds4::test::rel_error(hg, want) < 1e-2);  // and both match the CPU reference
    }
    CHECK(reg->stats().live == vm->stats().chunks_mapped);
  }
  vm->set_listener(nullptr);
}
