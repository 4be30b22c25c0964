"""DS4 decode attention and the C4 indexer's top-k as torch custom ops, with their workspaces from a
graphsafe arena.

    import graphsafe.ds4                                  # imports torch; registers the ops
    out = torch.ops.graphsafe.ds4_paged_attention(q, sink, seq_lens, topk_local,
                                                  swa_cache, swa_block_table, cmp_cache, cmp_block_table,
                                                  ratio, window, topk, max_model_len, query_tokens)

One layer's paged-direct sparse attention (kernels/ds4, graphsafe/ds4/paged_attention.hpp): the index
build and the attention, whose index lists and split-K partials are arena workspaces sized by
capacity_bound from static shapes, so a captured graph replays them as the sequences grow (the
lengths and picks are read from device memory at run time). Shapes, with R*s_q query rows:

    q [R*s_q, H, 512] bf16 (H 64 or 128)     sink [H] fp32            seq_lens [R] int32
    topk_local [R*s_q, topk] int32 (C4; an empty tensor otherwise)
    swa_cache [blocks, 37440] uint8           swa_block_table [R, blocks per request] int32
    cmp_cache [blocks, stride] uint8, cmp_block_table [R, n] int32 (C4/C128; None for C1)

The attention returns out [R*s_q, H, 512] bf16. `torch.ops.graphsafe.ds4_indexer_topk(q, weights,
seq_lens, index_cache, cmp_block_table, topk, max_model_len)` picks a C4 layer's rows: topk_local
[R, topk] int32 from fp8 queries [R, 64, 128], head weights [R, 64] and the paged fp8 indexer keys.
Each op has a fake kernel that gives torch.compile the output's shape without running anything
(fullgraph tracing, FakeTensor and meta tensors).

Workspaces come from the arena set with `use_arena(arena)`, else from a per-device arena on
TorchCudaBackend (`workspace_arena()`). Inside a CUDA graph, capture with that arena
(`with arena.capture(b):`, a torch.cuda.graph capture on TorchCudaBackend): graphsafe refuses a
workspace requested in a capture it did not start, since nothing would keep that memory for the graph.
"""

import contextlib
import threading
from typing import Optional

import torch

from . import _graphsafe

_native = getattr(_graphsafe, "ds4", None)

# A deterministic host problem (paged fp8 caches, block tables, lengths, picks, queries, sinks) and
# its CPU reference attention: Problem(ratio, window, topk, heads, max_model_len, seq_lens, seed=1,
# fill_to=0), .grow(seq_lens), .reference(); None without the DS4 kernels.
Problem = getattr(_native, "Problem", None)

HEAD_DIM = 512
SWA_BLOCK_TOKENS = 64
_TOKEN_BYTES = 584  # 448 fp8 + 128 B rope bf16 + 8 scale bytes
_STRIDE_ALIGN = 576


def available() -> bool:
    """Whether the extension was built with the DS4 kernels (GRAPHSAFE_BUILD_DS4=ON)."""
    return _native is not None


def _native_ops():
    if _native is None:
        raise RuntimeError("graphsafe was built without the DS4 kernels: reinstall with "
                           "-C cmake.define.GRAPHSAFE_BUILD_DS4=ON (needs nvcc for sm_90a)")
    return _native


def block_stride_bytes(block_tokens: int) -> int:
    """Bytes of one paged-cache block of `block_tokens` fp8_ds_mla rows (graphsafe/ds4/layout.hpp)."""
    raw = block_tokens * _TOKEN_BYTES
    return (raw + _STRIDE_ALIGN - 1) // _STRIDE_ALIGN * _STRIDE_ALIGN


# --- the arena the op takes its workspaces from -------------------------------------------------
_arenas: dict = {}
_arenas_lock = threading.Lock()
_local = threading.local()


def workspace_arena(device: Optional[int] = None):
    """The process' default arena of the op on `device` (the current one when None): TorchCudaBackend,
    so its captures are torch.cuda.graph captures and it runs on torch's current stream."""
    import graphsafe as gs

    if device is None:
        device = torch.cuda.current_device()
    with _arenas_lock:
        arena = _arenas.get(device)
        if arena is None:
            arena = gs.Arena(gs.TorchCudaBackend(device), gs.ArenaOptions(report_findings=False))
            _arenas[device] = arena
        return arena


