#!/usr/bin/env bash
# The main job: build examples/ds4_decode_demo in build/ and run it (installs what is missing, as
# test.sh does). With a CUDA device it runs the DS4 decode loop on the GPU at the default shapes
# (43 layers, batch buckets 8..64, max_model_len 65536); without one, the CPU reference path on tiny
# shapes. The first line of its output says which.
#   ./scripts/demo.sh                         all three policies (capacity, static-query, exact)
#   ./scripts/demo.sh --policy exact ...      ds4_decode_demo with these arguments (--help lists them)
#   ./scripts/demo.sh --guard-refusal [args]  the second example, guard_refusal (all four modes without args)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

gs_install_missing
gs_find_cuda

gs_configure build >/dev/null

if [[ "${1:-}" == "--guard-refusal" ]]; then
  shift
  cmake --build build --target guard_refusal -j "$(gs_jobs)"
  exe=build/examples/guard_refusal
  if (($#)); then
    exec "$exe" "$@"
  fi
  rc=0
  for args in "--policy capacity" "--policy static-query" "--policy exact" "--policy exact --recapture"; do
    echo
    echo "==> $exe $args"
    # shellcheck disable=SC2086
    "$exe" $args || rc=1
  done
  echo
  if ((rc)); then echo "demo: a check FAILED (see above)"; else echo "demo: all modes passed their checks"; fi
  exit "$rc"
fi

cmake --build build --target ds4_decode_demo -j "$(gs_jobs)"
exec build/examples/ds4_decode_demo "$@"
