"""Capture and replay on the host backend (no GPU): the motivating decode step with NumPy arrays
as device memory. Each replay is compared with an eager run of the same step (the reference)."""
import gc
import math

import numpy as np
import pytest

import graphsafe as gs

CAPACITY = 64


def rows_of(lens):
    return [math.ceil(l / 4) for l in lens]


def eager_step(lens):
    """The reference: request b owns ceil(L[b]/4) rows, each holding b+1; the output is the row sum
    of each request."""
    return np.array([(b + 1) * r for b, r in enumerate(rows_of(lens))], dtype=np.int64)


class DecodeStep:
    """A decode step as an engine writes it: the workspace is sized from the bindings, the "kernel"
    (a closure on the host stream) reads the lengths from "device" memory (`lens_dev`, updated before
    every replay) and writes into the workspace it was given at capture."""

    def __init__(self, arena, stream, B, L, policy):
        self.arena, self.stream, self.B, self.L, self.policy = arena, stream, B, L, policy
        self.rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
        self.lens_dev = np.zeros(8, dtype=np.int64)
        self.out = np.full(8, -1, dtype=np.int64)

    def __call__(self, b):
        ws = self.arena.request("rows", self.rows, self.policy, b, element_bytes=8, stream=self.stream)
        view = ws.as_array("int64")  # frozen into the closure, as a kernel argument is
        lens_dev, out, n = self.lens_dev, self.out, b[self.B]

        def kernel():
            rows = rows_of(lens_dev[:n])
            starts = np.concatenate([[0], np.cumsum(rows)])
            view[: starts[-1]] = np.repeat(np.arange(1, n + 1), rows)  # overflows a short workspace
            out[:n] = [view[starts[i]: starts[i + 1]].sum() for i in range(n)]

        self.stream.launch(kernel)

    def set_lens(self, b, lens):
        b[self.L] = lens
        self.lens_dev[: len(lens)] = lens


def test_capacity_bound_graph_replays_correctly_as_sequences_grow(host, decode_symbols):
    arena, s = host
    B, L = decode_symbols
    step = DecodeStep(arena, s, B, L, gs.capacity_bound)
    b = gs.Bindings({B: 2})
    step.set_lens(b, [3, 5])
    with arena.capture(b, stream=s) as cap:
        step(b)
    g = cap.graph
    assert g.plan.guard_count == 0  # capacity_bound is replay-safe: no guard to check
    assert g.plan.entries[0]["reserved"] == 2 * math.ceil(CAPACITY / 4)
    for lens in ([3, 5], [15, 17], [64, 64], [1, 40]):
        step.set_lens(b, lens)
        step.out[:] = -1
        g.replay(b, s)
        np.testing.assert_array_equal(step.out[:2], eager_step(lens))


def test_exact_at_capture_replay_that_outgrew_capture_is_refused_before_launch(host, decode_symbols):
    arena, s = host
    B, L = decode_symbols
    step = DecodeStep(arena, s, B, L, gs.exact_at_capture)
    b = gs.Bindings({B: 2})
    step.set_lens(b, [3, 5])
    with arena.capture(b, stream=s) as cap:
        step(b)  # the request's line is the site the violation names
    g = cap.graph
    assert g.plan.guard_count == 1
    assert g.plan.entries[0]["reserved"] == sum(rows_of([3, 5]))
    site_line = DecodeStep.__call__.__code__.co_firstlineno + 1

    step.set_lens(b, [2, 4])  # needs less: allowed, and correct
    g.replay(b, s)
    np.testing.assert_array_equal(step.out[:2], eager_step([2, 4]))

    step.set_lens(b, [15, 17])
    step.out[:] = -1
    with pytest.raises(gs.GuardFailure) as e:
        g.replay(b, s)
    assert (step.out == -1).all()  # refused before launch: the kernel never ran
    (v,) = e.value.violations
    assert v.request == "rows" and v.policy == "exact-at-capture"
    assert v.required == sum(rows_of([15, 17])) and v.reserved == sum(rows_of([3, 5]))
    assert v.site.startswith(f"test_host.py:{site_line} ")
    assert "seq_lens = [15, 17]" in v.symbols and "captured [3, 5]" in v.symbols
    assert v.to_dict()["required"] == v.required
    assert g.check(b)[0].required == v.required  # the same check without replaying

    # What the guard prevented: the frozen workspace is too short for these lengths.
    with pytest.raises(ValueError):
        g.replay_unguarded_for_testing(s)


