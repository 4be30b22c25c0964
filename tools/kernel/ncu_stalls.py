#!/usr/bin/env python3
"""Warp-stall samples of an Nsight Compute source export, per SASS instruction class.

Why: the ws attention kernel's S chains have taken over twice the cycles they take alone, growing
with the latency of the producer's row loads (wgmma_probe.cu's pipeline probe reproduces it). The
question is what the HGMMA warps stall on at that point: ncu's PC sampling answers it. This turns
the export that tools/kernel/ds4_iterate.sh NCU=1 writes,

    ncu --import ws_c4.ncu-rep --page source --csv --print-source sass > ncu_sass.csv

into two tables: samples per instruction class (S wgmma, PV wgmma, wgmma wait, named barriers,
global loads, shared stores, ...) split by stall reason, and the top instructions. The column names
of ncu's CSV differ between versions, so columns are found by pattern; if none matches, the header
is printed so that the script can be fixed here, without device time.

    python3 tools/kernel/ncu_stalls.py ncu_sass.csv[.gz] [--top 25]
"""
import argparse
import csv
import gzip
import io
import re
import sys

CLASSES = [  # (name, regex on the SASS text), first match wins
    ("S wgmma (HGMMA 64x64)", r"HGMMA\.64x64x16"),
    ("PV wgmma (HGMMA 64x128)", r"HGMMA\.64x128x16"),
    ("wgmma wait (WARPGROUP.DEPBAR)", r"WARPGROUP\.DEPBAR"),
    ("wgmma fence (WARPGROUP.ARRIVE)", r"WARPGROUP\.ARRIVE"),
    ("named barrier sync", r"BAR\.SYNC"),
    ("named barrier arrive", r"BAR\.ARV"),
    ("cluster barrier", r"UCGABAR|MEMBAR"),
    ("global load", r"\bLDG|\bLD\.E"),
    ("L2 prefetch", r"CCTL|PREFETCH"),
    ("global store", r"\bSTG|\bST\.E"),
    ("shared load", r"\bLDS|\bLDSM"),
    ("shared store", r"\bSTS"),
    ("remote shared (st.async / DSMEM)", r"STAS|\bST\.ASYNC|SYNCS"),
    ("proxy fence", r"FENCE"),
    ("MUFU (exp2)", r"\bMUFU"),
    ("shuffle", r"\bSHFL"),
    ("branch / sync", r"\bBRA|\bBSYNC|\bBSSY|\bWARPSYNC|\bEXIT"),
]


def open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def find_header(rows):
    for i, r in enumerate(rows):
        if any("Source" == c.strip() or c.strip().endswith("Source") for c in r) and len(r) > 3:
            return i
    return None


def number(x):
    x = x.strip().replace(",", "")
    try:
        return float(x)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows = list(csv.reader(open_text(a.csv)))
    h = find_header(rows)
    if h is None:
        print("ncu_stalls: no header with a 'Source' column; first lines:")
        for r in rows[:5]:
            print("  ", r[:12])
        return 2
    head = [c.strip() for c in rows[h]]
    src = next(i for i, c in enumerate(head) if c == "Source" or c.endswith("Source"))
    addr = next((i for i, c in enumerate(head) if "Address" in c), None)
    total = next((i for i, c in enumerate(head) if re.search(r"Warp Stall Sampling \(All", c)), None)
    reasons = [(i, c) for i, c in enumerate(head)
               if re.search(r"stall", c, re.I) and "Sampling" not in c and i != total]
    if total is None and not reasons:
        print("ncu_stalls: no stall-sample columns recognised; header:")
        for i, c in enumerate(head):
            print(f"  {i:3d} {c}")
        return 2
    data = []
    for r in rows[h + 1:]:
        if len(r) <= src:
            continue
        text = r[src].strip()
        per = {c: number(r[i]) for i, c in reasons if i < len(r)}
        tot = number(r[total]) if total is not None and total < len(r) else sum(per.values())
        data.append((r[addr].strip() if addr is not None else "", text, tot, per))
    grand = sum(d[2] for d in data) or 1.0
    by_class = {}
    for _, text, tot, per in data:
        name = next((n for n, rx in CLASSES if re.search(rx, text)), "other")
        c = by_class.setdefault(name, [0.0, {}])
        c[0] += tot
        for k, v in per.items():
            c[1][k] = c[1].get(k, 0.0) + v
    short = lambda c: re.sub(r"^(smsp__pcsamp_warps_issue_stalled_|stall_)", "", c)
    print(f"ncu_stalls: {len(data)} SASS instructions, {grand:.0f} samples; reasons from {len(reasons)} columns")
    print(f"{'class':36s} {'samples':>8s} {'share':>6s}  top reasons")
    for name, (tot, per) in sorted(by_class.items(), key=lambda kv: -kv[1][0]):
        top = sorted(per.items(), key=lambda kv: -kv[1])[:4]
        desc = ", ".join(f"{short(k)} {v:.0f}" for k, v in top if v > 0)
        print(f"{name:36s} {tot:8.0f} {100 * tot / grand:5.1f}%  {desc}")
    print(f"\ntop {a.top} instructions")
    for ad, text, tot, per in sorted(data, key=lambda d: -d[2])[: a.top]:
        top = sorted(per.items(), key=lambda kv: -kv[1])[:3]
        desc = ", ".join(f"{short(k)} {v:.0f}" for k, v in top if v > 0)
        print(f"{ad:>8s} {tot:7.0f}  {text[:60]:60s} {desc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
