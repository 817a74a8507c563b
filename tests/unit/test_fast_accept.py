"""llm/fast_accept.py against jsonschema itself: it may only accept what jsonschema accepts
(soundness, on the project's reply schemas and on generated schemas with mutated instances),
and it must accept the valid replies of the project's schemas (else the speed-up is gone)."""

from __future__ import annotations

import copy
import random
from typing import Any

import jsonschema
import pytest

from structmem_gpu.llm.fast_accept import compile_accept
from structmem_gpu.llm.scripted import SchemaFaker
from structmem_gpu.llm.structured import check_reply
from structmem_gpu.methods.seem.prompts import frame, query
from structmem_gpu.prompts import extraction_schema


def _project_schemas() -> list[dict[str, Any]]:
    b = frame.FrameBounds(max_events=4, max_participants=3, max_actions=3, max_chars=40,
                          summary_chars=120)
    return [
        extraction_schema(8, max_items=None, max_item_chars=400),
        extraction_schema(3, max_items=5, max_item_chars=30),
        frame.reply_schema(1, b),
        frame.reply_schema(3, b),
        query.reply_schema(5, 60),
    ]


def _generated_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A random schema from the keywords fast_accept handles (and a few it does not)."""
    kind = rng.choice(["string", "integer", "number", "boolean", "null", "object", "array",
                       "enum", "anyOf", "untyped", "multi"] if depth < 3 else
                      ["string", "integer", "number", "enum", "null"])
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.7:
            s["maxLength"] = rng.randint(0, 6)
        if rng.random() < 0.4:
            s["minLength"] = rng.randint(0, 3)
        return s
    if kind in ("integer", "number"):
        s = {"type": kind}
        if rng.random() < 0.6:
            s["minimum"] = rng.choice([0, 1, -2, 0.5])
        if rng.random() < 0.6:
            s["maximum"] = rng.choice([3, 10, 2.5])
        return s
    if kind == "enum":
        return {"enum": rng.sample([1, 2, "a", "b", None, True, False, 0, 1.0], rng.randint(1, 4))}
    if kind == "anyOf":
        return {"anyOf": [_generated_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if kind == "untyped":
        return {"maxLength": 2, "maxItems": 1, "minimum": 0, "required": ["x"]}
    if kind == "multi":
        return {"type": rng.sample(["string", "integer", "null", "array"], 2)}
    if kind == "array":
        s = {"type": "array", "items": _generated_schema(rng, depth + 1)}
        if rng.random() < 0.5:
            s["maxItems"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            s["minItems"] = rng.randint(0, 2)
        return s
    if kind == "object":
        names = rng.sample(["a", "b", "c", "d"], rng.randint(0, 3))
        s = {"type": "object", "properties": {n: _generated_schema(rng, depth + 1) for n in names}}
        if names and rng.random() < 0.7:
            s["required"] = rng.sample(names, rng.randint(1, len(names)))
        r = rng.random()
        if r < 0.4:
            s["additionalProperties"] = False
        elif r < 0.55:
            s["additionalProperties"] = _generated_schema(rng, depth + 1)
        if rng.random() < 0.1:
            s["description"] = "an annotation"
        return s
    return {"type": kind}


_ODD_VALUES = [None, True, False, 0, 1, 1.0, 2.5, -3, "", "x", "toolong-string", [], [1], {},
               {"a": 1}, float("nan")]


def _mutations(rng: random.Random, value: Any, n: int) -> list[Any]:
    """`value` changed in `n` random places (types swapped, keys dropped or added, lists grown)."""
    out = []
    for _ in range(n):
        v = copy.deepcopy(value)
        out.append(_mutate(rng, v))
    return out


def _mutate(rng: random.Random, v: Any) -> Any:
    if isinstance(v, dict) and v and rng.random() < 0.7:
        k = rng.choice(list(v))
        r = rng.random()
        if r < 0.3:
            del v[k]
        elif r < 0.45:
            v["zz"] = rng.choice(_ODD_VALUES)
        else:
            v[k] = _mutate(rng, v[k])
        return v
    if isinstance(v, list) and v and rng.random() < 0.7:
        i = rng.randrange(len(v))
        if rng.random() < 0.3:
            v.append(copy.deepcopy(v[i]))
        else:
            v[i] = _mutate(rng, v[i])
        return v
    if isinstance(v, str) and rng.random() < 0.5:
        return v + "y" * rng.randint(1, 500)
    return rng.choice(_ODD_VALUES)


def _jsonschema_ok(schema: dict[str, Any], value: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema)
    return next(iter(cls(schema).iter_errors(value)), None) is None


def test_project_schemas_compile_and_accept_their_valid_replies() -> None:
    for schema in _project_schemas():
        accept = compile_accept(schema)
        assert accept is not None, schema  # a new keyword would silently lose the fast path
        for seed in range(20):
            value = SchemaFaker(f"source text {seed}").make(schema)
            assert _jsonschema_ok(schema, value)
            assert accept(value), (schema, value)


@pytest.mark.parametrize("seed", range(8))
def test_never_accepts_what_jsonschema_rejects(seed: int) -> None:
    rng = random.Random(seed)
    accepted = rejected = 0
    schemas = _project_schemas() + [_generated_schema(rng) for _ in range(150)]
    for schema in schemas:
        accept = compile_accept(schema)
        if accept is None:
            continue
        base = [SchemaFaker(f"s{seed}-{i}").make(schema) for i in range(3)]
        for value in base + [m for b in base for m in _mutations(rng, b, 12)] + _ODD_VALUES:
            if accept(value):
                assert _jsonschema_ok(schema, value), (schema, value)
                accepted += 1
            else:
                rejected += 1
    # both answers occur, so the comparison above had something to compare
    assert accepted > 200 and rejected > 200


def test_keywords_it_does_not_model_leave_the_answer_to_jsonschema() -> None:
    assert compile_accept({"type": "string", "pattern": "^a"}) is None
    assert compile_accept({"$ref": "#/$defs/x", "$defs": {"x": {}}}) is None
    assert compile_accept({"type": "array", "items": [{"type": "string"}]}) is None
    assert compile_accept({"enum": [1.5]}) is None
    # a float where an integer is asked: not accepted here; jsonschema decides (and accepts 1.0)
    accept = compile_accept({"type": "integer"})
    assert accept is not None and not accept(1.0) and accept(1) and not accept(True)
    # check_reply still uses jsonschema for such a schema, and for every rejection
    assert check_reply('"abc"', {"type": "string", "pattern": "^a"}, "stop").ok
    bad = check_reply('{"entries": [{"turn": 9, "text": "x"}]}',
                      extraction_schema(3, max_items=None, max_item_chars=10), "stop")
    assert not bad.ok and bad.error is not None and "entries/0/turn" in bad.error
