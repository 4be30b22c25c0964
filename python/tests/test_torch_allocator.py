"""The arena as PyTorch's allocator (graphsafe.torch_mem_pool). The host part calls the exported C
symbols as torch's CUDAPluggableAllocator does (through ctypes, on a host-backend arena registered
for device -1) and runs in CI; the GPU part runs torch itself and skips, saying why, without torch or
a CUDA device."""
import ctypes
import gc

import numpy as np
import pytest

import graphsafe as gs
from graphsafe import _graphsafe, _torch_allocator

SEGMENT = 2 << 20  # torch's small-pool segment


@pytest.fixture
def symbols():
    lib = ctypes.CDLL(_graphsafe.__file__)  # the library CUDAPluggableAllocator loads
    alloc = lib.graphsafe_torch_alloc
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    free = lib.graphsafe_torch_free
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free


@pytest.fixture
def host_served(symbols):
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(report_findings=False))
    arena.reserve(16 << 20)
    assert _graphsafe._torch_allocator_register(arena, True) == -1
    yield arena
    for seg in gs.torch_allocator_stats(-1)["segments"]:  # what a failed test left behind
        symbols[1](seg["ptr"], seg["bytes"], -1, None)


def test_the_symbols_torch_loads_are_exported():
    path, alloc, free = _torch_allocator.allocator_symbols()
    lib = ctypes.CDLL(path)
    assert hasattr(lib, alloc) and hasattr(lib, free)


def test_an_eager_segment_comes_from_the_arena_and_goes_back(symbols, host_served):
    alloc, free = symbols
    arena = host_served
    before = arena.stats()["eager_bytes"]
    p = alloc(SEGMENT, -1, None)
    assert p, gs.torch_allocator_stats(-1)["last_error"]
    assert arena.stats()["eager_bytes"] == before + SEGMENT  # the arena's block, not a malloc
    # The memory is usable for its whole size.
    buf = (ctypes.c_uint8 * SEGMENT).from_address(p)
    np.frombuffer(buf, dtype=np.uint8)[:] = 7
    assert int(np.frombuffer(buf, dtype=np.uint8).sum()) == 7 * SEGMENT
    st = gs.torch_allocator_stats(-1)
    assert (st["allocs"], st["eager_allocs"], st["captured_allocs"], st["bytes_in_use"]) == (1, 1, 0, SEGMENT)
    (seg,) = st["segments"]
    assert seg["ptr"] == p and seg["bytes"] == SEGMENT and not seg["captured"]
    # The Python line that made the allocation: this test, innermost frame first.
    assert seg["site"].startswith("test_torch_allocator.py:")
    assert "in test_an_eager_segment_comes_from_the_arena_and_goes_back" in seg["traceback"]
    free(p, SEGMENT, -1, None)
    assert arena.stats()["eager_bytes"] == before
    st = gs.torch_allocator_stats(-1)
    assert (st["frees"], st["bytes_in_use"], st["peak_bytes"], st["segments"]) == (1, 0, SEGMENT, [])


def test_failures_return_null_and_say_why(symbols, host_served):
    alloc, free = symbols
    fails = gs.torch_allocator_stats(-1)["failures"]
    assert alloc(-5, -1, None) is None
    st = gs.torch_allocator_stats(-1)
    assert st["failures"] == fails + 1 and "-5 bytes" in st["last_error"]
    # A pointer the allocator never served: recorded, nothing changed, no crash.
    free(0x1000, 256, -1, None)
    st = gs.torch_allocator_stats(-1)
    assert st["failures"] == fails + 2 and "did not serve" in st["last_error"]
    # A device nothing serves: torch gets null (its out-of-memory error) rather than another arena's memory.
    assert alloc(256, 7, None) is None


