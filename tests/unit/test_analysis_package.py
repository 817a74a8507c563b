"""structmem_gpu.analysis: notebook-side analysis that never imports a pipeline stage."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "structmem_gpu"
ANALYSIS = sorted((ROOT / "analysis").glob("*.py"))
MOVED = ("inspect", "provenance", "plots", "curves", "compare", "agreement")
# Modules that define or run pipeline stages: the analysis side must not import them.
STAGE_MODULES = (
    "structmem_gpu.eval.answer",
    "structmem_gpu.eval.judge",
    "structmem_gpu.eval.report",
    "structmem_gpu.eval.report_md",
    "structmem_gpu.eval.audit",
    "structmem_gpu.eval.audit_extraction",
    "structmem_gpu.eval.audit_consolidation",
    "structmem_gpu.methods",
    "structmem_gpu.pipeline",
    "structmem_gpu.stage",
)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at top level or inside functions."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("path", ANALYSIS, ids=lambda p: p.name)
def test_analysis_imports_no_stage(path: Path) -> None:
    bad = {
        m for m in imported_modules(path) for s in STAGE_MODULES if m == s or m.startswith(s + ".")
    }
    assert not bad, f"{path.name} imports pipeline stage modules {sorted(bad)}"


def test_inspect_and_provenance_do_not_import_each_other_circularly() -> None:
    prov = imported_modules(ROOT / "analysis" / "provenance.py")
    assert not any(m.startswith("structmem_gpu.analysis.inspect") for m in prov)
    assert not any(m.startswith("structmem_gpu.eval.inspect") for m in prov)


@pytest.mark.parametrize("name", MOVED)
def test_old_module_paths_are_aliases(name: str) -> None:
    old = importlib.import_module(f"structmem_gpu.eval.{name}")
    new = importlib.import_module(f"structmem_gpu.analysis.{name}")
    assert old is new


def test_public_notebook_names_still_import_from_the_old_paths() -> None:
    from structmem_gpu.eval.inspect import answers_table, load_run, memory_of, question_view
    from structmem_gpu.eval.plots import write_run_plots

    assert all(callable(f) for f in (answers_table, load_run, memory_of, question_view))
    assert callable(write_run_plots)


@pytest.mark.parametrize("stage", ["audit_extraction.py", "audit_consolidation.py"])
def test_audit_stages_use_the_structmem_interface_only(stage: str) -> None:
    mods = imported_modules(ROOT / "eval" / stage)
    internal = {
        m
        for m in mods
        if m.startswith("structmem_gpu.methods.")
        and not m.startswith("structmem_gpu.methods.structmem.audit_api")
    }
    assert not internal, f"{stage} imports StructMem internals {sorted(internal)}"