def test_a_refused_replay_recaptures_at_the_bucket_the_callback_returns(host, decode_symbols):
    arena, s = host
    B, L = decode_symbols
    step = DecodeStep(arena, s, B, L, gs.exact_at_capture)
    b = gs.Bindings({B: 2})
    step.set_lens(b, [3, 5])
    asked = []

    def bucket(refused):  # round every length up to a multiple of 32
        asked.append(refused[L])
        return gs.Bindings({B: 2, L: [-(-x // 32) * 32 for x in refused[L]]})

    g = gs.capture(arena, step, b, stream=s, recapture=bucket)
    step.set_lens(b, [15, 40])
    g.replay(b, s)
    assert asked == [[15, 40]] and g.recaptures == 1
    np.testing.assert_array_equal(step.out[:2], eager_step([15, 40]))
    assert g.plan.captured_bindings[L] == [32, 64]


def test_graphs_of_a_family_share_one_region_sized_by_the_largest_plan(host):
    arena, s = host
    B = gs.Symbol.fixed("batch")
    fam = arena.family("decode")
    graphs = []
    for batch in (2, 8, 4):
        with arena.capture({B: batch}, stream=s, family=fam) as cap:
            arena.request("x", B * 1024, gs.capacity_bound, {B: batch}, element_bytes=4, stream=s)
        graphs.append(cap.graph)
    plans = [g.reserved_bytes for g in graphs]
    assert fam.graphs == 3 and fam.largest_plan_bytes == max(plans) and fam.sum_of_plan_bytes == sum(plans)
    assert fam.region_bytes == max(plans) < sum(plans)
    assert arena.stats()["families"] == 1 and arena.stats()["live_graphs"] == 3
    del graphs, cap
    gc.collect()
    assert arena.stats()["live_graphs"] == 0


def test_an_exception_in_the_capture_block_abandons_the_capture(host, decode_symbols):
    arena, s = host
    B, _ = decode_symbols
    with pytest.raises(KeyError):
        with arena.capture({B: 2}, stream=s) as cap:
            arena.request("x", B * 64, gs.capacity_bound, {B: 2}, stream=s)
            assert s.capturing
            raise KeyError("engine bug")
    assert not s.capturing
    stats = arena.stats()
    assert stats["active_captures"] == 0 and stats["live_graphs"] == 0 and stats["region_bytes"] == 0
    with pytest.raises(gs.CaptureStateError):
        cap.graph
    with arena.capture({B: 2}, stream=s) as again:  # the stream is usable again
        pass
    assert again.graph.plan.entries == []


def test_an_unbounded_request_under_capture_is_refused_when_asked(decode_symbols):
    B, L = decode_symbols
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(refuse_unsafe_capture=True, report_findings=False))
    s = gs.HostStream()
    with pytest.raises(gs.PolicyRefusal, match="seq_lens"):
        with arena.capture({B: 2, L: [3, 5]}, stream=s):
            arena.request("rows", gs.sum_over(L, lambda l: l), gs.exact_at_capture, {B: 2, L: [3, 5]}, stream=s)
    assert arena.stats()["active_captures"] == 0


def test_sized_dimension_is_guarded_like_a_request(host, decode_symbols):
    arena, s = host
    B, L = decode_symbols
    b = gs.Bindings({B: 2, L: [3, 5]})
    offsets = []
    with arena.capture(b, stream=s) as cap:
        offsets.append(arena.dimension("kv_offset", gs.sum_over(L, lambda l: l), gs.exact_at_capture, b, stream=s))
    assert offsets == [8]
    b[L] = [9, 9]
    with pytest.raises(gs.GuardFailure) as e:
        cap.graph.replay(b, s)
    assert e.value.violations[0].request == "kv_offset" and e.value.violations[0].required == 18


def test_debug_mode_reports_findings_as_dicts_with_the_python_site(decode_symbols):
    B, L = decode_symbols
    gs.debug.clear_findings()
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(debug=True, report_findings=False))
    s = gs.HostStream()
    b = {B: 2, L: [3, 5]}
    with arena.capture(b, stream=s):
        arena.request("rows", gs.sum_over(L, lambda l: l), gs.exact_at_capture, b, stream=s)
        arena.allocate(100, stream=s)  # an opaque (size-only) request during capture
    report = gs.debug.report()
    kinds = {f["kind"]: f for f in report["findings"]}
    assert "unbounded-dynamic-size" in kinds and "opaque-request-in-capture" in kinds
    assert kinds["unbounded-dynamic-size"]["request"] == "rows"
    assert kinds["unbounded-dynamic-size"]["site"].startswith("test_host.py:")
    assert report["finding_count"] == len(gs.debug.findings()) >= 2
    gs.debug.clear_findings()
    assert gs.debug.finding_count() == 0


def test_host_workspace_exports_dlpack_without_a_copy(host):
    arena, s = host
    ws = arena.request("buf", 256, gs.capacity_bound, None, element_bytes=4, stream=s)
    assert ws.__dlpack_device__() == (1, 0) and ws.device == -1
    a = ws.as_array("float32")
    b = np.from_dlpack(ws)
    assert a.shape == (256,) and b.nbytes == ws.bytes
    assert a.ctypes.data == b.ctypes.data == ws.ptr  # same memory
    a[:] = np.arange(256, dtype=np.float32)
    np.testing.assert_array_equal(b.view(np.float32)[:256], np.arange(256, dtype=np.float32))
    assert ws.as_array("int32", (16, 16)).shape == (16, 16)
    with pytest.raises(gs.InvalidArgumentError, match="257"):
        ws.as_array("float32", 257)
    assert ws.live_views == 2
    with pytest.raises(gs.CaptureStateError, match="live"):
        ws.release()  # a view would dangle
    del a, b
    gc.collect()
    assert ws.live_views == 0
    eager = arena.stats()["eager_bytes"]
    ws.release()
    assert arena.stats()["eager_bytes"] < eager and not ws
    with pytest.raises(gs.CaptureStateError, match="released"):
        np.from_dlpack(ws)


def test_streams_of_the_wrong_backend_and_memory_limits_are_errors(decode_symbols):
    B, _ = decode_symbols
    arena = gs.Arena(gs.HostBackend(limit_bytes=1 << 20), gs.ArenaOptions(growth_bytes=1 << 16))
    with pytest.raises(gs.InvalidArgumentError, match="HostStream"):
        arena.request("x", 16, stream=12345)
    with pytest.raises(gs.OutOfMemoryError):
        arena.request("big", B * (1 << 20), gs.capacity_bound, {B: 4})
    assert arena.stats()["eager_blocks"] == 0


def test_default_stream_is_the_process_host_stream(host):
    arena, _ = host
    seen = []
    with arena.capture({}) as cap:
        gs.default_host_stream().launch(lambda: seen.append(1))
    assert seen == []  # recorded, not run
    cap.graph.replay({})
    cap.graph.replay({})
    assert seen == [1, 1]


def test_a_graph_keeps_its_arena_and_backend_alive():
    ran = []

    def make():  # the arena, its backend and the capture stream go out of scope here
        arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(report_findings=False))
        s = gs.HostStream()
        with arena.capture({}, stream=s) as cap:
            ws = arena.request("x", 1024, stream=s)
            view = ws.as_array("uint8")
            view[:] = 1
            s.launch(lambda: ran.append(int(view.sum())))
        return cap.graph

    g = make()
    gc.collect()
    g.replay({}, gs.HostStream())
    assert ran == [1024]
    assert g.family.graphs == 1
    del g
    gc.collect()


@pytest.mark.skipif(gs.cuda_device_count() > 0, reason="a CUDA device is visible (test_torch_cuda covers CudaError)")
def test_without_a_device_the_cuda_backend_raises_cuda_error_with_its_code():
    with pytest.raises(gs.CudaError) as e:
        gs.CudaBackend()
    assert e.value.code != 0 and "cuda" in str(e.value).lower()
    assert isinstance(e.value, gs.Error) and isinstance(e.value, RuntimeError)


def test_probe_reports_what_two_captures_froze_differently(decode_symbols):
    B, L = decode_symbols
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(report_findings=False))
    s = gs.HostStream()
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))

    def step(b):
        arena.request("exact_rows", rows, gs.exact_at_capture, b, element_bytes=8, stream=s)
        arena.request("bounded_rows", rows, gs.capacity_bound, b, element_bytes=8, stream=s)

    found = gs.debug.probe(arena, step, {B: 2, L: [3, 5]}, {B: 2, L: [30, 50]}, s)
    about = {f["request"] for f in found if f["kind"] == "probe-difference"}
    assert "exact_rows" in about and "bounded_rows" not in about
    with pytest.raises(gs.CaptureStateError):
        with arena.capture({B: 2}, stream=s):
            with arena.capture({B: 2}, stream=s):  # a capture inside a capture of the same stream
                pass


