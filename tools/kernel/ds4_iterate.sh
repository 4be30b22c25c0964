#!/usr/bin/env bash
# One device call for DS4 attention kernel work (H200): build the attention benchmark in several
# variants, run the DS4 GPU tests on the default build (the attention ones also through the
# mma_sync engine and the scratch + combine merge), time every variant in the same run, and
# optionally take a timeline or an ncu profile. Everything lands in $OUT; the last lines are a table.
# Exits non-zero if a build, test, sanitizer run or benchmark failed (the table says which).
#
#   OUT=/tmp/out VARIANTS="base: pdl0:-DSOMETHING" TESTS=1 TL=1 NCU=1 bash tools/kernel/ds4_iterate.sh
#
# VARIANTS: space-separated name:CUDA_FLAGS (flags comma-separated, e.g. "x:-DA=1,-DB"); the first
#   is the default build (build/), which also builds the tests when TESTS=1. name@file.patch:FLAGS
#   builds that variant from a copy of the tree with the patch applied (an experiment beside the
#   unpatched tree, in one run). BENCH_ARGS: extra
#   arguments of ds4_attention_bench (default "--types c4,c128,c1 --reps 5"). TL=1: a timeline build
#   (-DGRAPHSAFE_DS4_TIMELINE) of the first variant, C4. NCU=1: ncu of one paged ws launch at C4
#   (needs ncu on PATH or under the toolkit) from the first variant's build, or from NCU_BUILD
#   (e.g. build-it-base); tools/kernel/ncu_stalls.py summarizes its stall samples. SANITIZE=1: memcheck +
#   racecheck (SANITIZE_TOOLS, e.g. "memcheck racecheck synccheck"; run at once) on test_ds4_kernels. PROBE=1: wgmma_probe (once, from the first variant's build).
set -u -o pipefail
: "${OUT:?set OUT}"
JOBS=${JOBS:-16}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$PATH:$CUDA_HOME/bin"
VARIANTS=${VARIANTS:-base:}
BENCH_ARGS=${BENCH_ARGS:---types c4,c128,c1 --reps 5}
T0=$(date +%s)
say() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
# Every step's timeout is capped so that the whole script ends by DEADLINE seconds (default 570,
# inside the device's 600 s per command) and the summary and the log tarball always come back
# (a deadlocked kernel would otherwise hang a test step until the device call is killed, logs and all).
DEADLINE=${DEADLINE:-570}
lim() {  # lim <seconds>: that, or what is left before DEADLINE less 25 s for the summary
  local left=$(( DEADLINE - ($(date +%s) - T0) - 25 ))
  (( left < 5 )) && left=5
  echo $(( $1 < left ? $1 : left ))
}
# run_cases <binary> <log> <tag filter or ""> [VAR=value ...]: each test case in its own process
# with a short timeout, so a hang costs CASE_T seconds and names its case (Catch2 2.x: commas in a
# name are escaped, or the name is read as two filters; -w NoTests fails a filter that matches
# nothing). Appends a line per case to the log; returns non-zero if any case failed.
run_cases() {
  local bin=$1 log=$2 tag=$3 bad=0 c rc
  shift 3
  : >"$log"
  while IFS= read -r c; do
    [ -n "$c" ] || continue
    env "$@" timeout "$(lim "${CASE_T:-60}")" "$bin" -w NoTests "${c//,/\\,}" >/tmp/ds4_case.log 2>&1
    rc=$?
    echo "rc $rc | $c | $(grep -E 'test cases|All tests passed' /tmp/ds4_case.log | tail -1)" >>"$log"
    if [ $rc -ne 0 ]; then bad=1; tail -n 30 /tmp/ds4_case.log | sed 's/^/    /' >>"$log"; fi
  done < <("$bin" --list-test-names-only ${tag:+"$tag"} 2>/dev/null)
  if ! grep -q '^rc ' "$log"; then echo "no test cases listed by $bin (no GPU, or it does not start)" >>"$log"; return 2; fi
  return $bad
}
declare -a TABLE=()
FAILED=0
fail() { TABLE+=("FAIL $*"); FAILED=1; }
FIRST=${VARIANTS%% *}
vname() { local n=${1%%:*}; echo "${n%%@*}"; }                    # vname <variant>: its name
vpatch() { local n=${1%%:*}; [ "$n" != "${n#*@}" ] && echo "${n#*@}"; true; }  # its patch, if any
dir_of() { [ "$1" = "$FIRST" ] && echo build || echo "build-it-$(vname "$1")"; }  # dir_of <variant>
# src_of <variant>: the source tree to build it from (a patched copy for name@file.patch).
src_of() {
  local pf src
  pf=$(vpatch "$1")
  if [ -z "$pf" ]; then echo "$PWD"; return 0; fi
  src="/tmp/ds4src-$(vname "$1")${2:-}"  # $2: a suffix, for a second copy built at the same time
  rm -rf "$src" && mkdir -p "$src" &&
    tar --exclude='./build' --exclude='./build-*' --exclude='./.deps' --exclude='./.git' -cf - . | tar -xf - -C "$src" &&
    (cd "$src" && git apply "$OLDPWD/$pf") >&2 || return 1
  echo "$src"
}