@contextlib.contextmanager
def use_arena(arena):
    """Within the block (this thread), the op takes its workspaces from `arena`."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(arena)
    try:
        yield arena
    finally:
        stack.pop()


def _current_arena(device: int, op: str):
    stack = getattr(_local, "stack", None)
    arena = stack[-1] if stack else workspace_arena(device)
    # The arena checks the stream's capture only while one of its own captures is under way; with
    # none, a workspace requested in torch's capture would go back to the arena when the op returns
    # and be reused under the graph. Refuse it here.
    if torch.cuda.is_current_stream_capturing() and arena.stats()["active_captures"] == 0:
        raise _graphsafe.CaptureStateError(
            f"graphsafe.ds4.{op}: the current stream is capturing a CUDA graph outside graphsafe; capture with the "
            "op's arena (`with arena.capture(bindings):`, a torch.cuda.graph capture on TorchCudaBackend), which "
            "keeps the op's workspaces for the graph")
    return arena


# --- argument checks, shared by the CUDA kernel and the fake one --------------------------------
def _fail(what: str, got, allowed: str):
    raise ValueError(f"graphsafe.ds4.paged_attention: {what} = {got} is not supported; allowed: {allowed}")


def _check(q, sink, seq_lens, topk_local, swa_cache, swa_block_table, cmp_cache, cmp_block_table, ratio, window,
           topk, max_model_len, query_tokens):
    if ratio not in (1, 4, 128):
        _fail("ratio", ratio, "1 (C1), 4 (C4) or 128 (C128)")
    if not 1 <= query_tokens <= 16:
        _fail("query_tokens", query_tokens, "1 .. 16")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM or q.dtype != torch.bfloat16:
        _fail("q", f"{q.dtype} {tuple(q.shape)}", "bfloat16 [requests * query_tokens, heads, 512]")
    heads = q.shape[1]
    if heads not in (64, 128):
        _fail("q.shape[1] (heads)", heads, "64 or 128 (pad the local heads up)")
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        _fail("seq_lens", f"{seq_lens.dtype} {tuple(seq_lens.shape)}", "int32 [requests]")
    requests = seq_lens.shape[0]
    if q.shape[0] != requests * query_tokens:
        _fail("q.shape[0]", q.shape[0], f"requests * query_tokens = {requests} * {query_tokens}")
    if sink.dtype != torch.float32 or tuple(sink.shape) != (heads,):
        _fail("sink", f"{sink.dtype} {tuple(sink.shape)}", f"float32 [{heads}]")
    if ratio == 4 and (topk_local.dtype != torch.int32 or tuple(topk_local.shape) != (q.shape[0], topk)):
        _fail("topk_local", f"{topk_local.dtype} {tuple(topk_local.shape)}", f"int32 [{q.shape[0]}, topk = {topk}]")
    stride = block_stride_bytes(SWA_BLOCK_TOKENS)
    if swa_cache.dtype != torch.uint8 or swa_cache.dim() != 2 or swa_cache.shape[1] != stride:
        _fail("swa_cache", f"{swa_cache.dtype} {tuple(swa_cache.shape)}", f"uint8 [blocks, {stride}]")
    if swa_block_table.dtype != torch.int32 or swa_block_table.dim() != 2 or swa_block_table.shape[0] != requests:
        _fail("swa_block_table", f"{swa_block_table.dtype} {tuple(swa_block_table.shape)}",
              f"int32 [{requests}, blocks per request]")
    if ratio > 1:
        cstride = block_stride_bytes(256 // ratio)
        if cmp_cache is None or cmp_cache.dtype != torch.uint8 or cmp_cache.dim() != 2 or cmp_cache.shape[1] != cstride:
            got = None if cmp_cache is None else f"{cmp_cache.dtype} {tuple(cmp_cache.shape)}"
            _fail("cmp_cache", got, f"uint8 [blocks, {cstride}] for ratio {ratio}")
        if (cmp_block_table is None or cmp_block_table.dtype != torch.int32 or cmp_block_table.dim() != 2
                or cmp_block_table.shape[0] != requests):
            got = None if cmp_block_table is None else f"{cmp_block_table.dtype} {tuple(cmp_block_table.shape)}"
            _fail("cmp_block_table", got, f"int32 [{requests}, blocks per request] for ratio {ratio}")


@torch.library.custom_op("graphsafe::ds4_paged_attention", mutates_args=(), device_types="cuda")
def paged_attention(q: torch.Tensor, sink: torch.Tensor, seq_lens: torch.Tensor, topk_local: torch.Tensor,
                    swa_cache: torch.Tensor, swa_block_table: torch.Tensor, cmp_cache: Optional[torch.Tensor],
                    cmp_block_table: Optional[torch.Tensor], ratio: int, window: int, topk: int, max_model_len: int,
                    query_tokens: int) -> torch.Tensor:
    _check(q, sink, seq_lens, topk_local, swa_cache, swa_block_table, cmp_cache, cmp_block_table, ratio, window, topk,
           max_model_len, query_tokens)
    native = _native_ops()
    tensors = [q, sink, seq_lens, topk_local, swa_cache, swa_block_table, cmp_cache, cmp_block_table]
    device = q.device
    for t in tensors:
        if t is not None and t.numel() and (t.device != device or not t.is_contiguous()):
            raise ValueError(f"graphsafe.ds4.paged_attention: every tensor must be contiguous on {device}; got one "
                             f"on {t.device} (contiguous: {t.is_contiguous()})")
    out = torch.empty_like(q)
    ptr = lambda t: 0 if t is None or t.numel() == 0 else t.data_ptr()  # noqa: E731
    native.paged_attention(
        _current_arena(device.index, "paged_attention"), ratio=ratio, window=window, topk=topk, heads=q.shape[1],
        max_model_len=max_model_len, query_tokens=query_tokens, batch=seq_lens.shape[0], seq_lens=ptr(seq_lens),
        topk_local=ptr(topk_local) if ratio == 4 else 0, swa_cache=ptr(swa_cache), swa_num_blocks=swa_cache.shape[0],
        swa_block_table=ptr(swa_block_table), swa_blocks_per_req=swa_block_table.shape[1],
        cmp_cache=ptr(cmp_cache) if ratio > 1 else 0, cmp_num_blocks=cmp_cache.shape[0] if ratio > 1 else 0,
        cmp_block_table=ptr(cmp_block_table) if ratio > 1 else 0,
        cmp_blocks_per_req=cmp_block_table.shape[1] if ratio > 1 else 0, q=ptr(q), sink=ptr(sink), out=ptr(out),
        stream=torch.cuda.current_stream(device).cuda_stream)
    return out


@paged_attention.register_fake
def _paged_attention_fake(q, sink, seq_lens, topk_local, swa_cache, swa_block_table, cmp_cache, cmp_block_table,
                          ratio, window, topk, max_model_len, query_tokens):
    _check(q, sink, seq_lens, topk_local, swa_cache, swa_block_table, cmp_cache, cmp_block_table, ratio, window, topk,
           max_model_len, query_tokens)
    return torch.empty_like(q)


INDEXER_HEADS = 64
INDEXER_DIM = 128


def indexer_block_stride_bytes(block_rows: int = 64) -> int:
    """Bytes of one indexer-cache block: `block_rows` fp8 rows of 128, then one fp32 scale per row."""
    return (block_rows * (INDEXER_DIM + 4) + 15) // 16 * 16


def _check_indexer(q, weights, seq_lens, index_cache, cmp_block_table, topk, max_model_len):
    fn = "graphsafe.ds4.indexer_topk"

    def fail(what, got, allowed):
        raise ValueError(f"{fn}: {what} = {got} is not supported; allowed: {allowed}")

    if not 1 <= topk <= 2048:
        fail("topk", topk, "1 .. 2048")
    if max_model_len < 1:
        fail("max_model_len", max_model_len, ">= 1")
    if seq_lens.dim() != 1 or seq_lens.dtype != torch.int32:
        fail("seq_lens", f"{seq_lens.dtype} {tuple(seq_lens.shape)}", "int32 [requests]")
    requests = seq_lens.shape[0]
    if q.dtype not in (torch.uint8, torch.float8_e4m3fn) or tuple(q.shape) != (requests, INDEXER_HEADS, INDEXER_DIM):
        fail("q", f"{q.dtype} {tuple(q.shape)}", f"fp8 e4m3 (uint8 or float8_e4m3fn) [{requests}, 64, 128]")
    if weights.dtype != torch.float32 or tuple(weights.shape) != (requests, INDEXER_HEADS):
        fail("weights", f"{weights.dtype} {tuple(weights.shape)}", f"float32 [{requests}, 64]")
    stride = indexer_block_stride_bytes()
    if index_cache.dtype != torch.uint8 or index_cache.dim() != 2 or index_cache.shape[1] != stride:
        fail("index_cache", f"{index_cache.dtype} {tuple(index_cache.shape)}", f"uint8 [blocks, {stride}]")
    if cmp_block_table.dtype != torch.int32 or cmp_block_table.dim() != 2 or cmp_block_table.shape[0] != requests:
        fail("cmp_block_table", f"{cmp_block_table.dtype} {tuple(cmp_block_table.shape)}",
             f"int32 [{requests}, blocks per request]")


@torch.library.custom_op("graphsafe::ds4_indexer_topk", mutates_args=(), device_types="cuda")
def indexer_topk(q: torch.Tensor, weights: torch.Tensor, seq_lens: torch.Tensor, index_cache: torch.Tensor,
                 cmp_block_table: torch.Tensor, topk: int, max_model_len: int) -> torch.Tensor:
    """A C4 layer's lightning indexer: scores of every visible compressed row, then the top-k local
    row ids per request (what ds4_paged_attention's topk_local takes), int32 [requests, topk], -1 padded.
    The logits [requests, ceil(max_model_len / 4)] are an arena workspace."""
    _check_indexer(q, weights, seq_lens, index_cache, cmp_block_table, topk, max_model_len)
    native = _native_ops()
    device = q.device
    for t in (q, weights, seq_lens, index_cache, cmp_block_table):
        if t.device != device or not t.is_contiguous():
            raise ValueError(f"graphsafe.ds4.indexer_topk: every tensor must be contiguous on {device}; got one "
                             f"on {t.device} (contiguous: {t.is_contiguous()})")
    out = torch.empty(seq_lens.shape[0], topk, dtype=torch.int32, device=device)
    native.indexer_topk(
        _current_arena(device.index, "indexer_topk"), topk=topk, max_model_len=max_model_len, batch=seq_lens.shape[0],
        seq_lens=seq_lens.data_ptr(), q=q.data_ptr(), weights=weights.data_ptr(), cache=index_cache.data_ptr(),
        cache_num_blocks=index_cache.shape[0], block_table=cmp_block_table.data_ptr(),
        blocks_per_req=cmp_block_table.shape[1], topk_local=out.data_ptr(),
        stream=torch.cuda.current_stream(device).cuda_stream)
    return out


@indexer_topk.register_fake
def _indexer_topk_fake(q, weights, seq_lens, index_cache, cmp_block_table, topk, max_model_len):
    _check_indexer(q, weights, seq_lens, index_cache, cmp_block_table, topk, max_model_len)
    return q.new_empty((seq_lens.shape[0], topk), dtype=torch.int32)


# Indexer inputs of a C4 Problem on the host (fp8 key cache, queries, head weights) and the CPU
# reference top-k: IndexerInputs(problem, seed=2, tie_every=0), .topk(problem); None without the kernels.
IndexerInputs = getattr(_native, "IndexerInputs", None)


def workspace_bytes(ratio: int, window: int, topk: int, heads: int, max_model_len: int, requests: int,
                    query_tokens: int = 1) -> int:
    """Bytes of the op's workspaces for `requests` (what to reserve before capturing it)."""
    return _native_ops().workspace_bytes(ratio, window, topk, heads, max_model_len, query_tokens, requests)


def problem_tensors(problem, device="cuda"):
    """The arguments of the op for a graphsafe._graphsafe.ds4.Problem (the CPU reference's problem),
    uploaded to `device`: a dict of tensors, one query token per request."""
    def up(a):
        return torch.from_numpy(a).to(device)

    return {
        "q": torch.from_numpy(problem.q.view("int16")).to(device).view(torch.bfloat16),
        "sink": up(problem.sink),
        "seq_lens": up(problem.seq_lens),
        "topk_local": up(problem.topk_local),
        "swa_cache": up(problem.swa_cache),
        "swa_block_table": up(problem.swa_block_table),
        "cmp_cache": up(problem.cmp_cache) if problem.cmp_cache.shape[1] else None,
        "cmp_block_table": up(problem.cmp_block_table) if problem.cmp_cache.shape[1] else None,
    }
