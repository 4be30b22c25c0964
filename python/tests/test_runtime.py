"""The extension's C++ runtime is its own: it exports only its entry point and the torch allocator's
functions, and a libstdc++.so.6 loaded before it (NumPy and torch load one; here in the global
scope, as torch's global dependencies are) does not take over its locale and iostream state. A
module linked with another GCC's libstdc++.a and exporting it crashed after NumPy's import on its
first formatted number, the message of a refused replay: the runtime's unique symbols (each locale
facet's id) had bound to the library loaded first."""
import ctypes.util
import shutil
import subprocess
import sys
import textwrap

import pytest

import graphsafe as gs
from graphsafe import _graphsafe

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol checks are for Linux")

EXPORTS = {"PyInit__graphsafe", "graphsafe_torch_alloc", "graphsafe_torch_free"}


@linux
@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_the_extension_exports_only_its_entry_points():
    out = subprocess.run(["nm", "-D", "--defined-only", _graphsafe.__file__], check=True,
                         capture_output=True, text=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert exported == EXPORTS, sorted(exported - EXPORTS)[:20]


REFUSED_REPLAY = textwrap.dedent("""
    import ctypes, sys
    ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # as torch loads its global dependencies
    import graphsafe as gs
    B = gs.Symbol.fixed("requests")
    L = gs.Symbol.batch("seq_lens", B, capacity=512)
    arena = gs.Arena(gs.HostBackend(), gs.ArenaOptions(report_findings=False))
    stream = gs.HostStream()
    arena.reserve(1 << 20, stream)
    b = gs.Bindings({B: 2, L: [3, 5]})
    with arena.capture(b, stream=stream) as cap:
        arena.request("kv", gs.sum_over(L, lambda l: l) * 8, gs.exact_at_capture, b, element_bytes=4,
                      stream=stream)
    b[L] = [15, 17]
    try:
        cap.graph.replay(b, stream)
    except gs.GuardFailure as e:
        print(str(e).splitlines()[0])
        print(e.violations[0].required, e.violations[0].reserved)
""")


@linux
def test_a_global_libstdcxx_does_not_break_a_refused_replays_message():
    lib = ctypes.util.find_library("stdc++")
    if lib is None:
        pytest.skip("no libstdc++.so.6 on this machine's library path")
    r = subprocess.run([sys.executable, "-c", REFUSED_REPLAY, lib], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.splitlines() == ["graphsafe: replay refused before launch: 1 guard failed", "256 64"]
