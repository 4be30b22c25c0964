#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the JSON results in bench/results/ (matplotlib; not needed by CI).

    python3 scripts/plot_benchmarks.py            # writes docs/img/*.png

step_time_per_layer.png  DS4 attention per layer type (H200): paged-direct, gather path, PyTorch baseline
demo_step_time.png       ds4_decode_demo: eager vs graph step time per path and policy
demo_workspace_bytes.png ds4_decode_demo: family region, peak live and separate regions per path and policy
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
IMG = os.path.join(ROOT, "docs", "img")


def load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return {}
    return {r["name"]: r for r in json.load(open(path))}


def step_time_per_layer():
    k = load("ds4_attention_bench.json")  # the PyTorch baseline: its ratios are against this file
    t = load("ds4_torch_baseline.json")
    if not k:
        return
    types = ["C1", "C4", "C128"]
    series = [("paged-direct", "paged_direct_us_per_layer", k), ("gather path (graphsafe client)", "gather_path_us_per_layer", k),
              ("PyTorch baseline", "torch_baseline_us_per_layer", t)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for i, (label, suffix, src) in enumerate(series):
        vals = [src.get(f"ds4_{ty}_B64_H64_{suffix}", {}).get("value", 0) for ty in types]
        ax.bar([x + (i - 1) * width for x in range(len(types))], vals, width, label=label)
    ax.set_xticks(range(len(types)), [f"{ty} (B=64, H=64, 64K)" for ty in types])
    ax.set_ylabel("us per layer (log)")
    ax.set_yscale("log")
    ax.set_title("DS4 sparse decode attention per layer, NVIDIA H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "step_time_per_layer.png"), dpi=110)


def demo_results():
    """{(machine, path): {policy: {figure: value}}}; record names are
    ds4_decode_demo.<shape>_<path>.<policy>.<figure>."""
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "ds4_decode_demo*.json"))):
        for r in json.load(open(path)):
            parts = r["name"].split(".")
            if len(parts) < 4:
                continue
            key = (r["machine"].split(",")[0], parts[1].rsplit("_", 1)[-1])
            out.setdefault(key, {}).setdefault(parts[2], {})[parts[3]] = r["value"]
    return out


def demo_bars(res, keys, scale, ylabel, title, filename):
    policies = ["capacity", "static-query", "exact"]
    width = 0.8 / len(keys)
    fig, axes = plt.subplots(1, len(res), figsize=(6 * len(res), 4), squeeze=False)
    for ax, ((machine, path), pol) in zip(axes[0], sorted(res.items())):
        for i, key in enumerate(keys):
            vals = [pol.get(p, {}).get(key, 0) / scale for p in policies]
            ax.bar([x + (i - (len(keys) - 1) / 2) * width for x in range(3)], vals, width, label=key.replace("_", " "))
        ax.set_xticks(range(3), policies)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, {path} path, {machine}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, filename), dpi=110)


def demo_plots():
    res = demo_results()
    if not res:
        return
    demo_bars(res, ["eager_step_ms", "graph_step_ms"], 1, "ms per decode step (all layers)", "ds4_decode_demo",
              "demo_step_time.png")
    demo_bars(res, ["family_region_bytes", "region_peak_live_bytes", "separate_regions_bytes"], 2**20,
              "MiB of captured workspaces", "workspace bytes", "demo_workspace_bytes.png")


def main():
    os.makedirs(IMG, exist_ok=True)
    step_time_per_layer()
    demo_plots()
    for f in sorted(glob.glob(os.path.join(IMG, "*.png"))):
        print(os.path.relpath(f, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
