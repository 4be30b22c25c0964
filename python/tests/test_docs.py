"""docs/python.md: every ```python block runs, in order, in one namespace (as a reader would paste
them); ```python cuda blocks run only with torch and a CUDA device, ```python ds4 blocks also only
when graphsafe was built with the DS4 kernels."""
import gc
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def blocks(tag):
    return re.findall(r"^```python" + tag + r"\n(.*?)^```", DOC.read_text(), re.S | re.M)


def run_blocks(tag, label):
    """Runs the blocks tagged `tag` in order in one namespace, as a reader would; returns it."""
    code = blocks(tag)
    assert code, f"docs/python.md lost its {label} block"
    ns = {}
    for i, block in enumerate(code):
        exec(compile(block, f"{DOC.name}[{label} block {i}]", "exec"), ns)
    return ns


def test_the_quickstart_runs():
    assert len(blocks("")) >= 2, "docs/python.md lost its quickstart blocks"
    ns = run_blocks("", "python")
    assert ns["out"].tolist() == [32, 40]  # the safe replay's result: the refused replay never ran


def release_torch_memory(ns, torch):
    """What a reader does before handing torch to another arena: drop the section's pools, graphs
    and tensors and let torch return its cached segments (one arena serves torch per device, and a
    later test registers its own)."""
    ns.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_the_torch_section_runs_on_a_gpu():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    release_torch_memory(run_blocks(" cuda", "cuda"), torch)


def test_the_ds4_section_runs_on_a_gpu():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    ds4 = pytest.importorskip("graphsafe.ds4")
    if not ds4.available():
        pytest.skip("graphsafe was built without the DS4 kernels (GRAPHSAFE_BUILD_DS4=OFF)")
    release_torch_memory(run_blocks(" ds4", "ds4"), torch)
