#!/usr/bin/env bash
# The GPU suite in one go, from the repository root on a machine with an NVIDIA GPU (H200):
#   configure + build (Release, sm_90a, Ninja, -j16), ctest (CPU tests in parallel, GPU tests one at
#   a time), compute-sanitizer memcheck, racecheck, initcheck and synccheck on every GPU test executable
#   ($OUT/sanitizer_sweep.json: one record per tool and test, the errors other than the deliberate API
#   errors listed below), then every benchmark in build/bench with --json. Logs and JSON go to $OUT. It
#   keeps going past failures and exits non-zero if any step failed, a sanitizer job included.
#   Needs: $OUT, .deps/catch2_*.deb, CUDA toolkit, Boost headers, and nlohmann-json and CLI11
#   (installed, or .deps/nlohmann-json3-dev_*.deb and .deps/libcli11-dev_*.deb: `apt-get download`);
#   for the static-runtime CUPTI catalogue, Boost.Stacktrace (installed, or .deps/libboost1.74-dev_*.deb
#   and .deps/libboost-stacktrace1.74*.deb).
#
#   OUT=/tmp/out bash bench/run_gpu_suite.sh
#
# Knobs (environment): BUILD_DIR (build), JOBS (16), SANITIZER_TIMEOUT (s per run, 110),
# BENCH_TIMEOUT (s per benchmark, 180), GRAPHSAFE_RELIABILITY_CYCLES (soak cycles) and
# GRAPHSAFE_RELIABILITY_ROUNDS (capture rounds of the concurrency tests) under the sanitizers
# (SAN_CYCLES 100, SAN_ROUNDS 20),
# STAGES (words among: build ctest sanitize bench; default all of them), SANITIZE_FILTER (regex on
# test executable names, default all), SANITIZE_TOOLS (memcheck racecheck initcheck synccheck),
# (a narrower SANITIZE_FILTER or SANITIZE_TOOLS runs, but the suite reports the sweep incomplete),
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
# Header-only build dependencies, unpacked from .deps/ when the machine lacks them (no network there).
DEPS_PREFIX=""
for deb in .deps/nlohmann-json3-dev_*.deb .deps/libcli11-dev_*.deb .deps/libboost*.deb; do
  [ -f "$deb" ] && dpkg -x "$deb" /tmp/gsdeps && DEPS_PREFIX=/tmp/gsdeps/usr
