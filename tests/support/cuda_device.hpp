// Whether a GPU test has a CUDA device to run on. A GPU test's main:
//
//   if (const int rc = graphsafe::testing::gpu_test_skip_or_fail("unsafe_catalogue"); rc >= 0) return rc;
//
// Skip (77, CTest "Skipped") only when no device is present: cudaErrorNoDevice, zero devices, or a
// runtime that finds no driver (cudaErrorInsufficientDriver / the toolkit's stub libcuda) on a machine
// whose kernel has no NVIDIA GPU (no /proc/driver/nvidia/gpus entry, no /dev/nvidia0). Any other error,
// or a missing/old driver where a GPU is present, fails (1) with the error printed: a broken driver
// must not read as a skipped, green test run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

namespace graphsafe::testing {

// An NVIDIA GPU the kernel knows of, whether or not a user-space driver is installed.
inline bool nvidia_gpu_present() {
  std::error_code ec;
  const std::filesystem::path gpus = "/proc/driver/nvidia/gpus";
  if (std::filesystem::is_directory(gpus, ec) && !std::filesystem::is_empty(gpus, ec)) return true;
  return std::filesystem::exists("/dev/nvidia0", ec);
}

// -1: a device is usable (run the tests). 77: no device (skip). 1: a device or driver error (fail).
inline int gpu_test_skip_or_fail(const char* program) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return -1;
  const bool no_driver = err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary;
  if ((err == cudaSuccess && count == 0) || err == cudaErrorNoDevice || (no_driver && !nvidia_gpu_present())) {
    std::printf("SKIPPED: %s: no CUDA device on this machine (cudaGetDeviceCount: %s). GPU tests run on a "
                "machine with an NVIDIA GPU and driver.\n",
                program, err == cudaSuccess ? "0 devices" : cudaGetErrorName(err));
    return 77;
  }
  std::fprintf(stderr, "%s: FAILED: the CUDA runtime cannot use this machine's GPU: cudaGetDeviceCount: %s (%s)%s\n",
               program, cudaGetErrorName(err), cudaGetErrorString(err),
               no_driver ? " -- an NVIDIA GPU is present (/proc/driver/nvidia or /dev/nvidia0) but the driver "
                           "is missing or older than the runtime" : "");
  return 1;
}

}  // namespace graphsafe::testing
