"""structmem_gpu.analysis: notebook-side analysis that never imports a pipeline stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "structmem_gpu"
ANALYSIS = sorted((ROOT / "analysis").glob("*.py"))
# Modules that define or run pipeline stages: the analysis side must not import them.
STAGE_MODULES = (
    "structmem_gpu.eval.answer",
    "structmem_gpu.eval.judge",
    "structmem_gpu.eval.report",
    "structmem_gpu.eval.report_md",
    "structmem_gpu.methods",
    "structmem_gpu.run.pipeline",
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


def test_public_notebook_names_import_from_their_modules() -> None:
    from structmem_gpu.analysis.inspect import answers_table, load_run, memory_of, question_view
    from structmem_gpu.analysis.sweep_plots import write_sweep_plots
    from structmem_gpu.eval.plots import write_run_plots

    funcs = (answers_table, load_run, memory_of, question_view, write_run_plots, write_sweep_plots)
    assert all(callable(f) for f in funcs)


@pytest.mark.parametrize("stage", ["audit_extraction.py", "audit_consolidation.py"])
def test_audit_stages_use_the_structmem_interface_only(stage: str) -> None:
    mods = imported_modules(ROOT / "methods" / "structmem" / stage)
    allowed = ("structmem_gpu.methods.structmem.audit_api", "structmem_gpu.methods.structmem.audit",
               # prompt texts (they live beside their method, no stage internals)
               "structmem_gpu.methods.structmem.prompts")
    internal = {
        m
        for m in mods
        if m.startswith("structmem_gpu.methods.")
        and not any(m == a or m.startswith(a + ".") for a in allowed)
    }
    assert not internal, f"{stage} imports StructMem internals {sorted(internal)}"
