# Sourced by demo.sh and test.sh: locate the CUDA toolkit and configure build/.
# shellcheck shell=bash

# nvcc: PATH, $CUDACXX, or the toolkit's usual home.
gs_find_cuda() {
  if [[ -n "${CUDACXX:-}" && -x "${CUDACXX}" ]]; then return 0; fi
  if command -v nvcc >/dev/null 2>&1; then return 0; fi
  local c
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /usr/bin/nvcc; do
    if [[ -x "$c" ]]; then
      export CUDACXX="$c"
      PATH="${c%/nvcc}:$PATH"
      export PATH
      return 0
    fi
  done
  echo "error: the CUDA toolkit (nvcc) was not found: install it (e.g. under /usr/local/cuda) or set CUDACXX" >&2
  return 1
}

# Configure build/ once (Ninja when available); later runs reuse its cache and generator.
gs_configure() {
  local build="$1"; shift
  if [[ -f "$build/CMakeCache.txt" ]]; then
    cmake -S . -B "$build" "$@"
  elif command -v ninja >/dev/null 2>&1; then
    cmake -S . -B "$build" -G Ninja "$@"
  else
    cmake -S . -B "$build" "$@"
  fi
}

gs_jobs() { nproc 2>/dev/null || echo 2; }

# Install what is missing with apt-get (as root; apt-get update first). Prints what to install
# when not root.
gs_install_missing() {
  local packages=(cmake ninja-build g++ libboost-dev libboost-stacktrace-dev catch2 nlohmann-json3-dev libcli11-dev python3-dev python3-venv) missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -eq 0 ]]; then
    # apt's progress goes to a log; the console gets one line, or the log's tail when it fails.
    local log
    log=$(mktemp "${TMPDIR:-/tmp}/graphsafe-apt.XXXXXX")
    echo "installing ${missing[*]} (apt-get, log: $log)"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -q >"$log" 2>&1 &&
       apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
      echo "installed ${missing[*]}"
    else
      echo "error: apt-get could not install ${missing[*]}; the end of $log:" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
  else
    echo "missing ${missing[*]} and not root -- install them: sudo apt-get install ${missing[*]}" >&2
  fi
}
