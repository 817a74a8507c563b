"""Judge pieces without a pipeline: label parsing, rules, request shape, merging judge rows."""

from __future__ import annotations

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval.judge import (
    JUDGMENT_COLUMNS,
    RULE_CAT5,
    RULE_EMPTY,
    JudgeItem,
    build_request,
    judge_items,
    keep_other_judges,
    parse_label,
    reasoning_chars,
    rule_verdict,
)
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.types import Sampling
from structmem_gpu.eval.prompts import judge_locomo, judge_longmemeval
from tests.fixtures.pipeline import job_with


@pytest.mark.parametrize(
    "data,text,expected",
    [
        ({"reasoning": "same city", "label": "CORRECT"}, "", True),
        ({"reasoning": "no", "label": "WRONG"}, "", False),
        (None, '```json\n{"reasoning": "x", "label": "correct"}\n```', True),  # fences, case
        (
            None,
            '{"reasoning": "cut off before the end", "label": "WRONG"',
            False,
        ),  # truncated after label
        (None, '{"reasoning": "cut off before the lab', None),  # no label at all
        (None, "CORRECT", None),  # bare word: not the schema, unjudged rather than guessed
        (None, '{"label": "MAYBE"}', None),  # outside the enum
        (None, "", None),
        ({"label": 1}, "", None),
    ],
)
def test_parse_label(data: object, text: str, expected: bool | None) -> None:
    assert parse_label(data, text, "CORRECT", "WRONG") is expected


def test_parse_label_longmemeval_yes_no() -> None:
    assert parse_label({"label": "yes"}, "", "yes", "no") is True
    assert parse_label(None, '{"reasoning": "r", "label": "no"}', "yes", "no") is False


def _item(**kw: object) -> JudgeItem:
    base = {
        "question_id": "c:q0",
        "conv_id": "c",
        "question": "Where?",
        "gold": "Rome",
        "category": 4,
        "category_name": "single-hop",
        "is_abstention": False,
        "prediction": "Rome, Italy",
    }
    base.update(kw)
    return JudgeItem(**base)  # type: ignore[arg-type]


def test_rules_without_llm_calls() -> None:
    assert rule_verdict(_item(category=5, prediction="Not mentioned in the conversation")) == (
        RULE_CAT5,
        "locomo_cat5_rule/1",
        True,
        None,
    )
    assert rule_verdict(_item(category=5, prediction="Yes")) == (
        RULE_CAT5,
        "locomo_cat5_rule/1",
        False,
        None,
    )
    assert rule_verdict(_item(prediction="  ")) == (RULE_EMPTY, RULE_EMPTY, False, None)
    assert rule_verdict(_item()) is None


def test_request_schema_puts_reasoning_before_label_and_fits_max_tokens() -> None:
    req = build_request(_item(), "j", Sampling(max_tokens=40), "reasoned")
    assert req.prompt_version == judge_locomo.VERSION and req.stage == "judge"
    assert list(req.schema["properties"]) == ["reasoning", "label"]  # type: ignore[index]
    assert req.schema["properties"]["label"]["enum"] == ["CORRECT", "WRONG"]  # type: ignore[index]
    assert req.schema["properties"]["reasoning"]["maxLength"] == reasoning_chars(40) < 40 * 4  # type: ignore[index]
    other = build_request(_item(), "other-judge", Sampling(max_tokens=40), "reasoned")
    assert other.request_id != req.request_id  # one request per (judge, question)


def test_longmemeval_rule_by_type_and_abstention() -> None:
    lme = _item(category=106, category_name="temporal-reasoning")
    req = build_request(lme, "j", Sampling(), "reasoned")
    assert req.prompt_version == judge_longmemeval.VERSION
    assert "off-by-one" in req.messages[0].content
    assert req.schema["properties"]["label"]["enum"] == ["yes", "no"]  # type: ignore[index]
    abst = build_request(
        _item(category=106, category_name="temporal-reasoning", is_abstention=True),
        "j",
        Sampling(),
        "reasoned",
    )
    assert "cannot be answered" in abst.messages[0].content
    assert judge_longmemeval.rule_for("knowledge-update", False) == "knowledge_update"
    assert judge_longmemeval.rule_for("single-session-preference", False) == "preference"
    assert judge_longmemeval.rule_for("multi-session", False) == "default"


def _questions() -> pl.DataFrame:
    base = {
        "conv_id": "c",
        "question": "?",
        "answer": "a",
        "adversarial_answer": None,
        "category_name": "x",
        "evidence": [],
        "evidence_raw": [],
        "question_time": None,
        "is_abstention": False,
    }
    return schemas.frame(
        [{**base, "question_id": f"c:q{i}", "category": cat} for i, cat in enumerate([1, 4, 5, 2])],
        schemas.QUESTIONS,
    )


def test_category_filtering_and_missing_answers() -> None:
    q = _questions()
    cfg = job_with({"benchmark": {"categories": [1, 2, 3, 4]}})
    assert selected_questions(cfg, q)["question_id"].to_list() == ["c:q0", "c:q1", "c:q3"]
    assert selected_questions(job_with({"benchmark": {"categories": None}}), q).height == 4
    answers = schemas.frame(
        [
            {
                "question_id": "c:q0",
                "conv_id": "c",
                "prediction": "p",
                "request_id": "r",
                "parse_ok": True,
            }
        ],
        schemas.ANSWERS,
    )
    with pytest.raises(StructMemError, match="no answer for 2 selected questions"):
        judge_items(selected_questions(cfg, q), answers)


def _judgment(qid: str, judge: str, prediction: str) -> dict[str, object]:
    return {
        "question_id": qid,
        "judge_model": "m",
        "judge_name": judge,
        "prompt_version": "v",
        "label": True,
        "reply_raw": "{}",
        "f1_locomo": 0.0,
        "f1_mem0": 0.0,
        "bleu1": 0.0,
        "evidence_recall": None,
        "prediction": prediction,
    }


def test_keep_other_judges_replaces_own_rows_and_drops_stale() -> None:
    old = schemas.frame(
        [_judgment("q0", "a", "p0"), _judgment("q1", "a", "OLD"), _judgment("q0", "b", "p0")],
        JUDGMENT_COLUMNS,
    )
    answers = schemas.frame(
        [
            {"question_id": q, "conv_id": "c", "prediction": p, "request_id": "r", "parse_ok": True}
            for q, p in [("q0", "p0"), ("q1", "p1")]
        ],
        schemas.ANSWERS,
    )
    kept = keep_other_judges(old, ["b"], answers)
    assert kept.select("question_id", "judge_name").rows() == [
        ("q0", "a")
    ]  # own (b) replaced, stale q1 dropped
    assert keep_other_judges(None, ["b"], answers).height == 0
