"""The synthetic LoCoMo-format generator of the scale benchmark: deterministic, loadable, sized."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.bench.synthetic import (
    SyntheticSpec,
    generate_locomo,
    locomo_date,
    unique_pool_sessions,
    write_locomo,
)
from structmem_gpu.data import load_benchmark
from structmem_gpu.methods.structmem.windows import count_windows


def test_same_spec_same_bytes(tmp_path: Path) -> None:
    spec = SyntheticSpec(5, sessions=3, turns_per_session=4, seed=7)
    a = write_locomo(spec, tmp_path / "a.json").read_bytes()
    b = write_locomo(spec, tmp_path / "b.json").read_bytes()
    assert a == b
    assert generate_locomo(SyntheticSpec(5, 3, 4, seed=8)) != json.loads(a)  # the seed matters


def test_loads_as_locomo_with_the_requested_sizes(tmp_path: Path) -> None:
    spec = SyntheticSpec(6, sessions=3, turns_per_session=5, questions_per_conversation=4)
    turns, questions = load_benchmark("locomo", write_locomo(spec, tmp_path / "s.json"), None, None)
    assert turns.height == 6 * 3 * 5
    assert turns["conv_id"].n_unique() == 6
    assert turns.select("conv_id", "session_index").unique().height == 18
    assert questions.height == 6 * 4
    assert set(questions["category"].to_list()) == {1, 2, 3, 4}
    # Every evidence id resolves to a turn of its conversation.
    known = set(zip(turns["conv_id"], turns["dia_id"], strict=True))
    for conv, evidence in questions.select("conv_id", "evidence").iter_rows():
        assert evidence and all((conv, e) in known for e in evidence)
    assert turns["image_caption"].drop_nulls().len() > 0  # some image turns
    # Sessions are more than a day apart: one consolidation window per session, like LoCoMo.
    assert count_windows(turns.rename({"session_time": "event_time"}), 3600) == 18


def test_turn_text_has_realistic_length(tmp_path: Path) -> None:
    turns, _ = load_benchmark(
        "locomo", write_locomo(SyntheticSpec(3), tmp_path / "s.json"), None, None
    )
    words = turns["text"].str.split(" ").list.len()
    assert 8 <= float(words.mean()) <= 40  # type: ignore[operator]


def test_haystack_mode_shares_sessions(tmp_path: Path) -> None:
    spec = SyntheticSpec(8, sessions=3, turns_per_session=2, shared_pool=5)
    turns, _ = load_benchmark("locomo", write_locomo(spec, tmp_path / "h.json"), None, None)
    assert turns.select("conv_id", "session_index").unique().height == 24
    assert turns["session_hash"].n_unique() == unique_pool_sessions(spec) <= 5
    # A shared session has the same date and text in every conversation that holds it.
    per_hash = turns.group_by("session_hash").agg(pl.col("session_time").n_unique().alias("t"))
    assert per_hash["t"].max() == 1


def test_unique_sessions_without_pool_is_every_session() -> None:
    assert unique_pool_sessions(SyntheticSpec(4, sessions=3)) == 12


def test_bad_specs_are_rejected() -> None:
    with pytest.raises(ValueError):
        SyntheticSpec(0)
    with pytest.raises(ValueError):
        SyntheticSpec(2, sessions=4, shared_pool=3)


def test_locomo_date_format() -> None:
    from datetime import datetime

    assert locomo_date(datetime(2023, 5, 8, 13, 56)) == "1:56 pm on 8 May, 2023"
    assert locomo_date(datetime(2023, 1, 2, 0, 5)) == "12:05 am on 2 January, 2023"