DEB=$(ls .deps/catch2_*.deb 2>/dev/null | head -n 1)
C2=""
if [ -n "$DEB" ]; then rm -rf /tmp/c2 && dpkg -x "$DEB" /tmp/c2 && C2=/tmp/c2/usr/lib/cmake/Catch2; fi
# nlohmann-json and CLI11 (header-only build dependencies) from .deps/ when the machine lacks them.
DEPS_PREFIX=""
for deb in .deps/nlohmann-json3-dev_*.deb .deps/libcli11-dev_*.deb; do
  [ -f "$deb" ] && dpkg -x "$deb" /tmp/gsdeps && DEPS_PREFIX=/tmp/gsdeps/usr
done

build_variant() {  # build_variant <dir> <flags> <tests 0/1> [source tree]
  local dir=$1 flags=$2 tests=$3 src=${4:-.}
  local tflag=OFF
  # A build folder left by an earlier call for another source tree (build/ serves whichever
  # variant is first; the device keeps ignored folders between calls) is started afresh.
  if [ -f "$dir/CMakeCache.txt" ] &&
     [ "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$dir/CMakeCache.txt")" != "$(cd "$src" && pwd)" ]; then
    rm -rf "$dir"
  fi
  [ "$tests" = 1 ] && [ -n "$C2" ] && tflag=ON
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DGRAPHSAFE_BUILD_TESTS=$tflag -DGRAPHSAFE_BUILD_EXAMPLES=OFF -DGRAPHSAFE_BUILD_CUPTI=OFF \
    -DGRAPHSAFE_DS4_WARN_SPILLS=ON \
    ${C2:+-DCatch2_DIR=$C2} ${DEPS_PREFIX:+-DCMAKE_PREFIX_PATH=$DEPS_PREFIX} "-DCMAKE_CUDA_FLAGS=${flags//,/ }" >"$OUT/cfg.$(basename "$dir").log" 2>&1 || return 1
  local targets=ds4_attention_bench
  [ "$tflag" = ON ] && targets="$targets test_ds4_kernels test_ds4_graph test_ds4_dequant"
  ninja -C "$dir" -j"$JOBS" $targets >"$OUT/build.$(basename "$dir").log" 2>&1
}

