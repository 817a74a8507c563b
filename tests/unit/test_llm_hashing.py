"""The request hashes built from memoised canonical pieces (llm/types.py, llm/dedup.py) are
exactly the stable_hash formulas every existing response cache and request id was keyed with:
a difference would silently orphan every cache."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from structmem_gpu.core.hashing import canonical_json, stable_hash
from structmem_gpu.llm.dedup import KEY_VERSION, cache_key
from structmem_gpu.llm.types import LLMRequest, Message, Sampling, schema_json

SCHEMA = {"type": "object", "required": ["entries"],
          "properties": {"entries": {"type": "array", "items": {"type": "string"}}}}


def _reference_key(model_id: str, req: LLMRequest, params: dict | None) -> str:
    return stable_hash(
        KEY_VERSION, model_id, dict(params or {}), asdict(req.sampling), req.prompt_version,
        None if req.schema is None else dict(req.schema),
        [m.as_dict() for m in req.messages], length=40,
    )


REQUESTS = [
    LLMRequest("r1", "s", (Message("user", "hello"),), "p/1"),
    LLMRequest("r2", "extract", (Message("system", "Ünïcode — \"quotes\"\n"),
                                 Message("user", "[1] Caroline: 🙂 {json}")),
               "factual/1", Sampling(temperature=0.7, max_tokens=9, top_p=0.9, seed=None), SCHEMA),
    LLMRequest("r3", "judge", (), "j/2", schema={"b": 1, "a": [{"z": None, "y": 1.5}]}),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.request_id)
@pytest.mark.parametrize("params", [None, {}, {"request_seed": False, "chat_template_kwargs": {"x": 1}}])
def test_cache_key_equals_the_stable_hash_formula(req: LLMRequest, params: dict | None) -> None:
    assert cache_key("m|id|", req, params) == _reference_key("m|id|", req, params)


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: r.request_id)
def test_messages_hash_equals_the_stable_hash_formula(req: LLMRequest) -> None:
    assert req.messages_hash() == stable_hash([m.as_dict() for m in req.messages], length=32)
    # memoised per object: a replaced request (a repair) hashes its own messages
    other = replace(req, messages=(*req.messages, Message("user", "again")))
    assert other.messages_hash() != req.messages_hash()
    assert other.messages_hash() == stable_hash([m.as_dict() for m in other.messages], length=32)


def test_schema_json_is_per_object_not_per_id_only() -> None:
    a = {"type": "string"}
    assert schema_json(a) == canonical_json(a)
    b = {"type": "integer"}
    assert schema_json(b) == canonical_json(b)  # another object, another text
    a["type"] = "number"  # schemas are not mutated in practice; the memo is by identity
    assert schema_json(dict(a)) == canonical_json({"type": "number"})


@pytest.mark.parametrize("source", ["Caroline went to a support group", "x'\"\\ ünï\n", ""])
@pytest.mark.parametrize("salt", [None, 3, -7])
def test_scripted_faker_hash_is_the_whole_text_hash(source: str, salt: int | None) -> None:
    """SchemaFaker hashes the source once and copies the state per value: the same digests
    as hashing repr((source, path[, salt])) whole, so scripted replies do not change."""
    from structmem_gpu.llm.scripted import SchemaFaker, _h

    faker = SchemaFaker(source, salt=salt)
    for path in ("$", "$.entries[0].text", "$.a'b"):
        want = _h(source, path) if salt is None else _h(source, path, salt)
        assert faker._hash(path) == want


@pytest.mark.parametrize("values", [[], ["a"], ["x", 1, None, {"b": [1.5, "ü"]}, [2, {"z": 0, "a": 1}]]])
def test_hash_canonical_parts_is_stable_hash(values: list) -> None:
    from structmem_gpu.core.hashing import hash_canonical_parts

    parts = [canonical_json(v) for v in values]
    assert hash_canonical_parts(parts, length=40) == stable_hash(*values, length=40)


def test_identity_memo_derives_once_per_object_and_stays_bounded() -> None:
    from structmem_gpu.core.hashing import IdentityMemo

    memo, calls = IdentityMemo(maxsize=2), []
    a, b = {"k": 1}, {"k": 1}
    assert memo.get(a, lambda: calls.append("a") or "A") == "A"
    assert memo.get(a, lambda: calls.append("a2") or "A2") == "A"  # same object: memoised
    assert memo.get(b, lambda: calls.append("b") or "B") == "B"  # equal, other object
    assert memo.get(a, lambda: "A3", "extra") == "A3"  # extra keys are part of the key
    assert calls == ["a", "b"] and len(memo._entries) <= 2
