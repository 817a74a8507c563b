"""The offline update stage and full_context's whole-history mode on the real stack
(llama.cpp + SmolLM2, MiniLM, faiss-cpu), on the slice of the bundled sample the baseline tests
use (sample-1, first 3 sessions, 2 questions of categories 1-4).

The update run builds StructMem's memory of that slice (the same extraction and consolidation
requests as the baseline tests' structmem run: served by the session's response cache), then
the update stage and retrieve/answer/judge/report reading the post-update store. Uncached
requests: the update candidates of the slice (a handful) + 2 answers + 2 judgments; the
whole-history full_context run: 2 answers + 2 judgments. Asserts structure, never quality.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

SLICE = ["benchmark=sample", "benchmark.conversations=[sample-1]", "benchmark.max_sessions=3"]
STAGES = "stages=[load,extract,embed,consolidate,update,retrieve,answer,judge,report]"


@pytest.fixture(scope="module")
def update_run(tmp_path_factory, ci_overrides) -> Path:
    run_dir = tmp_path_factory.mktemp("run-update-slice")
    run_pipeline([*ci_overrides, *SLICE, "method=structmem", STAGES, "update.read=post"], run_dir)
    return run_dir


def test_update_stage_records_every_candidate_and_qa_reads_the_post_store(update_run: Path) -> None:
    run = RunDir(update_run)
    manifest = json.loads((update_run / "manifest.json").read_text())
    notes = manifest["stages"]["update"]["notes"]
    updates, entries = run.read_table("entry_updates"), run.read_table("entries")
    reqs = run.read_table("requests").filter(pl.col("stage") == "update")
    assert updates.height == notes["candidates"] == notes["requests"] == reqs.height
    assert sorted(updates["request_id"]) == sorted(reqs["request_id"])
    assert set(updates["entry_id"]) <= set(entries["entry_id"])  # original ids
    assert notes["update"] + notes["delete"] + notes["ignore"] == updates.height
    gone = set(updates.filter(pl.col("decision") == "delete")["entry_id"])
    ret = run.read_table("retrievals")
    assert not gone & set(ret.filter(pl.col("circuit") == "entries")["item_id"])
    assert ret.filter(pl.col("circuit") == "syntheses").height == 0  # the post store has none
    report = json.loads((update_run / "report" / "report.json").read_text())
    assert report["protocols"]["qa_store"].startswith("post-update (without syntheses")
    assert all(s["status"] == "done" for s in manifest["stages"].values())


def test_whole_history_full_context_runs_to_a_report(tmp_path_factory, ci_overrides) -> None:
    run_dir = tmp_path_factory.mktemp("run-full-context-whole")
    run_pipeline([*ci_overrides, *SLICE, "method=full_context", "answer.context_tokens=null"],
                 run_dir)
    run = RunDir(run_dir)
    turns, answers = run.read_table("turns"), run.read_table("answers")
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert answers.height == report["questions"] == 2
    reqs = run.read_table("requests").filter(pl.col("stage") == "answer")
    assert (reqs["finish_reason"] != "over_context").all()  # 3 sessions fit SmolLM2's 8192
    assert report["overall"]["n"] == 2 and turns.height > 0
