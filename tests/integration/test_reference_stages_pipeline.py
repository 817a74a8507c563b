"""experiment=structmem_locomo_reference_code end to end on the real stack (llama.cpp + SmolLM2,
MiniLM, faiss-cpu): load -> compress -> segment -> extract -> embed -> consolidate -> update ->
retrieve -> answer -> judge -> report, with the LLMLingua-2 stand-in of tests/fixtures/lingua.py
(random weights: which words survive is meaningless, the volume follows compress.rate) and the
official texts from STRUCTMEM_OFFICIAL_DIR (.ci/run: ../shared/official), which the experiment
reads by default (no prompts.sources argument here).

Slice: sample-1, first 2 sessions (14 turns; the test took 196 s on the baseline tests' 3
sessions, 154 s on 2). Its compressed text fits one 512-token buffer, so extraction is 1 batch
x 2 perspectives; then a few syntheses, the update candidates, 2 answers and 2 judgments.
Asserts structure and provenance, never entry quality."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests import official_repos
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1500),
]

SLICE = ["benchmark=sample", "benchmark.conversations=[sample-1]", "benchmark.max_sessions=2"]


def test_reference_profile_end_to_end_on_llamacpp(ci_overrides: list[str], tiny_lingua_model: str,
                                                  tmp_path: Path) -> None:
    official_repos.repo("lightmem")  # skips (with the reason) only where no checkouts are named
    run = tmp_path / "run"
    run_pipeline([*ci_overrides, "experiment=structmem_locomo_reference_code", *SLICE,
                  f"compress.model={tiny_lingua_model}", "compress.device=cpu",
                  "segment.layers=[0,1]"], run)
    tables = run / "tables"
    turns = pl.read_parquet(tables / "turns.parquet")
    comp = pl.read_parquet(tables / "compressed_turns.parquet")
    segs = pl.read_parquet(tables / "segments.parquet")
    entries = pl.read_parquet(tables / "entries.parquet")
    updates = pl.read_parquet(tables / "entry_updates.parquet")
    requests = pl.read_parquet(tables / "requests.parquet")
    extract = requests.filter(pl.col("stage") == "extract")
    # compression: one row per turn, fewer tokens out than in
    assert comp.height == turns.height
    manifest = json.loads((run / "manifest.json").read_text())
    stages = manifest["stages"]
    assert stages["compress"]["notes"]["tokens_out"] < stages["compress"]["notes"]["tokens_in"]
    # segmentation: extraction windows are its batches, 2 perspectives each, all answered
    kept = set(segs.filter(pl.col("batch_index").is_not_null())["event_ids"].explode().to_list())
    batches = segs.filter(pl.col("batch_index").is_not_null()).unique(["conv_id", "batch_index"]).height
    assert batches >= 1 and extract.height == 2 * batches
    assert extract["unanswered"].fill_null(False).sum() == 0
    assert stages["extract"]["notes"]["input"] == "segments"
    assert stages["extract"]["notes"]["windows"] == batches
    assert set(entries["event_id"].to_list()) <= kept
    # the offline update: every candidate is an existing entry, keyed by its original id
    assert set(updates["entry_id"].to_list()) <= set(entries["entry_id"].to_list())
    assert set(updates["decision"].to_list()) <= {"update", "delete", "ignore"}
    assert requests.filter(pl.col("stage") == "update").height == updates.height
    # the report names compression, segmentation, the store QA read and the texts' commits
    report = json.loads((run / "report" / "report.json").read_text())
    protocols = report["protocols"]
    assert "LLMLingua-2" in protocols["compression"]
    assert f"{batches} extraction batches" in protocols["segmentation"]
    assert protocols["qa_store"].startswith("pre-update")
    assert "lightmem@8fc9a91" in protocols["texts"] and "mem0@b3ede5b" in protocols["texts"]
    assert (run / "report" / "report.md").read_text().count("Compression:") == 1
