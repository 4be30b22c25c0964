"""examples/python/decode_port.py end to end (torch and a CUDA device; skipped otherwise)."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "decode_port.py"


def test_the_decode_port_refuses_the_unsafe_replay_and_matches_eager_when_bounded():
    r = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "32"], capture_output=True, text=True, timeout=600)
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "replay refused before launch: 'gathered_kv'" in r.stdout
    assert "rows dropped" in r.stdout and r.stdout.rstrip().endswith("OK")
    assert "exact-at-capture" in r.stderr or "gathered_kv" in r.stderr  # the capture's finding
