"""Stage `graph`: the graph-memory paradigm (StructMem paper Table 2 "Graph Memory").

    python jobs/run.py method=graph_memory benchmark=sample
    python jobs/run.py method=graph_memory stages=[graph] graph_memory.entity_threshold=0.8

Per window (StructMem's extraction windows), four cascading LLM operations, as the paper
describes the paradigm: entity extraction -> entity de-duplication against the existing graph
(embedding shortlist + LLM decision) -> relation extraction between the window's entities ->
relation de-duplication / conflict resolution against existing relations (LLM). The factual
entries come from StructMem's own `extract` stage (`extract.perspectives: [fact]`), shared
through the response cache with StructMem and flat.

De-duplication reads the graph built from earlier windows, so a conversation's windows are
sequential. The stage runs them as a WAVEFRONT: step t takes window t of every conversation,
and each of the four sub-steps of a step is ONE LLM batch over all conversations. Hence, in
the manifest's build_cost.batches and ctx.notes:

    batches = steps x 4 - empty_sub_steps      (steps = the most windows of any conversation;
                                                a sub-step with nothing to ask sends nothing)

Writes tables/graph_entities.parquet and tables/graph_relations.parquet (GRAPH_ENTITIES /
GRAPH_RELATIONS below; examples in graph_state.py). Merged entities keep every alias, event
and request; obsolete relations stay, marked `status="obsolete"` with `superseded_by`.

ctx.notes: steps, sub_steps, batches, empty_sub_steps, calls (per sub-step), windows,
mentions, entities, entities_merged_exact / _llm, relations, relations_duplicate_exact /
_llm, relations_obsolete, parse_failures, rejected_items, duplicate_items,
invalid_decisions, undecided_items.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.llm.types import LLMRequest, LLMResult
from structmem_gpu.methods.baselines import graph_dedup as D
from structmem_gpu.methods.baselines import graph_extract as X
from structmem_gpu.methods.baselines.graph_state import (
    SUB_STEPS,
    ConvGraph,
    GraphSettings,
    Mention,
    NewRelation,
)
from structmem_gpu.methods.structmem.extraction_windows import ExtractionWindow
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)

_STR, _I32, _TIME, _STRLIST = pl.String(), pl.Int32(), pl.Datetime("us"), pl.List(pl.String())
GRAPH_ENTITIES: schemas.Schema = {
    "entity_id": _STR,  # "ent:" + hash(conv_id, normalised first name)
    "conv_id": _STR,
    "name": _STR,  # the first mention's name
    "entity_type": _STR,  # one of graph_memory.entity_types
    "aliases": _STRLIST,  # other names merged into it (exact case variants are not aliases)
    "event_ids": _STRLIST,  # provenance: every turn that mentioned it
    "request_ids": _STRLIST,  # extraction and dedup requests that shaped it
    "mentions": _I32,
    "first_step": _I32,  # wavefront step that created it
}
GRAPH_RELATIONS: schemas.Schema = {
    "relation_id": _STR,
    "conv_id": _STR,
    "source_id": _STR,
    "target_id": _STR,
    "source_name": _STR,
    "target_name": _STR,
    "relation": _STR,
    "text": _STR,  # "source -> relation -> target" (what is embedded and shown)
    "event_ids": _STRLIST,  # provenance: the turns that stated it (duplicates add theirs)
    "first_time": _TIME,
    "last_time": _TIME,
    "request_ids": _STRLIST,
    "status": _STR,  # "active" | "obsolete"
    "superseded_by": _STR,  # relation_id of the update that made it obsolete
    "obsoleted_by_request": _STR,
    "mentions": _I32,
    "step": _I32,
}


class Wavefront:
    """Runs the steps; owns the graphs and the counters that end up in ctx.notes."""

    def __init__(
        self, ctx: StageContext, s: GraphSettings, windows: dict[str, list[ExtractionWindow]]
    ) -> None:
        self.ctx, self.s, self.windows = ctx, s, windows
        self.graphs = {conv: ConvGraph(conv) for conv in windows}
        self.parse = X.ParseCounts()
        self.dedup = D.DecisionCounts()
        self.calls: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.empty_sub_steps = 0

    def _batch(self, sub: str, step: int, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        self.calls[sub] += len(requests)
        self.empty_sub_steps += not requests
        steps = max(map(len, self.windows.values()))
        return self.ctx.generate(requests, desc=f"graph step {step + 1}/{steps} {sub}")

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.ctx.encode(list(texts)) if texts else np.zeros((0, 0), dtype=np.float32)

    def run(self) -> None:
        for step in range(max(map(len, self.windows.values()), default=0)):
            active = [(conv, ws[step]) for conv, ws in self.windows.items() if step < len(ws)]
            window_entities = self.entities(step, active)
            self.relations(step, active, window_entities)
            log.info(
                "graph step %d: %d windows, calls so far %s",
                step + 1,
                len(active),
                dict(self.calls),
            )

    # ---- sub-steps 1 + 2 ---------------------------------------------------------------
    def entities(
        self, step: int, active: list[tuple[str, ExtractionWindow]]
    ) -> dict[str, X.WindowEntities]:
        """Extract (one batch), merge known names, shortlist the rest, ask (one batch)."""
        requests = [X.entity_request(w, self.s) for _, w in active]
        results = self._batch("entities", step, requests)
        out = {conv: X.WindowEntities() for conv, _ in active}
        fresh: list[tuple[str, Mention]] = []
        for (conv, w), req, res in zip(active, requests, results, strict=True):
            g = self.graphs[conv]
            for m in X.window_mentions(w, req, res, self.s.entity_types, self.parse):
                self.events["mentions"] += 1
                if (eid := g.known(m)) is not None:
                    out[conv].add(g.merge_entity(eid, m, None).entity_id)
                    self.events["entities_merged_exact"] += 1
                else:
                    fresh.append((conv, m))
        pending = self._shortlist_mentions(step, fresh, out)
        plans = [D.entity_dedup_plan(self.graphs[c], step, p, self.s) for c, p in pending.items()]
        results = self._batch("entity_dedup", step, [p.request for p in plans])
        for plan, res in zip(plans, results, strict=True):
            g = self.graphs[plan.conv_id]
            for d in D.entity_decisions(plan, res, self.dedup):
                if d.same_as is None:
                    ent = g.add_entity(d.mention, step, d.vec)
                else:
                    ent = g.merge_entity(d.same_as, d.mention, d.vec, d.request_id)
                    self.events["entities_merged_llm"] += 1
                out[plan.conv_id].add(ent.entity_id)
        return out

    def _shortlist_mentions(
        self, step: int, fresh: list[tuple[str, Mention]], out: dict[str, X.WindowEntities]
    ) -> dict[str, list[D.PendingMention]]:
        """Unknown names: those with similar known entities wait for the LLM, others are new."""
        vecs = self._encode([m.name for _, m in fresh])
        # Shortlists first, against the graph of EARLIER windows only; adding as we go would
        # make a mention's fate depend on the order of the window's other mentions.
        shortlists = [
            self.graphs[conv].entity_shortlist(
                vec, self.s.entity_threshold, self.s.entity_candidates_k
            )
            for (conv, _), vec in zip(fresh, vecs, strict=True)
        ]
        pending: dict[str, list[D.PendingMention]] = {}
        for (conv, m), vec, short in zip(fresh, vecs, shortlists, strict=True):
            if short:
                cands = tuple(e for e, _ in short)
                pending.setdefault(conv, []).append(D.PendingMention(m, vec, cands))
            else:
                out[conv].add(self.graphs[conv].add_entity(m, step, vec).entity_id)
        return pending

    # ---- sub-steps 3 + 4 ---------------------------------------------------------------
    def relations(
        self,
        step: int,
        active: list[tuple[str, ExtractionWindow]],
        window_entities: dict[str, X.WindowEntities],
    ) -> None:
        """Extract (one batch), merge exact duplicates, compare the rest, ask (one batch)."""
        plans = []
        for conv, w in active:
            ents = self.graphs[conv].entities
            shown = [(e, ents[e].name, ents[e].entity_type) for e in window_entities[conv].ids]
            if (plan := X.relation_plan(w, shown, self.s)) is not None:
                plans.append(plan)
        results = self._batch("relations", step, [p.request for p in plans])
        fresh: list[NewRelation] = []
        for plan, res in zip(plans, results, strict=True):
            g = self.graphs[plan.window.conv_id]
            for new in X.window_relations(plan, res, self.parse):
                self.events["relations_extracted"] += 1
                if (rid := g.active_duplicate(new)) is not None:
                    g.merge_relation(rid, new)
                    self.events["relations_duplicate_exact"] += 1
                else:
                    fresh.append(new)
        pending = self._relation_candidates(step, fresh)
        dplans = [
            D.relation_dedup_plan(self.graphs[c], step, p, self.s) for c, p in pending.items()
        ]
        dresults = self._batch("relation_dedup", step, [p.request for p in dplans])
        for dplan, res in zip(dplans, dresults, strict=True):
            for d in D.relation_decisions(dplan, res, self.dedup):
                self.apply_relation(step, d)

    def _relation_candidates(
        self, step: int, fresh: list[NewRelation]
    ) -> dict[str, list[D.PendingRelation]]:
        """New relations sharing an entity with active ones wait for the LLM; others are added."""
        vecs = self._encode([self.graphs[n.conv_id].relation_text(n) for n in fresh])
        candidates = [  # against earlier windows only, as for entities
            self.graphs[n.conv_id].relation_candidates(n, vec, self.s.relation_candidates_k)
            for n, vec in zip(fresh, vecs, strict=True)
        ]
        pending: dict[str, list[D.PendingRelation]] = {}
        for new, vec, cands in zip(fresh, vecs, candidates, strict=True):
            if cands:
                pending.setdefault(new.conv_id, []).append(
                    D.PendingRelation(new, vec, tuple(cands))
                )
            else:
                self.graphs[new.conv_id].add_relation(new, step, vec)
        return pending

    def apply_relation(self, step: int, d: D.RelationDecision) -> None:
        g = self.graphs[d.new.conv_id]
        if d.action == "duplicate" and d.existing is not None:
            g.merge_relation(d.existing, d.new, d.request_id)
            self.events["relations_duplicate_llm"] += 1
            return
        rel = g.add_relation(d.new, step, d.vec)
        if (
            d.action == "update"
            and d.existing is not None
            and g.relations[d.existing].status == "active"
        ):
            g.mark_obsolete(d.existing, rel.relation_id, d.request_id)
            self.events["relations_obsolete"] += 1

    # ---- output ------------------------------------------------------------------------
    def tables(self) -> dict[str, pl.DataFrame]:
        ents = [r for g in self.graphs.values() for r in g.entity_rows()]
        rels = [r for g in self.graphs.values() for r in g.relation_rows()]
        return {
            "graph_entities": schemas.frame(ents, GRAPH_ENTITIES),
            "graph_relations": schemas.frame(rels, GRAPH_RELATIONS),
        }

    def notes(self) -> dict[str, object]:
        steps = max(map(len, self.windows.values()), default=0)
        return {
            "steps": steps,
            "sub_steps": len(SUB_STEPS),
            "batches": self.ctx.batches,
            "empty_sub_steps": self.empty_sub_steps,
            "calls": {k: self.calls[k] for k in SUB_STEPS},
            "windows": sum(map(len, self.windows.values())),
            "entities": sum(len(g.entities) for g in self.graphs.values()),
            "relations": sum(len(g.relations) for g in self.graphs.values()),
            **{
                k: self.events[k]
                for k in (
                    "mentions",
                    "entities_merged_exact",
                    "entities_merged_llm",
                    "relations_extracted",
                    "relations_duplicate_exact",
                    "relations_duplicate_llm",
                    "relations_obsolete",
                )
            },
            "parse_failures": self.parse.parse_failures + self.dedup.parse_failures,
            "rejected_items": self.parse.rejected_items,
            "duplicate_items": self.parse.duplicate_items,
            "invalid_decisions": self.dedup.invalid,
            "undecided_items": self.dedup.undecided,
        }


def run_graph(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: GraphSettings = ctx.settings
    windows = X.windows_by_conversation(ctx.read("turns"), s.turns_per_request)
    wave = Wavefront(ctx, s, windows)
    if windows:
        wave.run()
    ctx.notes.update(wave.notes())
    log.info("graph: %s", ctx.notes)
    return wave.tables()


# ---- dry run (Stage.estimate) ------------------------------------------------------------

GRAPH_ITEM_TOKENS = 20  # one entity / relation / dedup decision in JSON


# A relation phrase ("adopted", "is training for") is a short phrase, as long as a SEEM
# frame role (methods/seem/fusion.ROLE_CHARS: 18 characters on average in SmolLM2's frames
# on the sample); max_relation_chars only caps it.
RELATION_CHARS = 18


# Share of the relations a window's reply may hold (max_relations) that the graph keeps:
# SmolLM2-135M on the sample (debug=ci: max_relations 4, 9 windows, 2026-12-02) extracted 10
# relations where the schema allowed 36. As many per window as the schema allows made the
# graph reader's prompts 1.24x what llama.cpp reported.
RELATION_FILL = 10 / 36


def stand_in_relations(windows: Sequence[Any], s: GraphSettings) -> pl.DataFrame:
    """Active graph relations as the stage is expected to write them, for the reader's
    stand-in retrievals: per window one relation for each of its first
    round(RELATION_FILL x min(turns, max_relations)) turns, at least one, the turn's speaker
    -> a short phrase of its words (RELATION_CHARS, at most max_relation_chars) -> the
    window's other speaker (or the turn's words as a name)."""
    def filled(text: str, chars: int) -> str:  # `chars` characters of the text, repeated as needed
        text = text.strip() or "x"
        return ((text + " ") * (chars // (len(text) + 1) + 1))[:chars]

    rows = []
    for w in windows:
        speakers = list(dict.fromkeys(t.speaker for t in w.turns))
        for t in w.turns[: max(1, round(min(len(w.turns), s.max_relations) * RELATION_FILL))]:
            other = next((x for x in speakers if x != t.speaker), None) or filled(t.text, RELATION_CHARS)
            phrase = filled(t.text, min(RELATION_CHARS, s.max_relation_chars))
            rows.append({"conv_id": w.conv_id, "relation_id": f"rel:{t.event_id}",
                         "text": f"{t.speaker[: s.max_name_chars]} -> {phrase} -> {other[: s.max_name_chars]}",
                         "first_time": t.session_time, "last_time": t.session_time,
                         "event_ids": [t.event_id]})
    return pl.DataFrame(rows, schema={"conv_id": pl.String, "relation_id": pl.String, "text": pl.String,
                                      "first_time": pl.Datetime("us"), "last_time": pl.Datetime("us"),
                                      "event_ids": pl.List(pl.String)})


def estimate_graph(inp: EstimateInputs) -> StageEstimate:
    """An UPPER BOUND: per window, the entity request (exact: the stage's own windows and
    builder) and at most one request of each later sub-step (relations need >= 2 entities;
    each dedup batch asks once per conversation and step, and only when the shortlist built
    from earlier replies is not empty). Prompts: entity prompts exact; relation prompts with
    the window's speakers as its entities; each dedup prompt counted as its window's relation
    prompt (a stand-in: the candidates come from replies)."""
    s = inp.job.settings(GraphSettings)
    windows = [w for ws in X.windows_by_conversation(inp.turns, s.turns_per_request).values() for w in ws]
    prompt = over = 0
    completion = 0
    for w in windows:
        ent = X.entity_request(w, s)
        speakers = list(dict.fromkeys(t.speaker for t in w.turns))
        shown = [(f"e{i}", name, "person") for i, name in enumerate(speakers or ["?", "?"])]
        shown += [("e-other", "someone", "person")] * max(0, 2 - len(shown))
        rel = X.relation_plan(w, shown, s)
        rel_msgs = rel.request.messages if rel is not None else ent.messages
        prompt += inp.counter.messages(ent.messages) + 3 * inp.counter.messages(rel_msgs)
        over += inp.over(ent.messages, s.max_tokens["entities"])
        over += inp.over(rel_msgs, s.max_tokens["relations"])
        completion += min(s.max_tokens["entities"], s.max_entities * GRAPH_ITEM_TOKENS)
        completion += min(s.max_tokens["relations"], s.max_relations * GRAPH_ITEM_TOKENS)
        completion += min(s.max_tokens["entity_dedup"], s.max_entities * GRAPH_ITEM_TOKENS)
        completion += min(s.max_tokens["relation_dedup"], s.max_relations * GRAPH_ITEM_TOKENS)
    inp.stand_ins["graph_relations"] = stand_in_relations(windows, s)
    return StageEstimate(
        X.STAGE_NAME, 4 * len(windows), prompt, completion,
        f"upper bound: {len(windows)} windows x 4 sub-steps (entities exact; relations and the "
        "two dedups at most one each)",
        over if inp.checked else None, bound=True, build=True,
    )


STAGE = Stage(
    name=X.STAGE_NAME,
    run=run_graph,
    reads=("turns",),
    writes=("graph_entities", "graph_relations"),
    settings=GraphSettings,
    depends=(*LLM_IDENTITY, *EMBEDDER_IDENTITY),
    uses=("llm", "encoder"),
    estimate=estimate_graph,
)
