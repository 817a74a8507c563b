"""Extraction helpers: window planning, local turn numbers -> events, rejection, dedupe."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl
import pytest

from structmem_gpu.core import schemas
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.types import LLMResult
from structmem_gpu.methods.structmem.extract import (
    ExtractSettings,
    build_request,
    collect_entries,
    map_items,
    plan_windows,
)

S1, S2 = datetime(2023, 5, 8, 13, 56), datetime(2023, 5, 25, 9, 0)
SETTINGS = ExtractSettings(turns_per_request=3, context_turns=2, perspectives=("fact", "relation"), max_tokens=256, max_items=8, max_item_chars=200, temperature=0.1, top_p=0.1)


def turns_frame() -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    for s_idx, when, n in ((1, S1, 5), (2, S2, 2)):
        for t in range(n):
            dia = f"D{s_idx}:{t + 1}"
            rows.append(
                {
                    "conv_id": "c",
                    "session_index": s_idx,
                    "session_id": f"S{s_idx}",
                    "session_hash": "h",
                    "session_time": when,
                    "turn_index": t,
                    "dia_id": dia,
                    "event_id": f"c:{dia}",
                    "speaker": "Ana" if t % 2 == 0 else "Ben",
                    "text": f"turn {dia}",
                    "image_caption": "a red door" if dia == "D1:4" else None,
                    "has_answer": None,
                }
            )
    return pl.DataFrame(rows, schema=schemas.TURNS)


def result(data: Any, parse_ok: bool = True, rid: str = "r") -> LLMResult:
    return LLMResult(rid, "", data, parse_ok, 0, 0, None, 0.0, "stop", False, 1, "m", "model-x")


def test_windows_stay_inside_sessions_with_context() -> None:
    wins = plan_windows(turns_frame(), 3, 2)
    assert [[t.dia_id for t in w.turns] for w in wins] == [
        ["D1:1", "D1:2", "D1:3"],
        ["D1:4", "D1:5"],
        ["D2:1", "D2:2"],
    ]
    assert [[t.dia_id for t in w.context] for w in wins] == [[], ["D1:2", "D1:3"], []]
    assert wins[1].turns[0].text == "turn D1:4 [image: a red door]"
    user = build_request(wins[1], "fact", SETTINGS).messages[-1].content
    assert "(context) Ben: turn D1:2" in user and "[1] Ben: turn D1:4 [image: a red door]" in user
    assert "[3]" not in user and "2023-05-08 13:56" in user


def test_local_turn_numbers_map_to_events_and_bad_numbers_are_rejected() -> None:
    win = plan_windows(turns_frame(), 3, 0)[1]  # D1:4, D1:5
    req = build_request(win, "relation", SETTINGS)
    items = [
        {"turn": 2, "text": " Ana thanked Ben. "},
        {"turn": 1, "text": "Ben showed a red door."},
        {"turn": 3, "text": "out of range"},
        {"turn": 0, "text": "zero"},
        {"turn": True, "text": "bool"},
        {"turn": "1", "text": "string"},
        {"turn": 1, "text": "   "},
    ]
    mapped = map_items(win, "relation", req, result({"entries": items}, rid=req.request_id))
    assert mapped.rejected == 4 and mapped.empty == 1
    assert [(e.dia_id, e.speaker, e.text) for e in mapped.entries] == [
        ("D1:5", "Ana", "Ana thanked Ben."),
        ("D1:4", "Ben", "Ben showed a red door."),
    ]
    e = mapped.entries[0]
    assert (e.event_id, e.session_index, e.turn_index, e.event_time, e.kind) == (
        "c:D1:5",
        1,
        4,
        S1,
        "relation",
    )
    assert (e.request_id, e.prompt_version, e.model) == (req.request_id, "relational/3", "model-x")


def test_failed_parse_yields_no_entries_and_is_counted() -> None:
    wins = plan_windows(turns_frame(), 3, 0)
    plan = [(w, "fact", build_request(w, "fact", SETTINGS)) for w in wins]
    ok = {
        "entries": [
            {"turn": 1, "text": "Ana said something."},
            {"turn": 1, "text": "Ana said something."},
        ]
    }
    results = [
        result(ok),
        result(None, parse_ok=False),
        result({"entries": [{"turn": 9, "text": "x"}]}),
    ]
    notes: dict[str, Any] = {}
    rows = collect_entries(plan, results, notes)
    assert [r.dia_id for r in rows] == ["D1:1"]  # the duplicate collapsed onto one entry id
    assert notes == {
        "parse_failures": 1,
        "truncated": 0,
        "salvaged": 0,
        "rejected_items": 1,
        "empty_items": 0,
        "duplicate_items": 1,
    }


def test_request_ids_are_stable_and_distinct() -> None:
    wins = plan_windows(turns_frame(), 3, 1)
    ids = [build_request(w, k, SETTINGS).request_id for w in wins for k in ("fact", "relation")]
    again = [
        build_request(w, k, SETTINGS).request_id
        for w in plan_windows(turns_frame(), 3, 1)
        for k in ("fact", "relation")
    ]
    assert ids == again and len(set(ids)) == len(ids) and all(i.startswith("extract:") for i in ids)
    schema = build_request(wins[0], "fact", SETTINGS).schema
    assert schema["properties"]["entries"]["items"]["properties"]["turn"]["maximum"] == 3


def test_settings_validation() -> None:
    from omegaconf import OmegaConf

    base = {
        "turns_per_request": 8,
        "context_turns": 0,
        "perspectives": ["fact"],
        "max_tokens": 10,
        "max_items": 2,
        "max_item_chars": 50,
        "temperature": 0.0,
        "top_p": 1.0,
    }
    assert ExtractSettings.from_cfg(OmegaConf.create({"extract": base})).perspectives == ("fact",)
    for bad in ({"turns_per_request": 0}, {"perspectives": []}, {"perspectives": ["opinion"]},
                {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ConfigError):
            ExtractSettings.from_cfg(OmegaConf.create({"extract": {**base, **bad}}))


def test_salvaged_replies_are_counted() -> None:
    win = plan_windows(turns_frame(), 3, 0)[0]
    req = build_request(win, "fact", SETTINGS)
    cut = LLMResult(
        req.request_id, "", {"entries": [{"turn": 1, "text": "Ana kept."}]}, True,
        0, 0, None, 0.0, "length", False, 1, "m", "model-x", salvaged=True,
    )
    notes: dict[str, Any] = {}
    rows = collect_entries([(win, "fact", req)], [cut], notes)
    assert [r.text for r in rows] == ["Ana kept."]
    assert notes["salvaged"] == 1 and notes["truncated"] == 1 and notes["parse_failures"] == 0


def test_token_packing_stays_in_sessions_and_under_budget() -> None:
    from structmem_gpu.methods.structmem.packing import pack_lengths

    # greedy would give 850 + 50; balanced packing keeps greedy's count with even windows
    assert pack_lengths([300, 300, 250, 50], 850) == [(0, 2), (2, 4)]
    assert pack_lengths([900, 10], 850) == [(0, 1), (1, 2)]  # an oversized turn alone
    assert pack_lengths([10] * 5, 850, max_turns=2) == [(0, 2), (2, 4), (4, 5)]
    turns = turns_frame()  # session 1: 5 turns, session 2: 2 turns
    lengths = {"turn D1:1": 5, "turn D1:2": 5, "turn D1:3": 5, "turn D1:4": 5, "turn D1:5": 5}

    def count(line: str) -> int:
        return next((n for k, n in lengths.items() if k in line), 5)

    wins = plan_windows(turns, None, 2, window_tokens=10, count_tokens=count)
    assert [[t.dia_id for t in w.turns] for w in wins] == [
        ["D1:1", "D1:2"], ["D1:3", "D1:4"], ["D1:5"], ["D2:1", "D2:2"],
    ]
    assert [t.dia_id for t in wins[1].context] == ["D1:1", "D1:2"]
    big = plan_windows(turns, None, 0, window_tokens=10_000)
    assert [len(w.turns) for w in big] == [5, 2]  # one window per session, never across


def test_settings_from_config_validate_the_window_unit() -> None:
    from omegaconf import OmegaConf

    base = {
        "turns_per_request": None, "window_tokens": 850, "context_turns": 2,
        "perspectives": ["fact", "relation"], "max_tokens": 4096, "max_items": None,
        "max_item_chars": 400, "temperature": 0.0, "top_p": 1.0, "prompt_variant": "grounded",
    }
    s = ExtractSettings.from_cfg(OmegaConf.create({"extract": base}))
    assert (s.window_tokens, s.turns_per_request, s.max_items, s.prompt_variant) == (
        850, None, None, "grounded",
    )
    req = build_request(plan_windows(turns_frame(), 3, 0)[0], "fact", s)
    assert req.prompt_version == "factual/2+grounded" and "maxItems" not in str(req.schema)
    for bad in ({"window_tokens": None}, {"window_tokens": 0}, {"prompt_variant": "x"}):
        with pytest.raises(ConfigError):
            ExtractSettings.from_cfg(OmegaConf.create({"extract": {**base, **bad}}))
