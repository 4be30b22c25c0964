#!/usr/bin/env bash
# The GPU suite in one go, from the repository root on a machine with an NVIDIA GPU (H200):
#   configure + build (Release, sm_90a, Ninja, -j16), ctest (CPU tests in parallel, GPU tests one at
#   a time), compute-sanitizer memcheck, racecheck, initcheck and synccheck on every GPU test executable, then every
#   benchmark in build/bench with --json. Logs and JSON go to $OUT. It keeps going past failures and
#   exits non-zero if any step failed. Needs: $OUT, .deps/catch2_*.deb, CUDA toolkit, Boost headers.
#
#   OUT=/tmp/out bash bench/run_gpu_suite.sh
#
# Knobs (environment): BUILD_DIR (build), JOBS (16), SANITIZER_TIMEOUT (s per run, 110),
# BENCH_TIMEOUT (s per benchmark, 180), GRAPHSAFE_RELIABILITY_CYCLES (soak cycles) and
# GRAPHSAFE_RELIABILITY_ROUNDS (capture rounds of the concurrency tests) under the sanitizers
# (SAN_CYCLES 100, SAN_ROUNDS 20),
# STAGES (words among: build ctest sanitize bench; default all of them), SANITIZE_FILTER (regex on
# test executable names, default all), SANITIZE_TOOLS (memcheck racecheck initcheck synccheck),
# SANITIZE_JOBS (sanitizer processes at once, 4), SANITIZE_SERIAL (regex: tests run alone, after the
# others, because they check device-wide memory; default vmm|reliability|arena).
set -u
set -o pipefail

: "${OUT:?set OUT to the folder for logs and JSON}"
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-16}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-110}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-180}
SAN_CYCLES=${SAN_CYCLES:-100}
SAN_ROUNDS=${SAN_ROUNDS:-20}
T0=$(date +%s)
STAGES=${STAGES:-build ctest sanitize bench}
SANITIZE_FILTER=${SANITIZE_FILTER:-.}
SANITIZE_TOOLS=${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
SANITIZE_JOBS=${SANITIZE_JOBS:-4}
SANITIZE_SERIAL=${SANITIZE_SERIAL:-vmm|reliability|arena}
stage() { [[ " $STAGES " == *" $1 "* ]]; }

declare -a SUMMARY=()
FAILED=0
record() {  # record <status> <what>
  SUMMARY+=("$(printf '%-6s %s' "$1" "$2")")
  if [ "$1" = "FAIL" ]; then FAILED=1; fi
}
elapsed() { echo "$(( $(date +%s) - T0 ))s"; }
banner() { echo; echo "=== [$(elapsed)] $*"; }

# ---- toolchain ------------------------------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$CUDA_HOME/bin"
SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -x "$CUDA_HOME/compute-sanitizer/compute-sanitizer" ] && SANITIZER="$CUDA_HOME/compute-sanitizer/compute-sanitizer"
GEN="Ninja"
command -v ninja >/dev/null 2>&1 || GEN="Unix Makefiles"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"

# ---- Catch2 -----------------------------------------------------------------------------------------
banner "unpacking Catch2"
DEB=$(ls .deps/catch2_*.deb 2>/dev/null | head -n 1)
if [ -n "$DEB" ] && rm -rf /tmp/c2 && dpkg -x "$DEB" /tmp/c2 && [ -d /tmp/c2/usr/lib/cmake/Catch2 ]; then
  record ok "catch2 unpacked ($DEB)"
else
  record FAIL "catch2: no .deps/catch2_*.deb or dpkg -x failed (tests will not be built)"
fi

# ---- configure + build ------------------------------------------------------------------------------
banner "configure ($GEN) + build -j$JOBS"
configure() {
  cmake -S . -B "$BUILD_DIR" -G "$GEN" \
    -DCatch2_DIR=/tmp/c2/usr/lib/cmake/Catch2 \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")" >"$OUT/configure.log" 2>&1
}
if ! configure; then
  echo "configure failed once; wiping $BUILD_DIR (stale cache?) and retrying"
  rm -rf "$BUILD_DIR"
  configure
fi
CONF_RC=$?
tail -n 5 "$OUT/configure.log"
if [ $CONF_RC -ne 0 ]; then
  record FAIL "configure (see configure.log)"
  cat "$OUT/configure.log" | tail -n 40
else
  record ok "configure"
