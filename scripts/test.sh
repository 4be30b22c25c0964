#!/usr/bin/env bash
# Install what is missing (as root, with apt-get), configure build/, build with all cores, run ctest.
# GPU tests report "Skipped" on a machine without a CUDA device.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

gs_install_missing
gs_find_cuda

jobs="$(gs_jobs)"
# GRAPHSAFE_TEST_NCCL=1 (CI sets it): NCCL from PyPI's nvidia-nccl-cu13 wheel in a venv, so
# graphsafe::nccl, its tests (the GPU ones skip without a GPU) and nccl_bench are built too.
nccl_args=()
if [[ "${GRAPHSAFE_TEST_NCCL:-0}" == 1 ]]; then
  python3 -m venv build/nccl-env
  build/nccl-env/bin/pip install --quiet nvidia-nccl-cu13
  nccl_root="$(build/nccl-env/bin/python -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')"
  nccl_args=(-DGRAPHSAFE_NCCL=ON "-DGRAPHSAFE_NCCL_ROOT=$nccl_root")
fi
gs_configure build "${nccl_args[@]}"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --no-tests=error

# The Python package (python/, docs/python.md): built by pip as a user builds it, in a venv, then its
# tests (the torch/CUDA ones skip, saying why, without torch or a GPU).
python3 -m venv build/pyenv
build/pyenv/bin/pip install --quiet nanobind scikit-build-core numpy pytest
build/pyenv/bin/pip install --quiet --no-build-isolation -C build-dir=build/python-wheel .
build/pyenv/bin/python -m pytest -q -rs python/tests
