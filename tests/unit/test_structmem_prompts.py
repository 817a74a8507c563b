"""Extraction and synthesis prompts: versions, schema bounds, rendering."""

from __future__ import annotations

from datetime import datetime

import jsonschema
import pytest

from structmem_gpu.errors import ConfigError
from structmem_gpu.prompts import (
    extraction_prompt,
    extraction_schema,
    factual,
    relational,
    render_window,
    synthesis,
)

WHEN = datetime(2023, 8, 17, 14, 5)


def test_versions_and_kinds() -> None:
    assert factual.VERSION.startswith("factual/") and relational.VERSION.startswith("relational/")
    assert extraction_prompt("fact") is factual and extraction_prompt("relation") is relational
    with pytest.raises(ConfigError):
        extraction_prompt("opinion")
    assert synthesis.prompt_version("constrained") != synthesis.prompt_version("unconstrained")


@pytest.mark.parametrize("module", [factual, relational])
def test_extraction_instructions_cover_the_spec(module) -> None:
    text = module.SYSTEM.lower()
    for phrase in (
        "session date",
        "(context)",
        "invent nothing",
        "[image:",
        "names",
        '"entries"',
        '"turn"',
    ):
        assert phrase in text, phrase


def test_factual_and_relational_specifics() -> None:
    f, r = factual.SYSTEM.lower(), relational.SYSTEM.lower()
    assert "said" in f and "happened" in f and "last year" in f and "skip none" in f
    for phrase in ("together", "causes", "followed", "change over time", "both sides", "praise"):
        assert phrase in r, phrase


def test_schema_bounds_are_enforced() -> None:
    schema = extraction_schema(3, max_items=2, max_item_chars=10)
    jsonschema.validate({"entries": [{"turn": 3, "text": "Ana moved."}]}, schema)
    for bad in (
        {"entries": [{"turn": 4, "text": "x"}]},
        {"entries": [{"turn": 0, "text": "x"}]},
        {"entries": [{"turn": 1, "text": "x" * 11}]},
        {"entries": [{"turn": 1, "text": "x"}] * 3},
        {"entries": [{"turn": 1}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_render_window_numbers_only_the_window() -> None:
    text = render_window(
        WHEN, [("Ana", "Are you moving?")], [("Ben", "Yes."), ("Ana", "Look! [image: a red door]")]
    )
    assert text.splitlines()[0] == "Session date: 2023-08-17 14:05 (Thursday)"
    assert "(context) Ana: Are you moving?" in text
    assert "[1] Ben: Yes." in text and "[2] Ana: Look! [image: a red door]" in text
    assert "[3]" not in text


def test_synthesis_variants() -> None:
    buf = [
        synthesis.Record(WHEN, "Ana", "fact", "Ana moved to Lyon on 2023-08-15."),
        synthesis.Record(WHEN, "Ben", "relation", "Ben congratulated Ana on the move."),
    ]
    ctx = [
        synthesis.Record(
            datetime(2023, 6, 1, 9, 0), "Ana", "fact", "Ana applied for a job in Lyon."
        )
    ]
    user = synthesis.render_user(buf, ctx)
    assert "- [2023-06-01 09:00 Thu] Ana (fact): Ana applied for a job in Lyon." in user
    assert "People: Ana, Ben." in user and "Period: 2023-08-17 14:05 (Thursday)." in user
    constrained, unconstrained = (
        synthesis.system_prompt("constrained"),
        synthesis.system_prompt("unconstrained"),
    )
    for text in (constrained, unconstrained):
        assert "200-350 words" in text and "concrete details" in text and "time order" in text
    assert (
        "date of every event" in constrained
        and "speculation" in constrained
        and "support" in constrained
    )
    assert "date of every event" not in unconstrained and "speculation" not in unconstrained
    assert "(none)" in synthesis.render_user(buf, [])
    messages = synthesis.build_messages("constrained", buf, ctx)
    assert [m.role for m in messages] == ["system", "user"] and messages[0].content == constrained
    with pytest.raises(ConfigError):
        synthesis.system_prompt("loose")


def test_llamacpp_grammar_bounds_turn_numbers() -> None:
    # llama.cpp ignores integer minimum/maximum; the schema's enum is what bounds the turn.
    grammar_mod = pytest.importorskip("llama_cpp.llama_grammar")
    conv = grammar_mod.SchemaConverter(
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )
    conv.visit(extraction_schema(3, max_items=2, max_item_chars=10), "")
    rules = dict(
        line.split(" ::= ", 1) for line in conv.format_grammar().splitlines() if " ::= " in line
    )
    turn_rules = [v for k, v in rules.items() if k.endswith("turn")]
    assert turn_rules == ['"1" | "2" | "3"']
