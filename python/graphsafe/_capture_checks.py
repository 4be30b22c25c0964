"""Capture checks for PyTorch code: flag, with the Python file and line, what breaks or silently
escapes a CUDA graph capture.

    with torch.cuda.graph(g), gs.capture_checks() as checks:
        y = model(x)                        # each finding names the model's line
    for f in checks.findings: print(f["kind"], f["site"], f["message"])

While the current stream is capturing (torch.cuda.graph, or a graphsafe capture on torch's current
stream) every aten op is inspected:
  * raw-allocation-in-capture: an op returned a new CUDA tensor, i.e. memory from torch's caching
    allocator that no graphsafe extent sized (write into a workspace with out= or in place instead);
  * host-sync-in-capture: an op that reads a device value on the host (.item(), nonzero, ...), or
    torch.cuda.synchronize / Stream.synchronize / Event.synchronize: illegal in a capture, or, in a
    relaxed capture, a value frozen at capture;
  * d2h-copy-in-capture: a device-to-host copy (.cpu(), .to("cpu"), copy_ into a host tensor).
Findings are recorded before the op runs (an op CUDA rejects still leaves its finding) and added to
graphsafe's debug report. always=True inspects outside captures too: run an eager step under it to
learn what its capture would hit.
"""
from __future__ import annotations

import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _graphsafe

_SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["graphsafe"]))
_SKIP_FILES = ("contextlib.py",)

# Ops whose result the host reads (a synchronizing device-to-host transfer of a value or a size).
_SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive",
             "unique_dim", "is_nonzero", "equal", "allclose", "repeat_interleave"}


def _site():
    """file:line (function) of the innermost frame outside torch, graphsafe and contextlib."""
    f = sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        if not path.startswith(_SKIP_DIRS) and not path.endswith(_SKIP_FILES):
            return f"{os.path.basename(path)}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "<unknown>"


def _cuda(t):
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


class _Mode(TorchDispatchMode):
    def __init__(self, checks):
        super().__init__()
        self.checks = checks

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        active = self.checks.always or torch.cuda.is_current_stream_capturing()
        if active:
            self.checks._before(func, args, kwargs)
        out = func(*args, **kwargs)
        if active:
            self.checks._after(func, out)
        return out


class CaptureChecks:
    """Context manager; `findings` lists what it flagged (dicts, as graphsafe.debug.findings())."""

    def __init__(self, always=False):
        self.always = always
        self.findings = []
        self._mode = None
        self._patched = []

    # ---- recording --------------------------------------------------------------------------
    def _flag(self, kind, message, fix):
        site = _site()
        f = dict(kind=kind, request="", graph="", site=site, message=message, fix=fix, count=1)
        self.findings.append(f)
        _graphsafe.debug.report_finding(kind, message, fix, site=site)

    def _before(self, func, args, kwargs):
        name = func._schema.name.split("::")[-1]
        if name in _SYNC_OPS and any(_cuda(t) for t in _tensors(list(args) + list(kwargs.values()))):
            self._flag("host-sync-in-capture", f"{func._schema.name} reads a device value on the host",
                       "keep the value on the device, or take it from the engine's host copy (a graphsafe binding)")
            return
        if name in ("_to_copy", "to", "copy_", "_copy_from"):
            src = args[1] if name == "copy_" else args[0]
            if name == "copy_":
                dst_device = args[0].device.type
            else:
                dev = kwargs.get("device")
                dst_device = torch.device(dev).type if dev is not None else src.device.type
            if _cuda(src) and dst_device == "cpu":
                self._flag("d2h-copy-in-capture", f"{func._schema.name} copies device memory to the host",
                           "a capture freezes the copy's result: read host values from the bindings instead")

    def _after(self, func, out):
        schema = func._schema
        outs = out if isinstance(out, (list, tuple)) else (out,)
        for ret, t in zip(schema.returns, outs):
            if ret.alias_info is None and _cuda(t):
                self._flag("raw-allocation-in-capture",
                           f"{schema.name} allocated a new {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} "
                           f"CUDA tensor ({t.numel() * t.element_size()} bytes) from torch's allocator",
                           "size it with a graphsafe extent: arena.request(...).as_tensor(...) and out= / in-place ops")
                return

    # ---- context ----------------------------------------------------------------------------
    def _patch_syncs(self):
        def wrap(owner, attr, what):
            original = getattr(owner, attr)

            def checked(*a, **k):
                if self.always or torch.cuda.is_current_stream_capturing():
                    self._flag("host-sync-in-capture", f"{what} waits for the device",
                               "no host synchronization inside a capture: order work with events or streams")
                return original(*a, **k)

            setattr(owner, attr, checked)
            self._patched.append((owner, attr, original))

        wrap(torch.cuda, "synchronize", "torch.cuda.synchronize()")
        wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize()")
        wrap(torch.cuda.Event, "synchronize", "Event.synchronize()")

    def __enter__(self):
        self._patch_syncs()
        self._mode = _Mode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()
        return False
