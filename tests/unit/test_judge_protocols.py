"""Judge protocols: messages and label rules on real reply shapes.

docs/evaluation.md "Judge protocols" describes both protocols."""

from __future__ import annotations

import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.eval.judge import JudgeItem, build_request, judge_protocol, read_label
from structmem_gpu.llm.types import Sampling
from structmem_gpu.eval.prompts import judge_locomo_paper, judge_longmemeval_paper
from tests.fixtures.pipeline import job_with


def _item(**kw: object) -> JudgeItem:
    base = {
        "question_id": "c:q0",
        "conv_id": "c",
        "question": "Where did Jon go on vacation?",
        "gold": "Rome",
        "category": 4,
        "category_name": "single-hop",
        "is_abstention": False,
        "prediction": "He visited Rome in June",
    }
    base.update(kw)
    return JudgeItem(**base)  # type: ignore[arg-type]


def test_locomo_paper_is_one_user_message_with_the_generous_rules() -> None:
    req = build_request(_item(), "j", Sampling(max_tokens=40), "paper")
    assert [m.role for m in req.messages] == ["user"]  # no system message
    text = req.messages[0].content
    assert "Question: Where did Jon go on vacation?" in text and "Gold answer: Rome" in text
    assert "touches on the topic" in text  # generous on topic (the reference: "touches on")
    assert "relative expression" in text  # generous on time
    assert '"label"' in text and "never both" in text
    assert req.prompt_version == judge_locomo_paper.VERSION
    # JSON mode: an object with a string label, no enum and no reasoning field
    assert req.schema is not None and list(req.schema["properties"]) == ["label"]
    assert "enum" not in req.schema["properties"]["label"]


@pytest.mark.parametrize(
    "reply,expected",
    [
        ('{"label": "CORRECT"}', True),
        ('{"label": "WRONG"}', False),
        ('{"label": "correct"}', False),  # not exactly CORRECT: wrong under `paper`
        ('{"label": "Correct"}', False),
        ('```json\n{"label": "CORRECT"}\n```', True),  # fenced, as extract_json reads it
        ('The answer names Rome. {"label": "CORRECT"} ', True),  # first { to last }
        ("CORRECT", None),  # no JSON: unreadable -> unjudged (counted wrong by the report)
        ('{"verdict": "CORRECT"}', None),  # no label key
        ('{"label": "CORRECT"', None),  # cut before the closing brace
        ("", None),
    ],
)
def test_locomo_paper_label_rule(reply: str, expected: bool | None) -> None:
    assert judge_locomo_paper.parse_label(reply) is expected
    assert read_label(_item(), "paper", None, reply) is expected


def test_reasoned_protocol_accepts_any_case_where_paper_does_not() -> None:
    reply = '{"reasoning": "same city", "label": "correct"}'
    assert read_label(_item(), "reasoned", None, reply) is True
    assert read_label(_item(), "paper", None, reply) is False


@pytest.mark.parametrize(
    "reply,expected",
    [
        ("Yes.", True),  # free text passes: the official 'yes' in reply.lower()
        ("yes", True),
        ("YES, it does", True),
        ("No.", False),
        ("The response is wrong", False),
        ("Not really, yesterday it was", True),  # a substring test, as evaluate_qa.py
        ("", None),
        (None, None),
    ],
)
def test_longmemeval_paper_substring_rule(reply: str | None, expected: bool | None) -> None:
    item = _item(category=101, category_name="single-session-user")
    assert judge_longmemeval_paper.parse_label(reply) is expected
    assert read_label(item, "paper", None, reply) is expected


def test_longmemeval_paper_messages_per_type() -> None:
    samp = Sampling(max_tokens=128)
    plain = build_request(_item(category=101, category_name="single-session-user"), "j", samp)
    assert [m.role for m in plain.messages] == ["user"]
    assert plain.schema is None and plain.sampling.max_tokens == 10  # evaluate_qa.py's budget
    assert plain.messages[0].content.rstrip().endswith("Answer yes or no only.")
    assert "Correct answer: Rome" in plain.messages[0].content
    temporal = build_request(_item(category=106, category_name="temporal-reasoning"), "j", samp)
    assert "off-by-one" in temporal.messages[0].content
    assert "days, weeks" in temporal.messages[0].content
    pref = build_request(
        _item(category=103, category_name="single-session-preference"), "j", samp
    ).messages[0].content
    assert "Rubric: Rome" in pref and "Correct answer" not in pref
    ku = build_request(_item(category=105, category_name="knowledge-update"), "j", samp)
    assert "updated answer" in ku.messages[0].content
    # _abs overrides the type: the abstention framing, the gold as an explanation
    abst = build_request(
        _item(category=105, category_name="knowledge-update", is_abstention=True), "j", samp
    ).messages[0].content
    assert "correctly identif" in abst and "unanswerable" in abst and "Explanation: Rome" in abst


def test_judge_protocol_config() -> None:
    assert judge_protocol(job_with()) == "paper"
    assert judge_protocol(job_with({"judge": {"protocol": "reasoned"}})) == "reasoned"
    with pytest.raises(ConfigError, match="judge.protocol"):
        judge_protocol(job_with({"judge": {"protocol": "strict"}}))
