#!/usr/bin/env bash
# Builds capture_time_bench against an earlier tree (the baseline of bench/results/capture_time_bench.json):
# that tree's library, Release, then this benchmark source compiled with GRAPHSAFE_CAPTURE_TIME_RAW_ONLY
# (it writes --raw only) and the flags CMake gives the benchmark here. From the repository root:
#
#   git worktree add /tmp/before ea4e734          # the allocator before in-capture reuse
#   bash bench/capture_time_before.sh /tmp/before  # -> /tmp/before/build/capture_time_bench
#   /tmp/before/build/capture_time_bench --reps 15 --raw before_reuse.txt
#   build/bench/capture_time_bench --reps 15 --before before_reuse.txt --json bench/results/capture_time_bench.json
#
# Knobs (environment): JOBS (16), CUDA_ARCH (90a), CMAKE_PREFIX_PATH (where nlohmann-json/Boost live).
set -euo pipefail
TREE=${1:?usage: capture_time_before.sh <earlier-tree>}
JOBS=${JOBS:-16}
CUDA_ARCH=${CUDA_ARCH:-90a}
SRC=$(cd "$(dirname "$0")" && pwd)/capture_time_bench.cu
cmake -S "$TREE" -B "$TREE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH-real" \
  -DGRAPHSAFE_BUILD_TESTS=OFF -DGRAPHSAFE_BUILD_BENCH=OFF -DGRAPHSAFE_BUILD_EXAMPLES=OFF -DGRAPHSAFE_BUILD_DS4=OFF \
  -DGRAPHSAFE_BUILD_CUPTI=OFF ${CMAKE_PREFIX_PATH:+-DCMAKE_PREFIX_PATH=$CMAKE_PREFIX_PATH} >/dev/null
cmake --build "$TREE/build" -j"$JOBS" --target graphsafe >/dev/null
nvcc -forward-unknown-to-host-compiler -I"$TREE/include" -I"$TREE/policies/include" -O3 -DNDEBUG \
  -DGRAPHSAFE_CAPTURE_TIME_RAW_ONLY --generate-code=arch=compute_$CUDA_ARCH,code=[sm_$CUDA_ARCH] -std=c++20 \
  -x cu -c "$SRC" -o "$TREE/build/capture_time_bench.o"
c++ -O3 -DNDEBUG "$TREE/build/capture_time_bench.o" -o "$TREE/build/capture_time_bench" "$TREE/build/libgraphsafe.a" \
  -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart_static -ldl -lrt -lpthread
echo "$TREE/build/capture_time_bench"