# Every variant's source tree (patched copies made now, one after the other: a copy taken while
# the builds run sees build folders appear and tar fails with "file changed as we read it").
declare -A SRC=()
for v in $VARIANTS; do SRC[$v]=$(src_of "$v") || SRC[$v]=FAILED; done
TLSRC=FAILED
[ "${TL:-0}" = 1 ] && { TLSRC=$(src_of "$FIRST" -tl) || TLSRC=FAILED; }
# build_one <variant>: its build; prints what failed (the caller records it in the table).
build_one() {
  local v=$1 name flags dir src
  name=$(vname "$v"); flags=${v#*:}; dir=$(dir_of "$v")
  local tests=0
  [ "$v" = "$FIRST" ] && tests=${TESTS:-0}
  src=${SRC[$v]}
  if [ "$src" = FAILED ]; then
    echo "PATCH FAILED: $name ($(vpatch "$v"))"; return 2
  fi
  if build_variant "$dir" "$flags" "$tests" "$src"; then
    grep -h "spill" "$OUT/build.$(basename "$dir").log" | sort -u | head -5
    return 0  # (the grep finds nothing when ninja had no work to do)
  else
    echo "BUILD FAILED: $name"; grep -m 20 -E "error" "$OUT/build.$(basename "$dir").log"; return 1
  fi
}
# record_build <variant> <build_one's status>: a failed patch or build goes into the table.
record_build() {
  [ "$2" -eq 2 ] && fail "$(vname "$1"): patch $(vpatch "$1") does not apply"
  [ "$2" -eq 1 ] && fail "$(vname "$1"): build (build.$(basename "$(dir_of "$1")").log)"
  true
}
# The timeline build (TL=1) and the other variants build in the background while the first one
# builds and runs its tests (each build is mostly one long nvcc of sparse_attention.cu: they overlap
# well on 16 cores).
TLPID=""
if [ "${TL:-0}" = 1 ]; then
  ( [ "$TLSRC" != FAILED ] && build_variant build-tl "${FIRST#*:},-DGRAPHSAFE_DS4_TIMELINE" 0 "$TLSRC" ) >"$OUT/bstatus.tl.log" 2>&1 &
  TLPID=$!
fi
declare -A BPID=()
for v in $VARIANTS; do
  [ "$v" = "$FIRST" ] && continue
  say "build $(vname "$v") (${v#*:}) in the background"
  build_one "$v" >"$OUT/bstatus.$(vname "$v").log" 2>&1 &
  BPID[$v]=$!
done

say "build $(vname "$FIRST") (${FIRST#*:})"
build_one "$FIRST"
record_build "$FIRST" $?
dir=$(dir_of "$FIRST")
if [ "${TESTS:-0}" = 1 ]; then
  for t in test_ds4_kernels test_ds4_dequant test_ds4_graph; do
    say "test $t (case by case)"
    run_cases "$dir/tests/gpu/$t" "$OUT/$t.log" ""
    rc=$?
    cat "$OUT/$t.log"
    TABLE+=("test $t: $(grep -c '^rc 0 ' "$OUT/$t.log") of $(grep -c '^rc ' "$OUT/$t.log") cases pass")
    [ $rc -eq 0 ] || fail "test $t ($t.log)"
  done
  # The attention tests again through the other engine and through the scratch + combine merge
  # (both read the caches through the same CacheView; ctest runs the first as
  # test_ds4_kernels_mma_sync).
  for envv in GRAPHSAFE_DS4_ATTENTION=mma_sync GRAPHSAFE_DS4_CLUSTER=0; do
    say "test test_ds4_kernels [attention] with $envv"
    lg="$OUT/test_ds4_kernels.${envv%%=*}.log"
    run_cases "$dir/tests/gpu/test_ds4_kernels" "$lg" "[attention]" "$envv"
    rc=$?
    TABLE+=("test test_ds4_kernels [attention] $envv: $(grep -c '^rc 0 ' "$lg") of $(grep -c '^rc ' "$lg") cases pass")
    [ $rc -eq 0 ] || fail "test test_ds4_kernels [attention] $envv"
  done
  if [ "${SANITIZE:-0}" = 1 ] && [ "$FAILED" = 1 ]; then
    say "sanitizers skipped: a test failed above (a hang would spend their whole timeout)"
    fail "sanitizers skipped"
  elif [ "${SANITIZE:-0}" = 1 ]; then
    # The tools run at once (separate processes on the one GPU): one after the other, the last one
    # often met the DEADLINE cap (racecheck killed mid-case: a hang and a slow run could not be told
    # apart). A run the cap killed says so in the table, with the cap.
    declare -A SPID=() SCAP=()
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      say "$tool test_ds4_kernels (in the background)"
      SCAP[$tool]=$(lim 300)
      timeout "${SCAP[$tool]}" compute-sanitizer --tool $tool --error-exitcode 99 "$dir/tests/gpu/test_ds4_kernels" >"$OUT/san.$tool.log" 2>&1 &
      SPID[$tool]=$!
    done
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      wait "${SPID[$tool]}"
      rc=$?
      capped=""
      [ $rc -eq 124 ] && capped=" KILLED BY THE ${SCAP[$tool]} s CAP (slow or hung: rerun alone with a larger DEADLINE)"
      TABLE+=("$tool test_ds4_kernels: rc $rc$capped $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test cases|All tests passed' "$OUT/san.$tool.log" | tr '\n' ' ')")
      [ $rc -eq 0 ] || fail "$tool test_ds4_kernels (san.$tool.log)"
    done
  fi
fi
# PROBE=1: tools/kernel/wgmma_probe.cu (the MMA shapes alone and inside a rebuilt producer handoff),
# built in the first variant's folder; it does not use the kernel, so one run serves all variants.
if [ "${PROBE:-0}" = 1 ]; then
  say "wgmma_probe"
  if ninja -C "$dir" -j"$JOBS" wgmma_probe >"$OUT/build.wgmma_probe.log" 2>&1; then
    timeout "$(lim 60)" "$dir/tools/kernel/wgmma_probe" >"$OUT/wgmma_probe.txt" 2>&1
    rc=$?
    tail -n 14 "$OUT/wgmma_probe.txt"
    TABLE+=("wgmma_probe: rc $rc $(tail -n 1 "$OUT/wgmma_probe.txt")")
    [ $rc -eq 0 ] || fail "wgmma_probe (wgmma_probe.txt)"
  else
    fail "wgmma_probe: build (build.wgmma_probe.log)"
  fi
fi
for v in "${!BPID[@]}"; do
  wait "${BPID[$v]}"
  rc=$?
  say "build $(vname "$v"): rc $rc"; cat "$OUT/bstatus.$(vname "$v").log"
  record_build "$v" $rc
done

for v in $VARIANTS; do
  name=$(vname "$v")
  dir=$(dir_of "$v")
  [ -x "$dir/bench/ds4_attention_bench" ] || continue
  say "bench $name"
  timeout "$(lim 60)" "$dir/bench/ds4_attention_bench" $BENCH_ARGS --json "$OUT/bench.$name.json" >"$OUT/bench.$name.log" 2>&1 ||
    fail "bench $name (bench.$name.log)"
  grep -E "^(C4|C128|C1|Pro) " "$OUT/bench.$name.log" | head -12
  while IFS= read -r line; do TABLE+=("$name | $line"); done < <(grep -E "^(C4|C128|C1) +A " "$OUT/bench.$name.log")
done

if [ "${TL:-0}" = 1 ]; then
  say "timeline build (started in the background)"
  if wait "$TLPID"; then
    timeout "$(lim 120)" build-tl/bench/ds4_attention_bench --types c4 --reps 3 --layers 43 >"$OUT/timeline.log" 2>&1
    grep -E "n=5|per layer|^C4" "$OUT/timeline.log"
  else
    cat "$OUT/bstatus.tl.log"; fail "timeline build (build.build-tl.log)"
  fi
fi

if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || ls -d $CUDA_HOME/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU_BIN" ]; then
    say "ncu ($NCU_BIN)"
    timeout "$(lim 300)" "$NCU_BIN" --clock-control none -k regex:ws_kernel --launch-skip 8 --launch-count 1 --set full \
      --import-source yes -o "$OUT/ws_c4" "${NCU_BUILD:-build}/bench/ds4_attention_bench" --types c4 --layers 12 --reps 1 >"$OUT/ncu_run.log" 2>&1
    "$NCU_BIN" --import "$OUT/ws_c4.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>&1
    "$NCU_BIN" --import "$OUT/ws_c4.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_sass.csv" 2>&1
    gzip -f "$OUT/ncu_sass.csv"
    # Stall samples per instruction class (S / PV wgmma, their waits, barriers, loads, stores).
    python3 tools/kernel/ncu_stalls.py "$OUT/ncu_sass.csv.gz" >"$OUT/ncu_stalls.txt" 2>&1; head -30 "$OUT/ncu_stalls.txt"
    grep -E "Duration|Throughput|Pipe|Tensor|Shared|Stall|Issue|Eligible|Active Warps" "$OUT/ncu_details.txt" | head -60
  else
    echo "no ncu"
  fi
fi

say "done"
printf '%s\n' "${TABLE[@]}" | tee "$OUT/summary.txt"
# At most 8 files come back from the device: everything but the JSON and the summary goes into one tarball.
(cd "$OUT" && find . -maxdepth 1 -type f ! -name '*.json' ! -name summary.txt ! -name logs.tgz -print0 |
   xargs -0 -r tar czf logs.tgz && find . -maxdepth 1 -type f ! -name '*.json' ! -name summary.txt ! -name logs.tgz -delete)
exit $FAILED
