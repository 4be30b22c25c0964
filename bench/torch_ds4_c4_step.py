#!/usr/bin/env python3
"""PyTorch peer of one DS4 C4 decode step (docs/ds4_model.md §2.3-2.5), the step that
bench/ds4_indexer_bench.cu times as ds4_C4_B64_H64_decode_step_us_per_layer.

Same shapes and lengths: B = 64 requests, 64 index heads of dim 128, K = 512, H = 64 query heads,
W = 128, max_model_len = 65,536, context lengths from the LCG of bench/ds4_attention_bench.cu,
`--layers` layers with distinct caches (indexer keys: 128 fp8 + one fp32 scale per row in blocks of
64 rows; attention: fp8_ds_mla rows). Per layer, written the straightforward way on whole tensors:
  1. indexer: the request's key blocks gathered through the block table as whole blocks, 8-byte
     words per element (index_select of the blocks' key words and, apart, their scale words: both
     come out contiguous), the keys widened fp8 -> bf16 ([B, N, 128]), S = K q^T (bf16 bmm,
     [B, N, 64]), ReLU in place, the head weights as a second bmm, times the row scale; rows past
     n_c masked to -inf;
  2. torch.topk(K) over the rows;
  3. the picked rows' and the window's global slots, one gather per row, dequantized to bf16;
  4. attention with the sink (bf16 bmm, fp32 softmax), as bench/torch_ds4_baseline.py.
Times the sweep as a CUDA Graph replay (the peer figure: no Python launch overhead, which depends on
the host's load) and eagerly, CUDA events, median of --reps; --json writes the records.
"""
import argparse
import json
import sys

import numpy as np
import torch

