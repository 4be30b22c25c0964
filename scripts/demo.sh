#!/usr/bin/env bash
# The main job: build the guard_refusal example in build/ and run it (installs what is missing,
# as test.sh does).
#   ./scripts/demo.sh                       all four modes (capacity, static-query, exact, exact+recapture)
#   ./scripts/demo.sh --policy exact ...    one run with these arguments
# Uses the CUDA backend when a CUDA device is present, the host backend otherwise (first line says).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

gs_install_missing
gs_find_cuda

gs_configure build >/dev/null
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
