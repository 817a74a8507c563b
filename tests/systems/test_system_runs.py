"""The CI tier of the baseline systems: each runs build -> search -> answer -> judge -> report
on the bundled sample from its own environment, behind the recording front, with its own
scripted replies (structmem_gpu/systems/<name>.py scripted_reply); a second run into a new run
directory sends nothing uncached; replies a small model would garble (no JSON, truncated JSON,
wrong keys) end in a finished run with the dropped memories counted, not a traceback."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from structmem_gpu.systems.registry import system_names
from tests.fixtures.pipeline import run_pipeline
from tests.systems.helpers import missing_env, system_requests, table

pytestmark = [pytest.mark.systems, pytest.mark.timeout(1800)]

# The systems of the CI tier (the others are in the heavy tier, test_heavy_systems.py).
CI_SYSTEMS = system_names("ci")


def _overrides(name: str, cache: Path, extra: Sequence[str] = ()) -> list[str]:
    return [*extra, f"method={name}", "benchmark=sample", "benchmark.conversations=[sample-1]",
            "benchmark.max_sessions=2",
            "debug=scripted", "embedder=minilm", f"paths.cache_dir={cache}",
            "report.plots=false", "system.workers=2"]


def _skip_unless_installed(name: str) -> None:
    if why := missing_env(name):
        pytest.skip(why)


@pytest.mark.parametrize("name", CI_SYSTEMS)
def test_a_system_runs_to_a_report_then_reruns_from_the_cache(name: str, tmp_path: Path) -> None:
    run_and_rerun(name, tmp_path)


def table1_row_of(run_dir: Path, name: str, build_requests: int) -> None:
    """`jobs/report.py table1` puts the system's run beside the paper's Table 1 row of its
    method, with the paper's scores and build cost and ours from the same accounting (every
    request the system's own code sent while building); a system without a Table 1 row (SEEM's
    and HippoRAG 2's baselines) is listed on its own, saying so."""
    from omegaconf import OmegaConf

    from structmem_gpu.analysis.table1 import table1, table1_rows
    from tests.fixtures.pipeline import compose_cfg

    (run_dir / ".hydra").mkdir(exist_ok=True)  # where a launched job's config is saved
    OmegaConf.save(compose_cfg(["debug=scripted", f"method={name}"]), run_dir / ".hydra" / "config.yaml")
    rows = [r for r in table1([run_dir]).iter_rows(named=True)
            if r.get("run_dir") == str(run_dir)]
    assert len(rows) == 1
    [row] = rows
    assert row["ours_calls"] == build_requests > 0 and row["ours_prompt_tokens"] > 0
    mine = [r for r in table1_rows() if r.match and r.match.get("method") == name]
    if mine:
        assert row["row"] in {r.id for r in mine} and row["paper_overall"] is not None
        assert row["status"].startswith("not the paper's configuration: harness run")
    else:
        assert row["status"] == "no Table 1 row for this method"


def run_and_rerun(name: str, tmp_path: Path, extra: Sequence[str] = ()) -> None:
    """The system's whole run, then the same job into a new run directory (shared with the
    heavy tier, test_heavy_systems.py; `extra`: overrides a system needs, e.g. a model path)."""
    _skip_unless_installed(name)
    cache = tmp_path / "cache"
    first = tmp_path / "run1"
    run_pipeline(_overrides(name, cache, extra), first)
    memories = table(first, "memories")
    hits = table(first, "system_hits")
    answers = table(first, "answers")
    units = table(first, "system_units")
    assert memories.height > 0 and memories["text"].str.len_chars().min() > 0
    assert hits.height > 0
    assert answers.height == table(first, "questions").filter(
        pl.col("category") != 5).height  # every selected question answered
    assert units["status"].to_list() == ["ok"]
    report = json.loads((first / "report" / "report.json").read_text())
    assert report["method"] == name
    rows = system_requests(first, name)
    chat = rows.filter(pl.col("prompt_version") == f"{name}/chat")
    # a fresh cache: the only hits are repeats of a body within the run (LightMem's offline
    # update can ask the same question twice)
    assert chat.height > 0
    assert int(chat["cache_hit"].sum()) == chat.height - chat["messages_hash"].n_unique()
    assert rows["stage"].unique().sort().to_list() == ["system_build", "system_search"]
    # every call the system made is a row (its worker counted them by unit: the front's count)
    assert int(units["requests"].sum()) == rows.filter(pl.col("stage") == "system_build").height
    # the workers refuse every non-loopback connection (worker_common.refuse_network): a
    # system that tried one (telemetry, a download) would have logged the refusal
    logs = sorted((first / "logs").glob(f"system_{name}_*.log"))
    assert logs and not any("network refused" in p.read_text(errors="replace") for p in logs)
    table1_row_of(first, name, int(units["requests"].sum()))

    second = tmp_path / "run2"
    run_pipeline(_overrides(name, cache, extra), second)
    chat2 = system_requests(second, name).filter(pl.col("prompt_version") == f"{name}/chat")
    assert chat2.height == chat.height and chat2["cache_hit"].all()  # 0 uncached requests
    assert sorted(table(second, "memories")["text"].to_list()) == sorted(memories["text"].to_list())