fi
if [ $CONF_RC -eq 0 ] && stage build; then
  if cmake --build "$BUILD_DIR" -j"$JOBS" >"$OUT/build.log" 2>&1; then
    record ok "build"
  else
    # Keep going with whatever was built; show the first errors.
    record FAIL "build (see build.log)"
    grep -n -m 30 -E "error|Error" "$OUT/build.log" || tail -n 40 "$OUT/build.log"
    cmake --build "$BUILD_DIR" -j"$JOBS" -- -k 0 >>"$OUT/build.log" 2>&1 || true
  fi
fi

# ---- ctest ------------------------------------------------------------------------------------------
if [ -d "$BUILD_DIR" ] && stage ctest; then
  banner "ctest: CPU tests (parallel)"
  (cd "$BUILD_DIR" && ctest -LE gpu -j"$JOBS" --output-on-failure --timeout 300) 2>&1 | tee "$OUT/ctest.log"
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then record ok "ctest cpu"; else record FAIL "ctest cpu (see ctest.log)"; fi
  banner "ctest: GPU tests (one at a time)"
  (cd "$BUILD_DIR" && ctest -L gpu --no-tests=error --output-on-failure --timeout 400) 2>&1 | tee -a "$OUT/ctest.log"
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then record ok "ctest gpu"; else record FAIL "ctest gpu (see ctest.log)"; fi
  # A skipped GPU test (exit 77) on this machine means no usable GPU: say so loudly.
  if grep -q "Not Run\|\*\*\*Skipped" "$OUT/ctest.log"; then
    record FAIL "ctest: some tests were skipped (no usable GPU?)"
  fi
fi

# ---- compute-sanitizer ---------------------------------------------------------------------------------
GPU_TESTS=()
if [ -d "$BUILD_DIR/tests/gpu" ]; then
  while IFS= read -r f; do GPU_TESTS+=("$f"); done < <(find "$BUILD_DIR/tests/gpu" -maxdepth 1 -type f -executable -name 'test_*' | sort)
fi
if ! stage sanitize; then
  :
elif [ -z "$SANITIZER" ]; then
  record FAIL "compute-sanitizer not found"
