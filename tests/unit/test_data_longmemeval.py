"""LongMemEval loader on the hand-written format example and on tiny invented files."""

from __future__ import annotations

import copy
import json
from datetime import datetime

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.data import load_benchmark, load_longmemeval
from structmem_gpu.data.categories import LONGMEMEVAL_TYPES, longmemeval_category
from structmem_gpu.data.longmemeval import repeated_sessions
from tests.fixtures.data import tiny_longmemeval


def test_type_ids_are_stable_and_disjoint_from_locomo() -> None:
    assert longmemeval_category("single-session-user") == (101, "single-session-user")
    assert sorted(LONGMEMEVAL_TYPES.values()) == list(range(101, 107))


def test_example(longmemeval_example_path) -> None:
    turns, questions = load_longmemeval(longmemeval_example_path)
    assert turns.schema == pl.Schema(schemas.TURNS)
    assert questions.schema == pl.Schema(schemas.QUESTIONS)
    raw = json.loads(longmemeval_example_path.read_text(encoding="utf-8"))
    # One conversation per question, named after it.
    assert questions["question_id"].to_list() == [r["question_id"] for r in raw]
    assert (questions["conv_id"] == questions["question_id"]).all()
    assert set(turns["conv_id"]) == set(questions["conv_id"])

    first = turns.filter(pl.col("conv_id") == "synthetic_0001")
    assert (
        first["session_id"].unique(maintain_order=True).to_list() == raw[0]["haystack_session_ids"]
    )
    assert first["session_index"].unique(maintain_order=True).to_list() == [1, 2, 3]
    assert first["session_time"][0] == datetime(2023, 5, 2, 9, 12)
    assert first["dia_id"][:2].to_list() == ["answer_synth01_1_1", "answer_synth01_1_2"]
    assert first["speaker"][:2].to_list() == ["user", "assistant"]
    assert first["has_answer"].to_list()[:3] == [True, None, None]

    q = {r["question_id"]: r for r in questions.iter_rows(named=True)}
    assert q["synthetic_0001"]["category"] == 105
    assert q["synthetic_0001"]["category_name"] == "knowledge-update"
    assert q["synthetic_0001"]["evidence"] == ["answer_synth01_1_1", "answer_synth01_2_1"]
    assert q["synthetic_0001"]["evidence_raw"] == raw[0]["answer_session_ids"]
    assert q["synthetic_0001"]["question_time"] == datetime(2023, 6, 1, 10, 15)
    assert not q["synthetic_0001"]["is_abstention"]
    assert q["synthetic_0002_abs"]["is_abstention"]
    assert q["synthetic_0002_abs"]["category_name"] == "single-session-user"  # keeps its base type


def test_selection_and_dispatch(longmemeval_example_path) -> None:
    turns, questions = load_benchmark(
        "longmemeval", longmemeval_example_path, ["synthetic_0002_abs"], None
    )
    assert questions["question_id"].to_list() == ["synthetic_0002_abs"]
    assert set(turns["conv_id"]) == {"synthetic_0002_abs"}


def test_shared_session_hash(write_json) -> None:
    one = tiny_longmemeval()[0]
    two = copy.deepcopy(one)
    two["question_id"] = "tq_2_abs"
    two["haystack_session_ids"][1] = "answer_tq_2"
    two["answer_session_ids"] = ["answer_tq_2"]
    two["haystack_sessions"][1][0]["content"] = "I painted my car blue."
    turns, _ = load_longmemeval(write_json([one, two]))
    h = turns.group_by("conv_id", "session_index").agg(pl.col("session_hash").first())
    h = {(c, i): s for c, i, s in h.iter_rows()}
    assert h[("tq_1", 1)] == h[("tq_2_abs", 1)]  # same filler session, same date
    assert h[("tq_1", 2)] != h[("tq_2_abs", 2)]
    # A different date gives a different hash even for equal turns.
    two["haystack_dates"][0] = "2024/01/02 (Tue) 08:01"
    turns, _ = load_longmemeval(write_json([one, two], "b.json"))
    assert turns.filter(pl.col("session_index") == 1)["session_hash"].n_unique() == 2


