"""Reader protocol `paper`: prompt, layouts, abstention, reply split.

docs/methods.md "StructMem: reader" describes the reader."""

from __future__ import annotations

from datetime import datetime

import polars as pl
import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.eval.answer import AnswerInputs, answer_protocol, answer_rows, make_requests
from structmem_gpu.llm.types import LLMResult, Sampling
from structmem_gpu.methods.structmem.context import build_prompts
from structmem_gpu.eval.prompts import answer_paper as A
from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED
from tests.fixtures.pipeline import job_with

D1, D2, D3 = datetime(2023, 5, 8, 13, 56), datetime(2023, 6, 1, 9, 5), datetime(2023, 7, 2, 10)


def _questions(cats: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "question_id": [f"c:q{i}" for i in range(len(cats))],
            "conv_id": ["c"] * len(cats),
            "question": ["Where does Ana live?"] * len(cats),
            "question_time": [None] * len(cats),
            "category": cats,
            "is_abstention": [False] * len(cats),
        },
        schema_overrides={"question_time": pl.Datetime("us")},
    )


def _tables(qids: list[str]) -> dict[str, pl.DataFrame]:
    # ranks: Ben's entry first, then Ana's two, then Cleo's (a third speaker)
    hits = [("e_ben", 0), ("e_ana2", 1), ("e_ana1", 2), ("e_cleo", 3)]
    retrievals = pl.DataFrame(
        {
            "question_id": [q for q in qids for _ in hits] + qids,
            "circuit": ["entries"] * (len(hits) * len(qids)) + ["syntheses"] * len(qids),
            "item_id": [h for _ in qids for h, _ in hits] + ["s1"] * len(qids),
            "rank": [r for _ in qids for _, r in hits] + [0] * len(qids),
        }
    )
    entries = pl.DataFrame(
        {
            "entry_id": ["e_ana1", "e_ana2", "e_ben", "e_cleo"],
            "speaker": ["Ana", "Ana", "Ben", "Cleo"],
            "event_time": [D1, D2, D1, D3],
            "text": ["Ana adopted a cat.", "Ana moved to Porto.", "Ben ran a race.", "Cleo sang."],
            "session_index": [1, 2, 1, 3],
            "turn_index": [0, 0, 1, 0],
        }
    )
    syntheses = pl.DataFrame(
        {
            "synth_id": ["s1"],
            "window_start": [D1],
            "window_end": [D2],
            "text": ["Ana and Ben both changed routines."],
        }
    )
    return {"retrievals": retrievals, "entries": entries, "syntheses": syntheses}


def _prompts(cats: list[int], **answer: object):
    cfg = job_with({"answer": {"protocol": "paper", **answer}})
    q = _questions(cats)
    return build_prompts(AnswerInputs(cfg, q, _tables(q["question_id"].to_list())))


def test_paper_reader_is_one_system_message_with_the_reference_instructions() -> None:
    p = _prompts([1, 2, 4])["c:q0"]
    assert p.reasoned_reply and p.prompt_version == A.VERSION
    assert [m.role for m in p.messages] == ["system"]  # the whole prompt, as the reference
    text = p.messages[0].content
    for point in ("dates", "directly", "most recent", "12 March 2023", "2021", "confuse",
                  "5-6 words", "step by step", "arithmetic", "Answer: <the short answer>"):
        assert point in text, point
    # categories 1-4 are all answerable: no abstention line
    assert NOT_MENTIONED not in text


def test_abstention_line_only_when_category_5_is_selected() -> None:
    text = _prompts([1, 5])["c:q0"].messages[0].content
    assert f"answer exactly: {NOT_MENTIONED}" in text