BAD_REPLIES = {
    "no JSON": lambda body: {"content": "I am not sure what you mean."},
    "truncated JSON": lambda body: {"content": '{"facts": ["Caroline went to'},
    "wrong keys": lambda body: {"content": '{"items": [{"x": 1}]}'},
}


@pytest.mark.parametrize("name", CI_SYSTEMS)
def test_garbled_replies_are_counted_not_a_traceback(name: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    garbled_run(name, tmp_path, monkeypatch)


def garbled_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                extra: Sequence[str] = ()) -> None:
    """One run whose replies cycle through the three kinds (request i gets kind i mod 3):
    each kind reaches every prompt type the system sends more than twice."""
    _skip_unless_installed(name)
    module = importlib.import_module(f"structmem_gpu.systems.{name}")
    good = module.SPEC.scripted_reply
    kinds = list(BAD_REPLIES.values())
    sent = itertools.count()

    def garbled(body: dict[str, Any]) -> dict[str, Any]:
        bad = kinds[next(sent) % len(kinds)]
        # a tool call keeps its name and gets garbled arguments (LangMem and Mem0^g write
        # memories through tool calls)
        if not body.get("tools"):
            return bad(body)
        reply = good(body)
        for call in reply.get("tool_calls") or []:
            call["function"]["arguments"] = bad(body)["content"]
        return reply

    monkeypatch.setattr(module, "SPEC", dataclasses.replace(module.SPEC, scripted_reply=garbled))
    run = tmp_path / "run"
    run_pipeline(_overrides(name, tmp_path / "cache", extra), run)
    units = table(run, "system_units")
    assert units["status"].to_list() == ["ok"], units["error"].to_list()
    assert int(units["dropped"].sum()) > 0, f"{name}: nothing counted as dropped"
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["system"]["dropped"] == int(units["dropped"].sum())
    # every kind was sent, where the system sends three or more (LightMem's sample sends two:
    # its one extraction batch, both perspectives; garbled, nothing else follows)
    assert next(sent) >= 2


def test_a_finished_conversation_is_not_rebuilt(tmp_path: Path) -> None:
    """force=true after a build: conversations with a marker are resumed (no request at all),
    one whose marker is gone (a crash before it finished) is built again."""
    _skip_unless_installed("mem0")
    over = [*_overrides("mem0", tmp_path / "cache"), "benchmark.conversations=null",
            "stages=[load,system_build]"]
    run = tmp_path / "run"
    run_pipeline(over, run)
    assert sorted(table(run, "system_units")["status"].to_list()) == ["ok", "ok"]
    markers = sorted((run / "systems" / "mem0" / "done" / "build").glob("*.json"))
    assert len(markers) == 2
    markers[0].unlink()
    run_pipeline([*over, "force=true"], run)
    units = table(run, "system_units").sort("conv_id")
    assert sorted(units["status"].to_list()) == ["ok", "resumed"]
    rebuilt = units.filter(pl.col("status") == "ok")["conv_id"][0]
    rows = system_requests(run, "mem0")
    assert set(rows["conv_id"]) == {rebuilt}  # only the rebuilt conversation sent requests
    assert table(run, "memories")["conv_id"].n_unique() == 2
