"""Entry points stay thin and no stage list is written by hand (issue 41): jobs/*.py parse
arguments and call the package, no module of the package grows past 800 lines, and the
readers of stages (evaluation, analysis, benchmarks, drivers) ask `Stage` and the method
registry instead of spelling stage names out in a tuple or list."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB_LINES, MODULE_LINES = 250, 800
# Tables a stage declares share their names with the stages that write them (audit tables);
# a listed deviation (analysis/deviations.py) names the stages whose requests it explains:
# its scope, not a copy of a method's stage order.
TABLE_KEYWORDS = {"reads", "writes", "optional_reads", "stages"}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_entry_points_are_thin() -> None:
    long = {p.name: _lines(p) for p in (ROOT / "jobs").glob("*.py") if _lines(p) > JOB_LINES}
    assert not long, f"jobs/*.py over {JOB_LINES} lines (move the logic into structmem_gpu/): {long}"


def test_no_module_over_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): _lines(p) for p in (ROOT / "structmem_gpu").rglob("*.py")
            if _lines(p) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def _stage_name_lists(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(kw.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            for kw in node.keywords if kw.arg in TABLE_KEYWORDS}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in skip:
            hits = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(hits) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {hits}")
    return found


def test_no_hand_written_stage_list_in_readers() -> None:
    from structmem_gpu.stage_lookup import packaged_stages

    names = set(packaged_stages())
    found = [hit for pkg in ("eval", "analysis", "bench", "node", "run")
             for p in sorted((ROOT / "structmem_gpu" / pkg).rglob("*.py"))
             for hit in _stage_name_lists(p, names)]
    assert not found, "stage names listed by hand (ask Stage.kind / methods.registry.method_stages):\n" + "\n".join(found)