def test_speaker_layout_rank_order_first_two_groups_dates_with_weekday() -> None:
    text = _prompts([4])["c:q0"].messages[0].content
    block = text[text.index("Memories of Ben:") : text.index("Question:")].strip().splitlines()
    assert block == [
        "Memories of Ben:",  # Ben ranks first: his group comes first
        "- (recorded on 8 May 2023, Mon) Ben ran a race.",
        "Memories of Ana:",
        "- (recorded on 1 June 2023, Thu) Ana moved to Porto.",  # rank order inside a group
        "- (recorded on 8 May 2023, Mon) Ana adopted a cat.",
        "Event summaries:",
        "- Ana and Ben both changed routines.",  # no time range
    ]
    assert "Cleo" not in text  # only the first two speaker groups, as the reference
    assert "Cleo sang." in _prompts([4], speaker_groups=3)["c:q0"].messages[0].content


def test_rank_layout_keeps_every_entry_in_rank_order() -> None:
    text = _prompts([4], entry_layout="rank")["c:q0"].messages[0].content
    i = [text.index(s) for s in ("Ben: Ben ran", "Ana: Ana moved", "Ana: Ana adopted", "Cleo:")]
    assert i == sorted(i)
    with pytest.raises(ConfigError, match="entry_layout"):
        _prompts([4], entry_layout="timeline")
    with pytest.raises(ConfigError, match="speaker_groups"):
        _prompts([4], speaker_groups=0)


def test_reasoned_protocol_keeps_the_earlier_reader() -> None:
    cfg = job_with({"answer": {"protocol": "reasoned"}})
    q = _questions([4])
    p = build_prompts(AnswerInputs(cfg, q, _tables(["c:q0"])))["c:q0"]
    assert not p.reasoned_reply and [m.role for m in p.messages] == ["system", "user"]
    assert NOT_MENTIONED in p.messages[0].content
    assert answer_protocol(job_with()) == "paper"
    with pytest.raises(ConfigError, match="answer.protocol"):
        answer_protocol(job_with({"answer": {"protocol": "x"}}))


@pytest.mark.parametrize(
    "reply,prediction,reasoning",
    [
        (
            "Ana moved on 1 June 2023.\n1 June 2023 is after 8 May.\nAnswer: Porto",
            "Porto",
            "Ana moved on 1 June 2023.\n1 June 2023 is after 8 May.",
        ),
        ("Step 1: ...\n**Answer:** 7 May 2023", "7 May 2023", "Step 1: ..."),
        ("Final answer: Porto", "Porto", None),
        ("answer: a\nmore text\nAnswer: b", "b", "answer: a\nmore text"),
        ("Ana lives in Porto", "Ana lives in Porto", None),  # no final line: the raw reply
        ("Let me think: Ana moved", "Let me think: Ana moved", None),  # cut by max_tokens
    ],
)
def test_split_reply(reply: str, prediction: str, reasoning: str | None) -> None:
    assert A.split_reply(reply) == (prediction, reasoning)


def test_answer_rows_store_reasoning_beside_the_prediction() -> None:
    prompts = _prompts([4, 4])
    q = _questions([4, 4])
    reqs = make_requests(q, prompts, Sampling(max_tokens=512))
    results = [
        LLMResult(reqs[0].request_id, "Ana moved in June.\nAnswer: Porto", None, True, 1, 1,
                  None, 0.0, "stop", False, 1, "h", "m", None),
        LLMResult(reqs[1].request_id, "Ana moved", None, True, 1, 1, None, 0.0, "length",
                  False, 1, "h", "m", None),
    ]
    rows = answer_rows(q, results, prompts, "paper")
    assert rows["prediction"].to_list() == ["Porto", "Ana moved"]
    assert rows["reasoning"].to_list() == ["Ana moved in June.", None]
    assert rows["protocol"].to_list() == ["paper", "paper"]


def test_has_final_line() -> None:
    assert A.has_final_line("reasoning\nAnswer: Porto") and A.has_final_line("Final answer: x")
    assert not A.has_final_line("Let me think: Ana moved") and not A.has_final_line("Answer:")
