"""Every kind of bad benchmark input raises one InputError naming the file and the record."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.data import load_locomo, load_longmemeval
from structmem_gpu.core.errors import InputError
from tests.fixtures.data import tiny_locomo, tiny_longmemeval

Loader = Callable[[Path], Any]


def _raises(loader: Loader, path: Path, *fragments: str) -> str:
    with pytest.raises(InputError) as info:
        loader(path)
    message = str(info.value)
    assert path.name in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval])
def test_missing_file(loader: Loader, tmp_path: Path) -> None:
    _raises(loader, tmp_path / "nope.json", "file not found")


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval])
def test_invalid_json(loader: Loader, tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('[{"sample_id": "x",', encoding="utf-8")
    _raises(loader, path, "invalid JSON")


@pytest.mark.parametrize("loader", [load_locomo, load_longmemeval])
def test_not_a_list(loader: Loader, write_json) -> None:
    _raises(loader, write_json({"a": 1}), "top level must be a JSON list")


# --------------------------------------------------------------------------- LoCoMo


def _locomo(mutate: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    data = tiny_locomo()
    mutate(data[0])
    return data


def test_locomo_missing_sample_key(write_json) -> None:
    path = write_json(_locomo(lambda s: s.pop("qa")))
    _raises(load_locomo, path, "[record 0]", "missing required key(s) ['qa']")


def test_locomo_missing_turn_key(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"]["session_2"][1].pop("speaker")))
    _raises(load_locomo, path, "[t-1 session_2 turn 2]", "missing required key(s) ['speaker']")


def test_locomo_missing_qa_key(write_json) -> None:
    path = write_json(_locomo(lambda s: s["qa"][1].pop("evidence")))
    _raises(load_locomo, path, "[t-1 q1]", "['evidence']")


def test_locomo_missing_answer(write_json) -> None:
    path = write_json(_locomo(lambda s: s["qa"][0].pop("answer")))
    _raises(load_locomo, path, "[t-1 q0]", "missing answer")
    path = write_json(_locomo(lambda s: s["qa"][2].pop("adversarial_answer")), "b.json")
    _raises(load_locomo, path, "[t-1 q2]", "missing answer or adversarial_answer")


def test_locomo_unknown_category(write_json) -> None:
    path = write_json(_locomo(lambda s: s["qa"][0].update(category=7)))
    _raises(load_locomo, path, "[t-1 q0]", "unknown category 7")


def test_locomo_unparseable_date(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"].update(session_2_date_time="June 2nd")))
    _raises(load_locomo, path, "[t-1 session_2]", "unparseable session date 'June 2nd'")


def test_locomo_missing_date(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"].pop("session_1_date_time")))
    _raises(load_locomo, path, "[t-1 session_1]", "missing session_1_date_time")


def test_locomo_no_sessions(write_json) -> None:
    def drop(s: dict[str, Any]) -> None:
        s["conversation"] = {
            "speaker_a": "Ana",
            "speaker_b": "Ben",
            "session_1_date_time": "9:30 am on 1 June, 2023",
        }

    _raises(load_locomo, write_json(_locomo(drop)), "[t-1]", "conversation has no sessions")


def test_locomo_empty_session(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"].update(session_2=[])))
    _raises(load_locomo, path, "[t-1 session_2]", "session has no turns")


@pytest.mark.parametrize("text", [None, "", "   "])
def test_locomo_turn_without_text(write_json, text: str | None) -> None:
    def blank(s: dict[str, Any]) -> None:
        turn = s["conversation"]["session_1"][1]
        turn.pop("text") if text is None else turn.update(text=text)

    _raises(
        load_locomo,
        write_json(_locomo(blank)),
        "[t-1 session_1 D1:2]",
        "no text and no image caption",
    )


def test_locomo_image_only_turn_is_accepted(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"]["session_2"][1].pop("text")))
    turns, _ = load_locomo(path)
    assert turns["text"][3] == "" and turns["image_caption"][3] == "a photo of a red door"


def test_locomo_duplicate_dia_id(write_json) -> None:
    path = write_json(_locomo(lambda s: s["conversation"]["session_2"][1].update(dia_id="D1:1")))
    message = _raises(load_locomo, path, "[t-1 session_2 D1:1]", "duplicate dia_id")
    assert re.search(r"bench\.json \[t-1 session_2 D1:1\]: duplicate dia_id", message)


def test_locomo_duplicate_sample_id(write_json) -> None:
    _raises(load_locomo, write_json(tiny_locomo() * 2), "[t-1]", "duplicate sample_id")


def test_locomo_bad_evidence_type(write_json) -> None:
    path = write_json(_locomo(lambda s: s["qa"][0].update(evidence="D1:2")))
    _raises(load_locomo, path, "[t-1 q0]", "evidence must be a list of strings")


# --------------------------------------------------------------------------- LongMemEval


def _lme(mutate: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    data = tiny_longmemeval()
    mutate(data[0])
    return data


def test_lme_missing_key(write_json) -> None:
    path = write_json(_lme(lambda r: r.pop("haystack_dates")))
    _raises(load_longmemeval, path, "[tq_1]", "missing required key(s) ['haystack_dates']")
    path = write_json([{"question": "x"}], "b.json")
    _raises(load_longmemeval, path, "[record 0]", "['question_id']")


def test_lme_missing_turn_role(write_json) -> None:
    path = write_json(_lme(lambda r: r["haystack_sessions"][1][1].pop("role")))
    _raises(load_longmemeval, path, "[tq_1 answer_tq_1 answer_tq_1_2]", "['role']")


@pytest.mark.parametrize("role", ["system-admin", "system", "User", ""])
def test_lme_unknown_turn_role(write_json, role: str) -> None:
    # only user / assistant exist; another role would have become a silent third speaker
    path = write_json(_lme(lambda r: r["haystack_sessions"][1][0].update(role=role)))
    _raises(load_longmemeval, path, "[tq_1 answer_tq_1 answer_tq_1_1]", f"unknown role {role!r}")


def test_lme_unknown_type(write_json) -> None:
    path = write_json(_lme(lambda r: r.update(question_type="two_hop")))
    _raises(load_longmemeval, path, "[tq_1]", "unknown question_type 'two_hop'")


def test_lme_unparseable_dates(write_json) -> None:
    path = write_json(_lme(lambda r: r["haystack_dates"].__setitem__(1, "2024-01-05 18:30")))
    _raises(
        load_longmemeval, path, "[tq_1 answer_tq_1]", "unparseable session date '2024-01-05 18:30'"
    )
    path = write_json(_lme(lambda r: r.update(question_date="soon")), "b.json")
    _raises(load_longmemeval, path, "[tq_1]", "unparseable question_date 'soon'")


def test_lme_length_mismatch(write_json) -> None:
    path = write_json(_lme(lambda r: r["haystack_dates"].pop()))
    _raises(load_longmemeval, path, "[tq_1]", "differ in length (2, 1, 2)")


def test_lme_no_sessions(write_json) -> None:
    def empty(r: dict[str, Any]) -> None:
        r.update(haystack_session_ids=[], haystack_dates=[], haystack_sessions=[])

    _raises(load_longmemeval, write_json(_lme(empty)), "[tq_1]", "no haystack sessions")


def test_lme_empty_session(write_json) -> None:
    path = write_json(_lme(lambda r: r["haystack_sessions"].__setitem__(0, [])))
    _raises(load_longmemeval, path, "[tq_1 filler_1]", "session has no turns")


@pytest.mark.parametrize("content", [None, "", " \n"])
def test_lme_turn_without_text(write_json, content: str | None) -> None:
    def blank(r: dict[str, Any]) -> None:
        turn = r["haystack_sessions"][0][1]
        turn.pop("content") if content is None else turn.update(content=content)

    _raises(
        load_longmemeval, write_json(_lme(blank)), "[tq_1 filler_1 filler_1_2]", "turn has no text"
    )


def test_lme_colliding_dia_id_is_still_an_error(write_json) -> None:
    # a real session id that spells the rename of a repeat collides with it: an error, not a merge
    path = write_json(
        _lme(
            lambda r: (
                r["haystack_session_ids"].__setitem__(1, "filler_1#repeat2"),
                r["haystack_session_ids"].append("filler_1"),
                r["haystack_dates"].append("2024/01/06 (Sat) 09:00"),
                r["haystack_sessions"].append([{"role": "user", "content": "Tea again?"}]),
            )
        )
    )
    where = "[tq_1 filler_1#repeat2 filler_1#repeat2_1]"
    _raises(load_longmemeval, path, where, "duplicate dia_id")


def test_lme_duplicate_question_id(write_json) -> None:
    _raises(load_longmemeval, write_json(tiny_longmemeval() * 2), "[tq_1]", "duplicate question_id")


def test_lme_unknown_keys_ignored(write_json) -> None:
    _, questions = load_longmemeval(
        write_json(_lme(lambda r: r.update(_note="synthetic", extra=[1])))
    )
    assert questions.height == 1
