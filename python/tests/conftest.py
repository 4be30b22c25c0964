"""Shared fixtures. The host-backend tests need only NumPy; the torch/CUDA ones skip with a reason
when torch or a CUDA device is missing."""
import pytest

import graphsafe as gs


@pytest.fixture
def host():
    """A host-backend arena and its stream."""
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(report_findings=False))
    return arena, gs.HostStream()


@pytest.fixture
def decode_symbols():
    """The motivating decode sizes: batch B, per-request lengths L (capacity 64)."""
    B = gs.Symbol.fixed("batch")
    L = gs.Symbol.batch("seq_lens", B, capacity=64)
    return B, L
