"""The bundled sample: small, invented, and covering what the pipeline needs to exercise."""

from __future__ import annotations

import json

import polars as pl

from structmem_gpu.data import load_benchmark, sample_path


def test_sample_shape() -> None:
    turns, questions = load_benchmark("sample", None, None, None)
    convs = turns["conv_id"].unique(maintain_order=True).to_list()
    assert len(convs) >= 2
    assert turns.height <= 70  # CI runs a 135M model over every turn
    for conv in convs:
        sessions = (
            turns.filter(pl.col("conv_id") == conv)
            .group_by("session_index")
            .agg(pl.col("session_time").first(), pl.len())
            .sort("session_index")
        )
        assert sessions.height >= 4
        assert sessions["session_time"].dt.date().n_unique() >= 4
        assert sessions["len"].is_between(6, 10).all()
        assert sessions["session_time"].is_sorted()


def test_sample_has_a_pair_of_sessions_within_an_hour() -> None:
    turns, _ = load_benchmark("sample", None, None, None)
    times = (
        turns.group_by("conv_id", "session_index")
        .agg(pl.col("session_time").first())
        .sort("conv_id", "session_index")
    )
    gaps = times.with_columns(gap=pl.col("session_time").diff().over("conv_id").dt.total_seconds())[
        "gap"
    ].drop_nulls()
    assert (gaps < 3600).any()


def test_sample_images() -> None:
    turns, _ = load_benchmark("sample", None, None, None)
    assert turns["image_caption"].is_not_null().sum() >= 4
    raw = json.loads(sample_path().read_text(encoding="utf-8"))
    image_turns = [
        t
        for s in raw
        for k, v in s["conversation"].items()
        if isinstance(v, list)
        for t in v
        if "blip_caption" in t
    ]
    assert any("img_url" in t for t in image_turns) and any("img_url" not in t for t in image_turns)


def test_sample_questions() -> None:
    turns, questions = load_benchmark("sample", None, None, None)
    assert questions.height >= 15
    assert set(questions["category"]) == {1, 2, 3, 4, 5}
    cat5 = questions.filter(pl.col("category") == 5)
    assert cat5["adversarial_answer"].null_count() == 0
    # All evidence resolves: normalised == raw, and every id is a turn of that conversation.
    assert (questions["evidence"] == questions["evidence_raw"]).all()
    assert (questions["evidence"].list.len() > 0).all()
    known = {(c, d) for c, d in turns.select("conv_id", "dia_id").iter_rows()}
    for conv, evidence in questions.select("conv_id", "evidence").iter_rows():
        assert all((conv, e) in known for e in evidence)
    # The file covers the LoCoMo irregularities the scorer must handle.
    raw = json.loads(sample_path().read_text(encoding="utf-8"))
    items = [q for s in raw for q in s["qa"]]
    assert any(isinstance(q.get("answer"), int) for q in items)
    assert any(q["category"] == 1 and "," in str(q.get("answer", "")) for q in items)
    assert all("answer" not in q for q in items if q["category"] == 5)


def test_sample_truncation_keeps_questions_answerable() -> None:
    turns, questions = load_benchmark("sample", None, ["sample-1"], 2)
    assert set(turns["session_id"]) == {"S1", "S2"}
    assert questions.height > 0
