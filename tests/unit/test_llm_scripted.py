"""Scripted backend: schema-valid, input-derived, deterministic; failure paths via responders."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from structmem_gpu.llm.scripted import SchemaFaker, ScriptedFailure, ScriptedLLM, fake_reply
from structmem_gpu.llm.types import LLMRequest, Message, Sampling

ENTRIES = {
    "type": "object",
    "properties": {
        "entries": {
            "type": "array",
            "minItems": 1,
            "maxItems": 32,
            "items": {
                "type": "object",
                "properties": {
                    "turn": {"type": "integer", "minimum": 1, "maximum": 8},
                    "kind": {"enum": ["fact", "relation"]},
                    "text": {"type": "string", "minLength": 5, "maxLength": 40},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                    "date": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]},
                    "ok": {"type": "boolean"},
                },
                "required": ["turn", "kind", "text", "confidence", "date", "ok"],
            },
        },
        "tags": {"type": "array", "minItems": 3, "items": {"type": "string", "maxLength": 3}},
        "label": {"const": "CORRECT"},
    },
    "required": ["entries", "tags", "label"],
}

REF = {
    "$defs": {
        "item": {
            "type": "object",
            "properties": {"x": {"type": "integer", "exclusiveMinimum": 4, "exclusiveMaximum": 6}},
            "required": ["x"],
        }
    },
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 1}},
    "required": ["items"],
}


def req(
    text: str, schema: dict[str, Any] | None = ENTRIES, stage: str = "extract", rid: str = "r"
) -> LLMRequest:
    return LLMRequest(
        request_id=rid,
        stage=stage,
        prompt_version="t/1",
        messages=(Message("system", "sys"), Message("user", text)),
        schema=schema,
        sampling=Sampling(max_tokens=64),
    )


@pytest.mark.parametrize("schema", [ENTRIES, REF])
def test_fake_reply_is_schema_valid(schema: dict[str, Any]) -> None:
    for text in ["Caroline went to the LGBTQ support group yesterday.", "", "a"]:
        data = json.loads(fake_reply(req(text, schema)))
        jsonschema.validate(data, schema)


def test_fake_reply_details() -> None:
    data = json.loads(fake_reply(req("Caroline went to the LGBTQ support group yesterday.")))
    assert len(data["entries"]) == 2 and len(data["tags"]) == 3  # min(maxItems, 2) / minItems
    assert data["label"] == "CORRECT"
    for e in data["entries"]:
        assert 1 <= e["turn"] <= 8 and e["kind"] in ("fact", "relation")
        assert 5 <= len(e["text"]) <= 40
        assert all(
            w in "Caroline went to the LGBTQ support group yesterday." for w in e["text"].split()
        )
    assert SchemaFaker("x").make(REF)["items"][0]["x"] == 5


def test_fake_reply_deterministic_and_input_derived() -> None:
    a = fake_reply(req("Melanie painted a lake sunrise in 2022."))
    assert a == fake_reply(req("Melanie painted a lake sunrise in 2022."))
    assert a != fake_reply(req("Caroline is researching adoption agencies."))


def test_free_text_is_snippet_of_user_message() -> None:
    [res] = ScriptedLLM().generate([req("When did Melanie paint a sunrise?", schema=None)])
    assert res.parse_ok and res.text == "When did Melanie paint a sunrise?" and res.data is None


def test_generate_order_calls_and_validation() -> None:
    llm = ScriptedLLM()
    reqs = [req(f"turn {i} text", rid=f"r{i}") for i in range(5)]
    out = llm.generate(reqs)
    assert [r.request_id for r in out] == [f"r{i}" for i in range(5)]
    assert all(r.parse_ok and r.attempts == 1 and not r.cache_hit for r in out)
    assert all(r.model == "scripted" and r.prompt_tokens > 0 for r in out)
    assert llm.calls == 5


def test_responder_used_for_its_stage_only() -> None:
    llm = ScriptedLLM({"judge": lambda r: '{"label": "CORRECT"}'})
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["CORRECT", "WRONG"]}},
        "required": ["label"],
    }
    [j, e] = llm.generate([req("q", schema, stage="judge"), req("x", stage="extract")])
    assert j.data == {"label": "CORRECT"} and e.parse_ok


def test_malformed_responder_fails_after_one_repair() -> None:
    llm = ScriptedLLM({"extract": lambda r: "not json {"})
    [res] = llm.generate([req("x")])
    assert (res.parse_ok, res.attempts, res.data) == (False, 2, None)
    assert "not valid JSON" in (res.error or "") and llm.calls == 2


def test_responder_fixed_by_repair() -> None:
    llm = ScriptedLLM({"s": lambda r: '{"n": 1}' if len(r.messages) > 2 else "oops"})
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    [res] = llm.generate([req("x", schema, stage="s")])
    assert res.parse_ok and res.attempts == 2 and res.data == {"n": 1}


def test_scripted_failure_is_an_error_result() -> None:
    def fail(r: LLMRequest) -> str:
        raise ScriptedFailure("server down")

    [res] = ScriptedLLM({"extract": fail}).generate([req("x")])
    assert (res.parse_ok, res.finish_reason) == (False, "error")
    assert "server down" in (res.error or "")


def test_on_result_callback() -> None:
    seen: list[int] = []
    ScriptedLLM().generate(
        [req("a", rid="a"), req("b", rid="b")], on_result=lambda i, r: seen.append(i)
    )
    assert sorted(seen) == [0, 1]
