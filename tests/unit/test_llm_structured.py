"""Structured output: response_format per flavor, validation, repair bookkeeping."""

from __future__ import annotations

import json

import pytest

from structmem_gpu.llm.structured import (
    RawReply,
    RepairState,
    check_reply,
    repair_messages,
    response_format,
    run_in_rounds,
    strip_fences,
)
from structmem_gpu.llm.types import LLMRequest, Message, Sampling

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}


def _req(schema: dict | None = SCHEMA) -> LLMRequest:
    return LLMRequest(
        request_id="r1",
        stage="extract",
        prompt_version="t/1",
        messages=(Message("user", "Where?"),),
        schema=schema,
        sampling=Sampling(max_tokens=16),
    )


def test_response_format_vllm_is_openai_json_schema() -> None:
    rf = response_format(SCHEMA, "vllm", name="extract")
    assert rf == {
        "type": "json_schema",
        "json_schema": {"name": "extract", "schema": SCHEMA, "strict": True},
    }


def test_response_format_llamacpp_is_json_object_with_schema() -> None:
    # json_schema gives HTTP 500 on llama-cpp-python 0.3.36 (docs/design.md "Backend notes").
    assert response_format(SCHEMA, "llamacpp") == {"type": "json_object", "schema": SCHEMA}


def test_response_format_unknown_flavor() -> None:
    with pytest.raises(ValueError, match="flavor"):
        response_format(SCHEMA, "guided")


@pytest.mark.parametrize(
    ("text", "finish", "ok", "fragment"),
    [
        ('{"city": "Paris"}', "stop", True, None),
        ('```json\n{"city": "Paris"}\n```', "stop", True, None),
        ('{"city": "Par', "length", False, "cut off"),
        ('{"city": "Paris"}', "length", True, None),  # complete JSON that hit the limit is kept
        ("Paris", "stop", False, "not valid JSON"),
        ('{"town": "Paris"}', "stop", False, "schema violation"),
        ('{"city": "' + "x" * 30 + '"}', "stop", False, "schema violation at city"),
    ],
)
def test_check_reply(text: str, finish: str, ok: bool, fragment: str | None) -> None:
    c = check_reply(text, SCHEMA, finish)
    assert c.ok is ok
    if ok:
        assert c.data == {"city": "Paris"}
        assert c.error is None
    else:
        assert fragment in (c.error or "")


LIST_SCHEMA = {
    "type": "object",
    "properties": {
        "entries": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"turn": {"type": "integer"}, "text": {"type": "string"}},
                "required": ["turn", "text"],
            },
        }
    },
    "required": ["entries"],
}


def test_truncated_reply_keeps_its_complete_items() -> None:
    cut = (
        '{"entries": [{"turn": 1, "text": "Ana moved to Lyon, {she said} [twice]."}, '
        '{"turn": 2, "text": "Ben \\"cheered\\"."}, {"turn": 3, "text": "Ana bought a bi'
    )
    c = check_reply(cut, LIST_SCHEMA, "length")
    assert c.ok and c.salvaged and c.error is None
    assert c.data == {
        "entries": [
            {"turn": 1, "text": "Ana moved to Lyon, {she said} [twice]."},
            {"turn": 2, "text": 'Ben "cheered".'},
        ]
    }
    # cut inside the first item: the empty list is all that was complete
    first = check_reply('{"entries": [{"turn": 1, "te', LIST_SCHEMA, "length")
    assert first.ok and first.salvaged and first.data == {"entries": []}
    # not cut by the limit: a broken reply is an error, never salvaged
    broken = check_reply(cut, LIST_SCHEMA, "stop")
    assert not broken.ok and not broken.salvaged and "not valid JSON" in (broken.error or "")
    # an incomplete item that would fail the schema is never kept: the prefix before it is
    partial = check_reply('{"entries": [{"turn": 1, "text": "a"}, {"turn": 2}', LIST_SCHEMA, "length")
    assert partial.ok and partial.data == {"entries": [{"turn": 1, "text": "a"}]}


