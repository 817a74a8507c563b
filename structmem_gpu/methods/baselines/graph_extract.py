"""Graph memory sub-steps 1 and 3: entity and relation extraction requests and their parsing.

    python jobs/run.py method=graph_memory stages=[graph]     # the stage in graph_memory.py

The windows are StructMem's extraction windows (`plan_windows`: `graph_memory.turns_per_request`
consecutive turns of one session), rendered with the extractors' own `render_window`. Every
window's speakers join its entities without an LLM (a relation needs its people as nodes).
Reply items are bound to the window's turns by their local `turn` number; items naming an
unknown turn or a relation from an entity to itself are rejected and counted. One mention:

    Mention(conv_id="sample-1", name="Biscuit", entity_type="animal",
            event_ids=("sample-1:D2:1",), request_id="graph:3b…")
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.baselines.graph_state import (
    GraphSettings,
    Mention,
    NewRelation,
    normalize,
)
from structmem_gpu.methods.structmem.extraction_windows import ExtractionWindow, plan_windows
from structmem_gpu.methods.baselines.prompts import graph_entities, graph_relations
from structmem_gpu.prompts import render_window

STAGE_NAME = "graph"


@dataclass
class ParseCounts:
    parse_failures: int = 0
    rejected_items: int = 0  # unknown turn, self-relation, blank text
    duplicate_items: int = 0  # repeated inside one reply


@dataclass(frozen=True)
class RelationPlan:
    """One window's relation request and the entity each number stands for."""

    window: ExtractionWindow
    entity_ids: tuple[str, ...]  # number k in the prompt -> entity_ids[k - 1]
    request: LLMRequest


@dataclass
class WindowEntities:
    """The canonical entities of one window after de-duplication, in mention order."""

    ids: list[str] = field(default_factory=list)

    def add(self, entity_id: str) -> None:
        if entity_id not in self.ids:
            self.ids.append(entity_id)


def windows_by_conversation(
    turns: pl.DataFrame, per_request: int
) -> dict[str, list[ExtractionWindow]]:
    """conv_id -> its windows in time order (the wavefront advances one window per step)."""
    windows = plan_windows(turns, per_request, 0)
    return {conv: list(ws) for conv, ws in itertools.groupby(windows, key=lambda w: w.conv_id)}


def window_text(w: ExtractionWindow) -> str:
    return render_window(w.session_time, [], [(t.speaker, t.text) for t in w.turns])


def _sampling(s: GraphSettings, sub_step: str) -> Sampling:
    return Sampling(temperature=s.temperature, max_tokens=s.max_tokens[sub_step])


def entity_request(w: ExtractionWindow, s: GraphSettings) -> LLMRequest:
    user = window_text(w)
    schema = graph_entities.schema(
        len(w.turns), max_items=s.max_entities, max_chars=s.max_name_chars, types=s.entity_types
    )
    return LLMRequest(
        request_id=request_id(
            STAGE_NAME, w.conv_id, w.turns[0].event_id, graph_entities.VERSION, user, schema
        ),
        stage=STAGE_NAME,
        conv_id=w.conv_id,
        messages=graph_entities.build_messages(user),
        prompt_version=graph_entities.VERSION,
        schema=schema,
        sampling=_sampling(s, "entities"),
    )


def window_mentions(
    w: ExtractionWindow, req: LLMRequest, res: LLMResult, types: Sequence[str], counts: ParseCounts
) -> list[Mention]:
    """The window's speakers, then the reply's entities; one mention per normalised name."""
    merged: dict[str, Mention] = {}

    def put(m: Mention) -> None:
        if not m.norm:
            counts.rejected_items += 1
            return
        old = merged.get(m.norm)
        if old is None:
            merged[m.norm] = m
            return
        counts.duplicate_items += m.request_id is not None and old.request_id is not None
        events = tuple(dict.fromkeys([*old.event_ids, *m.event_ids]))
        merged[m.norm] = Mention(
            old.conv_id, old.name, old.entity_type, events, old.request_id or m.request_id
        )

    for speaker in dict.fromkeys(t.speaker for t in w.turns):
        put(
            Mention(
                w.conv_id,
                speaker,
                "person",
                tuple(t.event_id for t in w.turns if t.speaker == speaker),
                None,
            )
        )
    counts.parse_failures += not res.parse_ok
    items: list[dict[str, Any]] = []
    if res.parse_ok and isinstance(res.data, dict):
        items = res.data.get("entities") or []
    for item in items:
        turn, name = item.get("turn"), str(item.get("name") or "").strip()
        if (
            isinstance(turn, bool)
            or not isinstance(turn, int)
            or not 1 <= turn <= len(w.turns)
            or not name
        ):
            counts.rejected_items += 1
            continue
        etype = str(item.get("type") or "other")
        put(
            Mention(
                w.conv_id,
                name,
                etype if etype in types else "other",
                (w.turns[turn - 1].event_id,),
                req.request_id,
            )
        )
    return list(merged.values())


def relation_plan(
    w: ExtractionWindow, entities: Sequence[tuple[str, str, str]], s: GraphSettings
) -> RelationPlan | None:
    """The relation request of a window with (entity_id, name, type) entities; None with < 2."""
    if len(entities) < 2:
        return None
    shown = [(name, etype) for _, name, etype in entities]
    messages = graph_relations.build_messages(window_text(w), shown)
    schema = graph_relations.schema(
        len(entities), len(w.turns), max_items=s.max_relations, max_chars=s.max_relation_chars
    )
    rid = request_id(
        STAGE_NAME,
        w.conv_id,
        w.turns[0].event_id,
        graph_relations.VERSION,
        messages[-1].content,
        schema,
    )
    req = LLMRequest(
        request_id=rid,
        stage=STAGE_NAME,
        conv_id=w.conv_id,
        messages=messages,
        prompt_version=graph_relations.VERSION,
        schema=schema,
        sampling=_sampling(s, "relations"),
    )
    return RelationPlan(w, tuple(e[0] for e in entities), req)


def window_relations(plan: RelationPlan, res: LLMResult, counts: ParseCounts) -> list[NewRelation]:
    """Reply items -> relations between canonical entities, bound to their turn's event."""
    counts.parse_failures += not res.parse_ok
    if not res.parse_ok or not isinstance(res.data, dict):
        return []
    out: dict[tuple[str, str, str], NewRelation] = {}
    n, turns = len(plan.entity_ids), plan.window.turns
    for item in res.data.get("relations") or []:
        src, tgt, turn = item.get("source"), item.get("target"), item.get("turn")
        rel = str(item.get("relation") or "").strip()
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (src, tgt, turn))
        if (
            not ok
            or not (1 <= src <= n and 1 <= tgt <= n and 1 <= turn <= len(turns))
            or src == tgt
            or not normalize(rel)
        ):
            counts.rejected_items += 1
            continue
        t = turns[turn - 1]
        new = NewRelation(
            plan.window.conv_id,
            plan.entity_ids[src - 1],
            plan.entity_ids[tgt - 1],
            rel,
            t.event_id,
            t.session_time,
            plan.request.request_id,
        )
        if new.key in out:
            counts.duplicate_items += 1
        else:
            out[new.key] = new
    return list(out.values())
