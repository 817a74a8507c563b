"""structmem_gpu.analysis.inspect on a sample run built with the scripted LLM (no server).

python -m pytest tests/unit -q -k inspect
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.analysis.inspect import (
    FAILURE_TYPES,
    Run,
    Sweep,
    answers_table,
    load,
    load_run,
    load_sweep,
    memory_of,
    published_rows,
    question_view,
    scores_table,
)
from structmem_gpu.core.errors import InputError, MissingTableError
from tests.fixtures.pipeline import run_pipeline

SCRIPTED = ["debug=scripted", "benchmark=sample", "method=structmem"]


def build_scripted_run(factory: pytest.TempPathFactory, method: str = "structmem") -> Path:
    """The full pipeline of `method` on the bundled sample with the scripted LLM, built once
    per session at a fixed path under the session's base temp dir (test_plots.py and
    test_notebooks.py call this from their own fixtures and share the run)."""
    base = factory.getbasetemp()
    run_dir = base / f"{method}-scripted-sample"
    if not (run_dir / "report" / "report.json").is_file():
        overrides = ["debug=scripted", "benchmark=sample", f"method={method}"]
        run_pipeline([*overrides, f"paths.cache_dir={base / 'scripted-cache'}"], run_dir)
    return run_dir


@pytest.fixture(scope="session")
def scripted_sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_scripted_run(tmp_path_factory)


@pytest.fixture
def run(scripted_sample_run: Path) -> Run:
    return load_run(scripted_sample_run)


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_tables_are_lazy_and_cached(run: Run) -> None:
    assert run._tables == {}
    first = run.entries
    assert run.entries is first, "a table is read once"
    assert set(run._tables) == {"entries"}
    assert {"turns", "questions", "entries", "syntheses", "judgments"} <= set(run.available())
    assert run.scan("entries").collect().height == first.height
    assert (run.method, run.benchmark) == ("structmem", "sample")


def test_missing_table_names_the_file(tmp_path: Path, run: Run) -> None:
    shutil.copytree(run.root, tmp_path / "r")
    (tmp_path / "r" / "tables" / "retrievals.parquet").unlink()
    other = load_run(tmp_path / "r")
    assert other.optional("retrievals") is None
    with pytest.raises(MissingTableError, match="retrievals.parquet"):
        _ = other.retrievals
    with pytest.raises(InputError, match="not a run directory"):
        load_run(tmp_path / "nothing")


def test_config_value_from_manifest(run: Run) -> None:
    assert run.config_value("consolidate.seed_k") == 15
    assert run.config_value("retrieve.entries_k") == 60
    assert run.config_value("llm.backend") == "scripted"  # stored flat, not nested
    assert run.config_value("method") == "structmem"
    assert run.config_value("no.such.key") is None


def test_answers_table_joins_and_classifies(run: Run) -> None:
    table = answers_table(run)
    assert table.height == run.answers.height
    assert table["question_id"].n_unique() == table.height
    assert set(table["failure"].unique()) <= set(FAILURE_TYPES)
    correct = table.filter(pl.col("failure") == "correct")
    assert correct.height == int(run.judgments["label"].sum())
    missed = table.filter(pl.col("failure") == "evidence_missed")
    assert (missed["evidence_recall"] == 0).all() and (~missed["label"]).all()
    assert table.filter(pl.col("failure") == "evidence_retrieved")["evidence_recall"].eq(1).all()


def test_scores_table_matches_report(run: Run) -> None:
    scores = scores_table(run)
    overall = scores.filter(pl.col("category") == "overall").row(0, named=True)
    assert overall["judge_accuracy"] == pytest.approx(run.report["overall"]["judge_accuracy"])
    assert scores.height == len(run.report["by_category"]) + 1


def test_question_view_matches_judged_recall(run: Run) -> None:
    table = answers_table(run).filter(pl.col("evidence_recall").is_not_null())
    for row in table.iter_rows(named=True):
        view = question_view(run, row["question_id"])
        assert (
            view.retrieved.height
            == run.retrievals.filter(pl.col("question_id") == row["question_id"]).height
        )
        assert view.retrieved["text"].null_count() == 0, "every retrieved item resolves"
        # The evidence turns marked covered reproduce the judge stage's evidence recall.
        covered = view.evidence["covered"].sum() / len(row["evidence"])
        assert covered == pytest.approx(row["evidence_recall"]), row["question_id"]
        assert row["question_id"] in view.summary()
    with pytest.raises(InputError, match="no answer"):
        question_view(run, "sample-1:q999")


def test_memory_of_groups_entries_and_syntheses(run: Run) -> None:
    conv = run.turns["conv_id"][0]
    mem = memory_of(run, conv)
    entries = run.entries.filter(pl.col("conv_id") == conv)
    assert mem.entries.height == entries.height
    assert mem.entries_by_event.height == entries["event_id"].n_unique()
    n_items = (
        mem.entries_by_event.select(pl.col("facts").list.len() + pl.col("relations").list.len())
        .sum()
        .item()
    )
    assert n_items == entries.height
    assert mem.syntheses.height == run.syntheses.filter(pl.col("conv_id") == conv).height
    dia_ids = set(mem.turns["dia_id"])
    for col in ("buffer_events", "seed_events", "context_events"):
        assert set(mem.syntheses[col].explode().drop_nulls()) <= dia_ids
    assert (mem.syntheses["buffer_events"].list.len() > 0).all()
    with pytest.raises(InputError, match="no turns"):
        memory_of(run, "no-such-conv")


def test_load_sweep_and_comparison(tmp_path: Path, run: Run) -> None:
    for name in ("consolidate.seed_k=5", "consolidate.seed_k=15"):
        shutil.copytree(run.root, tmp_path / name)
    manifest = json.loads((tmp_path / "consolidate.seed_k=5" / "manifest.json").read_text())
    manifest["stages"]["consolidate"]["config"]["consolidate"]["seed_k"] = 5
    (tmp_path / "consolidate.seed_k=5" / "manifest.json").write_text(json.dumps(manifest))
    sweep = load(tmp_path)
    assert isinstance(sweep, Sweep)
    assert sorted(sweep.runs) == ["consolidate.seed_k=15", "consolidate.seed_k=5"]
    table = sweep.comparison()
    assert sorted(table["consolidate.seed_k"].to_list()) == [5, 15]
    assert table["acc_overall"].null_count() == 0
    assert isinstance(load(run.root), Run)
    with pytest.raises(InputError, match="no run directories"):
        load_sweep(tmp_path / "empty")


def test_published_rows_follow_recorded_config(tmp_path: Path) -> None:
    root = tmp_path / "locomo-run"
    root.mkdir()
    # every setting the rows fix, as the stages record them (no report.json yet)
    manifest = {
        "benchmark": "locomo",
        "method": "structmem",
        "stages": {
            "load": {"config": {"benchmark": {"categories": [1, 2, 3, 4]}}},
            "consolidate": {  # the reference code's seed pool and encoder (null = MiniLM)
                "config": {"consolidate": {"seed_k": 15, "enabled": True, "window_seconds": 3600,
                                           "seed_scope": "global", "seed_exclude_buffer": False},
                           "embedder": {"model": None, "long_texts": "truncate"}}
            },
            "extract": {"config": {"extract": {"input": "segments", "reference_mode": "event"}}},
            "update": {"config": {"update": {"enabled": True, "read": "pre"}}},
            "retrieve": {"config": {"retrieve.entries_k": 60, "retrieve.syntheses_k": 5}},
            "answer": {"config": {"answer": {"protocol": "paper"}}},
            "judge": {
                "config": {"judge": {"protocol": "paper"}, "llm": {"backend": "vllm_server"}}
            },
        },
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    # the method's pipeline, which no stage records: from the saved config (.hydra/config.yaml)
    (root / ".hydra").mkdir()
    stages = ["load", "compress", "segment", "extract", "embed", "consolidate", "update",
              "retrieve", "answer", "judge", "report"]
    saved = root / ".hydra" / "config.yaml"
    saved.write_text(json.dumps({"method": {"stages": stages}}))
    ids = {r.id for r in published_rows(load_run(root))}
    assert ids == {"structmem-table1", "structmem-fig3d-k15"}
    # without the compression and segmentation stages it is not the code's configuration
    raw_turns = [s for s in stages if s not in ("compress", "segment")]
    saved.write_text(json.dumps({"method": {"stages": raw_turns}}))
    assert published_rows(load_run(root)) == []
    saved.write_text(json.dumps({"method": {"stages": stages}}))
    manifest["stages"]["consolidate"]["config"]["consolidate"]["seed_k"] = 7
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert published_rows(load_run(root)) == []
    # a finished run: the ids its report.json lists
    (root / "report").mkdir()
    (root / "report" / "report.json").write_text(json.dumps({"published": ["structmem-fig3d-k5"]}))
    assert [r.id for r in published_rows(load_run(root))] == ["structmem-fig3d-k5"]
