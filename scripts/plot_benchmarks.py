#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the JSON results in bench/results/ (matplotlib; not needed by CI).

    python3 scripts/plot_benchmarks.py            # writes docs/img/*.png

step_time_per_layer.png  DS4 attention per layer type (H200): paged-direct, gather path, PyTorch baseline
demo_step_time.png       ds4_decode_demo: eager vs graph step time per policy (every demo JSON found)
demo_workspace_bytes.png ds4_decode_demo: family region vs separate regions per policy
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
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "ds4_decode_demo*.json"))):
        recs = json.load(open(path))
        if not recs:
            continue
        label = recs[0]["machine"].split(",")[0]
        pol = {}
        for r in recs:
            parts = r["name"].split(".")
            if len(parts) >= 4:
                pol.setdefault(parts[2], {})[parts[3]] = r["value"]
        out[label] = pol
    return out


def demo_plots():
    res = demo_results()
    if not res:
        return
    policies = ["capacity", "static-query", "exact"]
    fig, axes = plt.subplots(1, len(res), figsize=(6 * len(res), 4), squeeze=False)
    for ax, (machine, pol) in zip(axes[0], res.items()):
        for i, key in enumerate(["eager_step_ms", "graph_step_ms"]):
            vals = [pol.get(p, {}).get(key, 0) for p in policies]
            ax.bar([x + (i - 0.5) * 0.4 for x in range(3)], vals, 0.4, label=key.replace("_", " "))
        ax.set_xticks(range(3), policies)
        ax.set_ylabel("ms per decode step (all layers)")
        ax.set_title(f"ds4_decode_demo on {machine}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "demo_step_time.png"), dpi=110)

    fig, axes = plt.subplots(1, len(res), figsize=(6 * len(res), 4), squeeze=False)
    for ax, (machine, pol) in zip(axes[0], res.items()):
        for i, key in enumerate(["family_region_bytes", "separate_regions_bytes"]):
            vals = [pol.get(p, {}).get(key, 0) / 2**20 for p in policies]
            ax.bar([x + (i - 0.5) * 0.4 for x in range(3)], vals, 0.4, label=key.replace("_", " "))
        ax.set_xticks(range(3), policies)
        ax.set_ylabel("MiB of captured workspaces")
        ax.set_title(f"workspace bytes per policy, {machine}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(IMG, "demo_workspace_bytes.png"), dpi=110)


def main():
    os.makedirs(IMG, exist_ok=True)
    step_time_per_layer()
    demo_plots()
    for f in sorted(glob.glob(os.path.join(IMG, "*.png"))):
        print(os.path.relpath(f, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
