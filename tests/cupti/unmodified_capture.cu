// A program that knows nothing of graphsafe: captures a graph in relaxed mode and, unless --safe,
// cudaMallocs a buffer and copies a device value to the host inside the capture. Run it with
// CUDA_INJECTION64_PATH=libgraphsafe_cupti.so to see the tool work on an unmodified binary. Built
// twice: exporting its symbols (unmodified_capture) and as nvcc builds it, static runtime and
// nothing exported (unmodified_capture_plain).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "../support/cuda_device.hpp"  // header-only, CUDA runtime only: not graphsafe

__global__ void touch(int* p) { p[threadIdx.x] += 1; }

__attribute__((noinline)) int reads_a_device_value(const int* d) {
  int h = 0;
  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);  // stale value, frozen into the graph
  return h;
}

__attribute__((noinline)) void step_with_unsafe_calls(cudaStream_t s, int* d, bool safe) {
  if (!safe) {
    void* scratch = nullptr;
    cudaMalloc(&scratch, 1 << 20);  // not in the graph
    if (reads_a_device_value(d) < 0) return;
  }
  touch<<<1, 32, 0, s>>>(d);
}

int main(int argc, char** argv) {
  bool safe = false;
  for (int i = 1; i < argc; ++i) safe = safe || std::strcmp(argv[i], "--safe") == 0;
  if (const int rc = graphsafe::testing::gpu_test_skip_or_fail("unmodified_capture"); rc >= 0) return rc;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int* d = nullptr;
  cudaMalloc(&d, 32 * sizeof(int));
  cudaMemset(d, 0, 32 * sizeof(int));
  touch<<<1, 32, 0, s>>>(d);
  cudaStreamSynchronize(s);
  cudaGraph_t g = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  step_with_unsafe_calls(s, d, safe);
  if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) {
    cudaGraphExec_t e;
    if (cudaGraphInstantiate(&e, g, 0) == cudaSuccess) {
      cudaGraphLaunch(e, s);
      cudaStreamSynchronize(s);
      cudaGraphExecDestroy(e);
    }
    cudaGraphDestroy(g);
  }
  cudaGetLastError();
  cudaFree(d);
  cudaStreamDestroy(s);
  std::printf("done\n");
  return 0;
}
