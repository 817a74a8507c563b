"""LoCoMo loader: rules on tiny invented files, counts on the real file (marker `locomo`)."""

from __future__ import annotations

import logging
from datetime import datetime

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.data import display_text, load_benchmark, load_locomo
from structmem_gpu.data.categories import CATEGORY_NAMES, LOCOMO_CATEGORIES, category_name
from structmem_gpu.data.locomo import normalise_evidence
from structmem_gpu.core.errors import ConfigError, InputError
from tests.fixtures.data import tiny_locomo


def test_category_map_is_the_code_mapping() -> None:
    assert dict(LOCOMO_CATEGORIES) == {
        1: "multi-hop",
        2: "temporal",
        3: "open-domain",
        4: "single-hop",
        5: "adversarial",
    }
    assert category_name(4) == "single-hop"
    assert set(CATEGORY_NAMES) >= set(LOCOMO_CATEGORIES)


def test_display_text() -> None:
    assert display_text("Look!", "a photo of a dog") == "Look! [image: a photo of a dog]"
    assert display_text("Hi", None) == "Hi"
    assert display_text("", "a photo of a dog") == "[image: a photo of a dog]"


def test_normalise_evidence_rules() -> None:
    known = {"D8:6", "D9:17", "D11:26", "D30:5", "D9:1", "D4:4"}
    ev = normalise_evidence(
        ["D8:6; D9:17", "D:11:26", "D30:05", "D9:1 D4:4", "D", "D4:36", "D8:6"], known
    )
    assert ev.ids == ("D8:6", "D9:17", "D11:26", "D30:5", "D9:1", "D4:4")
    assert ev.recovered == ("D8:6; D9:17", "D:11:26", "D30:05", "D9:1 D4:4")
    assert ev.unresolved == ("D", "D4:36")


def test_tiny_file_rules(write_json) -> None:
    turns, questions = load_locomo(write_json(tiny_locomo()))
    assert turns.schema == pl.Schema(schemas.TURNS)
    assert questions.schema == pl.Schema(schemas.QUESTIONS)
    # Sessions from `session_<n>` keys, numeric order; the orphan session_3 date key is ignored.
    assert turns["session_id"].to_list() == ["S1", "S1", "S2", "S2"]
    assert turns["turn_index"].to_list() == [0, 1, 0, 1]
    assert turns["event_id"][2] == "t-1:D2:1"
    # "12:05 am" is just after midnight.
    assert turns["session_time"][2] == datetime(2023, 6, 2, 0, 5)
    assert turns["image_caption"].to_list() == [None, None, None, "a photo of a red door"]
    assert turns["session_hash"].n_unique() == 2
    q = {r["question_id"]: r for r in questions.iter_rows(named=True)}
    assert q["t-1:q1"]["answer"] == "2"  # integer gold as a string
    assert q["t-1:q1"]["evidence"] == ["D2:1"] and q["t-1:q1"]["evidence_raw"] == ["D02:1"]
    assert q["t-1:q2"]["answer"] == "red" and q["t-1:q2"]["adversarial_answer"] == "red"
    assert q["t-1:q2"]["is_abstention"] and q["t-1:q2"]["category_name"] == "adversarial"
    assert q["t-1:q3"]["evidence"] == []  # empty evidence kept without truncation
    assert questions["question_time"].null_count() == questions.height


def test_max_sessions_keeps_questions_inside_prefix(write_json) -> None:
    turns, questions = load_locomo(write_json(tiny_locomo()), max_sessions=1)
    assert turns["session_id"].unique().to_list() == ["S1"]
    # q0 needs D2:1, q1/q2 live in S2, q3 has no evidence: all dropped.
    assert questions.height == 0
    data = tiny_locomo()
    data[0]["qa"].append(
        {"question": "When?", "answer": "Friday", "evidence": ["D1:2"], "category": 2}
    )
    _, questions = load_locomo(write_json(data), max_sessions=1)
    assert questions["question_id"].to_list() == ["t-1:q4"]


def test_session_hash_depends_on_content_and_date(write_json) -> None:
    data = tiny_locomo()
    base = load_locomo(write_json(data, "a.json"))[0]
    data[0]["conversation"]["session_1_date_time"] = "9:31 am on 1 June, 2023"
    moved = load_locomo(write_json(data, "b.json"))[0]
    assert base["session_hash"][0] != moved["session_hash"][0]
    assert base["session_hash"][2] == moved["session_hash"][2]


