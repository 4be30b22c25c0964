"""gs.capture_checks(): raw allocations, host syncs and D2H copies flagged with the Python line, in a
torch.cuda.graph capture and (always=True) in an eager step. Needs torch and a CUDA device."""
import sys

import pytest

import graphsafe as gs

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def line_of(marker):
    """file:line of the line of this file whose comment holds `marker`."""
    src = open(__file__).read().splitlines()
    (n,) = [i + 1 for i, l in enumerate(src) if "#" in l and marker in l.split("#", 1)[1]]
    return f"test_capture_checks.py:{n} "


def test_an_eager_step_under_always_shows_what_its_capture_would_hit():
    x = torch.randn(8, 8, device="cuda")
    h = torch.empty(8, 8, device="cuda")
    gs.debug.clear_findings()
    with gs.capture_checks(always=True) as checks:
        torch.mul(x, 2.0, out=h)           # QUIET-out: nothing allocated
        h.relu_()                          # QUIET-inplace
        v = h.view(64)                     # QUIET-view
        y = x @ h                          # MARK-alloc
        n = int(x.sum().item() > 0)        # MARK-sync
        c = x.cpu()                        # MARK-d2h
        torch.cuda.synchronize()           # MARK-cudasync
    kinds = [(f["kind"], f["site"].split("(")[0]) for f in checks.findings]
    assert ("raw-allocation-in-capture", line_of("MARK-alloc")) in kinds
    assert ("host-sync-in-capture", line_of("MARK-sync")) in kinds
    assert ("d2h-copy-in-capture", line_of("MARK-d2h")) in kinds
    assert ("host-sync-in-capture", line_of("MARK-cudasync")) in kinds
    flagged_lines = {site for _, site in kinds}
    for quiet in ("QUIET-out", "QUIET-inplace", "QUIET-view"):
        assert line_of(quiet) not in flagged_lines
    assert len(gs.debug.findings()) >= 4  # also in graphsafe's report
    assert torch.cuda.synchronize.__name__ == "synchronize"  # patches undone
    del v, y, n, c


def test_a_torch_cuda_graph_capture_flags_the_allocating_line_only():
    x = torch.randn(16, 16, device="cuda")
    h = torch.empty(16, 16, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with gs.capture_checks() as checks:
            with torch.cuda.graph(g, stream=s):
                torch.mul(x, 3.0, out=h)
                y = torch.relu(h)          # MARK-graph-alloc
            z = x + 1                      # outside the capture: not flagged
    torch.cuda.synchronize()
    assert [(f["kind"], f["site"].split("(")[0]) for f in checks.findings] == [
        ("raw-allocation-in-capture", line_of("MARK-graph-alloc"))]
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.relu(x * 3.0))
    del z
    assert "graphsafe._capture_checks" in sys.modules
