"""The commands shown in README.md, docs/*.md and the conf/experiment/*.yaml headers: every
`python jobs/run.py` command (`shown_commands`: continuation lines joined, comments dropped,
FILE / DIR / RUN / NODE placeholders substituted, `$HOME` expanded as the shell would, a `...`
left out) is composed at every point it launches (`-m` sweeps, the experiment's and the command
line's, `range()` included, expanded as `python jobs/data.py models -m` expands them) and
checked like a job; and every published row with a configuration must be matched by at least
one of those points (eval/published.match_note), so each paper row is reachable from a command
a user can copy. Composition only: the e2e tier runs every method and sweep point to a report
(tests/unit/test_every_command.py). In the gate's integration tier: ~200 Hydra compositions
(39 s on 2 cores), no server.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from structmem_gpu.config.schema import check_config
from structmem_gpu.eval.published import comparison_lines, load_published, match_note
from structmem_gpu.methods.registry import stage_registry
from tests.fixtures.pipeline import CONF_DIR, compose_with_hydra, load_job, sweep_points

# ---- the commands README.md, docs/ and the experiment headers show ---------------------------

ROOT = CONF_DIR.parent
RUN = "python jobs/run.py"
# Placeholders of the shown commands and what a user would put there.
PLACEHOLDERS = {"FILE": "data/locomo10.json", "DIR": "outputs/some_run", "RUN": "outputs/some_run",
                "NODE": "node01"}


def _shown_in() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((CONF_DIR / "experiment").glob("*.yaml"))]


def shown_commands() -> list[tuple[str, str]]:
    """(file:line, command text) of every `python jobs/run.py` command shown: a code line (or
    a YAML comment line) from RUN to its end, backslash continuations joined; inline code up to
    its closing backtick, across a line break. A second command on a line: `file:line+1`."""
    out = []
    for path in _shown_in():
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.suffix == ".yaml":  # the header: comment lines only
            lines = [ln.lstrip()[1:] if ln.lstrip().startswith("#") else "" for ln in lines]
        for n, line in enumerate(lines):
            start = line.find(RUN)
            while start >= 0:
                text, k = line[start:], n
                if start and line[start - 1] == "`":  # inline code: up to the closing backtick
                    while "`" not in text and k + 1 < len(lines):
                        k += 1
                        text += " " + lines[k].strip()
                    text = text.split("`")[0]
                else:
                    while text.rstrip().endswith("\\") and k + 1 < len(lines):
                        k += 1
                        text = text.rstrip()[:-1] + " " + lines[k].strip()
                where = f"{path.relative_to(ROOT)}:{n + 1}"
                out.append((where + ("" if start == line.find(RUN) else "+1"), text))
                start = line.find(RUN, start + len(RUN))
    return out


def command_overrides(text: str) -> tuple[bool, list[str]]:
    """(multirun, overrides) of a shown command, as a user's shell would pass them."""
    words = shlex.split(text, comments=True)[len(RUN.split()):]
    multirun = "-m" in words
    out = []
    for word in words:
        if word == "-m" or word == "..." or word.endswith("=..."):
            continue
        word = os.path.expandvars(word)  # $HOME/..., as the shell expands it
        for name, value in PLACEHOLDERS.items():
            word = re.sub(rf"\b{name}\b", value, word)
        out.append(word)
    return multirun, out


SHOWN = shown_commands()


def _compose_checked(point: list[str], shards: dict[tuple[str, ...], DictConfig | str]
                     ) -> DictConfig | str:
    """The point's config, checked as jobs/run.py checks it, or the one-line error. Shards of
    one job differ only in the root int `shard_index`: composed once, each index then set on
    a copy and checked (Hydra composes nothing else differently for a value override)."""
    shard = next((o for o in point if o.startswith("shard_index=")), None)
    rest = tuple(o for o in point if o != shard)
    try:
        if rest not in shards:
            shards[rest] = compose_with_hydra(list(rest))
        base = shards[rest]
        if isinstance(base, str):
            return base
        cfg = base.copy()
        if shard is not None:
            cfg.shard_index = int(shard.split("=", 1)[1])
        check_config(cfg, stage_registry(cfg).values())
        return cfg
    except Exception as err:  # Hydra's and ours: recorded, asserted by the test
        shards.setdefault(rest, f"{type(err).__name__}: {err}".splitlines()[0])
        return f"{type(err).__name__}: {err}".splitlines()[0]