def test_conversation_selection(write_json) -> None:
    data = tiny_locomo() + [{**tiny_locomo()[0], "sample_id": "t-2"}]
    turns, questions = load_locomo(write_json(data), conversations=["t-2"])
    assert set(turns["conv_id"]) == {"t-2"} and set(questions["conv_id"]) == {"t-2"}
    with pytest.raises(InputError, match=r"bench\.json.*\['t-9'\] not in file"):
        load_locomo(write_json(data), conversations=["t-9"])


def test_load_benchmark_dispatch(write_json) -> None:
    path = write_json(tiny_locomo())
    assert load_benchmark("locomo", path, None, None)[0].height == 4
    with pytest.raises(ConfigError, match="benchmark.path is required"):
        load_benchmark("locomo", None, None, None)
    with pytest.raises(ConfigError, match="unknown benchmark"):
        load_benchmark("locomo2", path, None, None)
    with pytest.raises(ConfigError, match="max_sessions"):
        load_benchmark("locomo", path, None, 0)


# --------------------------------------------------------------------------- real file


@pytest.mark.locomo
def test_real_locomo_counts(locomo_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="structmem_gpu.data.locomo"):
        turns, questions = load_locomo(locomo_path)
    assert turns.schema == pl.Schema(schemas.TURNS)
    assert questions.schema == pl.Schema(schemas.QUESTIONS)
    assert turns["conv_id"].n_unique() == 10
    assert turns.select("conv_id", "session_id").unique().height == 272
    assert turns.height == 5882
    assert turns["image_caption"].is_not_null().sum() == 1226
    assert (
        turns["dia_id"].str.extract(r"^D(\d+):", 1).cast(pl.Int32).eq(turns["session_index"]).all()
    )
    assert questions.height == 1986
    by_cat = dict(questions.group_by("category").len().iter_rows())
    assert by_cat == {1: 282, 2: 321, 3: 96, 4: 841, 5: 446}
    assert questions.filter(pl.col("category") != 5).height == 1540
    assert questions["answer"].null_count() == 0
    # conv-26 has 35 date keys but 19 sessions.
    assert turns.filter(pl.col("conv_id") == "conv-26")["session_index"].max() == 19

    # Category 5: gold = answer if present (2 items answer "No") else adversarial_answer.
    cat5 = questions.filter(pl.col("category") == 5)
    assert cat5["adversarial_answer"].null_count() == 0
    assert (
        cat5["is_abstention"].all()
        and not questions.filter(pl.col("category") != 5)["is_abstention"].any()
    )
    differs = cat5.filter(pl.col("answer") != pl.col("adversarial_answer"))
    assert differs.height == 2 and set(differs["answer"]) == {"No"}

    # Evidence: 4 questions with empty raw evidence are kept; 9 malformed raw ids, 6 recovered.
    assert (questions["evidence_raw"].list.len() == 0).sum() == 4
    known_by_conv = {c: set(g["dia_id"]) for (c,), g in turns.group_by("conv_id")}
    malformed = recovered = 0
    for row in questions.iter_rows(named=True):
        known = known_by_conv[row["conv_id"]]
        assert set(row["evidence"]) <= known
        for raw in row["evidence_raw"]:
            if raw not in known:
                malformed += 1
                ev = normalise_evidence([raw], known)
                recovered += len(ev.recovered)
    assert (malformed, recovered) == (9, 6)
    dropped = [r.getMessage() for r in caplog.records if "unresolvable evidence" in r.getMessage()]
    assert len(dropped) == 3 and any("conv-42 q88" in m for m in dropped)


@pytest.mark.locomo
def test_real_locomo_slice(locomo_path) -> None:
    turns, questions = load_locomo(locomo_path, conversations=["conv-30"], max_sessions=2)
    assert set(turns["session_id"]) == {"S1", "S2"}
    assert questions.height > 0
    allowed = set(turns["dia_id"])
    assert all(e and set(e) <= allowed for e in questions["evidence"].to_list())
    assert questions["question_id"].str.starts_with("conv-30:q").all()
