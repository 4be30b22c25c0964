#!/usr/bin/env python3
"""The Python package's overheads, written as bench/results records.

    python3 bench/python_bench.py --json bench/results/python_bench.json

python.request_release_us     a workspace request + release through Python (explicit stream), mean
                              of --iterations; baseline: the same pair looped in C++ in this process.
python.request_release_default_stream_us
                              the same with stream=None (torch's current stream when torch is imported).
python.replay_overhead_ratio  a guarded replay from Python over the same replay looped in C++ (host
                              time; the graph has live exact-at-capture guards, so every replay checks).
python.torch_block_pool_bytes
                              a small transformer block (LayerNorm, attention, MLP) captured with
                              torch: bytes the graph holds when torch's segments come from graphsafe
                              (TorchCudaBackend(pool='graphsafe'): the graph's region); baseline: the
                              segments of torch's own graph pool for the same capture with
                              torch.cuda.graph, same run. ratio = graphsafe / torch (<= 1: no more).
                              Each side warms up eagerly and with a discarded capture in a pool of
                              its own first, so cuBLAS workspaces and first-use buffers count on
                              neither side. GPU and torch only.
On the CUDA backend (on a torch stream) when a device and torch are there, else on the host backend
(the records' machine says which).
"""
import argparse
import json
import platform
import shlex
import sys
import time

import graphsafe as gs


def mean_ns(fn, iterations, repeats):
    """Best of `repeats` means: host timings are noisy, the minimum is the repeatable figure."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn(iterations)
        best = min(best, (time.perf_counter_ns() - t0) / iterations)
    return best


def transformer_block(torch, d=512, heads=8, mlp=2048):
    """A pre-norm block: x + attn(ln(x)), then + mlp(ln(.)); random weights, inference."""
    F = torch.nn.functional
    dev = "cuda"
    p = {k: torch.randn(*shape, device=dev) * 0.02 for k, shape in
         dict(wqkv=(d, 3 * d), wo=(d, d), w1=(d, mlp), w2=(mlp, d)).items()}

    def block(x):
        bsz, seq, _ = x.shape
        h = F.layer_norm(x, (d,))
        q, k, v = (h @ p["wqkv"]).view(bsz, seq, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(bsz, seq, d)
        x = x + a @ p["wo"]
        return x + F.gelu(F.layer_norm(x, (d,)) @ p["w1"]) @ p["w2"]

    return block


def torch_pool_bytes(torch, pool_id):
    """Bytes of the segments torch's caching allocator holds for one pool."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool_id))


