#!/usr/bin/env python3
"""Straightforward PyTorch baseline for DS4 sparse decode attention (docs/ds4_model.md §2.5, §7.1), on the GPU.

Same shapes and lengths as bench/ds4_attention_bench.cu: B = 64, H = 64, K = 512, W = 128,
max_model_len = 65536, context lengths from the same LCG, `--layers` layers with distinct fp8_ds_mla
caches (same byte layout: 576 data bytes + 8 scale bytes per token, 64-token SWA blocks, 256/r-entry
compressed blocks, padded block stride). Per layer: gather the attended rows' bytes through their
global slots (one gather per row), dequantize (fp8 * 2^(scale-127) ++ bf16 rope) to bf16, S = q K^T
(bf16 matmul), masked softmax with the per-head sink as an extra logit, O = P V with V = K. Times the
43-layer sweep with CUDA events (median of --reps), as a CUDA Graph replay (the peer figure) and
eagerly, and prints us/layer; --json writes records, and --bench-json (the CUDA
bench's JSON) adds the ratio to our paged-direct kernel.
"""
import argparse
import json
import math
import sys

import numpy as np
import torch


def lcg_lens(B, max_len):
    s = 12345
    out = []
    for _ in range(B):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(1 + ((s >> 33) % max_len))
    return out