@pytest.fixture(scope="module")
def shown_points() -> dict[str, list[tuple[list[str], DictConfig | str]]]:
    """where -> (overrides, config or the error it composes with) of every point the
    command launches (one for a single run)."""
    points = load_job("data").sweep_points  # as `python jobs/data.py models -m` expands them
    out: dict[str, list[tuple[list[str], DictConfig | str]]] = {}
    composed: dict[tuple[str, ...], DictConfig | str] = {}
    bases: dict[tuple[str, ...], DictConfig | str] = {}
    for where, text in SHOWN:
        multirun, overrides = command_overrides(text)
        try:
            todo = points(overrides) if multirun else [overrides]
        except Exception as err:  # the sweep itself does not parse: recorded, asserted below
            out[where] = [(overrides, f"{type(err).__name__}: {err}")]
            continue
        out[where] = []
        for point in todo:
            key = tuple(point)
            if key not in composed:
                composed[key] = _compose_checked(list(point), bases)
            out[where].append((list(point), composed[key]))
    return out


def test_shown_commands_are_found() -> None:
    wheres = [w for w, _ in SHOWN]
    assert len(SHOWN) >= 50 and any(w.startswith("docs/") for w in wheres)
    assert any(w.startswith("conf/experiment/") for w in wheres)
    texts = [t for _, t in SHOWN]
    assert any("range(0,16)" in t for t in texts)  # continuation line joined
    assert any(t.endswith("hydra.run.dir=RUN") for t in texts)  # inline code across a line break


def test_every_shown_command_composes(shown_points: dict[str, list[tuple[list[str], Any]]]) -> None:
    failed = [f"{where}: {' '.join(o)}: {cfg}" for where, pts in shown_points.items()
              for o, cfg in pts if isinstance(cfg, str)]
    assert not failed, "\n".join(failed)
    sharded = [pts for pts in shown_points.values() if any("shard_index=15" in o for o, _ in pts)]
    assert sharded and all(len(p) >= 16 for p in sharded)  # range() expanded


def test_every_published_row_with_a_configuration_is_reached(
    shown_points: dict[str, list[tuple[list[str], Any]]]
) -> None:
    rows = [r for r in load_published() if r.match]
    reached: dict[str, list[str]] = {}
    for where, pts in shown_points.items():
        for overrides, cfg in pts:
            if isinstance(cfg, str):
                continue
            for row in rows:
                if match_note(cfg, row) is not None:
                    reached.setdefault(row.id, []).append(f"{where}: {' '.join(overrides)}")
                    assert row.id in "\n".join(comparison_lines(cfg))  # the dry run lists it
    missing = [r.id for r in rows if r.id not in reached]
    assert not missing, f"published rows no shown command reaches: {missing}"


def test_the_table_2_experiments_run_on_locomo_and_match_their_rows() -> None:
    ids = {r.id: r for r in load_published()}
    want = {"flat": "structmem-table2-flat", "graph_memory": "structmem-table2-graph",
            "structmem_no_cross_event": "structmem-table2-no-cross-event"}
    for experiment in ("paradigms", "baselines"):
        for point in sweep_points(experiment):
            cfg = compose_with_hydra([f"experiment={experiment}", *point, "llm=vllm_qwen2_5_7b"])
            assert cfg.benchmark.name == "locomo", (experiment, point)
            method = point[0].split("=", 1)[1]
            if method in want:
                assert match_note(cfg, ids[want[method]]) is not None, (experiment, method)


def test_seem_no_eef_reaches_its_row_and_the_second_reading_does_not() -> None:
    from structmem_gpu.methods.seem.settings import Ablation

    row = next(r for r in load_published() if r.id == "seem-table3-no-eef")
    base = ["experiment=seem_ablations"]
    no_eef = compose_with_hydra([*base, "method=seem_no_eef"])
    assert match_note(no_eef, row) is not None
    assert match_note(compose_with_hydra([*base, "method=seem_no_eef_rpe"]), row) is None
    # the switches the row names are what the run does: no frames in the context, no RPE
    assert not Ablation.from_cfg(no_eef).expands
