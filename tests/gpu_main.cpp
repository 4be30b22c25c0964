// Entry point of every GPU test executable: skip (exit 77, CTest "Skipped") with the reason when the
// machine has no CUDA device, so CI machines without a GPU stay green and say why; a device the runtime
// cannot use (driver or runtime error) fails (support/cuda_device.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/cuda_device.hpp"

int main(int argc, char* argv[]) {
  if (const int rc = graphsafe::testing::gpu_test_skip_or_fail(argv[0]); rc >= 0) return rc;
  return Catch::Session().run(argc, argv);
}
