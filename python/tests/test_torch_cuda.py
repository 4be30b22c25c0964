"""The CUDA backend with PyTorch: zero-copy tensors, torch's current stream, capture and guarded
replay of torch ops writing into graphsafe workspaces, checked against eager torch. Skipped with the
reason when torch or a CUDA device is missing."""
import pytest

import graphsafe as gs

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available() or gs.cuda_device_count() == 0:
    pytest.skip("no CUDA device", allow_module_level=True)


@pytest.fixture
def arena():
    a = gs.Arena(gs.CudaBackend(), gs.ArenaOptions(report_findings=False))
    a.reserve(32 << 20)
    return a


@pytest.fixture
def sym():
    B = gs.Symbol.fixed("requests")
    L = gs.Symbol.batch("seq_lens", B, capacity=4096)
    return B, L


def test_a_workspace_is_a_torch_tensor_without_a_copy(arena):
    ws = arena.request("buf", 4096, gs.capacity_bound, None, element_bytes=4)
    raw = torch.from_dlpack(ws)
    assert raw.device.type == "cuda" and raw.dtype == torch.uint8 and raw.numel() == ws.bytes
    t = ws.as_tensor(torch.float32, (64, 64))
    assert raw.data_ptr() == t.data_ptr() == ws.ptr
    t.copy_(torch.arange(4096, dtype=torch.float32, device="cuda").view(64, 64))
    assert torch.equal(raw[:16].view(torch.float32), torch.arange(4, dtype=torch.float32, device="cuda"))
    assert ws.as_tensor("bfloat16").numel() == 8192  # the reserved bytes, in bfloat16 elements
    with pytest.raises(gs.CaptureStateError):
        ws.release()
    del raw, t
    ws.release()


def test_the_default_stream_is_torchs_current_stream(arena, sym):
    B, _ = sym
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with arena.capture({B: 1}) as cap:
            assert torch.cuda.is_current_stream_capturing()  # graphsafe began capture on `side`
    assert not torch.cuda.is_current_stream_capturing()
    cap.graph.replay({B: 1}, side)
    side.synchronize()


def step(arena, policy, b, B, L, x, lens_dev):
    """A decode step in torch ops that allocate nothing: out[r] = x[r] * ceil(L[r] / 4) for each
    request, read from device lengths at run time."""
    need = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))  # the workspace the engine sized from lengths
    ws = arena.request("scratch", need * 64, policy, b, element_bytes=4)
    out_ws = arena.request("out", B * 64, gs.capacity_bound, b, element_bytes=4)
    out = out_ws.as_tensor(torch.float32, (b[B], 64))
    rows = ws.as_tensor(torch.float32)
    n = b[B]
    scale = rows[:n]
    # Only out= / in-place ops: the ceil division lands in the workspace, then scales x.
    scale.copy_(lens_dev)
    scale.add_(3).div_(4, rounding_mode="floor")
    torch.mul(x, scale.view(n, 1), out=out)
    return out