def test_list_order_not_resorted(write_json) -> None:
    data = tiny_longmemeval()
    data[0]["haystack_dates"] = ["2024/01/05 (Fri) 20:00", "2024/01/05 (Fri) 18:30"]
    turns, _ = load_longmemeval(write_json(data))
    assert turns["session_id"].unique(maintain_order=True).to_list() == ["filler_1", "answer_tq_1"]


def test_max_sessions_drops_instances_with_evidence_outside(write_json) -> None:
    path = write_json(tiny_longmemeval())
    turns, questions = load_longmemeval(path, max_sessions=1)
    assert turns.height == 0 and questions.height == 0
    turns, questions = load_longmemeval(path, max_sessions=2)
    assert questions.height == 1 and turns.height == 4


def test_integer_answer_is_a_string(write_json) -> None:
    data = tiny_longmemeval()
    data[0]["answer"] = 3
    _, questions = load_longmemeval(write_json(data))
    assert questions["answer"].to_list() == ["3"]


def test_repeated_session_id_loads_with_both_occurrences(write_json, caplog) -> None:
    """As in 13 histories of the real longmemeval_s_cleaned.json: the same filler session id
    twice, identical turns, different dates. Both stay, in list order, with unique dia_ids."""
    data = tiny_longmemeval()
    rec = data[0]
    rec["haystack_session_ids"].append("filler_1")
    rec["haystack_dates"].append("2024/01/07 (Sun) 10:00")
    rec["haystack_sessions"].append(copy.deepcopy(rec["haystack_sessions"][0]))
    with caplog.at_level("WARNING", logger="structmem_gpu.data.longmemeval"):
        turns, questions = load_longmemeval(write_json(data))
    assert turns["session_id"].unique(maintain_order=True).to_list() == [
        "filler_1",
        "answer_tq_1",
        "filler_1#repeat2",
    ]
    assert turns["session_index"].unique(maintain_order=True).to_list() == [1, 2, 3]
    assert turns["dia_id"].is_unique().all()
    copy1 = turns.filter(pl.col("session_index") == 1)["text"].to_list()
    copy2 = turns.filter(pl.col("session_index") == 3)["text"].to_list()
    assert copy1 == copy2  # identical turns, different session (date, hash)
    assert turns.filter(pl.col("session_index") == 3)["session_hash"].n_unique() == 1
    assert questions["evidence"].to_list() == [["answer_tq_1_1"]]
    warnings = [r for r in caplog.records if "more than once" in r.getMessage()]
    assert len(warnings) == 1 and "tq_1" in warnings[0].getMessage()
    assert repeated_sessions(turns) == 1


@pytest.mark.e2e  # e2e: job subprocesses
def test_repeated_sessions_land_in_turns_parquet_and_the_load_notes(tmp_path, write_json) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = tiny_longmemeval()
    rec = data[0]
    rec["haystack_session_ids"].append("filler_1")
    rec["haystack_dates"].append("2024/01/07 (Sun) 10:00")
    rec["haystack_sessions"].append(copy.deepcopy(rec["haystack_sessions"][0]))
    path, run_dir = write_json(data), tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(root / "jobs" / "run.py"), "benchmark=longmemeval",
         f"benchmark.path={path}", "stages=[load]", f"hydra.run.dir={run_dir}"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "more than once" in proc.stdout + proc.stderr  # the one warning line
    from structmem_gpu.core.artifacts import RunDir

    # LongMemEval turns are stored compactly (turns_store.py); the accessor expands them.
    assert not (run_dir / "tables" / "turns.parquet").exists()
    turns = RunDir(run_dir).read_table("turns")
    assert set(turns["session_id"]) == {"filler_1", "answer_tq_1", "filler_1#repeat2"}
    assert turns.height == 6
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["stages"]["load"]["notes"]["repeated_sessions"] == 1