elif [ ${#GPU_TESTS[@]} -eq 0 ]; then
  record FAIL "no GPU test executables under $BUILD_DIR/tests/gpu"
else
  # One job per (tool, test); SANITIZE_JOBS of them at once (separate processes share the GPU fine).
  # API errors a test makes on purpose, by test name (memcheck reports every failing CUDA call):
  # test_debug_gpu: debug::probe walks a kernel's parameters with cudaFuncGetParamInfo until it fails
  # (CUDA 13.0's runtime has no parameter-count call; src/debug_arena.cpp uses cuFuncGetParamCount
  # where the driver has it) and clears that error; test_reliability_gpu: the out-of-memory tests
  # exhaust a capped pool. Errors of any other kind still fail the run.
  expected_api_errors() {
    case $1 in
      test_debug_gpu) echo 'cudaErrorInvalidValue .* call to (cudaFuncGetParamInfo|cudaGetLastError)\.' ;;
      test_reliability_gpu) echo 'cudaErrorMemoryAllocation .* call to (cudaMallocFromPoolAsync|cudaMallocAsync|cudaMalloc|cudaGetLastError)\.' ;;
      *) echo '^$' ;;
    esac
  }
  # synccheck sizes its barrier tracking from the compiler's count of cuda::barrier objects, which
  # is 0 for mbarriers made with inline PTX (the DS4 attention kernel's cluster-merge barriers): it
  # then warns "overflow of tracked cuda::barrier structures" and the launch fails. A larger table
  # makes it track them.
  san_tool_args() { [ "$1" = synccheck ] && echo "--num-cuda-barriers 64"; true; }
  # One job per (tool, test); SANITIZE_JOBS of them at once (separate processes share the GPU fine).
  san_one() {  # san_one <tool> <exe>: runs one sanitizer job, prints "<status>\t<what>"
    local tool=$1 exe=$2 name log rc
    name=$(basename "$exe")
    log="$OUT/$name.$tool.log"
    GRAPHSAFE_SANITIZER_TOOL=$tool GRAPHSAFE_RELIABILITY_CYCLES=$SAN_CYCLES GRAPHSAFE_RELIABILITY_ROUNDS=$SAN_ROUNDS \
      timeout "$SANITIZER_TIMEOUT" "$SANITIZER" --tool "$tool" $(san_tool_args "$tool") --print-limit 100000 --error-exitcode 99 \
      "$exe" >"$log" 2>&1
    rc=$?
    local counts
    counts=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed" "$log" | tr '\n' ' ' | tr -s ' ')
    if [ $rc -eq 99 ] && [ "$tool" = memcheck ]; then
      # All errors expected API errors and the tests passed -> ok, with the split in the summary.
      local total hits expected
      total=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | head -n 1)
      hits=$(grep -c "Program hit" "$log")
      expected=$(grep "Program hit" "$log" | grep -cE "$(expected_api_errors "$name")")
      if [ "${total:-x}" = "$expected" ] && [ "$hits" = "$expected" ] && ! grep -q "FAILED" "$log" &&
         grep -qE "All tests passed|test cases:.* 0 failed" "$log"; then
        printf 'ok\t%s %s: %s (all %s = expected API errors, see the suite)\n' "$tool" "$name" "$counts" "$expected"
        return
      fi
    fi
    case $rc in
      0) printf 'ok\t%s %s: %s\n' "$tool" "$name" "$counts" ;;
      124) printf 'FAIL\t%s %s: timed out after %ss (%s)\n' "$tool" "$name" "$SANITIZER_TIMEOUT" "$log" ;;
      99) printf 'FAIL\t%s %s: sanitizer reported errors: %s (%s)\n' "$tool" "$name" "$counts" "$log" ;;
      *) printf 'FAIL\t%s %s: exit %s: %s (%s)\n' "$tool" "$name" "$rc" "$counts" "$log" ;;
    esac
  }
  export -f san_one expected_api_errors
  export OUT SAN_CYCLES SAN_ROUNDS SANITIZER_TIMEOUT SANITIZER
  banner "compute-sanitizer ($SANITIZE_TOOLS) on ${#GPU_TESTS[@]} GPU tests, $SANITIZE_JOBS at a time"
  # Tests that check device-wide memory (cudaMemGetInfo: VMM growth, the soak, the arena's flat-memory
  # cycles) run one at a time
  # after the others: other sanitizer processes on the GPU move that figure (seen on the H200).
  JOBLIST=()
  SERIAL=()
  for tool in $SANITIZE_TOOLS; do
    for exe in "${GPU_TESTS[@]}"; do
      name=$(basename "$exe")
      [[ "$name" =~ $SANITIZE_FILTER ]] || continue
      if [[ "$name" =~ $SANITIZE_SERIAL ]]; then SERIAL+=("$tool $exe"); else JOBLIST+=("$tool $exe"); fi
    done
  done
  while IFS=$'\t' read -r st what; do
    echo "$st $what"
    record "$st" "$what"
  done < <({ [ ${#JOBLIST[@]} -gt 0 ] && printf '%s\n' "${JOBLIST[@]}" | xargs -P "$SANITIZE_JOBS" -L 1 bash -c 'san_one "$0" "$1"';
             [ ${#SERIAL[@]} -gt 0 ] && printf '%s\n' "${SERIAL[@]}" | xargs -P 1 -L 1 bash -c 'san_one "$0" "$1"'; })
fi

# ---- benchmarks ----------------------------------------------------------------------------------------
BENCHES=()
if [ -d "$BUILD_DIR/bench" ] && stage bench; then
  while IFS= read -r f; do BENCHES+=("$f"); done < <(find "$BUILD_DIR/bench" -maxdepth 1 -type f -executable | sort)
fi
if [ ${#BENCHES[@]} -eq 0 ] && stage bench; then
  record FAIL "no benchmark executables under $BUILD_DIR/bench"
fi
for exe in "${BENCHES[@]}"; do
  name=$(basename "$exe")
  banner "benchmark $name"
  timeout "$BENCH_TIMEOUT" "$exe" --json "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] && [ -s "$OUT/$name.json" ]; then
    record ok "bench $name -> $name.json"
  else
    record FAIL "bench $name: exit $rc$([ -s "$OUT/$name.json" ] || echo ', no JSON') ($name.log)"
  fi
done

# ---- summary -----------------------------------------------------------------------------------------
banner "summary"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
for j in "$OUT"/*.json; do
  [ -f "$j" ] || continue
  echo "  $(basename "$j"):"
  python3 - "$j" <<'EOF' 2>/dev/null || echo "    (could not parse)"
import json, sys
for r in json.load(open(sys.argv[1])):
    base = f"  vs {r['baseline_name']} {r['baseline_value']:.4g} -> {r['ratio']:.3g}x" if r.get('baseline_name') else ""
    print(f"    {r['name']}: {r['value']:.4g} {r['unit']}{base}")
EOF
done
echo "total $(elapsed); logs in $OUT"
if [ $FAILED -ne 0 ]; then echo "SUITE: FAILED"; exit 1; fi
echo "SUITE: OK"
exit 0
