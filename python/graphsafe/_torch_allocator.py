"""The arena as PyTorch's allocator: torch.cuda.MemPool objects whose segments come from a graphsafe
arena, through the C symbols graphsafe_torch_alloc / graphsafe_torch_free that the extension module
exports (torch.cuda.memory.CUDAPluggableAllocator loads them from it).

    arena = gs.Arena(gs.CudaBackend())
    pool = gs.torch_mem_pool(arena)
    with torch.cuda.graph(g, pool=pool.id):          # torch's capture: segments from the arena
        y = model(x)

    backend = gs.TorchCudaBackend(pool="graphsafe")  # graphsafe's capture: segments are the capture's
    arena = gs.Arena(backend)                        # opaque requests, with their Python lines
    gs.torch_mem_pool(arena)
    with torch.cuda.stream(side), arena.capture(b) as cap:
        y = model(x)

torch asks for segments (2 MiB for small tensors, rounded sizes for large ones) and places tensors in
them itself; graphsafe sees one request per segment. Imports torch when called.
"""
from __future__ import annotations

from . import _graphsafe as _C

_ALLOC = "graphsafe_torch_alloc"
_FREE = "graphsafe_torch_free"
_pluggable = None


def _allocator():
    """The process' CUDAPluggableAllocator over the extension's symbols (torch loads a library's
    symbols once; every pool shares this allocator and the symbols route by device)."""
    global _pluggable
    if _pluggable is None:
        import torch

        _pluggable = torch.cuda.memory.CUDAPluggableAllocator(_C.__file__, _ALLOC, _FREE)
    return _pluggable


def _skip_prefixes():
    """Files whose frames are torch's or graphsafe's own, not the line that made torch allocate."""
    import contextlib
    import os

    import torch

    return [os.path.dirname(torch.__file__) + os.sep, os.path.dirname(_C.__file__) + os.sep, contextlib.__file__]


def _new_pool(device):
    import torch

    with torch.cuda.device(device):
        return torch.cuda.MemPool(_allocator().allocator())


def torch_mem_pool(arena, sites=True):
    """A torch.cuda.MemPool whose segments come from `arena` (on CudaBackend or TorchCudaBackend):
    pass `pool.id` to torch.cuda.graph(pool=...) or use torch.cuda.use_mem_pool(pool). One arena
    serves torch on each device: a later call with another arena takes over once torch holds no
    segment of the first. `sites` records the Python stack of each segment (the GIL is taken for
    it, in the allocator, when torch asks for a segment). See torch_allocator_stats()."""
    if arena.backend.name not in ("cuda", "torch-cuda"):
        raise _C.InvalidArgumentError(
            f"graphsafe: torch_mem_pool needs an arena on CudaBackend or TorchCudaBackend; this one is on the "
            f"'{arena.backend.name}' backend")
    return _new_pool(_C._torch_allocator_register(arena, sites, _skip_prefixes()))


def _capture_pool(device):
    """A fresh pool for one capture of a TorchCudaBackend(pool='graphsafe') arena."""
    return _new_pool(device)


def allocator_symbols():
    """(library path, alloc symbol, free symbol): the arguments of CUDAPluggableAllocator."""
    return _C.__file__, _ALLOC, _FREE
