"""Extraction and synthesis prompts: versions, schema bounds, rendering."""

from __future__ import annotations

import json
import re
from datetime import datetime

import jsonschema
import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.structmem.prompts import extraction_prompt
from structmem_gpu.prompts import extraction_schema, render_window
from structmem_gpu.methods.structmem.prompts import factual, relational, synthesis

WHEN = datetime(2023, 8, 17, 14, 5)


def test_versions_and_kinds() -> None:
    assert factual.VERSION == "factual/2" and relational.VERSION == "relational/3"
    assert extraction_prompt("fact") is factual and extraction_prompt("relation") is relational
    with pytest.raises(ConfigError):
        extraction_prompt("opinion")
    assert factual.version("grounded") == "factual/2+grounded" != factual.version("default")
    # the grounded text is unchanged since relational/2: its version (a cache key part) too
    assert relational.version("grounded") == "relational/2+grounded"
    assert relational.version("default", example=False) == "relational/3+noexample"
    assert factual.version("default", example=False) == "factual/2+noexample"
    for m in (factual, relational):  # without the example: the same instructions, nothing else
        short = m.system("default", example=False)
        assert m.EXAMPLE not in short and short.split("\n\n")[:3] == m.SYSTEM.split("\n\n")[:3]
        assert m.system("grounded", example=False) == m.SYSTEM_GROUNDED
    with pytest.raises(ConfigError):
        factual.system("strict")
    assert synthesis.prompt_version("constrained") == "synthesis/3+constrained"
    assert synthesis.prompt_version("constrained") != synthesis.prompt_version("unconstrained")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


# The reference factual prompt, one entry per instruction group: (group, phrases that must all
# be in the default factual prompt). Dropping any instruction fails exactly one case.
FACTUAL_GROUPS = {
    "role: extract all facts about the speakers": ["extract personal information", "every fact"],
    "input line format explained": ['"[n] speaker: text"', "session date", "(context)"],
    "image folded into the text's facts": ["[image: ...]", "never write a separate fact"],
    "ascending order, one by one, none skipped": ["strictly in ascending order", "one by one",
                                                  "skip none", "no turn is too minor"],
    "what to take": ["past events and current states", "plans and intentions",
                     "opinions and attitudes", "wishes and preferences"],
    "every specific detail": ["full titles", "with their authors", "full names of places",
                              "names of events", "details of items", "numbers",
                              "relative times", "names of organisations"],
    "inferred insights as extra entries": ["inferred insight", "clearly supports",
                                           "extra entry", "never let it replace"],
    "light completion, standalone": ["complete each fact lightly", "stands on its own"],
    "said vs happened": ["when something was said apart from when it happened"],
    "relative time kept and anchored": ["keep a relative time exactly as said",
                                        "yyyy-mm-dd", '"next month after 2024-01-07"',
                                        "do not work out a new date"],
    "timeless facts undated": ["timeless fact", "gets no date"],
    "reply format": ['"entries"', '"turn"', '"text"'],
    "closing reminder to be exhaustive": ["be exhaustive"],
}


@pytest.mark.parametrize("group", sorted(FACTUAL_GROUPS))
def test_default_factual_prompt_carries_every_reference_instruction(group: str) -> None:
    text = _norm(factual.system("default"))
    for phrase in FACTUAL_GROUPS[group]:
        assert _norm(phrase) in text, (group, phrase)


def _example_reply(example: str) -> list[dict]:
    return json.loads(example[example.index('{"entries"') : example.rindex("]}") + 2])["entries"]


def test_factual_worked_example_has_the_reference_shape() -> None:
    ex = factual.EXAMPLE
    assert ex in factual.system("default")
    turns = [line for line in ex.splitlines() if line.startswith("[")]
    assert len(turns) == 10 and turns[-1].startswith("[10] ")
    items = _example_reply(ex)
    assert len(items) == 10
    texts = [i["text"] for i in items]
    assert sum("inferred" in t for t in texts) == 1  # one inferred insight, beside specifics
    assert any("next month after 2024-01-07" in t for t in texts)  # relative time anchored
    assert "[image:" in ex and any("yellow-tiled" in t for t in texts)  # image folded in
    assert {i["turn"] for i in items} <= set(range(1, 11))
    # two topics: books (turns 1-4) and the trip (turns 5-10)
    assert "Le Guin" in turns[0] and "Lisbon" in turns[4]


