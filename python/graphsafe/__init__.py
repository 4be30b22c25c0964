"""graphsafe: graph-safe GPU workspaces for CUDA Graph capture and replay.

    import graphsafe as gs
    B = gs.Symbol.fixed("batch")
    L = gs.Symbol.batch("seq_lens", B, capacity=4096)
    rows = gs.sum_over(L, lambda l: gs.ceil_div(l, 4))

    arena = gs.Arena(gs.CudaBackend())                # or gs.HostBackend() without a GPU
    b = gs.Bindings({B: 2, L: [3, 5]})
    with arena.capture(b) as cap:                     # on torch's current stream when torch is imported
        ws = arena.request("kv", rows * 512, gs.capacity_bound, b, element_bytes=2)
        kv = ws.as_tensor("bfloat16")                 # zero copy (DLPack)
        ...
    b[L] = [15, 17]                                   # sequences grew
    cap.graph.replay(b)                               # guards first: GuardFailure before launch if unsafe

PyTorch is optional: nothing here imports it; when the program has imported it, the CUDA backend's
default stream is torch's current stream and Workspace.as_tensor returns torch tensors.
See docs/python.md.
"""
from __future__ import annotations

import builtins as _builtins
import sys as _sys

from ._graphsafe import (  # noqa: F401
    Arena,
    ArenaOptions,
    Backend,
    Bindings,
    Capture,
    CaptureFamily,
    CapturedGraph,
    CapacityBound,
    CaptureStateError,
    CudaBackend,
    CudaError,
    Error,
    ExactAtCapture,
    Extent,
    GuardFailure,
    GuardViolation,
    HostBackend,
    HostStream,
    InvalidArgumentError,
    CapacityError,
    OutOfMemoryError,
    Plan,
    PolicyRefusal,
    SizeOverflowError,
    SizingDecision,
    SizingPolicy,
    StaticQueryBound,
    Symbol,
    TorchCudaBackend,
    UnboundSymbolError,
    Workspace,
    capacity_bound,
    capture,
    ceil_div,
    cuda_device_count,
    debug,
    default_host_stream,
    exact_at_capture,
    floor_div,
    max_over,
    round_up,
    static_query_bound,
    sum_over,
    torch_allocator_stats,
)
from ._graphsafe import max, min  # noqa: F401,A004  (extent max/min; not in __all__)

__version__ = "0.1.0"

def _dtype_bytes_and_names(dtype):
    """(itemsize, torch dtype or None, numpy dtype or None) for a dtype given as a string, a torch
    dtype or a numpy dtype."""
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size(), dtype, None
    if isinstance(dtype, str) and torch is not None and hasattr(torch, dtype):
        t = getattr(torch, dtype)
        if isinstance(t, torch.dtype):
            return torch.empty((), dtype=t).element_size(), t, None
    import numpy as np

    d = np.dtype(dtype)
    return d.itemsize, None, d


def _shape_for(ws, itemsize, shape):
    if ws.bytes % itemsize:
        raise InvalidArgumentError(
            f"graphsafe: workspace '{ws.name}' has {ws.bytes} bytes, not a multiple of the element size {itemsize}")
    capacity = ws.bytes // itemsize
    if shape is None:
        # The reserved elements (count of element_bytes each), in elements of this dtype.
        return (_builtins.min(ws.count * ws.element_bytes // itemsize, capacity),)
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        if s < 0:
            raise InvalidArgumentError(f"graphsafe: shape {shape} has a negative dimension")
        n *= s
    if n > capacity:
        raise InvalidArgumentError(
            f"graphsafe: shape {shape} needs {n} elements of {itemsize} bytes ({n * itemsize} bytes) but workspace "
            f"'{ws.name}' has {ws.bytes} bytes ({capacity} elements); lay it out with ws.count")
    return shape


def _as_tensor(self, dtype="uint8", shape=None):
    """A torch tensor over the workspace's memory (zero copy, through DLPack), of `dtype` and
    `shape` (default: the reserved elements, ws.count, as a 1-d tensor). The tensor keeps the
    workspace alive; release() refuses while a view lives."""
    import torch

    itemsize, tdtype, npdtype = _dtype_bytes_and_names(dtype)
    if tdtype is None:
        tdtype = torch.from_numpy(__import__("numpy").empty(0, dtype=npdtype)).dtype
    shape = _shape_for(self, itemsize, shape)
    n = 1
    for s in shape:
        n *= s
    raw = torch.from_dlpack(self)
    return raw.view(tdtype)[:n].view(shape)


def _as_array(self, dtype="uint8", shape=None):
    """A NumPy array over a host workspace's memory (zero copy, through DLPack)."""
    import numpy as np

    if self.device >= 0:
        raise InvalidArgumentError(
            f"graphsafe: workspace '{self.name}' is CUDA memory; use as_tensor (torch) for device workspaces")
    d = np.dtype(dtype)
    shape = _shape_for(self, d.itemsize, shape)
    n = 1
    for s in shape:
        n *= s
    return np.from_dlpack(self).view(d)[:n].reshape(shape)


Workspace.as_tensor = _as_tensor
Workspace.as_array = _as_array



def capture_checks(always=False):
    """A context manager that flags, with the Python file and line, raw CUDA allocations, host
    syncs and device-to-host copies made while the current stream is capturing (PyTorch code; see
    graphsafe._capture_checks). Imports torch when called, never at `import graphsafe`."""
    from ._capture_checks import CaptureChecks

    return CaptureChecks(always)

from ._torch_allocator import torch_mem_pool  # noqa: E402,F401

__all__ = [n for n in dir() if not n.startswith("_") and n not in ("max", "min")]
