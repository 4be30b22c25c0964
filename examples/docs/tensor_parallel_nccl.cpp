// An all-gather inside a captured graph on arena memory registered with NCCL (one rank per GPU of
// this process; one here). Exits 77 without a GPU.
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/nccl.hpp>

#include <cstdio>
#include <vector>

using namespace graphsafe;

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77;
  nccl::LocalComms comms(1);  // ncclGetUniqueId + ncclCommInitRank(nranks = 1)
  const ncclComm_t comm = comms[0];
  const int world = comms.size();
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  {
    auto vm = std::make_shared<CudaVirtualMemory>(CudaVirtualMemoryOptions{.shareable = true});
    auto reg = nccl::attach_nccl(*vm, comm);  // before the memory serves an arena
    CudaBackend backend;
    ArenaOptions options;
    options.virtual_memory = vm;
    options.report_findings = false;  // the bucket's frozen sizes are intended: its guard refuses more
    Arena arena(backend, options);
    const Symbol rows = Symbol::dynamic("rows", 1 << 20);
    const std::int64_t hidden = 4096, bucket_rows = 512;
    const StaticQueryBound bucket{Extent(bucket_rows) * hidden}, bucket_all{Extent(bucket_rows) * (hidden * world)};
    // A captured collective's count is fixed: it covers the whole bucket, so map all of it at capture.
    const Footprint whole = Footprint::prefix(Extent(bucket_rows) * hidden);
    const Footprint whole_all = Footprint::prefix(Extent(bucket_rows) * (hidden * world));
    float* host = nullptr;  // pinned: a captured copy reads it at every replay
    cudaMallocHost(&host, bucket_rows * hidden * 4);
    float* part_at = nullptr;
    float* full_at = nullptr;
    auto step = [&](const Bindings& b) {
      auto part = arena.request(s, "tp.part", Extent(rows) * hidden, 4, bucket, b, whole);
      auto full = arena.request(s, "tp.full", Extent(rows) * (hidden * world), 4, bucket_all, b, whole_all);
      cudaMemcpyAsync(part.data(), host, part.bytes(), cudaMemcpyHostToDevice, s);  // "the kernels"
      nccl::all_gather(part, full, ncclFloat32, comm, s);  // a node of the graph
      part_at = part.as<float>();
      full_at = full.as<float>();
    };
    Bindings b;
    b.set(rows, 100);
    CaptureOptions co;
    co.family = arena.family("tp");
    auto warm = capture(arena, s, b, step, co);  // maps the family's chunks; registration deferred
    reg->flush();                                // registered here, outside any capture
    auto graph = capture(arena, s, b, step, co);  // collectives captured on registered chunks
    for (std::int64_t i = 0; i < bucket_rows * hidden; ++i) host[i] = static_cast<float>(i % 977);
    b.set(rows, 400);
    graph.replay(b, s);  // guards: 400 rows fit the 512-row bucket
    std::vector<float> back(400 * hidden);
    cudaMemcpyAsync(back.data(), full_at, back.size() * 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    bool same = true;
    for (std::size_t i = 0; i < back.size(); ++i) same = same && back[i] == host[i];
    const auto st = reg->stats();
    std::printf("all-gather of 400 rows in the graph: %s; %llu chunk registrations, %llu during capture\n",
                same ? "correct" : "WRONG", static_cast<unsigned long long>(st.registrations),
                static_cast<unsigned long long>(st.during_capture));
    b.set(rows, 513);
    try {
      graph.replay(b, s);
    } catch (const guard_failure&) {
      std::printf("513 rows: refused before launch\n");
    }
    cudaFreeHost(host);
    if (!same || st.during_capture != 0) return 1;
  }
  cudaStreamDestroy(s);
  return 0;
}
