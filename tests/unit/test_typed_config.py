"""Typed all the way (issue 40): outside the configuration package, the pipeline driver and the
entry points, code receives typed settings (LLMSettings, EmbedderSettings, JudgeSettings, a
JobConfig's `root` and `settings(...)`), never the configuration as data.

Refused anywhere else in structmem_gpu/: a `.select(...)` on a job (`job`, `inp.job`,
`inputs.job`, `ctx.job`, `self.job`), the `.plain` view, and a parameter `cfg: Any`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "structmem_gpu"
# config/ and the pipeline driver; eval/published.py looks up the published rows' match keys,
# which are data (structmem_gpu/eval/published/*.json), not names in code.
ALLOWED = ("config/", "run/pipeline.py", "eval/published.py")
JOB_NAMES = {"job", "cfg"}


def _receiver(node: ast.AST) -> str:
    """`inp.job` for the receiver of `inp.job.select(...)`; '' for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def violations(source: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "select":
            who = _receiver(node.func.value)
            if who.split(".")[-1] in JOB_NAMES:
                out.append(f"line {node.lineno}: {who}.select(...)")
        elif isinstance(node, ast.Attribute) and node.attr == "plain":
            out.append(f"line {node.lineno}: {_receiver(node)}")
        elif isinstance(node, ast.arg) and node.arg == "cfg" and isinstance(node.annotation, ast.Name) \
                and node.annotation.id == "Any":
            out.append(f"line {node.lineno}: cfg: Any")
    return out


FILES = sorted(p for p in PACKAGE.rglob("*.py")
               if not str(p.relative_to(PACKAGE)).startswith(ALLOWED))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_configuration_as_data_outside_config(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_each_kind() -> None:
    found = violations(
        "def f(cfg: Any, inp):\n"
        "    a = inp.job.select('llm')\n"
        "    b = job.plain\n"
        "    c = frame.select('col')\n")  # polars' select: not a job
    assert found == ["line 1: cfg: Any", "line 2: inp.job.select(...)", "line 3: job.plain"]