def eager(x, lens):
    return x * torch.tensor([(l + 3) // 4 for l in lens], dtype=torch.float32, device="cuda").view(-1, 1)


def test_capture_and_replay_of_torch_ops_match_eager_as_lengths_grow(arena, sym):
    B, L = sym
    b = gs.Bindings({B: 4, L: [100, 7, 300, 9]})
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(4, 64, device="cuda")
        lens_dev = torch.tensor(b[L], dtype=torch.float32, device="cuda")
        with arena.capture(b) as cap:
            out = step(arena, gs.capacity_bound, b, B, L, x, lens_dev)
        for lens in ([100, 7, 300, 9], [4096, 1, 2, 3], [500, 500, 500, 500]):
            b[L] = lens
            lens_dev.copy_(torch.tensor(lens, dtype=torch.float32))
            x.copy_(torch.randn(4, 64))
            out.fill_(float("nan"))
            cap.graph.replay(b)
            torch.testing.assert_close(out, eager(x, lens), rtol=0, atol=0)
    side.synchronize()


def test_a_replay_that_outgrew_exact_at_capture_is_refused_before_launch(arena, sym):
    B, L = sym
    b = gs.Bindings({B: 4, L: [100, 7, 300, 9]})
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.randn(4, 64, device="cuda")
        lens_dev = torch.tensor(b[L], dtype=torch.float32, device="cuda")
        with arena.capture(b) as cap:
            out = step(arena, gs.exact_at_capture, b, B, L, x, lens_dev)
        b[L] = [101, 8, 301, 10]  # each grows by one: 2 more rows
        out.fill_(-7.0)
        with pytest.raises(gs.GuardFailure) as e:
            cap.graph.replay(b)
        torch.cuda.synchronize()
        assert bool((out == -7.0).all())  # the graph never ran
    (v,) = e.value.violations
    assert v.request == "scratch" and v.policy == "exact-at-capture"
    assert v.required == (26 + 2 + 76 + 3) * 64 and v.reserved == (25 + 2 + 75 + 3) * 64
    assert "seq_lens = [101, 8, 301, 10]" in v.symbols and v.site.startswith("test_torch_cuda.py:")


def test_bindings_take_host_tensors_and_refuse_device_tensors(sym):
    B, L = sym
    b = gs.Bindings({B: 3})
    b[L] = torch.tensor([5, 6, 7], dtype=torch.int32)
    assert b[L] == [5, 6, 7]
    b[L] = torch.tensor([8, 9, 10])
    assert b[L] == [8, 9, 10]
    with pytest.raises(gs.InvalidArgumentError, match="device memory"):
        b[L] = torch.tensor([1, 2, 3], device="cuda")


def test_a_bad_device_is_a_cuda_error_with_its_code():
    with pytest.raises(gs.CudaError) as e:
        gs.CudaBackend(device=gs.cuda_device_count() + 7)
    assert e.value.code != 0


def test_torch_backend_captures_through_torch_so_torch_may_allocate_inside(sym):
    B, L = sym
    arena = gs.Arena(gs.TorchCudaBackend(), gs.ArenaOptions(report_findings=False))
    assert arena.backend.name == "torch-cuda"
    b = gs.Bindings({B: 4, L: [100, 7, 300, 9]})
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        arena.reserve(16 << 20)
        x = torch.randn(4, 64, device="cuda")
        w = torch.randn(64, 64, device="cuda")
        lens_dev = torch.tensor(b[L], dtype=torch.float32, device="cuda")
        x @ w  # warm-up: cuBLAS creates its handle on first use, which a capture cannot hold
        with arena.capture(b) as cap:
            assert torch.cuda.is_current_stream_capturing()
            rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
            ws = arena.request("scratch", rows * 64, gs.exact_at_capture, b, element_bytes=4)
            scale = ws.as_tensor(torch.float32)[:4]
            scale.copy_(lens_dev).add_(3).div_(4, rounding_mode="floor")
            y = torch.relu(x @ w) * scale.view(4, 1)   # temporaries from the torch graph's pool
        g = cap.graph
        for lens in ([100, 7, 300, 9], [90, 5, 250, 1]):  # needs no more than captured: replays
            b[L] = lens
            lens_dev.copy_(torch.tensor(lens, dtype=torch.float32))
            x.copy_(torch.randn(4, 64))
            g.replay(b)
            torch.testing.assert_close(y, torch.relu(x @ w) * eager(torch.ones(4, 1, device="cuda"), lens))
        before = y.clone()
        x.copy_(torch.randn(4, 64))
        b[L] = [101, 8, 301, 10]
        with pytest.raises(gs.GuardFailure) as e:
            g.replay(b)
        assert torch.equal(y, before)  # refused before launch: y still holds the last replay's result
    side.synchronize()
    assert e.value.violations[0].request == "scratch"
    del g, cap
    assert arena.stats()["live_graphs"] == 0
