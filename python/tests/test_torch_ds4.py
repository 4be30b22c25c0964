"""graphsafe.ds4's torch custom ops, one DS4 layer's paged decode attention and a C4 layer's indexer
top-k, with arena workspaces: against the CPU reference, traced by torch.compile(fullgraph=True) and
make_fx through their fake kernels, captured with the arena and replayed as the sequences grow
(equal to eager at every step), and refused inside a capture graphsafe did not start. The fake-kernel tests need torch only; the
others a CUDA device and an extension built with the DS4 kernels (each skipped with the reason)."""
import numpy as np
import pytest

import graphsafe as gs

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
ds4 = pytest.importorskip("graphsafe.ds4", reason="graphsafe.ds4 needs torch.library.custom_op (PyTorch >= 2.4)")

needs_gpu = pytest.mark.skipif(
    not ds4.available() or not torch.cuda.is_available() or gs.cuda_device_count() == 0,
    reason="needs a CUDA device and graphsafe built with the DS4 kernels (GRAPHSAFE_BUILD_DS4=ON)")

H = 64
LAYERS = {  # small layers of each type: C4 with 128 picks, C128, C1 (sliding window only)
    "C4": dict(ratio=4, window=128, topk=128, max_model_len=2048),
    "C128": dict(ratio=128, window=128, topk=128, max_model_len=4096),
    "C1": dict(ratio=1, window=128, topk=128, max_model_len=2048),
}
ORDER = ["q", "sink", "seq_lens", "topk_local", "swa_cache", "swa_block_table", "cmp_cache", "cmp_block_table"]


def run(args, layer, query_tokens=1):
    return torch.ops.graphsafe.ds4_paged_attention(*(args[k] for k in ORDER), layer["ratio"], layer["window"],
                                                   layer["topk"], layer["max_model_len"], query_tokens)


def problem(layer, seq_lens, seed=7, fill_to=0):
    return ds4.Problem(heads=H, seq_lens=seq_lens, seed=seed, fill_to=fill_to, **layer)


def max_rel_error(out, want):
    """Max over (request, head) of ||out - want|| / ||want||; rows where the reference is zero (no
    rows to attend: a padded request) must be exactly zero."""
    got = out.float().cpu().numpy().reshape(-1, 512).astype(np.float64)
    want = want.reshape(-1, 512).astype(np.float64)
    assert np.isfinite(got).all()
    dn, rn = np.linalg.norm(got - want, axis=1), np.linalg.norm(want, axis=1)
    assert (dn[rn == 0] == 0).all(), "a request with nothing to attend must give exactly zero"
    return float((dn[rn > 0] / rn[rn > 0]).max())


IX_ORDER = ["q", "weights", "seq_lens", "index_cache", "cmp_block_table"]


def pick(ix, layer):
    return torch.ops.graphsafe.ds4_indexer_topk(*(ix[k] for k in IX_ORDER), layer["topk"], layer["max_model_len"])


def indexer_tensors(inputs, args):
    """The indexer op's arguments for IndexerInputs of a problem whose tensors are `args`."""
    return {"q": torch.from_numpy(inputs.q).cuda(), "weights": torch.from_numpy(inputs.weights).cuda(),
            "seq_lens": args["seq_lens"], "index_cache": torch.from_numpy(inputs.cache).cuda(),
            "cmp_block_table": args["cmp_block_table"]}


def e4m3_values():
    """float32 value of each fp8 e4m3 byte (0x7F/0xFF: NaN)."""
    v = np.arange(256)
    e, m = (v >> 3) & 0xF, (v & 7) / 8.0
    mag = np.where(e == 0, m * 2.0 ** -6, (1 + m) * 2.0 ** (e - 7.0))
    mag = np.where((v & 0x7F) == 0x7F, np.nan, mag)
    return np.where(v & 0x80, -mag, mag).astype(np.float32)


