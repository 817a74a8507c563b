"""A baseline system against the real llama.cpp server (SmolLM2-135M): the system's own
requests go through the recording front to the server, and `requests.parquet` accounts for
every one the server answered (counted in the server's access log). SmolLM2 garbles most
structured replies: the run completes and counts what the system dropped."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pytest

from tests.fixtures.pipeline import run_pipeline
from tests.systems.helpers import missing_env, system_requests, table

pytestmark = [pytest.mark.systems, pytest.mark.timeout(1800)]

# mem0_graph and langmem need a server-side tool parser, zep's reranker logprobs at the
# choice: the heavy tier runs them, and the heavy systems, against llama.cpp
# (test_heavy_systems.py, which calls run_on_llamacpp).
LLAMACPP_SYSTEMS = ["mem0", "lightrag"]


@pytest.mark.parametrize("name", LLAMACPP_SYSTEMS)
def test_a_system_on_llamacpp_accounts_for_every_request(name: str, llama_server, tmp_path: Path) -> None:
    run_on_llamacpp(name, llama_server, tmp_path)


def run_on_llamacpp(name: str, llama_server, tmp_path: Path, extra: Sequence[str] = ()) -> None:
    """The system's run on one session of sample-1 against the session's llama.cpp server:
    every call the server saw is a row; the run completes, whatever the model's replies."""
    if why := missing_env(name):
        pytest.skip(why)
    base = [*extra, f"method={name}", "benchmark=sample", "benchmark.conversations=[sample-1]",
            "benchmark.max_sessions=1", "debug=ci", f"llm.base_url={llama_server.base_url}",
            f"paths.cache_dir={tmp_path / 'cache'}", "report.plots=false"]
    run = tmp_path / "run"
    before = llama_server.calls()
    run_pipeline([*base, "stages=[load,system_build]"], run)
    sent = llama_server.calls() - before
    rows = system_requests(run, name)
    chat = rows.filter(pl.col("prompt_version") == f"{name}/chat")
    assert chat.height > 0
    assert chat.filter(~pl.col("cache_hit")).height == sent  # every call the server saw
    assert chat["model"].str.contains("smollm2").all()
    run_pipeline(base, run)  # search, answer, judge, report on the same run directory
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["system"]["conversations"] == 1
    units = table(run, "system_units")
    assert units["status"].to_list() == ["ok"]
    print(f"{name} on SmolLM2: {chat.height} build chat requests, "
          f"{report['system']['memories']} memories, {report['system']['dropped']} dropped")