done
# Boost.Stacktrace's backend for graphsafe_cupti's call sites, when it came from .deps/.
STACKTRACE_DIR=$(ls -d /tmp/gsdeps/usr/lib/*/cmake/boost_stacktrace_backtrace-* 2>/dev/null | head -n 1)
if [ -n "$STACKTRACE_DIR" ]; then
  export LD_LIBRARY_PATH="$(dirname "$(dirname "$STACKTRACE_DIR")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- configure + build ------------------------------------------------------------------------------
banner "configure ($GEN) + build -j$JOBS"
configure() {
  cmake -S . -B "$BUILD_DIR" -G "$GEN" \
    -DCatch2_DIR=/tmp/c2/usr/lib/cmake/Catch2 \
    ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} \
    ${STACKTRACE_DIR:+-Dboost_stacktrace_backtrace_DIR=$STACKTRACE_DIR} \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")" >"$OUT/configure.log" 2>&1
}
# A run without the build stage reuses the configured build directory as it is.
if ! stage build && [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  : >"$OUT/configure.log"
  true
elif ! configure; then
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
  # test_debug_gpu, test_vmm_gpu, test_graph_audit_gpu: debug mode walks a kernel's parameters with
  # cudaFuncGetParamInfo until it fails
  # (CUDA 13.0's runtime has no parameter-count call; src/debug_arena.cpp uses cuFuncGetParamCount
  # where the driver has it) and clears that error; test_reliability_gpu: the out-of-memory tests
  # exhaust a capped pool. Errors of any other kind still fail the run.
  expected_api_errors() {
    case $1 in
      test_debug_gpu|test_vmm_gpu|test_graph_audit_gpu) echo 'cudaErrorInvalidValue .* call to (cudaFuncGetParamInfo|cudaGetLastError)\.' ;;
      test_reliability_gpu) echo 'cudaErrorMemoryAllocation .* call to (cudaMallocFromPoolAsync|cudaMallocAsync|cudaMalloc|cudaGetLastError)\.' ;;
      *) echo '^$' ;;
    esac
  }
  # synccheck sizes its barrier tracking from the compiler's count of cuda::barrier objects, which
  # is 0 for mbarriers made with inline PTX (the DS4 attention kernel's cluster-merge barriers): it
  # then warns "overflow of tracked cuda::barrier structures" and the launch fails. A larger table
  # makes it track them.
  san_tool_args() { [ "$1" = synccheck ] && echo "--num-cuda-barriers 1024"; true; }
  # One job per (tool, test); SANITIZE_JOBS of them at once (separate processes share the GPU fine).
  # Each job's count goes to $OUT/sanitizer_sweep.json: the tool's error count (ERROR SUMMARY;
  # racecheck: the errors of RACECHECK SUMMARY) less the "Program hit" API errors the test makes on
  # purpose (expected_api_errors). A job passes only with that count 0, the tool's summary printed and
  # the tests passed; anything else fails the suite.
  san_one() {  # san_one <tool> <exe>: runs one sanitizer job, prints "<status>\t<what>"
    local tool=$1 exe=$2 name log rc
    name=$(basename "$exe")
    log="$OUT/$name.$tool.log"
    GRAPHSAFE_SANITIZER_TOOL=$tool GRAPHSAFE_RELIABILITY_CYCLES=$SAN_CYCLES GRAPHSAFE_RELIABILITY_ROUNDS=$SAN_ROUNDS \
      timeout "$SANITIZER_TIMEOUT" "$SANITIZER" --tool "$tool" $(san_tool_args "$tool") --print-limit 100000 --error-exitcode 99 \
      "$exe" >"$log" 2>&1
    rc=$?
    local counts total expected errors="" note=""
    counts=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed" "$log" | tr '\n' ' ' | tr -s ' ')
    if [ "$tool" = racecheck ]; then
      total=$(sed -n 's/.*RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$log" | head -n 1)
    else
      total=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | head -n 1)
    fi
    expected=$(grep "Program hit" "$log" | grep -cE "$(expected_api_errors "$name")")
    [ -n "$total" ] && errors=$(( total - expected ))
    if [ $rc -eq 124 ]; then
      note="timed out after ${SANITIZER_TIMEOUT}s"
    elif [ -z "$total" ]; then
      note="no $tool summary in the log (exit $rc)"
    elif [ $rc -ne 0 ] && [ $rc -ne 99 ]; then
      note="exit $rc"
    elif grep -q "FAILED" "$log" || ! grep -qE "All tests passed|test cases:.* 0 failed" "$log"; then
      note="the tests did not pass under $tool"
    elif [ "$errors" -ne 0 ]; then
      note="$errors error(s) besides the $expected expected API error(s)"
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$tool" "$name" "$errors" "$note" \
      "compute-sanitizer --tool $tool --print-limit 100000 --error-exitcode 99 $exe" >"$OUT/sanitizer_sweep.d/$tool.$name.tsv"
    if [ -z "$note" ]; then
      printf 'ok\t%s %s: 0 errors (%s; %s expected API errors)\n' "$tool" "$name" "$counts" "$expected"
    else
      printf 'FAIL\t%s %s: %s: %s (%s)\n' "$tool" "$name" "$note" "$counts" "$log"
    fi
  }
  export -f san_one expected_api_errors san_tool_args
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
  rm -rf "$OUT/sanitizer_sweep.d"
  mkdir -p "$OUT/sanitizer_sweep.d"
  while IFS=$'\t' read -r st what; do
    echo "$st $what"
    record "$st" "$what"
  done < <({ [ ${#JOBLIST[@]} -gt 0 ] && printf '%s\n' "${JOBLIST[@]}" | xargs -P "$SANITIZE_JOBS" -L 1 bash -c 'san_one "$0" "$1"';
             [ ${#SERIAL[@]} -gt 0 ] && printf '%s\n' "${SERIAL[@]}" | xargs -P 1 -L 1 bash -c 'san_one "$0" "$1"'; })
  # One record per (tool, test) in bench/results' record format (value null: the run gave no count).
  jobs_total=$(( ${#JOBLIST[@]} + ${#SERIAL[@]} ))
  jobs_run=$(find "$OUT/sanitizer_sweep.d" -name '*.tsv' | wc -l)
  [ "$jobs_run" -eq "$jobs_total" ] || record FAIL "sanitizer sweep: $jobs_run of $jobs_total jobs reported"
  if python3 - "$OUT/sanitizer_sweep.d" "$(head -n 1 "$OUT/gpu.txt" | cut -d, -f1)" >"$OUT/sanitizer_sweep.json" <<'EOF'
import json, pathlib, sys
records = []
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.tsv")):
    tool, test, errors, note, command = p.read_text().rstrip("\n").split("\t")
    r = {"name": f"sanitizer.{tool}.{test}.errors", "value": int(errors) if errors else None, "unit": "errors",
         "baseline_name": None, "baseline_value": None, "ratio": None, "machine": sys.argv[2] or "unknown",
         "command": command}
    if note:
        r["note"] = note
    records.append(r)
json.dump(records, sys.stdout, indent=1)
print()
EOF
  then
    record ok "sanitizer sweep -> sanitizer_sweep.json ($jobs_run records)"
  else
    record FAIL "sanitizer sweep: could not write sanitizer_sweep.json"
  fi
  # The required sweep is every GPU test under all four tools: a narrower run is not the suite's result.
  for tool in memcheck racecheck initcheck synccheck; do
    [[ " $SANITIZE_TOOLS " == *" $tool "* ]] || record FAIL "sanitizer sweep incomplete: SANITIZE_TOOLS lacks $tool"
  done
  [ "$SANITIZE_FILTER" = . ] || record FAIL "sanitizer sweep incomplete: SANITIZE_FILTER=$SANITIZE_FILTER"
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
    value = f"{r['value']:.4g}" if r['value'] is not None else "none"
    note = f"  ({r['note']})" if r.get('note') else ""
    print(f"    {r['name']}: {value} {r['unit']}{base}{note}")
EOF
done
echo "total $(elapsed); logs in $OUT"
if [ $FAILED -ne 0 ]; then echo "SUITE: FAILED"; exit 1; fi
echo "SUITE: OK"
exit 0
