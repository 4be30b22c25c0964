// Entry point of every GPU test executable: skip (exit 77, CTest "Skipped") with the reason when no
// CUDA device can be used, so CI machines without a GPU stay green and say why.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cstdio>

int main(int argc, char* argv[]) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, count=%d). "
                "GPU tests run on a machine with an NVIDIA GPU and driver.\n",
                err == cudaSuccess ? "ok" : cudaGetErrorString(err), count);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