def indexer_scores(inputs, p, b):
    """Request b's indexer scores in numpy, independent of the C++ reference: for compressed row j,
    scale_j * sum_h w_h * relu(q8_h . k8_j), the row in block table[b, j // 64] at slot j % 64."""
    f8 = e4m3_values()
    n_c = int(p.seq_lens[b]) // 4
    blocks = p.cmp_block_table[b, np.arange(n_c) // 64]
    t = np.arange(n_c) % 64
    cache = inputs.cache
    k8 = f8[cache[blocks[:, None], t[:, None] * 128 + np.arange(128)]]  # [n_c, 128]
    scale = cache[blocks[:, None], 64 * 128 + t[:, None] * 4 + np.arange(4)].copy().view(np.float32)[:, 0]
    q8 = f8[inputs.q[b]].astype(np.float64)  # [64, 128]
    return scale * (inputs.weights[b].astype(np.float64) @ np.maximum(q8 @ k8.T.astype(np.float64), 0))


def check_picks(picks, inputs, p, k):
    """The selection rule against independent scores: n_c <= k gives rows 0 .. n_c-1 in order; else
    k distinct rows listed in ascending row order, none left out scoring above the lowest one picked
    (within the fp32 summation's rounding: the GPU and the references add in different orders)."""
    for b in range(p.batch):
        row, scores = picks[b], indexer_scores(inputs, p, b)
        n_c = len(scores)
        if n_c <= k:
            assert row.tolist() == list(range(n_c)) + [-1] * (k - n_c), b
            continue
        assert len(set(row.tolist())) == k and row.min() >= 0 and row.max() < n_c, b
        tol = 1e-5 * np.abs(scores).max() + 1e-6
        got = scores[row]
        assert (np.diff(row) > 0).all(), f"request {b}: picks not in ascending row order"
        left_out = np.delete(scores, row)
        assert left_out.max() <= got.min() + tol, f"request {b}: a row scoring {left_out.max()} left out"


def meta_args(layer, requests=3, heads=H):
    stride = ds4.block_stride_bytes(64)
    cmp = layer["ratio"] > 1
    cstride = ds4.block_stride_bytes(256 // layer["ratio"]) if cmp else 0
    m = dict(device="meta")
    return {
        "q": torch.empty(requests, heads, 512, dtype=torch.bfloat16, **m),
        "sink": torch.empty(heads, dtype=torch.float32, **m),
        "seq_lens": torch.empty(requests, dtype=torch.int32, **m),
        "topk_local": torch.empty(requests, layer["topk"] if layer["ratio"] == 4 else 0, dtype=torch.int32, **m),
        "swa_cache": torch.empty(10, stride, dtype=torch.uint8, **m),
        "swa_block_table": torch.empty(requests, 32, dtype=torch.int32, **m),
        "cmp_cache": torch.empty(10, cstride, dtype=torch.uint8, **m) if cmp else None,
        "cmp_block_table": torch.empty(requests, 8, dtype=torch.int32, **m) if cmp else None,
    }


@pytest.mark.parametrize("name", LAYERS)
def test_the_fake_kernel_gives_the_output_shape_without_running(name):
    args = meta_args(LAYERS[name])
    out = run(args, LAYERS[name])
    assert out.device.type == "meta" and out.dtype == torch.bfloat16 and tuple(out.shape) == (3, H, 512)


def test_the_fake_kernel_refuses_bad_shapes_naming_the_value_and_the_limit():
    layer = LAYERS["C4"]
    args = meta_args(layer)
    args["topk_local"] = torch.empty(3, 64, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"topk_local = torch.int32 \(3, 64\).*\[3, topk = 128\]"):
        run(args, layer)
    args = meta_args(layer, heads=96)
    with pytest.raises(ValueError, match=r"heads\) = 96 .*64 or 128"):
        run(args, layer)


def test_the_indexer_fake_kernel_gives_the_picks_shape_and_checks_its_inputs():
    m = dict(device="meta")
    ix = {"q": torch.empty(3, 64, 128, dtype=torch.uint8, **m), "weights": torch.empty(3, 64, **m),
          "seq_lens": torch.empty(3, dtype=torch.int32, **m),
          "index_cache": torch.empty(8, ds4.indexer_block_stride_bytes(), dtype=torch.uint8, **m),
          "cmp_block_table": torch.empty(3, 8, dtype=torch.int32, **m)}
    picks = pick(ix, LAYERS["C4"])
    assert picks.device.type == "meta" and picks.dtype == torch.int32 and tuple(picks.shape) == (3, 128)
    ix["weights"] = torch.empty(3, 32, **m)
    with pytest.raises(ValueError, match=r"weights = torch.float32 \(3, 32\).*float32 \[3, 64\]"):
        pick(ix, LAYERS["C4"])


def test_make_fx_traces_the_op_through_its_fake_kernel():
    from torch.fx.experimental.proxy_tensor import make_fx

    layer = LAYERS["C4"]
    args = meta_args(layer)

    def step(*a):
        return run(dict(zip(ORDER, a)), layer).float() * 2

    gm = make_fx(step, tracing_mode="fake")(*(args[k] for k in ORDER))
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.graphsafe.ds4_paged_attention.default in ops


@needs_gpu
@pytest.mark.parametrize("name", LAYERS)
def test_the_op_matches_the_cpu_reference(name):
    layer = LAYERS[name]
    p = problem(layer, [0, 1, 77, 300, 1500])  # 0: a padded request (zero output)
    args = ds4.problem_tensors(p)
    out = run(args, layer)
    torch.cuda.synchronize()
    assert out.shape == (5, H, 512)
    assert max_rel_error(out, p.reference()) <= 1e-2  # the kernels' tolerance (docs/ds4_model.md)


@needs_gpu
def test_opcheck_finds_the_fake_kernels_consistent_with_the_real_ones():
    """torch.library.opcheck: the schema (no input mutated) and each fake kernel's output metadata
    against the real kernel's, for both ops."""
    layer = LAYERS["C4"]
    p = problem(layer, [3, 64, 700])
    args = ds4.problem_tensors(p)
    utils = ("test_schema", "test_faketensor")
    torch.library.opcheck(torch.ops.graphsafe.ds4_paged_attention.default,
                          tuple(args[k] for k in ORDER) + (4, 128, 128, 2048, 1), test_utils=utils)
    ix = indexer_tensors(ds4.IndexerInputs(p), args)
    torch.library.opcheck(torch.ops.graphsafe.ds4_indexer_topk.default, tuple(ix[k] for k in IX_ORDER) + (128, 2048),
                          test_utils=utils)


@needs_gpu
def test_torch_compile_fullgraph_traces_the_op():
    layer = LAYERS["C4"]
    p = problem(layer, [3, 64, 129, 1000])
    args = ds4.problem_tensors(p)

    def step(q, *rest):
        a = dict(zip(ORDER, (q * 1.0, *rest)))  # a torch op around it, traced into the same graph
        return run(a, layer).float().relu()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(*(args[k] for k in ORDER))
    want = step(*(args[k] for k in ORDER))
    assert torch.equal(got, want)


@needs_gpu
def test_the_captured_op_replays_equal_to_eager_as_sequences_grow():
    layer = LAYERS["C4"]
    steps = [[5, 60, 130, 400], [6, 61, 131, 401], [70, 200, 513, 1000], [71, 260, 900, 2000]]
    p = problem(layer, steps[0], seed=11, fill_to=2048)
    args = ds4.problem_tensors(p)
    arena = gs.Arena(gs.TorchCudaBackend(), gs.ArenaOptions(report_findings=False))
    arena.reserve(ds4.workspace_bytes(heads=H, requests=4, **layer) + (8 << 20))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), ds4.use_arena(arena):
        run(args, layer)  # warm-up (cuBLAS-free, but the kernels' first launch configures them)
        with arena.capture(gs.Bindings()) as cap:
            graph_out = run(args, layer)
        plan = cap.graph.plan
        assert all(e["replay_safe"] for e in plan.entries), plan.report()  # static extents: no guard
        for lens in steps:
            p.grow(lens)  # new lengths and C4 picks, written where the graph reads them
            args["seq_lens"].copy_(torch.from_numpy(p.seq_lens))
            args["topk_local"].copy_(torch.from_numpy(p.topk_local))
            cap.graph.replay(gs.Bindings())
            eager = run(args, layer)
            side.synchronize()
            assert torch.equal(graph_out, eager), lens
            assert max_rel_error(graph_out, p.reference()) <= 1e-2, lens


@needs_gpu
def test_the_indexer_op_matches_the_cpu_reference():
    layer = LAYERS["C4"]
    p = problem(layer, [0, 3, 300, 513, 2048])  # no rows, n_c <= topk (in order), n_c > topk (scored)
    inputs = ds4.IndexerInputs(p, seed=8, tie_every=7)  # repeated rows: ties broken by the lower row
    got = pick(indexer_tensors(inputs, ds4.problem_tensors(p)), layer).cpu().numpy()
    check_picks(got, inputs, p, layer["topk"])
    want = inputs.topk(p)  # the C++ reference: the same rule, its own scores
    assert np.array_equal(got[:3], want[:3])  # no scoring involved (n_c <= topk): exactly


@needs_gpu
def test_the_captured_indexer_and_attention_replay_equal_to_eager_as_sequences_grow():
    """The C4 decode path: the indexer's picks feed the attention, both captured once at short
    context and replayed through the switch to scored top-k."""
    layer = LAYERS["C4"]
    steps = [[3, 5], [15, 33], [36, 40], [255, 257], [511, 600], [1500, 2048]]
    p = problem(layer, steps[0], seed=7, fill_to=2048)
    inputs = ds4.IndexerInputs(p, seed=8, tie_every=7)
    args = ds4.problem_tensors(p)
    ix = indexer_tensors(inputs, args)

    def step():
        picks = pick(ix, layer)
        return picks, run(dict(args, topk_local=picks), layer)

    arena = gs.Arena(gs.TorchCudaBackend(), gs.ArenaOptions(report_findings=False))
    logits = 2 * (layer["max_model_len"] // 4) * 4
    arena.reserve(ds4.workspace_bytes(heads=H, requests=2, **layer) + logits + (8 << 20))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), ds4.use_arena(arena):
        step()
        with arena.capture(gs.Bindings()) as cap:
            graph_picks, graph_out = step()
        assert all(e["replay_safe"] for e in cap.graph.plan.entries), cap.graph.plan.report()
        for lens in steps:
            p.grow(lens)
            args["seq_lens"].copy_(torch.from_numpy(p.seq_lens))
            cap.graph.replay(gs.Bindings())
            eager_picks, eager_out = step()
            side.synchronize()
            assert torch.equal(graph_picks, eager_picks) and torch.equal(graph_out, eager_out), lens
            picks = graph_picks.cpu().numpy()
            check_picks(picks, inputs, p, layer["topk"])
            p.set_topk_local(picks)  # the reference attends what the indexer picked
            assert max_rel_error(graph_out, p.reference()) <= 1e-2, lens


@needs_gpu
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused op captured nothing
def test_the_op_is_refused_in_a_capture_graphsafe_did_not_start():
    layer = LAYERS["C1"]
    p = problem(layer, [10, 20])
    args = ds4.problem_tensors(p)
    arena = gs.Arena(gs.TorchCudaBackend(), gs.ArenaOptions(report_findings=False))
    run(args, layer)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with ds4.use_arena(arena), pytest.raises(gs.CaptureStateError, match="outside graphsafe"):
        with torch.cuda.graph(g, stream=side):
            run(args, layer)
