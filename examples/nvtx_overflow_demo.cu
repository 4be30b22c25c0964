// nvtx_overflow_demo: the seed's overflow, in debug mode, for compute-sanitizer.
//
//   compute-sanitizer --tool memcheck ./nvtx_overflow_demo            (expect: Invalid __global__ write
//                                                                      in gather_kernel, inside the slab)
//   ./nvtx_overflow_demo --canaries                                   (without the sanitizer: the canary
//                                                                      check names workspace, graph, replay)
//
// The arena registers its slab with the NVTX Memory API as a sub-allocator heap and every workspace
// as a named region; the guard gap behind 'kv' is left unregistered. A graph captured with
// exact-at-capture sizes at lengths [3, 5] is replayed (guards bypassed) at [255, 257]: gather_kernel
// writes past 'kv' into the gap. Without NVTX, memcheck sees one big pool allocation and stays
// silent; with it, the write is out of every registered region. Canaries are off by default so that
// graphsafe's own fills/read-backs of the gap never show up in the sanitizer's report.
#include <graphsafe/debug.hpp>
#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "../tests/support/cuda_device.hpp"  // skip (77) only without a GPU

using namespace graphsafe;

namespace {
constexpr int kWindow = 4, kRatio = 4, kMaxLen = 512, kOutW = kMaxLen / kRatio + kWindow;

__global__ void gather_kernel(std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / kRatio, gb = L < kWindow ? L : kWindow;
  for (int c = threadIdx.x; c < n_c; c += blockDim.x) ws[b * M + c] = 1'000'000LL * (b + 1) + 500'000 + c;
  __syncthreads();
  for (int i = threadIdx.x; i < gb; i += blockDim.x) ws[b * M + N + i] = 1'000'000LL * (b + 1) + L - gb + i;
}

__global__ void attend_kernel(const std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens,
                              std::int64_t* out) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / kRatio, gb = L < kWindow ? L : kWindow;
  for (int c = threadIdx.x; c < n_c; c += blockDim.x) out[b * kOutW + c] = ws[b * M + c];
  for (int i = threadIdx.x; i < gb; i += blockDim.x) out[b * kOutW + n_c + i] = ws[b * M + N + i];
}
}  // namespace

int main(int argc, char** argv) {
  const bool canaries = argc > 1 && std::strcmp(argv[1], "--canaries") == 0;
  if (const int rc = graphsafe::testing::gpu_test_skip_or_fail("nvtx_overflow_demo"); rc >= 0) return rc;
  try {
    cudaStream_t s = nullptr;
    GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int* d_lens = nullptr;
    std::int64_t* d_out = nullptr;
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_lens), 2 * sizeof(int)));
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_out), 2 * kOutW * sizeof(std::int64_t)));
    {
      CudaBackend backend(CudaBackendOptions{.plain_allocations = true});  // NVTX heaps need cudaMalloc'd slabs
      ArenaOptions o;
      o.debug = true;         // NVTX registration, guard gaps, capture report
      o.canaries = canaries;  // off: leave the gap untouched for the sanitizer
      Arena arena(backend, o);
      arena.reserve(4 << 20, s);

      Symbol R = Symbol::fixed("requests"), W = Symbol::fixed("window");
      Symbol L = Symbol::batch("seq_lens", R, kMaxLen);
      const Extent n_c = max_over(L, [](const Extent& l) { return floor_div(l, kRatio); });
      const Extent g = max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });
      auto bind = [&](std::vector<int> lens) {
        Bindings b;
        b.set(R, 2).set(W, kWindow).set(L, std::span<const std::int32_t>(lens.data(), lens.size()));
        GRAPHSAFE_CUDA(cudaMemcpyAsync(d_lens, lens.data(), 2 * sizeof(int), cudaMemcpyHostToDevice, s));
        GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
        return b;
      };
      CaptureOptions co;
      co.family = arena.family("seed");
      auto graph = capture(
          arena, s, bind({3, 5}),
          [&](const Bindings& b) {
            const std::int64_t N = arena.dimension(s, "kv.compressed_rows", n_c, exact_at_capture, b);
            const std::int64_t G = arena.dimension(s, "kv.swa_rows", g, exact_at_capture, b);
            auto ws = arena.request(s, "kv", Extent(R) * (N + G), sizeof(std::int64_t), capacity_bound, b);
            gather_kernel<<<2, 128, 0, s>>>(ws.as<std::int64_t>(), N, N + G, d_lens);
            GRAPHSAFE_CUDA(cudaGetLastError());
            attend_kernel<<<2, 128, 0, s>>>(ws.as<std::int64_t>(), N, N + G, d_lens, d_out);
            GRAPHSAFE_CUDA(cudaGetLastError());
          },
          co);
      graph.replay(bind({3, 5}), s);  // in bounds
      GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
      bind({255, 257});
      std::printf("replaying the graph captured at [3, 5] with lengths [255, 257], guards bypassed\n");
      graph.replay_unguarded_for_testing(s);  // gather_kernel writes past 'kv'
      GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
      if (canaries) {
        const auto f = debug::check_canaries(graph, s);
        std::printf("canary check: %zu overwrite(s)%s\n", f.size(), f.empty() ? "" : (" -- " + f[0].message).c_str());
        if (f.empty()) return 1;
      } else {
        std::printf("done; under compute-sanitizer --tool memcheck the writes past 'kv' are reported\n");
      }
    }
    GRAPHSAFE_CUDA(cudaFree(d_lens));
    GRAPHSAFE_CUDA(cudaFree(d_out));
    GRAPHSAFE_CUDA(cudaStreamDestroy(s));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvtx_overflow_demo: %s\n", e.what());
    return 1;
  }
  return 0;
}
