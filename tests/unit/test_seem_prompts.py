"""SEEM prompt modules: versions, bounded schemas (valid for a scripted reply), rendering."""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any

import jsonschema
import pytest

from structmem_gpu.llm.scripted import SchemaFaker
from structmem_gpu.methods.seem.model import Event, clean_events, render_frame, split_actions
from structmem_gpu.methods.seem.prompts import (
    filter as seem_filter,
    frame as seem_frame,
    fuse_window as seem_fuse_window,
    judge as seem_judge,
    judge_fuse as seem_judge_fuse,
    merge as seem_merge,
    quadruples as seem_quadruples,
    query as seem_query,
)

MODULES = ["seem_frame", "seem_judge_fuse", "seem_judge", "seem_merge", "seem_fuse_window", "seem_quadruples",
           "seem_query", "seem_filter", "seem_answer"]
B = seem_frame.FrameBounds(max_events=2, max_participants=2, max_actions=3, max_chars=30, summary_chars=90)


@pytest.mark.parametrize("name", MODULES)
def test_every_prompt_module_has_a_version(name: str) -> None:
    mod = importlib.import_module(f"structmem_gpu.methods.seem.prompts.{name.removeprefix('seem_')}")
    assert mod.VERSION == f"{name}/1" and mod.__doc__


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("frame1", seem_frame.reply_schema(1, B)), ("frame3", seem_frame.reply_schema(3, B)),
    ("judge_fuse", seem_judge_fuse.reply_schema(B, 4)), ("judge", seem_judge.SCHEMA),
    ("merge", seem_merge.reply_schema(B, 4)), ("window", seem_fuse_window.reply_schema(3, 2, B, 4)),
    ("window_no_earlier", seem_fuse_window.reply_schema(2, 0, B, 4)),
    ("quad1", seem_quadruples.reply_schema(1, 3, 30)), ("quad4", seem_quadruples.reply_schema(4, 3, 30)),
    ("query", seem_query.reply_schema(2, 30)), ("filter", seem_filter.reply_schema(5, 4)),
]


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_schemas_are_bounded_and_fakeable(name: str, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(SchemaFaker("Lena ran the Riverside Half Marathon", schema).make(schema), schema)
    assert not list(unbounded(schema))  # a reply capped by max_tokens stays short enough to be valid


def unbounded(node: Any, path: str = "$") -> Any:
    """Paths of strings without maxLength and arrays without maxItems."""
    if isinstance(node, dict):
        if node.get("type") == "string" and "maxLength" not in node:
            yield path
        if node.get("type") == "array" and "maxItems" not in node:
            yield path
        if node.get("type") == "integer":  # llama-cpp-python's grammar ignores integer bounds: use enums
            yield path
        for key, value in node.items():
            yield from unbounded(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from unbounded(value, f"{path}[{i}]")


def test_multi_passage_schema_asks_exactly_one_frame_per_passage() -> None:
    frames = seem_frame.reply_schema(3, B)["properties"]["frames"]
    assert frames["minItems"] == frames["maxItems"] == 3
    msgs = seem_frame.build_messages(datetime(2023, 5, 8, 13, 56), [("Caroline", "Hi!", None),
                                                                   ("Mel", "Look", "a photo of a dog")])
    assert msgs[0].content == seem_frame.SYSTEM_MANY and "Message 2:\n[Mel]: Look\n[Image: a photo of a dog]" in msgs[1].content
    one = seem_frame.build_messages(datetime(2023, 5, 8, 13, 56), [("Caroline", "Hi!", None)])
    assert one[1].content == "Session time: 2023-05-08 13:56 (Monday)\n[Caroline]: Hi!"


def test_event_cleaning_and_action_split() -> None:
    raw = [{"participants": ["Lena", " ", "Lena"], "action": ["a", "b", "c"], "time": "null", "location": "park",
            "reason": None, "method": ""}, {"participants": [], "action": []}, "junk"]
    [a, b] = clean_events(raw, max_actions=2, max_events=5)
    assert a == Event(("Lena",), ("a", "b"), None, "park", None, None) and b.action == ("c",)
    assert split_actions([a], 1)[1].action == ("b",)
    text = render_frame("Lena ran.", [a])
    assert text == "Summary: Lena ran.\nEvent 1:\n  Participants: Lena\n  Action: a; b\n  Location: park"
