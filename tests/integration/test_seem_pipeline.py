"""SEEM on the real stack: llama.cpp + SmolLM2, MiniLM, igraph, on conversation sample-1.

`seem_sample_run` (session) runs every SEEM stage once with debug=ci, restricted to sample-1's
first 2 sessions (14 passages; 3 questions, 2 of categories 1-4) and with debug=ci's SEEM
deviations (conf/debug/ci.yaml `seem:`): 8 passages per extraction request (F_ext and quadruple requests grouped per session),
windowed fusion with w = 5 (one request per wavefront step), then per question query
quadruples + filter + answer + judge. Asserts structure, provenance
and batch counts, never the quality of a 135M model's answers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(3600),
]

# sample-1's first 2 sessions (14 turns): the frames and graph replies run to 450-670 tokens
# each under SmolLM2, 35-60 s apiece on 2 cores (measured 2026-12-05); a third session (6
# turns, no question of categories 1-4 more) is left out: the fixture took 514 s with it.
SUBSET = ["benchmark.conversations=[sample-1]", "benchmark.max_sessions=2"]
UNCACHED_BUDGET = 80


@pytest.fixture(scope="session")
def seem_sample_run(tmp_path_factory: pytest.TempPathFactory, ci_overrides: list[str], llama_server) -> Path:
    run_dir = tmp_path_factory.mktemp("run-seem-sample")
    before = llama_server.calls()
    run_pipeline([*ci_overrides, "benchmark=sample", "method=seem", *SUBSET], run_dir)
    sent = llama_server.calls() - before
    (run_dir / "uncached_requests.txt").write_text(str(sent))
    print(f"\nSEEM integration run: {sent} uncached LLM requests")
    return run_dir


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def test_tables_exist_and_provenance_resolves_to_turns(seem_sample_run: Path) -> None:
    run = RunDir(seem_sample_run)
    turns = run.read_table("turns")
    events = set(turns["event_id"])
    frames, frame_of, facts = run.read_table("frames"), run.read_table("frame_of"), run.read_table("facts")
    assert frames.height > 0 and facts.height > 0
    prov = frames.explode("provenance")["provenance"]
    assert prov.n_unique() == prov.len() and set(prov) == events  # every turn in exactly one frame
    assert sorted(frame_of["pid"]) == sorted(events)
    assert (frames["provenance"].list.len() <= 10).all()
    assert set(facts.explode("provenance")["provenance"]) <= events
    nodes, edges = run.read_table("graph_nodes"), run.read_table("graph_edges")
    assert set(nodes.filter(pl.col("kind") == "passage")["name"]) == events
    assert set(edges["src"]) | set(edges["dst"]) <= set(nodes["node_id"])
    eef = run.read_table("frames_extracted")
    assert sorted(eef["pid"]) == sorted(events)


def test_every_question_has_one_answer_and_one_judgment(seem_sample_run: Path) -> None:
    run = RunDir(seem_sample_run)
    qids = sorted(run.read_table("questions").filter(pl.col("category").is_in([1, 2, 3, 4]))["question_id"])
    answers, judgments = run.read_table("answers"), run.read_table("judgments")
    assert sorted(answers["question_id"]) == qids
    assert judgments.group_by("question_id", "judge_name").len()["len"].max() == 1
    assert sorted(judgments["question_id"].unique()) == qids
    assert (seem_sample_run / "report" / "report.json").exists()


def test_fusion_batches_equal_wavefront_steps(seem_sample_run: Path) -> None:
    run = RunDir(seem_sample_run)
    stages = _manifest(seem_sample_run)["stages"]
    notes, cost = stages["fusion"]["notes"], stages["fusion"]["build_cost"]
    longest = run.read_table("passages").group_by("conv_id").len()["len"].max()
    window = notes["window"]
    # Windowed fusion: one batch per step, ceil(longest / w) steps (every window has >= 2 frames here).
    assert notes["steps"] == math.ceil(longest / window) == cost["batches"] == notes["batches"]
    assert notes["sub_batches_per_step"] == 1
    for stage in ("frames", "graph", "answer"):
        assert stages[stage]["build_cost"]["batches"] == 1
    assert stages["retrieve"]["build_cost"]["batches"] in (1, 2)  # query batch (+ filter batch)


def test_retrieval_respects_the_rpe_cap(seem_sample_run: Path) -> None:
    run = RunDir(seem_sample_run)
    ret = run.read_table("retrievals")
    turns = ret.filter(pl.col("circuit") == "turns")
    assert turns.group_by("question_id").len()["len"].max() <= 10
    frame_of = dict(zip(run.read_table("frame_of")["pid"], run.read_table("frame_of")["frame_id"], strict=True))
    for (qid,), part in turns.group_by("question_id"):
        frames = set(ret.filter((pl.col("question_id") == qid) & (pl.col("circuit") == "frames"))["item_id"])
        added = part.filter(pl.col("source") == "rpe")["item_id"].to_list()
        assert all(frame_of[p] in frames for p in added)


def test_uncached_request_count_within_budget(seem_sample_run: Path) -> None:
    sent = int((seem_sample_run / "uncached_requests.txt").read_text())
    calls = RunDir(seem_sample_run).read_table("requests").group_by("stage").len().sort("stage")
    print(f"\nSEEM requests per stage: {dict(calls.iter_rows())}; uncached: {sent}")
    assert sent <= UNCACHED_BUDGET
