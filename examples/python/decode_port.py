#!/usr/bin/env python3
"""The motivating decode path, ported to graphsafe (PyTorch, one CUDA device).

A sparse decode step over a compressed KV cache: request b keeps one compressed row per 4 tokens,
ceil(L[b] / 4) rows; the step gathers every request's rows into one workspace, then attends over
each request's rows with its query. As first written, the engine sized the gather workspace from
the CPU sequence lengths -- correct eagerly, where the size is recomputed every step, but frozen at
capture in a CUDA graph: once the sequences grow, replays silently drop rows.

    python3 examples/python/decode_port.py [--steps 64]

1. as written (exact_at_capture, the same sizing made explicit): graphsafe flags the workspace when
   the capture ends; the replay whose lengths outgrew the capture is refused before launch
   (GuardFailure naming the request, the lengths and the limit), and the same replay forced through
   without its guard is shown to differ from eager -- what the refusal prevented;
2. with graphsafe extents (capacity_bound over max_model_len): one capture, replayed as every
   sequence grows, each step compared with an eager reference computed per request.
Exit code 0 when both behave so, 1 otherwise, 77 (skipped) without torch or a CUDA device.
"""
import argparse
import math
import sys

try:
    import torch
except ImportError:
    print("SKIPPED: PyTorch is not installed")
    sys.exit(77)
import graphsafe as gs

D = 64            # head dim
MAX_MODEL_LEN = 2048
RATIO = 4         # tokens per compressed row


def gather(kv, lens_dev, gathered):
    """Row j of `gathered` <- the compressed row of request b(j); rows past the total are zero.
    Static shapes (the workspace's rows), device lengths: capturable."""
    n, B = gathered.shape[0], lens_dev.shape[0]
    counts = (lens_dev + RATIO - 1) // RATIO
    ends = torch.cumsum(counts, 0)
    j = torch.arange(n, device=kv.device)
    b_of_j = torch.searchsorted(ends, j, right=True)
    valid = b_of_j < B
    b = b_of_j.clamp(max=B - 1)
    t = ((j - (ends - counts)[b]) * RATIO).clamp(0, kv.shape[1] - 1)
    gathered.copy_(torch.where(valid[:, None], kv[b, t], torch.zeros((), device=kv.device)))
    return b, valid


def attend(q, gathered, b, valid):
    """Per request: softmax(rows . q / sqrt(D)) weighted sum of its rows."""
    B = q.shape[0]
    s = (gathered * q[b]).sum(-1) / math.sqrt(D)
    s = torch.where(valid, s, torch.full((), -math.inf, device=s.device))
    m = torch.full((B,), -math.inf, device=s.device).scatter_reduce(0, b, s, "amax")
    e = torch.where(valid, torch.exp(s - m[b]), torch.zeros((), device=s.device))
    den = torch.zeros(B, device=s.device).index_add(0, b, e)
    out = torch.zeros(B, D, device=s.device).index_add(0, b, e[:, None] * gathered)
    return out / den[:, None]


def step(arena, policy, bindings, L, q, kv, lens_dev):
    """The decode step with its workspace sized through graphsafe."""
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, RATIO))
    ws = arena.request("gathered_kv", rows * D, policy, bindings, element_bytes=4)
    gathered = ws.as_tensor(torch.float32, (ws.count // D, D))
    return attend(q, gathered, *gather(kv, lens_dev, gathered))


def reference(q, kv, lens):
    """Eager, per request, from the CPU lengths: the independent reference."""
    out = []
    for b, l in enumerate(lens):
        rows = kv[b, 0:l:RATIO]
        out.append(torch.softmax(rows @ q[b] / math.sqrt(D), 0) @ rows)
    return torch.stack(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=64, help="decode steps of part 2")
    args = ap.parse_args()
    if not torch.cuda.is_available() or gs.cuda_device_count() == 0:
        print("SKIPPED: no CUDA device")
        return 77
    torch.manual_seed(0)
    start = [100, 7, 300, 9]
    B = gs.Symbol.fixed("requests")
    L = gs.Symbol.batch("seq_lens", B, capacity=MAX_MODEL_LEN)
    kv = torch.randn(len(start), MAX_MODEL_LEN, D, device="cuda")
    q = torch.randn(len(start), D, device="cuda")
    ok = True

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        arena = gs.Arena(gs.TorchCudaBackend())
        arena.reserve(64 << 20)

        # ---- 1. as written: sized exactly for the capture-time lengths ----------------------
        print("1. as written: the gather workspace sized from the CPU lengths at capture")
        b = gs.Bindings({B: len(start), L: start})
        lens_dev = torch.tensor(start, device="cuda")
        with arena.capture(b) as cap:  # prints the capture's finding when it ends
            out = step(arena, gs.exact_at_capture, b, L, q, kv, lens_dev)
        graph = cap.graph
        lens = list(start)
        for i in range(8):
            lens = [l + 1 for l in lens]
            b[L] = lens
            lens_dev.copy_(torch.tensor(lens))
            try:
                graph.replay(b)
            except gs.GuardFailure as e:
                v = e.violations[0]
                print(f"   step {i + 1}: replay refused before launch: '{v.request}' needs {v.required} elements, "
                      f"the graph reserved {v.reserved}; {v.symbols}")
                graph.replay_unguarded_for_testing()  # what the refusal prevented
                err = (out - reference(q, kv, lens)).abs().max().item()
                print(f"   the same replay without its guard: max |graph - eager| = {err:.3g} (rows dropped)")
                ok &= err > 1e-3
                break
            err = (out - reference(q, kv, lens)).abs().max().item()
            print(f"   step {i + 1}: lengths {lens} still fit the capture: max |graph - eager| = {err:.2g}")
            ok &= err < 1e-4
        else:
            print("   FAILED: no replay was refused")
            ok = False
        del graph, cap

        # ---- 2. with graphsafe extents: bounded by max_model_len ----------------------------
        print(f"2. with graphsafe extents: capacity_bound over max_model_len = {MAX_MODEL_LEN}")
        lens = list(start)
        b = gs.Bindings({B: len(start), L: lens})
        lens_dev.copy_(torch.tensor(lens))
        with arena.capture(b) as cap:
            out = step(arena, gs.capacity_bound, b, L, q, kv, lens_dev)
        worst = 0.0
        for i in range(args.steps):
            lens = [min(l + 1 + 7 * (k == 2), MAX_MODEL_LEN) for k, l in enumerate(lens)]
            b[L] = lens
            lens_dev.copy_(torch.tensor(lens))
            cap.graph.replay(b)
            worst = max(worst, (out - reference(q, kv, lens)).abs().max().item())
        print(f"   {args.steps} replays, lengths {start} -> {lens}: max |graph - eager| = {worst:.2g}; "
              f"workspace {cap.graph.reserved_bytes} bytes")
        ok &= worst < 1e-4
    torch.cuda.synchronize()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
