#!/usr/bin/env bash
# Install what is missing (as root, with apt-get), configure build/, build with all cores, run ctest.
# GPU tests report "Skipped" on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

gs_install_missing
gs_find_cuda

jobs="$(gs_jobs)"
gs_configure build
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --no-tests=error
