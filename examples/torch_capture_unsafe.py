"""Capture-unsafe PyTorch graph captures, for graphsafe_cupti (docs/cupti_injection.md).

    CUDA_INJECTION64_PATH=/path/to/libgraphsafe_cupti.so \
    GRAPHSAFE_CUPTI_REPORT=torch_report.json python3 examples/torch_capture_unsafe.py

Three captures of the same model step:
  1. safe: pure tensor ops. PyTorch's caching allocator may cudaMalloc a segment for the graph's
     private pool during capture, after switching the thread to relaxed mode
     (cudaThreadExchangeStreamCaptureMode): reported as a "note", not a finding.
  2. a raw driver allocation (cuMemAlloc, as a custom extension's workspace would) inside a capture
     with capture_error_mode="relaxed": succeeds silently, not part of the graph -> finding "alloc".
  3. `.item()` inside a relaxed capture: a device-to-host copy plus a stream sync of the capturing
     stream -> findings "d2h-copy" / "host-sync" (CUDA rejects the sync; the capture fails, which we
     catch). A frozen host value is the bug class behind most capture bugs engines report.
Exit code 0 when the tool flagged 2 and 3 (and not 1) -- checked from the JSON report if the path is
known, else the script only runs the captures.
"""
import ctypes
import json
import os
import sys

import torch


def step(x, w):
    return torch.relu(x @ w) + 1.0


def capture(name, fn, mode):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s, capture_error_mode=mode):
                out = fn()
        g.replay()
        torch.cuda.synchronize()
        print(f"[{name}] captured and replayed")
        return out
    except Exception as e:  # the .item() capture is expected to fail
        print(f"[{name}] capture failed as CUDA rejects it: {type(e).__name__}: {str(e).splitlines()[0]}")
        torch.cuda.synchronize()
        return None


def main():
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 77
    torch.manual_seed(0)
    x = torch.randn(64, 256, device="cuda")
    w = torch.randn(256, 256, device="cuda")
    step(x, w)  # warm up (cuBLAS handles, kernels) outside capture
    torch.cuda.synchronize()

    capture("1 safe", lambda: step(x, w), "global")

    libcuda = ctypes.CDLL("libcuda.so.1")
    raw = ctypes.c_uint64(0)

    def with_raw_alloc():
        # A custom op that grabs its own workspace with the driver API inside the capture.
        libcuda.cuMemAlloc_v2(ctypes.byref(raw), ctypes.c_size_t(1 << 20))
        return step(x, w)

    capture("2 raw cuMemAlloc in relaxed capture", with_raw_alloc, "relaxed")

    def with_item():
        n = int((x[0, 0] > -100).sum().item())  # D2H copy + sync inside the capture
        return step(x[:n], w)

    capture("3 .item() in relaxed capture", with_item, "relaxed")
    if raw.value:
        libcuda.cuMemFree_v2(ctypes.c_uint64(raw.value))

    path = os.environ.get("GRAPHSAFE_CUPTI_REPORT")
    if not path or not os.environ.get("CUDA_INJECTION64_PATH"):
        print("graphsafe_cupti not injected (set CUDA_INJECTION64_PATH); nothing to check")
        return 0
    # The report is written at exit; ask the library for it now through its C ABI.
    lib = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])  # the already-loaded instance
    lib.graphsafe_cupti_write_report(path.encode())
    with open(path) as f:
        report = json.load(f)
    kinds = sorted({f["kind"] for f in report["findings"]})
    print("findings:", [(f["kind"], f["api"], f["site"]) for f in report["findings"]])
    print("notes:", len(report["notes"]))
    ok = "alloc" in kinds and ("d2h-copy" in kinds or "host-sync" in kinds)
    print("OK" if ok else "MISSING FINDINGS", kinds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
