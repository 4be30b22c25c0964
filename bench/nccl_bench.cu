// NCCL inside replayed graphs on registered arena memory, with the ranks this process can drive (one
// rank per GPU through graphsafe::nccl::LocalComms; a one-GPU machine runs one rank, where NCCL's
// collectives are local copies and registration changes no transport -- the records say so in their
// machine field, e.g. "NVIDIA H200 (1 rank)").
//
//   nccl.registrations_during_capture       registration calls made while the stream captured (must be 0)
//   nccl.registrations                      registration calls (one per chunk) vs chunk maps; a chunk
//                                           mapped while capturing a graph that dies before flush()
//                                           (here: the copy-in graphs) is never registered
//   nccl.<op>.<size>.registered_vs_copy_in  us per collective in a replayed graph on registered arena
//                                           workspaces; baseline: the same graph copying the arena
//                                           input into an unregistered cudaMalloc buffer first and
//                                           running the collective there; ratio = baseline / value
//   nccl.tp_decode.world<N>_vs_single       us per tensor-parallel DS4 attention step (heads split by
//                                           rank, all-gathered in the graph); baseline: the single-GPU
//                                           layer over all heads; ratio = baseline / value
//
//   build/bench/nccl_bench --json bench/results/nccl_bench.json
#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/nccl.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "../tests/support/tp_attention.hpp"
#include "bench_support.hpp"

using namespace graphsafe;
namespace gn = graphsafe::nccl;