def test_segments_inside_a_graphsafe_capture_are_opaque_requests_with_their_site(symbols, host_served):
    alloc, free = symbols
    arena = host_served
    B = gs.Symbol.fixed("batch")
    b = gs.Bindings({B: 1})
    with arena.capture(b) as cap:  # the default host stream, the one stream 0 means
        a = alloc(SEGMENT, -1, None)
        free(a, SEGMENT, -1, None)  # torch gave the segment back during the capture
        c = alloc(SEGMENT, -1, None)  # in-capture reuse: the arena hands the same range again
        d = alloc(SEGMENT // 2, -1, None)
    g = cap.graph
    assert a and c == a and d not in (None, a)
    opaque = [e for e in g.plan.entries if e["kind"] == "opaque"]
    assert [e["bytes"] for e in opaque] == [SEGMENT, SEGMENT, SEGMENT // 2]
    assert all(e["site"].startswith("test_torch_allocator.py:") for e in opaque)
    assert all("test_segments_inside_a_graphsafe_capture" in e["site"] for e in opaque)
    # Peak live bytes, not the sum of the requests: the reused range counts once.
    assert g.reserved_bytes == SEGMENT + SEGMENT // 2
    st = gs.torch_allocator_stats(-1)
    assert st["captured_allocs"] == 3 and st["captured_bytes"] == SEGMENT + SEGMENT // 2
    # torch frees the graph's segments when its pool goes: the graph keeps the range until it dies.
    region = arena.stats()["region_bytes"]
    free(c, SEGMENT, -1, None)
    free(d, SEGMENT // 2, -1, None)
    st = gs.torch_allocator_stats(-1)
    assert arena.stats()["region_bytes"] == region and st["failures"] == 0, st["last_error"]
    assert st["bytes_in_use"] == 0 and st["captured_bytes"] == 0
    del g, cap
    gc.collect()


def test_torch_mem_pool_refuses_a_host_arena():
    pytest.importorskip("torch", reason="PyTorch is not installed")
    arena = gs.Arena(gs.HostBackend())
    with pytest.raises(gs.InvalidArgumentError, match="'host' backend"):
        gs.torch_mem_pool(arena)


def test_another_arena_takes_over_only_when_torch_holds_nothing_of_the_first(symbols, host_served):
    alloc, free = symbols
    p = alloc(4096, -1, None)
    other = gs.Arena(gs.HostBackend())
    with pytest.raises(gs.CaptureStateError, match="4096 bytes"):
        _graphsafe._torch_allocator_register(other, True)
    free(p, 4096, -1, None)
    _graphsafe._torch_allocator_register(other, True)
    q = alloc(4096, -1, None)
    assert q and other.stats()["eager_bytes"] == 4096
    free(q, 4096, -1, None)


# ---- GPU: torch itself ----------------------------------------------------------------------------


def _torch_or_skip():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available() or gs.cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    return torch


def test_torch_cuda_graph_takes_its_segments_from_the_arena():
    torch = _torch_or_skip()
    arena = gs.Arena(gs.CudaBackend(), gs.ArenaOptions(report_findings=False))
    arena.reserve(64 << 20)
    pool = gs.torch_mem_pool(arena)
    x = torch.randn(64, 256, device="cuda")
    w = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (x @ w).relu()  # warm-up: cuBLAS's workspace comes from torch's own pool, outside the graph
    torch.cuda.current_stream().wait_stream(side)
    before = gs.torch_allocator_stats(0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id, stream=side):  # the warmed-up stream (cuBLAS workspace)
        y = (x @ w).relu() * 2
    st = gs.torch_allocator_stats(0)
    assert st["failures"] == 0, st["last_error"]
    assert st["external_capture_allocs"] > before["external_capture_allocs"]
    assert any(s["ptr"] <= y.data_ptr() < s["ptr"] + s["bytes"] for s in st["segments"]), hex(y.data_ptr())
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (x @ w).relu() * 2)  # eager torch: the reference
    del y, g, pool
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # torch gave every segment back once the graph and the pool were gone: the arena has them again.
    st = gs.torch_allocator_stats(0)
    assert st["bytes_in_use"] == 0 and st["failures"] == 0, st
    assert arena.stats()["eager_bytes"] == 0


def test_an_arena_capture_records_torchs_segments_with_python_lines_and_replays_right():
    torch = _torch_or_skip()
    backend = gs.TorchCudaBackend(pool="graphsafe")
    arena = gs.Arena(backend, gs.ArenaOptions(report_findings=False))
    arena.reserve(64 << 20)
    gs.torch_mem_pool(arena)
    B = gs.Symbol.fixed("batch")
    b = gs.Bindings({B: 8})
    x = torch.randn(8, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.nn.functional.gelu(x @ w)  # warm-up outside the capture
        with arena.capture(b) as cap:
            h = x @ w  # torch allocates here: an opaque request with this line
            y = torch.nn.functional.gelu(h) + x
    torch.cuda.current_stream().wait_stream(side)
    graph = cap.graph
    opaque = [e for e in graph.plan.entries if e["kind"] == "opaque"]
    assert opaque, graph.plan.report()
    assert all(e["site"].startswith("test_torch_allocator.py:") for e in opaque), [e["site"] for e in opaque]
    st = gs.torch_allocator_stats(0)
    assert st["failures"] == 0, st["last_error"]
    captured = [s for s in st["segments"] if s["captured"]]
    assert len(captured) == len(opaque) and sorted(s["bytes"] for s in captured) == sorted(e["bytes"] for e in opaque)
    # The output lives in the graph's region (a captured segment), so replays write where y reads.
    assert any(s["ptr"] <= y.data_ptr() < s["ptr"] + s["bytes"] for s in captured), hex(y.data_ptr())
    assert graph.reserved_bytes >= max(e["offset"] + e["bytes"] for e in opaque)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay(b, side)
        side.synchronize()
        torch.testing.assert_close(y, torch.nn.functional.gelu(x @ w) + x)
    del y, h, graph, cap
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    st = gs.torch_allocator_stats(0)
    assert st["bytes_in_use"] == 0 and st["failures"] == 0, st
    assert arena.stats()["region_bytes"] == 0  # the graph's region went back when the graph died