RELATIONAL_GROUPS = {
    "role: how people relate, facts elsewhere": ["how the people in a conversation relate",
                                                 "another system already extracts the facts",
                                                 "relational and emotional dynamics"],
    "input line format explained": ['"[n] speaker: text"', "(context)", "[image: ...]"],
    "evaluative": ["evaluative: praising, acknowledging"],
    "supportive": ["supportive: encouraging", "confidence"],
    "emotional": ["emotional: gratitude, pride, excitement, congratulations"],
    "engagement": ["engagement: asking questions, showing interest"],
    "agreement": ["agreement: shared values, views"],
    "responsive": ["responsive: sharing something in reply"],
    "skip facts, keep responsive sharing": ["skip statements that only report a fact",
                                            "in response to the other person"],
    "enough context": ["enough context", "exactly what was praised"],
    "time when relevant": ["time information when it matters"],
    "merge behaviours of one message": ["merges related behaviours within one turn"],
    "mutual agreement with both": ['says "both"', "where the agreement is completed"],
    "reply format": ['"entries"', '"turn"', '"text"'],
}


@pytest.mark.parametrize("group", sorted(RELATIONAL_GROUPS))
def test_default_relational_prompt_carries_every_reference_instruction(group: str) -> None:
    text = _norm(relational.system("default"))
    for phrase in RELATIONAL_GROUPS[group]:
        assert _norm(phrase) in text, (group, phrase)


def test_relational_worked_example_has_the_reference_shape() -> None:
    ex = relational.EXAMPLE
    assert ex in relational.system("default")
    assert len([line for line in ex.splitlines() if line.startswith("[")]) == 13
    items = _example_reply(ex)
    assert len(items) == 7
    assert any(" both " in i["text"] and i["turn"] == 7 for i in items)  # agreement completed
    assert 10 not in {i["turn"] for i in items}  # a plain fact gives no relation
    assert "[image:" in ex and any("offer letter" in i["text"] for i in items)  # photo context
    # time as said, never anchored to a date (the reference relational prompt asks no anchoring)
    assert any("next week" in i["text"] for i in items)
    assert not re.search(r"\d{4}-\d{2}-\d{2}", " ".join(i["text"] for i in items))
    assert "YYYY-MM-DD" not in relational.system("default")


def test_grounded_variant_is_the_earlier_wording() -> None:
    f, r = factual.system("grounded").lower(), relational.system("grounded").lower()
    assert "invent nothing" in f and "last year (2022; said on 2023-08-17)" in f
    for phrase in ("together", "causes", "followed", "change over time", "do not guess motives"):
        assert phrase in r, phrase
    # the default follows the reference instead: no ban on inference, no computed dates
    assert "invent nothing" not in factual.system("default").lower()
    assert "co-participation" not in relational.system("default").lower()


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


SYNTHESIS_GROUPS = {
    "facts and interaction patterns": ["both kinds of information",
                                       "the facts and the patterns of interaction"],
    "concrete details, turning points, plans, quotes": ["dates, times, places",
                                                        "emotional turning points",
                                                        "shifts in how a person thinks or feels",
                                                        "concrete plans", "quotes"],
    "weave in related events with their dates": ["weave in earlier events or later plans",
                                                 "with their dates"],
    "only when bearing on current topics": ["only when it bears directly", "adds meaning"],
    "no repetition, chronological, unfolding together": ["remove repetition", "time order",
                                                         "unfold together"],
    "causal links with an example": ["bring out causal links", "e.g. \"after"],
    "cite specific times if available": ["name its specific time if the entries give one"],
    "concrete connections over general patterns": ["prefer concrete connections",
                                                   "general remarks about patterns"],
    "integrate, do not append": ["into the narrative itself", "do not append"],
    "balance timeline and relational dynamics": ["balance the factual timeline with the "
                                                 "relational dynamics"],
    "200-350 words, summary only": ["200-350 words", "narrative only"],
}


@pytest.mark.parametrize("group", sorted(SYNTHESIS_GROUPS))
def test_default_synthesis_prompt_carries_every_reference_instruction(group: str) -> None:
    text = _norm(synthesis.system_prompt("constrained"))
    for phrase in SYNTHESIS_GROUPS[group]:
        assert _norm(phrase) in text, (group, phrase)


def test_unconstrained_is_a_pure_deletion_of_the_grounding_lines() -> None:
    c = synthesis.system_prompt("constrained").splitlines()
    u = synthesis.system_prompt("unconstrained").splitlines()
    it = iter(c)
    assert all(line in it for line in u)  # u is a subsequence of c: nothing added or changed
    removed = [line for line in c if line not in u]
    assert removed == [t for t, grounding in synthesis.LINES if grounding] and removed
    joined = " ".join(u).lower()
    assert "only when it bears directly" not in joined and "specific time if" not in joined


def test_synthesis_rendering() -> None:
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
    assert "(none)" in synthesis.render_user(buf, [])
    messages = synthesis.build_messages("constrained", buf, ctx)
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == synthesis.system_prompt("constrained")
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