namespace {

constexpr int kOpsPerGraph = 10;  // collectives per graph: one launch's overhead spread over them

// Median of `reps` timings of `replays` graph launches, in us per launch.
double time_graph(CapturedGraph& g, const Bindings& b, cudaStream_t s, int reps, int replays) {
  cudaEvent_t e0, e1;
  GRAPHSAFE_CUDA(cudaEventCreate(&e0));
  GRAPHSAFE_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) g.replay(b, s);
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    GRAPHSAFE_CUDA(cudaEventRecord(e0, s));
    for (int i = 0; i < replays; ++i) g.replay(b, s);
    GRAPHSAFE_CUDA(cudaEventRecord(e1, s));
    GRAPHSAFE_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    GRAPHSAFE_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1000.0 / replays);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 7, replays = 50;
  CLI::App app("nccl_bench: NCCL collectives in replayed graphs on registered arena memory", "nccl_bench");
  app.add_option("--json", json_path, "write the records to this file");
  app.add_option("--reps", reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  app.add_option("--replays", replays, "graph launches per repetition")->check(CLI::Range(1, 100000));
  if (const auto code = bench::parse_command_line(app, argc, argv, json_path)) return *code;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "nccl_bench: no CUDA device\n");
    return 77;
  }
  try {
    GRAPHSAFE_CUDA(cudaSetDevice(0));
    cudaDeviceProp prop{};
    GRAPHSAFE_CUDA(cudaGetDeviceProperties(&prop, 0));
    // One process drives one rank here: several ranks from one thread would need every capture
    // and collective grouped across devices, which this benchmark does not do.
    const int world = 1;
    gn::LocalComms comms(world);
    const ncclComm_t comm = comms[0];
    const std::string machine = std::string(prop.name) + " (" + std::to_string(world) + " rank)";
    std::printf("nccl_bench on %s, NCCL %d (headers %d)\n", machine.c_str(), gn::loaded_version(), NCCL_VERSION_CODE);
    cudaStream_t s;
    GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<bench::Record> rec;
    // The automatic choice (window registration where NCCL has it), unless registering one chunk
    // that way fails here: then ncclCommRegister, and the output says why.
    gn::Registration kind_used = gn::Registration::automatic;
    try {
      CudaVirtualMemory probe(CudaVirtualMemoryOptions{.shareable = true});
      const std::uint64_t g = probe.granularity();
      const std::uintptr_t va = probe.reserve(g);
      std::uint64_t chunk = 0;
      probe.map(va, 1, &chunk);
      auto calls = gn::nccl_registration(comm);
      try {
        calls->deregister(calls->register_range(reinterpret_cast<void*>(va), g));
      } catch (const std::exception& e) {
        std::printf("%s of one chunk failed (%s); using ncclCommRegister\n", calls->kind().c_str(), e.what());
        kind_used = gn::Registration::local;
      }
      probe.unmap(va, 1, &chunk);
      probe.unreserve(va, g);
    } catch (const std::exception& e) {
      std::printf("registration probe failed (%s); using ncclCommRegister\n", e.what());
      kind_used = gn::Registration::local;
    }
    {
      const tp::CheckedRegisteredMemory mem(comm, kind_used, s);
      const auto& vm = mem.vm;
      const auto& reg = mem.registrar;
      const auto calls = mem.calls, during = mem.while_capturing;
      const std::string& kind = mem.kind_name;
      CudaBackend backend;
      ArenaOptions ao = mem.arena_options(4ull << 30);
      ao.report_findings = false;  // each graph's size is frozen on purpose (one per size)
      Arena arena(backend, ao);
      std::printf("registration: %s, chunks of %llu bytes\n", kind.c_str(),
                  static_cast<unsigned long long>(vm->granularity()));
      const Symbol bytes_sym = Symbol::dynamic("bytes", 1ll << 30);
      std::printf("%-12s %8s %14s %14s %8s\n", "op", "size", "registered us", "copy-in us", "ratio");
      for (const char* op : {"all_gather", "all_reduce"})
        for (const std::int64_t size : {512ll << 10, 1ll << 20, 2ll << 20, 4ll << 20, 8ll << 20}) {
          const bool gather = op[4] == 'g';
          const std::int64_t out_bytes = gather ? size * world : size;
          const StaticQueryBound in_b{Extent(size)}, out_b{Extent(out_bytes)};
          auto plain_in = ds4::cuda::device_alloc(size), plain_out = ds4::cuda::device_alloc(out_bytes);
          Bindings b;
          b.set(bytes_sym, size);
          auto step = [&](bool copy_in) {
            return [&, copy_in](const Bindings& bb) {
              auto in = arena.request(s, "nccl.in", Extent(bytes_sym), 1, in_b, bb);
              auto out = arena.request(s, "nccl.out", Extent(bytes_sym) * world, 1, out_b, bb);
              for (int k = 0; k < kOpsPerGraph; ++k) {
                if (copy_in) {
                  GRAPHSAFE_CUDA(cudaMemcpyAsync(plain_in.get(), in.data(), size, cudaMemcpyDeviceToDevice, s));
                  if (gather)
                    gn::check(ncclAllGather(plain_in.get(), plain_out.get(), size / 4, ncclFloat32, comm, s), "ncclAllGather");
                  else
                    gn::check(ncclAllReduce(plain_in.get(), plain_out.get(), size / 4, ncclFloat32, ncclSum, comm, s),
                              "ncclAllReduce");
                } else if (gather) {
                  gn::all_gather(in, out, ncclFloat32, comm, s);
                } else {
                  gn::all_reduce(in, out, ncclFloat32, ncclSum, comm, s);
                }
              }
            };
          };
          // Warm eagerly (NCCL's connections), then capture: once to map, flush, and again so the
          // collectives are captured on registered chunks.
          gn::check(ncclAllReduce(plain_in.get(), plain_out.get(), size / 4, ncclFloat32, ncclSum, comm, s), "warm");
          GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
          CaptureOptions co;
          co.family = arena.family(std::string("nccl.") + op + "." + std::to_string(size));
          auto warm = capture(arena, s, b, step(false), co);
          reg->flush();
          auto registered = capture(arena, s, b, step(false), co);
          auto copy = capture(arena, s, b, step(true));
          const double t_reg = time_graph(registered, b, s, reps, replays) / kOpsPerGraph;
          const double t_copy = time_graph(copy, b, s, reps, replays) / kOpsPerGraph;
          const std::string label = size >= (1 << 20) ? std::to_string(size >> 20) + "MiB" : std::to_string(size >> 10) + "KiB";
          std::printf("%-12s %8s %14.2f %14.2f %8.2f\n", op, label.c_str(), t_reg, t_copy, t_copy / t_reg);
          rec.push_back({std::string("nccl.") + op + "." + label + ".registered_vs_copy_in", t_reg, "us",
                         std::string("nccl.") + op + "." + label + ".unregistered_copy_in", t_copy});
        }
      rec.push_back({"nccl.registrations_during_capture", static_cast<double>(*during), "calls"});
      // Every chunk map (none is an alias here) should have made exactly one registration.
      const double maps = static_cast<double>(vm->stats().map_calls);
      rec.push_back({"nccl.registrations", static_cast<double>(*calls), "calls", "nccl.chunk_maps", maps,
                     static_cast<double>(*calls) / std::max(1.0, maps)});
      std::printf("registrations: %llu calls for %llu chunk maps, %llu while capturing\n",
                  static_cast<unsigned long long>(*calls), static_cast<unsigned long long>(vm->stats().map_calls),
                  static_cast<unsigned long long>(*during));
    }
    {
      // The tensor-parallel DS4 attention step (B = 32 requests of 2K tokens) vs the single-GPU layer.
      ds4::LayerConfig full;
      full.heads = 64 * world;
      full.max_model_len = 65536;
      std::vector<std::int32_t> lens(32, 2048);
      ds4::DecodeProblem p = ds4::make_problem(full, lens, 11, ds4::Picks::random, 2048);
      auto d = ds4::cuda::upload(p);
      const ds4::Ds4Symbols syms(full);
      const std::size_t n_out = static_cast<std::size_t>(p.batch) * full.heads * ds4::kHeadDim;
      auto out_tp = ds4::cuda::device_alloc(n_out * 2), out_single = ds4::cuda::device_alloc(n_out * 2);
      auto u16 = [](ds4::cuda::DeviceBytes& x) { return static_cast<std::uint16_t*>(static_cast<void*>(x.get())); };
      auto vm = std::make_shared<CudaVirtualMemory>(CudaVirtualMemoryOptions{.shareable = true});
      auto reg = gn::attach_nccl(*vm, comm, {}, kind_used);
      CudaBackend backend;
      ArenaOptions ao;
      ao.virtual_memory = vm;
      ao.virtual_reserve_bytes = 4ull << 30;
      Arena arena(backend, ao), single_arena(backend);
      const tp::TpAttention layer(full, 0, world);
      const ds4::PagedAttention single({full, 1});
      const Bindings b = syms.bind(p.batch, full, p.seq_lens);
      auto tp_step = [&](const Bindings& bb) { layer.run(arena, s, syms, bb, ds4::arguments_of(d, u16(out_tp)), u16(out_tp), comm); };
      auto single_step = [&](const Bindings& bb) {
        const ds4::AttentionWorkspaces w = single.request(single_arena, s, syms, bb);
        single.run(ds4::arguments_of(d, u16(out_single)), w, s);
      };
      single_step(b);
      GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
      CaptureOptions co;
      co.family = arena.family("tp.decode");
      auto warm = capture(arena, s, b, tp_step, co);
      reg->flush();
      auto g_tp = capture(arena, s, b, tp_step, co);
      auto g_single = capture(single_arena, s, b, single_step);
      const double t_tp = time_graph(g_tp, b, s, reps, replays);
      const double t_single = time_graph(g_single, b, s, reps, replays);
      std::printf("DS4 C4 attention, B = 32, L = 2048: tensor-parallel (world %d) %.2f us, single GPU %.2f us\n", world,
                  t_tp, t_single);
      rec.push_back({"nccl.tp_decode.world" + std::to_string(world) + "_vs_single", t_tp, "us",
                     "nccl.tp_decode.single_gpu", t_single});
    }
    cudaStreamDestroy(s);
    if (!json_path.empty()) bench::write_records(json_path, rec, machine, bench::command_line(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
