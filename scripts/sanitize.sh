#!/usr/bin/env bash
# Sanitizer and fuzz pass over the CPU side. Every stage either runs or fails; none is skipped silently:
#   1. CPU tests (ctest -L cpu, the DS4 CPU reference included) built with ASan + UBSan (gcc) -> build-asan/
#   2. every test tagged [concurrency] (the tests that start threads) built with TSan         -> build-tsan/
#   3. the libFuzzer harness: corpus replay, then $FUZZ_SECONDS (default 60) of fuzzing; needs a clang
#      with <source_location> (clang >= 15; Debian bookworm: clang-16 libclang-rt-16-dev)    -> build-fuzz/
# GPU tests and the DS4 CUDA kernels are not built here (no device needed). Env: JOBS, FUZZ_SECONDS,
# SANITIZE_SKIP_FUZZ=1 (developers without clang; CI refuses it), GRAPHSAFE_SOAK_OPS (the soak's op count,
# >= 10^5; 10^6 by default, ~5 s under ASan), SANITIZE_BUILD_ROOT (where build-asan/ build-tsan/
# build-fuzz/ go; default: the repository root).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
gs_find_cuda

jobs="${JOBS:-$(gs_jobs)}"
fuzz_seconds="${FUZZ_SECONDS:-60}"
root="${SANITIZE_BUILD_ROOT:-.}"
asan_dir="$root/build-asan" tsan_dir="$root/build-tsan" fuzz_dir="$root/build-fuzz"
# DS4 on for its CPU reference and tests; only the targets named below are built, never its CUDA kernels.
common=(-DGRAPHSAFE_BUILD_DS4=ON -DGRAPHSAFE_BUILD_BENCH=OFF -DGRAPHSAFE_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
cpu_targets() {  # the CPU test executables of a configured build dir (tests/CMakeLists.txt: <dir>/tests/cpu)
  ninja -C "$1" -t targets all | sed -n 's|^tests/cpu/\(test_[a-z0-9_]*\): CXX_EXECUTABLE_LINKER.*|\1|p' | sort -u
}
cpu_sources() {  # their sources: tests/<component>/<executable>.cpp (or tests/bench/)
  local t
  for t in $(cpu_targets "$1"); do find tests -name "$t.cpp" -not -path 'tests/fuzz/*'; done
}
die() { echo "sanitize.sh: error: $*" >&2; exit 1; }

# Every CPU test case that starts threads must be tagged [concurrency] (its CTest label), or TSan never
# runs it. Checked per test case; threads started by helpers above the first test case need a tagged
# test case in that file. (POSIX awk: CI's may be mawk.)
untagged_threads() {
  awk '
    /^(TEST_CASE|TEST_CASE_METHOD|SCENARIO)\(/ {
      if (uses && head != "" && !tagged) print FILENAME ": " head
      if (uses && head == "") helpers = 1
      head = $0; head_nr = NR; tagged = 0; uses = 0
    }
    /\[concurrency\]/ { file_tagged = 1; if (head != "" && NR - head_nr <= 2) tagged = 1 }
    /std::(jthread|thread|async)[^a-zA-Z_]/ { uses = 1 }
    END {
      if (uses && head != "" && !tagged) print FILENAME ": " head
      if ((helpers || (uses && head == "")) && !file_tagged) print FILENAME ": starts threads, no [concurrency] test case"
    }' "$1"
}
check_threads_tagged() {  # $1: a configured build dir
  local untagged f
  untagged="$(for f in $(cpu_sources "$1"); do untagged_threads "$f"; done)"
  [[ -z "$untagged" ]] || die "these CPU tests start threads but are not tagged [concurrency], so TSan would not run them:
$untagged"
}
tsan_targets() {  # the CPU test executables with a [concurrency] test case
  # shellcheck disable=SC2046
  grep -l '\[concurrency\]' $(cpu_sources "$1") | sed 's|.*/\(.*\)\.cpp$|\1|'
}

# The fuzz stage's compiler, found first so that a machine without one fails before the long builds.
clangxx=""
for c in clang++-16 clang++-17 clang++-18 clang++-15 clang++; do
  if command -v "$c" >/dev/null 2>&1 &&
     echo '#include <source_location>
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return std::source_location::current().line() > 0 ? 0 : 1; }' |
       "$c" -std=c++20 -fsanitize=fuzzer -x c++ - -o /dev/null 2>/dev/null; then
    clangxx="$c"; break
  fi
done
if [[ "${SANITIZE_SKIP_FUZZ:-0}" == 1 ]]; then
  clangxx=""
elif [[ -z "$clangxx" ]]; then
  die "no clang++ >= 15 with libFuzzer for the fuzz stage: install one (apt-get install clang-16 libclang-rt-16-dev) or set SANITIZE_SKIP_FUZZ=1 to leave the fuzzer out of a local run"
fi

# The library links libcuda (driver API); machines without a driver get the toolkit's stub.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1'; then
  stub_dir="$(mktemp -d)"
  for d in "${CUDA_HOME:-/usr/local/cuda}"/lib64/stubs /usr/local/cuda/targets/*/lib/stubs; do
    if [[ -f "$d/libcuda.so" ]]; then ln -sf "$d/libcuda.so" "$stub_dir/libcuda.so.1"; break; fi
  done
  export LD_LIBRARY_PATH="$stub_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "== ASan + UBSan: ctest -L cpu"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
gs_configure "$asan_dir" "${common[@]}" -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san"
cpu_targets "$asan_dir" | grep -q . || die "no CPU test executables under $asan_dir/tests/cpu"
check_threads_tagged "$asan_dir"
# shellcheck disable=SC2046
cmake --build "$asan_dir" -j "$jobs" --target $(cpu_targets "$asan_dir")
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir "$asan_dir" -L cpu --no-tests=error --output-on-failure -j "$jobs"
ctest --test-dir "$asan_dir" -N -R '^test_ds4_reference:' | grep -q 'Total Tests: [1-9]' ||
  die "the DS4 CPU reference tests were not registered in $asan_dir"

echo "== TSan: ctest -L concurrency"
tsan="-fsanitize=thread -fno-omit-frame-pointer"
gs_configure "$tsan_dir" "${common[@]}" -DCMAKE_CXX_FLAGS="$tsan" -DCMAKE_EXE_LINKER_FLAGS="$tsan"
# shellcheck disable=SC2046
cmake --build "$tsan_dir" -j "$jobs" --target $(tsan_targets "$tsan_dir") test_arena_model test_soak arena_fuzzer_replay
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
  ctest --test-dir "$tsan_dir" -L '^concurrency$' --no-tests=error --output-on-failure
echo "== TSan: ctest -L async (the host backend's seeded mode)"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" \
  ctest --test-dir "$tsan_dir" -L '^async$' --no-tests=error --output-on-failure

if [[ -z "$clangxx" ]]; then
  echo "== fuzzer NOT RUN (SANITIZE_SKIP_FUZZ=1; CI runs it)"
else
  echo "== libFuzzer ($clangxx): corpus replay, then ${fuzz_seconds}s"
  gs_configure "$fuzz_dir" "${common[@]}" -DGRAPHSAFE_FUZZ=ON -DCMAKE_CXX_COMPILER="$clangxx"
  cmake --build "$fuzz_dir" -j "$jobs" --target arena_fuzzer
  ctest --test-dir "$fuzz_dir" -L fuzz --no-tests=error --output-on-failure
  mkdir -p "$fuzz_dir/fuzz-corpus"  # new inputs go here, not into the committed corpus
  corpus="$(pwd)/tests/fuzz/corpus"
  (cd "$fuzz_dir" && ASAN_OPTIONS="allocator_may_return_null=1" \
     ./tests/fuzz/arena_fuzzer -max_total_time="$fuzz_seconds" -rss_limit_mb=4096 -print_final_stats=1 \
     fuzz-corpus "$corpus")
fi
if [[ -n "$clangxx" ]]; then
  echo "sanitize.sh: all passed (ASan + UBSan, TSan, fuzz)"
else
  echo "sanitize.sh: ASan + UBSan and TSan passed; the fuzzer was NOT RUN (SANITIZE_SKIP_FUZZ=1)"
fi