def torch_block_pool_bytes(torch):
    block = transformer_block(torch)
    x = torch.randn(4, 256, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):  # eager warm-up: cuBLAS handles and workspaces, from torch's default pool
            block(x)
        side.synchronize()
        ref = block(x)

        # torch's own graph pool: a warm-up capture in a pool of its own, then the measured one.
        warm = torch.cuda.CUDAGraph()
        with torch.cuda.graph(warm, pool=torch.cuda.graph_pool_handle(), stream=side):
            block(x)
        del warm
        pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=side):
            y_torch = block(x)
        g.replay()
        side.synchronize()
        torch.testing.assert_close(y_torch, ref)
        torch_bytes = torch_pool_bytes(torch, pool)

        # graphsafe: torch's segments are the capture's requests, placed in the graph's region.
        arena = gs.Arena(gs.TorchCudaBackend(pool="graphsafe"), gs.ArenaOptions(report_findings=False))
        arena.reserve(256 << 20)
        gs.torch_mem_pool(arena)
        B = gs.Symbol.fixed("batch")
        b = gs.Bindings({B: 4})
        with arena.capture(b):  # the warm-up capture; its graph is dropped with the Capture
            block(x)
        before = arena.stats()["region_bytes"]
        assert before == 0, f"the warm-up graph still holds {before} bytes"
        with arena.capture(b) as cap:
            y_gs = block(x)
        graph = cap.graph
        graph.replay(b)
        side.synchronize()
        torch.testing.assert_close(y_gs, ref)
        gs_bytes = arena.stats()["region_bytes"] - before
        assert gs_bytes == graph.reserved_bytes, (gs_bytes, graph.reserved_bytes)
        st = gs.torch_allocator_stats(torch.cuda.current_device())
        assert st["failures"] == 0, st["last_error"]
    return gs_bytes, torch_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--host", action="store_true", help="the host backend even when a GPU is visible")
    args = ap.parse_args()

    torch = None
    if not args.host and gs.cuda_device_count() > 0:
        try:
            import torch  # noqa: F811  (the default stream is then torch's current stream)
        except ImportError:
            print("torch is not installed: measuring the host backend", file=sys.stderr)
    cuda = torch is not None
    if cuda:
        backend = gs.CudaBackend()
        side = torch.cuda.Stream()  # captures need a stream other than the legacy default one
        torch.cuda.set_stream(side)
        stream = side.cuda_stream
        machine = torch.cuda.get_device_name()
    else:
        backend = gs.HostBackend()
        stream = gs.default_host_stream()
        machine = f"host backend ({platform.processor() or platform.machine()}, no GPU)"
    arena = gs.Arena(backend, gs.ArenaOptions(report_findings=False))
    arena.reserve(64 << 20, stream)
    command = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    records = []

    def record(name, value, unit, baseline_name=None, baseline_value=None):
        ratio = value / baseline_value if baseline_value else None
        records.append(dict(name=name, value=round(value, 4), unit=unit, baseline_name=baseline_name,
                            baseline_value=None if baseline_value is None else round(baseline_value, 4),
                            ratio=None if ratio is None else round(ratio, 4), machine=machine, command=command))

    # ---- request + release ------------------------------------------------------------------
    need, policy = gs.Extent(4096), gs.capacity_bound
    request = arena.request

    def pairs(n, s=stream):
        for _ in range(n):
            request("bench", need, policy, None, 1, s).release()

    def pairs_default(n):
        for _ in range(n):
            request("bench", need, policy, None, 1).release()

    py = mean_ns(pairs, args.iterations, args.repeats)
    py_default = mean_ns(pairs_default, args.iterations, args.repeats)
    cpp = min(arena._request_release_loop_ns(need, policy, None, 1, stream, args.iterations)
              for _ in range(args.repeats))
    record("python.request_release_us", py / 1e3, "us", "cpp.request_release_us", cpp / 1e3)
    record("python.request_release_default_stream_us", py_default / 1e3, "us", "cpp.request_release_us", cpp / 1e3)

    # ---- guarded replay ---------------------------------------------------------------------
    B = gs.Symbol.fixed("requests")
    L = gs.Symbol.batch("seq_lens", B, capacity=4096)
    b = gs.Bindings({B: 4, L: [100, 200, 300, 400]})
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
    with arena.capture(b, stream) as cap:
        for i in range(4):  # live guards: every replay evaluates them
            ws = arena.request(f"ws{i}", rows * (i + 1), gs.exact_at_capture, b, 2, stream)
        if torch is not None:
            ws.as_tensor(torch.float16).add_(1)  # one kernel node
        elif not cuda:
            stream.launch(lambda: None)
    g = cap.graph
    replay = g.replay

    def replays(n):
        for _ in range(n):
            replay(b, stream)

    replays(100)
    py_replay = mean_ns(replays, args.iterations // 4, args.repeats)
    cpp_replay = min(g._replay_loop_ns(b, stream, args.iterations // 4) for _ in range(args.repeats))
    if cuda:
        backend.synchronize(stream)
    record("python.replay_us", py_replay / 1e3, "us", "cpp.replay_us", cpp_replay / 1e3)
    record("python.replay_overhead_ratio", py_replay / cpp_replay, "x")

    if cuda:
        gs_bytes, torch_bytes = torch_block_pool_bytes(torch)
        record("python.torch_block_pool_bytes", gs_bytes, "B", "torch.graph_pool_bytes", torch_bytes)

    for r in records:
        print(f"{r['name']:<42} {r['value']:>10.4f} {r['unit']:<3}"
              + (f"  (baseline {r['baseline_name']} {r['baseline_value']}, ratio {r['ratio']})" if r["baseline_name"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
