"""The import graph of structmem_gpu points down only: no up-arrow, no module circle, no
package loop.

Every import of every structmem_gpu/**/*.py counts: top level, inside functions and under
`if TYPE_CHECKING:` alike (a type-hint-only import still ties two modules together).
`LAYERS` below is the one place the order is written, lowest first; a module may import its
own layer and the layers below it. Inside a layer, and between the subpackages of a package,
imports may go either way but never round in a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "structmem_gpu"

# structmem_gpu.<name>, lowest layer first.
LAYERS: tuple[tuple[str, ...], ...] = (
    # core: errors, hashes, table schemas and layouts, the run directory, locks, signals,
    # shared cache segments, the HF cache reader
    ("core",),
    # configuration: typed settings and their checks, which keys change a result (run
    # directory names, changed-keys log, sweep point records), path values
    ("config",),
    # backends and inputs: LLM clients, encoders, indexes, benchmark loaders, official texts
    ("llm", "embed", "index", "data", "prompts"),
    # the stage contract (opens the LLM and encoder backends a stage asks for), and stages
    # looked up by reference (a method's implementations, a finished run's saved method)
    ("stage", "stage_lookup"),
    # evaluation: answer -> judge -> metrics -> report (and what the report draws)
    ("eval",),
    # memory methods: load, StructMem, SEEM, baselines, each with its prompts (may use eval's
    # answer helpers); the baseline systems run from their own code (front, workers, stages)
    ("methods", "systems"),
    # notebook-side analysis of finished runs (imported by nothing in a stage)
    ("analysis",),
    # drivers: run (stages, shard merge, sweep summary), node readiness (the models a job names,
    # its preflight, the GPU plan, the dry run), what jobs/data.py fetches, benchmarks
    ("run", "node", "fetch", "bench"),
)
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path) -> set[str]:
    """The structmem_gpu modules `name` imports (a name inside a package counts as the
    submodule when there is one, else as the package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "structmem_gpu")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "structmem_gpu":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m != name}


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def unit(module: str) -> str:
    """structmem_gpu.<unit>...: the layer member a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer() -> None:
    missing = sorted({unit(m) for m in MODULES if unit(m)} - set(RANK))
    assert not missing, f"structmem_gpu.{missing} are in no layer: add them to LAYERS"


def test_imports_point_down_only() -> None:
    up = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in sorted(targets)
        if unit(a) and unit(b) and RANK[unit(b)] > RANK[unit(a)]
    ]
    assert not up, "imports of a higher layer (see LAYERS):\n" + "\n".join(up)


def test_no_import_circle_between_modules() -> None:
    assert not cycles(GRAPH), f"import circles: {cycles(GRAPH)}"


def sibling_edges() -> dict[str, set[str]]:
    """a -> b between two children of one package (modules or subpackages) whenever something
    under a imports something under b: a loop here is a package loop."""
    out: dict[str, set[str]] = {}
    for a, targets in GRAPH.items():
        for b in targets:
            pa, pb = a.split("."), b.split(".")
            n = 0
            while n < min(len(pa), len(pb)) and pa[n] == pb[n]:
                n += 1
            if n < len(pa) and n < len(pb):  # not one inside the other
                out.setdefault(".".join(pa[: n + 1]), set()).add(".".join(pb[: n + 1]))
    return out


def test_no_package_loop() -> None:
    loops = cycles(sibling_edges())
    assert not loops, f"package loops: {loops}"


@pytest.mark.parametrize(
    ("source", "expect"),
    [
        ("from structmem_gpu.analysis.inspect import load_run\n", "up"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from structmem_gpu.methods.structmem import extract\n", "up"),
        ("def f():\n    from structmem_gpu.run import pipeline\n", "up"),
        ("from structmem_gpu.eval import selection\n", None),
    ],
)
def test_the_checker_sees_every_kind_of_import(
    tmp_path: Path, source: str, expect: str | None
) -> None:
    """The parser behind the tests above, on a module of eval that imports `source`."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    targets = imports_of("structmem_gpu.eval.probe", path)
    up = [b for b in targets if RANK[unit(b)] > RANK["eval"]]
    assert bool(up) == (expect == "up"), targets


def test_cycles_finds_a_circle_and_nothing_else() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# Only the configuration package reads OmegaConf (it turns the entry points' Hydra config into
# typed objects, config/job.py); the package root registers the Hydra resolvers the YAML names,
# and eval/published.py reads a finished run's saved config. Everything else receives a
# JobConfig or the typed settings it needs.
OMEGACONF_HOMES = ("structmem_gpu.config", "structmem_gpu", "structmem_gpu.eval.published")


def omegaconf_uses(path: Path) -> list[str]:
    """`line: what` for every import of omegaconf and every use of the name OmegaConf /
    DictConfig / ListConfig in the module (type hints under TYPE_CHECKING count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] == "omegaconf"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "omegaconf":
            out.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id in ("OmegaConf", "DictConfig", "ListConfig"):
            out.append(f"{node.lineno}: {node.id}")
    return out


def omegaconf_allowed(module: str) -> bool:
    return module in OMEGACONF_HOMES or module.startswith("structmem_gpu.config.")


def test_only_the_configuration_package_reads_omegaconf() -> None:
    found = [
        f"{m}:{use}"
        for m, p in MODULES.items()
        if not omegaconf_allowed(m)
        for use in omegaconf_uses(p)
    ]
    assert not found, (
        "OmegaConf outside structmem_gpu/config/ (take a JobConfig or typed settings, "
        "config/job.py):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from omegaconf import OmegaConf\n", True),
        ("import omegaconf\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from omegaconf import DictConfig\n", True),
        ("def f(cfg):\n    return OmegaConf.select(cfg, 'llm')\n", True),
        ("def f(job):\n    return job.root.llm.model\n", False),
    ],
)
def test_the_omegaconf_checker_sees_every_kind_of_use(tmp_path: Path, source: str, found: bool) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert bool(omegaconf_uses(path)) == found
