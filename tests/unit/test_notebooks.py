"""The notebooks execute headless (nbclient) against a run built with the scripted LLM.

    python -m pytest tests/unit -q -k notebook

Each notebook reads STRUCTMEM_RUN_DIR (its `parameters` cell); any failing cell fails the
test with the cell's traceback. The integration tier (tests/integration/test_notebooks.py)
does the same against the real llama.cpp sample run. `execute_notebook` is shared by both.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from tests.unit.test_inspect import build_scripted_run

# e2e: every test here executes a notebook in a kernel
pytestmark = pytest.mark.e2e

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL = "structmem-test-python"


def use_this_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A kernelspec running the test's own interpreter, found first on JUPYTER_PATH: the
    default "python3" spec may launch whatever `python` is on PATH (not this venv's)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "structmem tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def execute_notebook(
    path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timeout: int = 300
):
    """Run every cell of `path` with STRUCTMEM_RUN_DIR=run_dir; CellExecutionError on failure."""
    monkeypatch.setenv("STRUCTMEM_RUN_DIR", str(run_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The kernel imports structmem_gpu from this checkout even where it is not pip-installed.
    paths = [str(NOTEBOOK_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    kernel = use_this_python(monkeypatch, tmp_path)
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name=kernel, timeout=timeout, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    client.execute()
    return nb


@pytest.fixture(scope="session")
def scripted_sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_scripted_run(tmp_path_factory)


def test_notebooks_found() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_results.ipynb",
        "02_error_analysis.ipynb",
        "03_memory_browser.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "strip outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "STRUCTMEM_RUN_DIR" in params[0].source
    # Notebooks read results; pipeline code (stages, LLM backends) never runs in them.
    text = "\n".join(c.source for c in code)
    for forbidden in (
        "run_stages",
        "structmem_gpu.run.pipeline",
        "structmem_gpu.llm",
        "structmem_gpu.methods",
    ):
        assert forbidden not in text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_on_scripted_run(
    path: Path, scripted_sample_run: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nb = execute_notebook(path, scripted_sample_run, monkeypatch, tmp_path)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert outputs, "the notebook displayed nothing"


def test_results_notebook_on_a_sweep_folder(
    scripted_sample_run: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """RUN_DIR = a folder of runs takes the sweep branch (comparison table + sweep figures)."""
    sweep = tmp_path / "sweep"
    for name in ("a", "b"):
        shutil.copytree(scripted_sample_run, sweep / name)
    nb = execute_notebook(NOTEBOOK_DIR / "01_results.ipynb", sweep, monkeypatch, tmp_path)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the sweep branch showed no figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_without_memory_tables(
    path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """full_context writes no entries, syntheses or retrievals: every notebook still runs."""
    run_dir = build_scripted_run(tmp_path_factory, "full_context")
    execute_notebook(path, run_dir, monkeypatch, tmp_path)