def fill_cache(nblocks, bs, stride, gen, dev):
    """Random valid fp8_ds_mla bytes (as the CUDA bench: |fp8| < 2, scales 124..127, bf16 rope)."""
    c = torch.zeros(nblocks, stride, dtype=torch.uint8, device=dev)
    data = torch.randint(0, 256, (nblocks, bs, 448), dtype=torch.uint8, device=dev, generator=gen) & 0xBF
    rope = (torch.rand(nblocks, bs, 64, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
    tok = torch.cat([data, rope.view(torch.uint8).view(nblocks, bs, 128)], -1)  # [nb, bs, 576]
    c[:, : bs * 576] = tok.reshape(nblocks, bs * 576)
    sc = torch.zeros(nblocks, bs, 8, dtype=torch.uint8, device=dev)
    sc[:, :, :7] = 124 + torch.randint(0, 4, (nblocks, bs, 7), dtype=torch.uint8, device=dev, generator=gen)
    c[:, bs * 576: bs * 584] = sc.reshape(nblocks, bs * 8)
    return c.reshape(-1)


def dequant(cache, slots, bs, stride):
    """slots [B, T] int64 (valid) -> bf16 rows [B, T, 512].

    One gather per row, and each gathered element a word, not a byte: the cache is viewed as 8-byte
    words, [blocks, bs, 72] data rows and [blocks, bs, 1] scale words (strided views of the same bytes),
    and indexed by (block, offset). PyTorch's index kernel moves one element per thread step, so a
    byte view moves 8x the elements for the same bytes."""
    nb = cache.numel() // stride
    words = cache.view(torch.int64).view(nb, stride // 8)
    data = words[:, : bs * 72].view(nb, bs, 72)
    scales = words[:, bs * 72: bs * 73].view(nb, bs, 1)
    blk = slots // bs
    off = slots % bs
    raw = data[blk, off].view(torch.uint8)                                   # [B, T, 576]
    sc = scales[blk, off].view(torch.uint8)[..., :7]                          # [B, T, 8] -> [B, T, 7]
    B, T = slots.shape
    nope = raw[..., :448].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16).view(B, T, 7, 64)
    nope = nope * torch.exp2(sc.to(torch.bfloat16) - 127.0).unsqueeze(-1)  # exact: powers of two
    rope = raw[..., 448:].contiguous().view(torch.bfloat16)                   # [B, T, 64]
    return torch.cat([nope.view(B, T, 448), rope], -1)


def attention(q, sink, K, valid, scale):
    s = torch.einsum("bhd,btd->bht", q, K).float() * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    B, H, _ = s.shape
    lse = torch.logsumexp(torch.cat([s, sink.view(1, H, 1).expand(B, H, 1)], -1), -1, keepdim=True)
    p = torch.exp(s - lse)
    return torch.einsum("bht,btd->bhd", p.to(torch.bfloat16), K)


def time_us(fn, reps):
    """Median microseconds of fn() between CUDA events (after two warm-up calls), and its last result."""
    for _ in range(2):
        out = fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        out = fn()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    ms.sort()
    return ms[len(ms) // 2] * 1e3, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--types", default="c4,c128,c1")
    ap.add_argument("--json", default="")
    ap.add_argument("--bench-json", default="")
    a = ap.parse_args()
    dev = torch.device("cuda")
    B, H, W, K, L = a.batch, a.heads, 128, a.topk, a.max_len
    scale = 512 ** -0.5
    lens = lcg_lens(B, L)
    rng = np.random.default_rng(7)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1)
    machine = torch.cuda.get_device_name(0)
    command = " ".join(sys.argv)
    bench = {}
    if a.bench_json:
        with open(a.bench_json) as f:
            bench = {r["name"]: r for r in json.load(f)}
    recs = []
    print(f"machine: {machine}")
    print(f"{'type':6s} {'path':32s} {'us/layer':>10s} {'vs paged kernel':>16s}")
    for t in a.types.split(","):
        r = {"c4": 4, "c128": 128, "c1": 1}[t]
        tname = {4: "C4", 128: "C128", 1: "C1"}[r]
        E = 256 // r if r > 1 else 0
        cap = (L + r - 1) // r if r > 1 else 0
        cw = K if r == 4 else ((cap + 127) // 128 * 128 if r > 1 else 0)
        sbs, sstride = 64, (64 * 584 + 575) // 576 * 576
        cstride = (E * 584 + 575) // 576 * 576 if r > 1 else 0
        # block tables: SWA window blocks and compressed entries 0..n_c-1, shuffled physical ids
        swa_blocks, cmp_blocks = {}, {}
        snb = cnb = 0
        for b, Lb in enumerate(lens):
            for blk in range(max(0, Lb - W) // sbs, (Lb - 1) // sbs + 1):
                swa_blocks[(b, blk)] = snb
                snb += 1
            if r > 1:
                for blk in range((Lb // r + E - 1) // E):
                    cmp_blocks[(b, blk)] = cnb
                    cnb += 1
        sperm = rng.permutation(snb)
        cperm = rng.permutation(max(cnb, 1))
        T = cw + W
        slots_c = np.zeros((B, max(cw, 1)), np.int64)
        valid_c = np.zeros((B, max(cw, 1)), bool)
        slots_s = np.zeros((B, W), np.int64)
        valid_s = np.zeros((B, W), bool)
        rows = 0
        for b, Lb in enumerate(lens):
            n_c = Lb // r if r > 1 else 0
            if r == 4:
                picks = rng.choice(n_c, size=min(n_c, K), replace=False) if n_c > 0 else []
            else:
                picks = range(min(n_c, cw))
            for i, c in enumerate(picks):
                slots_c[b, i] = cperm[cmp_blocks[(b, c // E)]] * E + c % E
                valid_c[b, i] = True
            sl = min(Lb, W)
            for i in range(sl):
                pos = Lb - sl + i
                slots_s[b, i] = sperm[swa_blocks[(b, pos // sbs)]] * sbs + pos % sbs
                valid_s[b, i] = True
            rows += sl + len(list(picks))
        slots_c = torch.from_numpy(slots_c).to(dev)
        slots_s = torch.from_numpy(slots_s).to(dev)
        valid = torch.from_numpy(np.concatenate([valid_c, valid_s], 1) if r > 1 else valid_s).to(dev)
        q = (torch.rand(B, H, 512, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
        sink = torch.linspace(-2, 2, H + 1, device=dev)[:H].float()
        swa = [fill_cache(snb, sbs, sstride, gen, dev) for _ in range(a.layers)]
        cmp = [fill_cache(cnb, E, cstride, gen, dev) for _ in range(a.layers)] if r > 1 else None

        def sweep():
            outs = None
            for l in range(a.layers):
                Ks = dequant(swa[l], slots_s, sbs, sstride)
                Kr = torch.cat([dequant(cmp[l], slots_c, E, cstride), Ks], 1) if r > 1 else Ks
                outs = attention(q, sink, Kr, valid, scale)
            return outs

        us_eager, out = time_us(sweep, a.reps)
        us_eager /= a.layers
        # The peer figure is a CUDA Graph replay of the sweep: eager PyTorch launches ~20 kernels per
        # layer from Python, and that host time (which varies with the machine's load) would be
        # counted against PyTorch rather than its GPU work.
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sweep()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            gout = sweep()
        us, _ = time_us(lambda: g.replay() or gout, a.reps)
        us /= a.layers
        assert torch.isfinite(out.float()).all(), "non-finite output"
        assert torch.equal(out, gout), "graph replay differs from eager"
        key = f"ds4_{tname}_B{B}_H{H}_paged_direct_us_per_layer"
        ours = bench.get(key, {}).get("value")
        rtxt = f"{us / ours:15.1f}x" if ours else f"{'n/a':>16s}"
        print(f"{tname:6s} {'torch graph (gather+dequant+2 bmm)':32s} {us:10.1f} {rtxt}  rows={rows}  eager {us_eager:.1f}")
        recs.append({"name": f"ds4_{tname}_B{B}_H{H}_torch_baseline_us_per_layer", "value": us, "unit": "us",
                     "baseline_name": key if ours else None, "baseline_value": ours,
                     "ratio": (us / ours) if ours else None, "machine": machine, "command": command})
        recs.append({"name": f"ds4_{tname}_B{B}_H{H}_torch_baseline_eager_us_per_layer", "value": us_eager,
                     "unit": "us", "baseline_name": None, "baseline_value": None, "ratio": None,
                     "machine": machine, "command": command})
        del swa, cmp
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in recs) + "\n]\n")  # one record per line
        print(f"wrote {len(recs)} records to {a.json}")


if __name__ == "__main__":
    main()