class Bucket(gs.SizingPolicy):
    """A policy written in Python: the need rounded up to a multiple of `step` (not replay-safe: the
    graph's guard refuses a replay past the bucket)."""

    def __init__(self, step):
        super().__init__(f"bucket-{step}")
        self.step, self.calls = step, []

    def size(self, request, need, bindings, capturing):
        self.calls.append((request, capturing))
        n = need.evaluate(bindings)
        return gs.SizingDecision(-(-n // self.step) * self.step, False, f"{n} rounded up to {self.step}")


def test_a_python_policy_sizes_requests_and_its_guard_refuses_past_the_bucket(host, decode_symbols):
    arena, s = host
    B, L = decode_symbols
    policy = Bucket(8)
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))
    b = gs.Bindings({B: 2, L: [3, 5]})  # 3 rows -> 8
    with arena.capture(b, stream=s) as cap:
        arena.request("rows", rows, policy, b, element_bytes=8, stream=s)
    (entry,) = cap.graph.plan.entries
    assert (entry["policy"], entry["reserved"], entry["note"]) == ("bucket-8", 8, "3 rounded up to 8")
    assert policy.calls == [("rows", True)] and policy.name == "bucket-8"
    b[L] = [15, 16]  # 8 rows: inside the bucket
    cap.graph.replay(b, s)
    b[L] = [15, 17]  # 9 rows
    with pytest.raises(gs.GuardFailure) as e:
        cap.graph.replay(b, s)
    assert e.value.violations[0].policy == "bucket-8" and e.value.violations[0].required == 9


def test_an_error_raised_by_a_python_policy_reaches_the_caller_and_abandons_the_capture(host, decode_symbols):
    arena, s = host
    B, _ = decode_symbols

    class Broken(gs.SizingPolicy):
        def __init__(self):
            super().__init__("broken")

        def size(self, request, need, bindings, capturing):
            raise ZeroDivisionError("policy bug")

    with pytest.raises(ZeroDivisionError, match="policy bug"):
        with arena.capture({B: 2}, stream=s):
            arena.request("x", B * 8, Broken(), {B: 2}, stream=s)
    assert arena.stats()["active_captures"] == 0 and not s.capturing
