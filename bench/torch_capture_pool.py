#!/usr/bin/env python3
"""PyTorch's CUDA graph pool on the allocation pattern of capture_memory_bench's DS4 step.

    build/bench/capture_memory_bench --pattern ds4_pattern.json
    python3 bench/torch_capture_pool.py ds4_pattern.json --json torch_pool.json
    build/bench/capture_memory_bench --torch torch_pool.json --json bench/results/capture_memory_bench.json

For each bucket graph (largest batch first, all sharing one graph pool, as engines capture), every
layer allocates one scratch tensor of that layer's workspace bytes, uses it (a kernel writes it) and
frees it when the layer is done -- what graphsafe's GatherDecode does with its four workspaces.
Reports the bytes the caching allocator reserved for the pool (memory_reserved after the captures
minus before), the figure graphsafe's family region is compared with.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pattern", help="JSON written by capture_memory_bench --pattern")
    ap.add_argument("--json", help="write {reserved_bytes, ...} here")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("torch_capture_pool: no CUDA device", file=sys.stderr)
        return 77
    with open(args.pattern) as f:
        pattern = json.load(f)
    buckets = sorted(pattern["buckets"], key=lambda b: -b["batch"])  # largest first

    dev = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_before = torch.cuda.memory_reserved(dev)
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for b in buckets:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=stream):
                for layer_bytes in b["layer_bytes"]:
                    scratch = torch.empty(int(layer_bytes), dtype=torch.uint8, device=dev)
                    scratch.zero_()  # the layer's kernels use it
                    del scratch  # freed when the layer is done
            graphs.append(g)
    torch.cuda.synchronize()
    for g in graphs:  # the graphs run (and the pool holds what they need)
        g.replay()
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved(dev) - reserved_before
    largest_layer = max(max(b["layer_bytes"]) for b in buckets)
    out = {
        "reserved_bytes": reserved,
        "largest_layer_bytes": largest_layer,
        "graphs": len(graphs),
        "layers": pattern.get("layers"),
        "graphsafe_region_bytes": pattern.get("graphsafe_region_bytes"),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(dev),
    }
    print(f"torch graph pool: {reserved / 2**30:.3f} GiB reserved for {len(graphs)} graphs x {pattern.get('layers')} "
          f"layers (largest layer scratch {largest_layer / 2**30:.3f} GiB; graphsafe region "
          f"{(pattern.get('graphsafe_region_bytes') or 0) / 2**30:.3f} GiB) on {out['device']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
