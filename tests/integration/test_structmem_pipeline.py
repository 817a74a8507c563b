"""StructMem build stages on the real stack: llama.cpp + SmolLM2, MiniLM, faiss-cpu.

Reads the session runs of tests/fixtures/pipeline.py (`structmem_sample_run`: the full
pipeline on the bundled sample with debug=ci; `structmem_locomo2_run`: conv-26 cut to its
first 2 sessions, stages up to consolidate). Asserts structure, counts, provenance and
caching, never the quality of a 135M model's text. Uncached LLM budget: the fixtures' runs
plus, for the rerun test, only the requests whose first reply failed (the cache keeps
successes only).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.methods.structmem.windows import count_windows
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import SAMPLE_RUN, run_pipeline

pytestmark = [
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

LLM_STAGES = ("extract", "consolidate")


def _tables(run_dir: Path) -> RunDir:
    return RunDir(run_dir)


def check_entries(run: RunDir) -> pl.DataFrame:
    turns, entries = run.read_table("turns"), run.read_table("entries")
    assert entries.height > 0
    assert set(entries["kind"]) == {"fact", "relation"}
    assert entries["entry_id"].n_unique() == entries.height
    # Every entry is bound to a turn of its own conversation, with that turn's time and speaker.
    joined = entries.join(
        turns.select(
            "conv_id", "event_id", "session_time", pl.col("speaker").alias("turn_speaker")
        ),
        on=["conv_id", "event_id"],
        how="left",
    )
    assert joined["session_time"].null_count() == 0
    assert (joined["event_time"] == joined["session_time"]).all()
    assert (joined["speaker"] == joined["turn_speaker"]).all()
    return entries


def check_provenance(run: RunDir) -> None:
    entries, syn = run.read_table("entries"), run.read_table("syntheses")
    requests = run.read_table("requests")
    extract_ids = set(requests.filter(pl.col("stage") == "extract")["request_id"])
    assert set(entries["request_id"]) <= extract_ids
    assert set(syn["request_id"]) <= set(
        requests.filter(pl.col("stage") == "consolidate")["request_id"]
    )
    emb = run.read_table("entry_embeddings")
    assert sorted(emb["item_id"]) == sorted(entries["entry_id"])
    assert set(run.read_table("synthesis_embeddings")["item_id"]) == set(
        syn.filter("parse_ok")["synth_id"]
    )
    owner = dict(zip(entries["entry_id"], entries["conv_id"], strict=True))
    for r in syn.iter_rows(named=True):
        ids = [*r["buffer_entry_ids"], *r["seed_entry_ids"], *r["context_entry_ids"]]
        assert all(owner.get(i) == r["conv_id"] for i in ids), r["synth_id"]
        assert not set(r["buffer_entry_ids"]) & set(r["context_entry_ids"])
        assert set(r["seed_entry_ids"]) <= set(r["context_entry_ids"])


def check_windows(run: RunDir) -> None:
    entries, syn = run.read_table("entries"), run.read_table("syntheses")
    manifest = json.loads((run.root / "manifest.json").read_text())
    notes = manifest["stages"]["consolidate"]["notes"]
    assert syn.height == notes["windows"] == count_windows(entries, 3600)
    assert manifest["stages"]["consolidate"]["build_cost"]["batches"] == 1
    assert manifest["stages"]["extract"]["build_cost"]["batches"] == 1


def test_sample_run_entries_syntheses_provenance(structmem_sample_run: Path) -> None:
    run = _tables(structmem_sample_run)
    check_entries(run)
    check_windows(run)
    check_provenance(run)


def test_sample_run_retrievals_resolve(structmem_sample_run: Path) -> None:
    run = _tables(structmem_sample_run)
    ret = run.read_table("retrievals")
    entries, syn = run.read_table("entries"), run.read_table("syntheses")
    owner = {
        **dict(zip(entries["entry_id"], entries["conv_id"], strict=True)),
        **dict(zip(syn["synth_id"], syn["conv_id"], strict=True)),
    }
    assert ret.height > 0 and set(ret["circuit"]) <= {"entries", "syntheses"}
    assert all(owner.get(i) == c for i, c in zip(ret["item_id"], ret["conv_id"], strict=True))


@pytest.mark.e2e  # its own conv-26 run
def test_locomo2_run_one_window_per_session(structmem_locomo2_run: Path) -> None:
    run = _tables(structmem_locomo2_run)
    entries = check_entries(run)
    check_windows(run)
    check_provenance(run)
    syn = run.read_table("syntheses").sort("window_index")
    assert syn.height == entries["session_index"].n_unique() == 2
    assert syn["seed_entry_ids"][0].len() == 0  # historical scope: nothing precedes session 1


def test_forced_rerun_is_served_from_the_caches(
    structmem_sample_run: Path, tmp_path: Path, ci_overrides: list[str], llama_server
) -> None:
    # Rerun on a copy so the session run that other tests read stays untouched.
    run_dir = tmp_path / "rerun"
    shutil.copytree(structmem_sample_run, run_dir)
    first = RunDir(run_dir).read_table("requests").filter(pl.col("stage").is_in(LLM_STAGES))
    before = llama_server.calls()
    run_pipeline(
        [
            *ci_overrides,
            *SAMPLE_RUN,
            "stages=[extract,consolidate]",
            "force=true",
        ],
        run_dir,
    )
    sent = llama_server.calls() - before
    again = RunDir(run_dir).read_table("requests").filter(pl.col("stage").is_in(LLM_STAGES))
    assert sorted(again["request_id"]) == sorted(first["request_id"])
    # Only successful replies are cached, so a request is re-sent only if its first reply failed.
    failed_first = set(first.filter(~pl.col("parse_ok"))["request_id"])
    assert set(again.filter(~pl.col("cache_hit"))["request_id"]) == failed_first
    assert sent == int(again.filter(~pl.col("cache_hit"))["attempts"].sum())
    if not failed_first:
        assert sent == 0 and again["cache_hit"].all()
        for table in ("entries", "syntheses"):  # identical replies -> identical tables
            assert (
                RunDir(run_dir)
                .read_table(table)
                .equals(RunDir(structmem_sample_run).read_table(table))
            )


def _report_and_versions(run_dir: Path) -> set[str]:
    run = RunDir(run_dir)
    assert (run_dir / "report" / "report.json").is_file() and (run_dir / "report" / "report.md").is_file()
    return set(run.read_table("requests")["prompt_version"])


def test_sample_run_default_prompts_end_in_a_report(structmem_sample_run: Path) -> None:
    # the CPU profile's default prompts: reference instructions, worked examples left out
    versions = _report_and_versions(structmem_sample_run)
    assert {"factual/2+noexample", "relational/3+noexample", "synthesis/3+constrained"} <= versions
    assert "salvaged" in RunDir(structmem_sample_run).read_table("requests").columns


@pytest.mark.e2e  # two more extraction runs; the gate runs the default prompts
@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        (["extract.worked_example=true"], {"factual/2", "relational/3"}),  # the full default text
        (["extract.prompt_variant=grounded"], {"factual/2+grounded", "relational/2+grounded"}),
    ],
    ids=["default-with-examples", "grounded"],
)
def test_prompt_variants_end_in_a_report(
    tmp_path: Path, ci_overrides: list[str], overrides: list[str], want: set[str]
) -> None:
    # One conversation, one session: 2 extraction requests and a synthesis; no question of
    # sample-1 is answerable after its first session, so the report has no answers. The
    # variants change only the extraction prompts (two sessions took 154 s + 100 s on 2 cores).
    run_dir = tmp_path / "variant"
    run_pipeline(
        [*ci_overrides, "benchmark=sample", "benchmark.conversations=[sample-1]", "benchmark.max_sessions=1",
         "method=structmem", *overrides],
        run_dir,
    )
    assert want <= _report_and_versions(run_dir)
    assert check_entries(RunDir(run_dir)).height > 0