from torch_ds4_baseline import attention, dequant, fill_cache, lcg_lens, time_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    ap.add_argument("--profile", action="store_true", help="print the sweep's CUDA kernels by time (torch.profiler)")
    a = ap.parse_args()
    dev = torch.device("cuda")
    B, H, W, K, L = a.batch, 64, 128, a.topk, a.max_len
    IH, ID, E = 64, 128, 64            # index heads, index head dim, rows per block (256 / 4)
    scale = 512 ** -0.5
    lens = lcg_lens(B, L)
    n_c = torch.tensor([x // 4 for x in lens], device=dev)
    N = (L + 3) // 4                   # capacity rows per request
    bpr = (N + E - 1) // E
    rng = np.random.default_rng(7)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    # One block table for the indexer cache and the compressed cache (every block allocated).
    ctab = torch.from_numpy(rng.permutation(B * bpr).reshape(B, bpr)).to(dev)
    nb = B * bpr
    istride = (E * (ID + 4) + 15) // 16 * 16
    cstride = (E * 584 + 575) // 576 * 576
    # SWA: the window's blocks only, shuffled physical ids.
    sbs, sstride = 64, (64 * 584 + 575) // 576 * 576
    sw = {}
    for b, Lb in enumerate(lens):
        for blk in range(max(0, Lb - W) // sbs, (Lb - 1) // sbs + 1):
            sw[(b, blk)] = len(sw)
    sperm = rng.permutation(len(sw))
    slots_s = np.zeros((B, W), np.int64)
    valid_s = np.zeros((B, W), bool)
    for b, Lb in enumerate(lens):
        sl = min(Lb, W)
        for i in range(sl):
            pos = Lb - sl + i
            slots_s[b, i] = sperm[sw[(b, pos // sbs)]] * sbs + pos % sbs
            valid_s[b, i] = True
    slots_s = torch.from_numpy(slots_s).to(dev)
    valid_s = torch.from_numpy(valid_s).to(dev)

    def icache_fill():
        c = torch.zeros(nb, istride, dtype=torch.uint8, device=dev)
        c[:, : E * ID] = torch.randint(0, 256, (nb, E * ID), dtype=torch.uint8, device=dev, generator=gen) & 0xBF
        sc = 0.005 + 0.01 * torch.rand(nb, E, device=dev, generator=gen)
        c[:, E * ID: E * (ID + 4)] = sc.view(torch.uint8).view(nb, E * 4)
        return c

    icache = [icache_fill() for _ in range(a.layers)]
    cmp = [fill_cache(nb, E, cstride, gen, dev) for _ in range(a.layers)]
    swa = [fill_cache(len(sw), sbs, sstride, gen, dev) for _ in range(a.layers)]
    q8 = (torch.randint(0, 256, (B, IH, ID), dtype=torch.uint8, device=dev, generator=gen) & 0xBF)
    qI = q8.view(torch.float8_e4m3fn).to(torch.bfloat16)                       # [B, 64, 128]
    wI = (torch.rand(B, IH, 1, device=dev, generator=gen) - 0.5).to(torch.bfloat16)
    q = (torch.rand(B, H, 512, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    sink = torch.linspace(-2, 2, H + 1, device=dev)[:H].float()
    rows = torch.arange(N, device=dev)
    kpos = torch.arange(K, device=dev)
    valid_c = kpos[None, :] < torch.clamp(n_c, max=K)[:, None]

    icache_words = [c.view(torch.int64) for c in icache]                       # [nb, istride / 8]
    ctab_flat = ctab.reshape(-1)
    KW, SW = E * ID // 8, E * 4 // 8                                            # key / scale words per block

    def step(l):
        w = icache_words[l]
        # Key and scale words gathered separately, so each comes out contiguous: widening a strided
        # view of the keys runs PyTorch's generic elementwise kernel, ~0.5 ms per layer here.
        keys = w[:, :KW].index_select(0, ctab_flat)                                # [B * bpr, 1024] int64
        k = keys.view(torch.float8_e4m3fn).to(torch.bfloat16).view(B, bpr * E, ID)[:, :N]  # [B, N, 128]
        kscale = w[:, KW: KW + SW].index_select(0, ctab_flat).view(torch.float32).view(B, bpr * E)[:, :N]
        s = torch.bmm(k, qI.transpose(1, 2)).relu_()                               # [B, N, 64]
        score = torch.bmm(s, wI).squeeze(-1).float() * kscale
        score = score.masked_fill(rows[None, :] >= n_c[:, None], float("-inf"))
        top = torch.topk(score, K, dim=1).indices                                  # [B, K]
        slots_c = torch.gather(ctab, 1, top // E) * E + top % E
        kr = torch.cat([dequant(cmp[l], slots_c, E, cstride), dequant(swa[l], slots_s, sbs, sstride)], 1)
        return attention(q, sink, kr, torch.cat([valid_c, valid_s], 1), scale)

    def sweep():
        out = None
        for l in range(a.layers):
            out = step(l)
        return out

    if a.profile:
        sweep()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            sweep()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
    us_eager, out = time_us(sweep, a.reps)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sweep()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gout = sweep()
    us_graph, _ = time_us(lambda: g.replay() or gout, a.reps)
    assert torch.isfinite(out.float()).all(), "non-finite output"
    assert torch.equal(out, gout), "graph replay differs from eager"
    machine = torch.cuda.get_device_name(0)
    command = " ".join(sys.argv)
    us_graph /= a.layers
    us_eager /= a.layers
    print(f"machine: {machine}; torch {torch.__version__}")
    print(f"C4 decode step (indexer + top-k + gather + attention), B={B} H={H} K={K}: "
          f"graph {us_graph:.1f} us/layer, eager {us_eager:.1f} us/layer")
    p = f"ds4_C4_B{B}_H{H}_torch_decode_step"
    recs = [
        {"name": p + "_us_per_layer", "value": us_graph, "unit": "us", "baseline_name": None,
         "baseline_value": None, "ratio": None, "machine": machine, "command": command},
        {"name": p + "_eager_us_per_layer", "value": us_eager, "unit": "us", "baseline_name": None,
         "baseline_value": None, "ratio": None, "machine": machine, "command": command},
    ]
    if a.json:
        with open(a.json, "w") as f:
            f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in recs) + "\n]\n")  # one record per line
        print(f"wrote {len(recs)} records to {a.json}")


if __name__ == "__main__":
    main()