def test_salvaged_result_is_flagged_and_not_repaired() -> None:
    st = RepairState(_req(LIST_SCHEMA), repair_attempts=1)
    assert st.feed(RawReply('{"entries": [{"turn": 1, "text": "a"}, {"tu', "length")) is None
    res = st.result("m")
    assert res.parse_ok and res.salvaged and res.finish_reason == "length"
    assert res.data == {"entries": [{"turn": 1, "text": "a"}]}


def test_repair_never_asks_for_less() -> None:
    msgs = repair_messages((Message("user", "q"),), "oops", "bad")
    assert "short" not in msgs[-1].content.lower() and "everything" in msgs[-1].content


def test_free_text_always_ok_even_when_truncated() -> None:
    assert check_reply("any text", None, "length").ok


def test_strip_fences_keeps_plain_json() -> None:
    assert strip_fences(' {"a": 1} ') == '{"a": 1}'


def test_repair_messages_append_bad_reply_and_instruction() -> None:
    msgs = repair_messages((Message("user", "q"),), "oops", "the reply is not valid JSON")
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1].content == "oops"
    assert "not valid JSON" in msgs[2].content and "JSON" in msgs[2].content


def test_repair_state_one_repair_then_failure() -> None:
    st = RepairState(_req(), repair_attempts=1)
    nxt = st.feed(RawReply("nope", "stop", 5, 2, None, 0.1))
    assert nxt is not None and nxt.messages[-2].content == "nope"
    assert st.feed(RawReply("still nope", "stop", 9, 3, None, 0.2)) is None
    res = st.result("m")
    assert (res.parse_ok, res.attempts, res.prompt_tokens, res.completion_tokens) == (
        False,
        2,
        14,
        5,
    )
    assert res.error and "not valid JSON" in res.error
    assert res.text == "still nope" and res.model == "m"
    assert res.latency_s == pytest.approx(0.3)


def test_repair_state_repair_succeeds() -> None:
    st = RepairState(_req(), repair_attempts=1)
    assert st.feed(RawReply("{}", "stop")) is not None
    assert st.feed(RawReply('{"city": "Oslo"}', "stop")) is None
    res = st.result("m")
    assert res.parse_ok and res.data == {"city": "Oslo"} and res.attempts == 2 and res.error is None


def test_http_error_is_not_repaired() -> None:
    st = RepairState(_req(), repair_attempts=1)
    assert st.feed(RawReply("", "error", http_attempts=5, error="HTTP 500: boom")) is None
    res = st.result("m")
    assert (res.parse_ok, res.finish_reason, res.attempts) == (False, "error", 5)
    assert res.error == "HTTP 500: boom"


def test_run_in_rounds_order_and_callback() -> None:
    reqs = [
        LLMRequest(
            request_id=f"r{i}",
            stage="s",
            prompt_version="t/1",
            messages=(Message("user", str(i)),),
            schema=SCHEMA,
        )
        for i in range(5)
    ]
    rounds: list[int] = []

    def send(batch: list[LLMRequest]) -> list[RawReply]:
        rounds.append(len(batch))
        # Even requests answer badly the first time, well after the repair.
        out = []
        for r in batch:
            i = int(r.messages[0].content)
            good = i % 2 == 1 or len(r.messages) > 1
            out.append(RawReply(json.dumps({"city": f"c{i}"}) if good else "bad", "stop"))
        return out

    seen: list[int] = []
    res = run_in_rounds(
        reqs, send, model="m", repair_attempts=1, on_result=lambda i, r: seen.append(i)
    )
    assert [r.request_id for r in res] == [f"r{i}" for i in range(5)]
    assert all(r.parse_ok for r in res)
    assert [r.attempts for r in res] == [2, 1, 2, 1, 2]
    assert rounds == [5, 3]
    assert sorted(seen) == list(range(5))


def test_raw_control_character_inside_a_string_is_accepted() -> None:
    # llama.cpp's grammar allows a literal newline inside a JSON string.
    from structmem_gpu.llm.structured import check_reply

    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    check = check_reply('{"text": "line one\nline two"}', schema, "stop")
    assert check.ok and check.data == {"text": "line one\nline two"}
