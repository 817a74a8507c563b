"""graph_memory baseline: wavefront scheduling, dedup bookkeeping, schemas, retrieval, reader.

Scripted LLM + hashed bag-of-words encoder on the bundled sample (one extraction window per
session: sample-1 has 5, sample-2 has 4, so the wavefront has 5 steps).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from omegaconf import OmegaConf
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.embed.encoder import Encoder
from structmem_gpu.eval.answer import AnswerInputs, context_builder
from structmem_gpu.llm.types import LLMRequest, LLMResult
from structmem_gpu.methods.baselines import graph_dedup as D
from structmem_gpu.methods.baselines import graph_memory, graph_retrieve
from structmem_gpu.methods.baselines.graph_state import (
    ACTIVE,
    OBSOLETE,
    ConvGraph,
    Mention,
    NewRelation,
)
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.structmem import embed, extract
from structmem_gpu.methods.baselines.prompts import (
    graph_entities,
    graph_entity_dedup,
    graph_relation_dedup,
    graph_relations,
)
from tests.unit.test_embed_encoder import CountingModel
from tests.unit.test_structmem_stages import FakeBackends, cfg_for, echo, run_stage

_DATE = re.compile(r"^Session date: (\S+ \S+)", re.MULTILINE)  # date and time: unique per window
_MIGHT_BE = re.compile(r"^\((\d+)\) (\S+).*; might be: ([\d, ]+)$", re.MULTILINE)
_KNOWN = re.compile(r"^\[(\d+)\] (\S+)", re.MULTILINE)
_COMPARE = re.compile(r"^\((\d+)\) .*; compare with: ([\d, ]+)$", re.MULTILINE)
_ENTITY_LINE = re.compile(r"^\[(\d+)\] .+ \((\w+)\)$", re.MULTILINE)


def graph_cfg(*overrides: str) -> Any:
    # Bag-of-words cosine of "Biscuit <date> <time1>" and "Biscuit <date> <time2>" is >= 1/3.
    return cfg_for("method=graph_memory", "graph_memory.entity_threshold=0.3", *overrides)


def _user(req: LLMRequest) -> str:
    return req.messages[-1].content


def entities_reply(req: LLMRequest) -> str:
    """Every window names the same puppy differently ("Biscuit <session date>")."""
    date = _DATE.search(_user(req)).group(1)  # type: ignore[union-attr]
    return json.dumps({"entities": [{"name": f"Biscuit {date}", "type": "animal", "turn": 1}]})


def relations_reply(req: LLMRequest) -> str:
    """The first entity (a speaker) -> a new phrase per session -> the last entity (the puppy)."""
    ents = _ENTITY_LINE.findall(_user(req).split("Entities:")[1])
    date = _DATE.search(_user(req)).group(1)  # type: ignore[union-attr]
    return json.dumps(
        {
            "relations": [
                {"source": 1, "relation": f"walked on {date}", "target": len(ents), "turn": 1}
            ]
        }
    )


def entity_decisions(user: str, same: bool) -> list[dict[str, Any]]:
    """Each mention is the known entity with the same first word (when `same`), else new."""
    known = {word: int(k) for k, word in _KNOWN.findall(user.split("New mentions")[0])}
    out = []
    for n, word, cands in _MIGHT_BE.findall(user):
        k = known.get(word, 0)
        out.append(
            {
                "mention": int(n),
                "same_as": k if same and str(k) in cands.replace(" ", "").split(",") else 0,
            }
        )
    return out


def relation_decisions(user: str, action: str) -> list[dict[str, Any]]:
    """Every new relation gets `action` against its first (most similar) candidate."""
    return [
        {
            "relation": int(n),
            "action": action,
            "existing": int(c.split(",")[0]) if action != "add" else 0,
        }
        for n, c in _COMPARE.findall(user)
    ]


def graph_responder(entity_same: bool = True, relation_action: str = "update"):
    def reply(req: LLMRequest) -> str:
        v, user = req.prompt_version, _user(req)
        if v == graph_entities.VERSION:
            return entities_reply(req)
        if v == graph_relations.VERSION:
            return relations_reply(req)
        if v == graph_entity_dedup.VERSION:
            return json.dumps({"decisions": entity_decisions(user, entity_same)})
        if v == graph_relation_dedup.VERSION:
            return json.dumps({"decisions": relation_decisions(user, relation_action)})
        raise AssertionError(v)

    return reply


class GraphBackends(FakeBackends):
    """A wider hashed bag of words than the default (fewer accidental word collisions)."""

    def __init__(self, responders: dict[str, Any]) -> None:
        super().__init__(responders)
        self.model = CountingModel(dim=512)
        self.enc = Encoder(self.model, "fake-bow-512")


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    from structmem_gpu.data import load_benchmark

    turns, questions = load_benchmark("sample", sample_path, None, None)
    r = RunDir(tmp_path / "run")
    r.write_table("turns", turns)
    r.write_table("questions", questions)
    return r


def build_graph(run: RunDir, responder=None, *overrides: str):
    cfg = graph_cfg(*overrides)
    backends = GraphBackends({"extract": echo, "graph": responder or graph_responder()})
    ctx = run_stage(run, cfg, backends, graph_memory.STAGE)
    return cfg, backends, ctx


# ---- wavefront -------------------------------------------------------------------------------


def test_wavefront_one_batch_per_sub_step_across_conversations(run: RunDir) -> None:
    _, _, ctx = build_graph(run)
    windows = extract.plan_windows(run.read_table("turns"), 8, 0)
    per_conv = pl.Series([w.conv_id for w in windows]).value_counts()
    steps = int(per_conv["count"].max())
    assert ctx.notes["steps"] == steps == 5 and ctx.notes["sub_steps"] == 4
    # Step 0 has no earlier graph to compare with, so its two dedup sub-steps send nothing;
    # every later step sends all four batches.
    assert ctx.notes["empty_sub_steps"] == 2
    assert ctx.batches == ctx.notes["batches"] == steps * 4 - 2 == len(ctx.request_frames)
    calls = ctx.notes["calls"]
    assert calls["entities"] == calls["relations"] == len(windows) == 9
    assert (
        calls["entity_dedup"] == calls["relation_dedup"] == len(windows) - 2
    )  # all but each conv's first
    assert sum(calls.values()) == sum(f.height for f in ctx.request_frames)
    # The first batch holds window 0 of BOTH conversations; the last holds only sample-1's.
    assert set(ctx.request_frames[0]["conv_id"]) == {"sample-1", "sample-2"}
    assert set(ctx.request_frames[-1]["conv_id"]) == {"sample-1"}
    assert all(
        f["prompt_version"].n_unique() == 1 for f in ctx.request_frames
    )  # one sub-step per batch


def test_merged_entities_keep_all_provenance(run: RunDir) -> None:
    _, _, ctx = build_graph(run)
    ents = run.read_table("graph_entities")
    assert ents.schema == pl.Schema(graph_memory.GRAPH_ENTITIES)
    turns = run.read_table("turns")
    for conv, n_windows in (("sample-1", 5), ("sample-2", 4)):
        puppy = ents.filter(
            (pl.col("conv_id") == conv) & pl.col("name").str.starts_with("Biscuit")
        ).row(0, named=True)
        assert (
            ents.filter((pl.col("conv_id") == conv) & (pl.col("entity_type") == "animal")).height
            == 1
        )
        assert len(puppy["aliases"]) == n_windows - 1 and puppy["mentions"] == n_windows
        first_turns = turns.filter((pl.col("conv_id") == conv) & (pl.col("turn_index") == 0))[
            "event_id"
        ]
        assert sorted(puppy["event_ids"]) == sorted(
            first_turns.to_list()
        )  # one turn per window, none lost
        graph_ids = set(ctx.request_frames[0]["request_id"]).union(
            *(f["request_id"] for f in ctx.request_frames)
        )
        assert (
            set(puppy["request_ids"]) <= graph_ids
            and len(puppy["request_ids"]) == 2 * n_windows - 1
        )
    assert ctx.notes["entities_merged_llm"] == 7
    speakers = ents.filter(pl.col("entity_type") == "person")
    assert (
        speakers.height == turns.select("conv_id", "speaker").unique().height
    )  # exact merges, no LLM


def test_obsolete_relations_are_marked_never_deleted(run: RunDir) -> None:
    _, _, ctx = build_graph(run)
    rels = run.read_table("graph_relations")
    assert rels.schema == pl.Schema(graph_memory.GRAPH_RELATIONS)
    assert rels.height == ctx.notes["relations_extracted"] == 9  # one per window, all kept
    active, obsolete = (
        rels.filter(pl.col("status") == ACTIVE),
        rels.filter(pl.col("status") == OBSOLETE),
    )
    assert active.height == 2 and obsolete.height == 7 == ctx.notes["relations_obsolete"]
    ids = set(rels["relation_id"])
    for r in obsolete.iter_rows(named=True):
        newer = rels.filter(pl.col("relation_id") == r["superseded_by"]).row(0, named=True)
        assert (
            r["superseded_by"] in ids
            and newer["conv_id"] == r["conv_id"]
            and newer["step"] == r["step"] + 1
        )
        assert r["obsoleted_by_request"] in r["request_ids"]
    assert sorted(active["step"].to_list()) == [3, 4]  # each conversation's last window


def test_duplicate_relation_adds_provenance_to_the_existing_one(run: RunDir) -> None:
    _, _, ctx = build_graph(run, graph_responder(relation_action="duplicate"))
    rels = run.read_table("graph_relations")
    assert rels.height == 2 and set(rels["status"]) == {ACTIVE}  # one per conversation
    assert (
        sorted(rels["mentions"].to_list()) == [4, 5] and ctx.notes["relations_duplicate_llm"] == 7
    )
    assert sorted(rels["event_ids"].list.len().to_list()) == [4, 5]


def test_distinct_decisions_create_new_entities(run: RunDir) -> None:
    _, _, ctx = build_graph(run, graph_responder(entity_same=False, relation_action="add"))
    ents, rels = run.read_table("graph_entities"), run.read_table("graph_relations")
    assert ents.filter(pl.col("entity_type") == "animal").height == 9
    assert rels.height == 9 and set(rels["status"]) == {ACTIVE}
    assert ctx.notes["entities_merged_llm"] == 0


def test_failed_dedup_reply_keeps_items_as_new_and_is_counted(run: RunDir) -> None:
    base = graph_responder()

    def broken(req: LLMRequest) -> str:
        return "no JSON" if req.prompt_version == graph_entity_dedup.VERSION else base(req)

    _, _, ctx = build_graph(run, broken)
    assert ctx.notes["parse_failures"] == 7  # each dedup request, after its one repair
    assert run.read_table("graph_entities").filter(pl.col("entity_type") == "animal").height == 9


def _graph_with(names: list[str]) -> ConvGraph:
    g = ConvGraph("c")
    for i, n in enumerate(names):
        g.add_entity(
            Mention("c", n, "person", (f"c:D1:{i}",), f"r{i}"), 0, np.eye(4, dtype=np.float32)[i]
        )
    return g


def _result(data: Any) -> LLMResult:
    return LLMResult("x", json.dumps(data), data, True, 1, 1, None, 0.0, "stop", False, 1, "h", "m")


def test_decision_outside_the_items_candidates_is_invalid_never_merged() -> None:
    g = _graph_with(["Ana", "Tomas"])
    ana, tomas = list(g.entities)
    vec = np.eye(4, dtype=np.float32)[2]
    pending = [
        D.PendingMention(Mention("c", "Anna", "person", ("c:D2:1",), "r9"), vec, (ana,)),
        D.PendingMention(Mention("c", "Tom", "person", ("c:D2:2",), "r9"), vec, (tomas,)),
    ]
    plan = D.entity_dedup_plan(g, 1, pending, graph_memory.GraphSettings.from_cfg(graph_cfg()))
    assert (
        "might be: 1" in plan.request.messages[-1].content
        and "might be: 2" in plan.request.messages[-1].content
    )
    counts = D.DecisionCounts()
    out = D.entity_decisions(plan, _result({"decisions": [{"mention": 1, "same_as": 2}]}), counts)
    assert (
        [d.same_as for d in out] == [None, None] and counts.invalid == 1 and counts.undecided == 1
    )


def test_entity_merge_bookkeeping_directly() -> None:
    g = _graph_with(["Tomas"])
    (tid,) = g.entities
    g.merge_entity(tid, Mention("c", "Tom", "person", ("c:D3:4",), "r-extract"), None, "r-dedup")
    g.merge_entity(tid, Mention("c", "TOMAS", "person", ("c:D4:1",), "r-extract2"), None)
    e = g.entities[tid]
    assert e.aliases == ["Tom"]  # a case variant is the same name, not an alias
    assert e.event_ids == ["c:D1:0", "c:D3:4", "c:D4:1"] and e.mentions == 3
    assert e.request_ids == ["r0", "r-extract", "r-dedup", "r-extract2"]
    assert g.known(Mention("c", "tom", "person", (), None)) == tid


def test_relation_obsolete_bookkeeping_directly() -> None:
    g = _graph_with(["Tomas", "Lisbon", "Porto"])
    t, lis, por = list(g.entities)
    when = datetime(2024, 3, 1)
    old = g.add_relation(NewRelation("c", t, lis, "lives in", "c:D1:1", when, "r1"), 0, None)
    new = g.add_relation(NewRelation("c", t, por, "moved to", "c:D5:1", when, "r2"), 4, None)
    g.mark_obsolete(old.relation_id, new.relation_id, "r-dedup")
    rows = {r["relation_id"]: r for r in g.relation_rows()}
    assert len(rows) == 2 and rows[old.relation_id]["status"] == OBSOLETE
    assert rows[old.relation_id]["superseded_by"] == new.relation_id
    assert rows[old.relation_id]["request_ids"] == ["r1", "r-dedup"]
    assert (
        rows[new.relation_id]["status"] == ACTIVE
        and rows[old.relation_id]["text"] == "Tomas -> lives in -> Lisbon"
    )


# ---- schemas are bounded ---------------------------------------------------------------------


def _walk(schema: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield schema
    for sub in schema.get("properties", {}).values():
        yield from _walk(sub)
    if "items" in schema:
        yield from _walk(schema["items"])


def test_every_graph_schema_is_bounded(run: RunDir) -> None:
    _, _, ctx = build_graph(run)
    seen = set()
    for f in ctx.request_frames:
        seen |= set(f["prompt_version"])
    assert seen == {
        graph_entities.VERSION,
        graph_entity_dedup.VERSION,
        graph_relations.VERSION,
        graph_relation_dedup.VERSION,
    }
    schemas = [
        graph_entities.schema(8, max_items=4, max_chars=40),
        graph_entity_dedup.schema(3, 5),
        graph_relations.schema(4, 8, max_items=4, max_chars=40),
        graph_relation_dedup.schema(2, 3),
    ]
    for s in schemas:
        for node in _walk(s):
            t = node.get("type")
            assert t != "array" or "maxItems" in node
            assert t != "string" or "maxLength" in node or "enum" in node
            assert t != "integer" or "enum" in node  # llama.cpp ignores integer bounds
            assert t != "object" or node.get("additionalProperties") is False


# ---- retrieval and reader --------------------------------------------------------------------


def test_retrieval_returns_active_relations_of_entities_named_in_the_question(run: RunDir) -> None:
    cfg, backends, _ = build_graph(run)
    run_stage(run, cfg, backends, extract.STAGE)
    run_stage(run, cfg, backends, embed.STAGE)
    ctx = run_stage(run, cfg, backends, graph_retrieve.STAGE)
    ret, rels = run.read_table("retrievals"), run.read_table("graph_relations")
    rel_rows = ret.filter(pl.col("circuit") == "relations")
    assert ctx.notes["rows_relations"] == rel_rows.height > 0
    active = set(rels.filter(pl.col("status") == ACTIVE)["relation_id"])
    assert set(rel_rows["item_id"]) <= active  # obsolete relations are never shown
    assert rel_rows.group_by("question_id").len()["len"].max() <= int(cfg.retrieve.relations_k)
    assert rel_rows["relation_text"].null_count() == 0
    owner = dict(zip(rels["relation_id"], rels["conv_id"], strict=True))
    assert all(owner[i] == c for i, c in zip(rel_rows["item_id"], rel_rows["conv_id"], strict=True))
    # A question naming an endpoint of an active relation (whole word) gets that relation.
    live = rels.filter(pl.col("status") == ACTIVE)
    q = run.read_table("questions").filter(pl.col("category") < 5)
    checked = 0
    for qid, conv, text in q.select("question_id", "conv_id", "question").iter_rows():
        mine = live.filter(pl.col("conv_id") == conv)
        for rid, a, b in mine.select("relation_id", "source_name", "target_name").iter_rows():
            if any(re.search(rf"\b{re.escape(n)}\b", text) for n in (a, b)):
                checked += 1
                assert rid in set(rel_rows.filter(pl.col("question_id") == qid)["item_id"]), text
    assert checked > 0


def test_graph_reader_shows_entries_and_relations(run: RunDir) -> None:
    cfg, backends, _ = build_graph(run)
    for stage in (extract.STAGE, embed.STAGE, graph_retrieve.STAGE):
        run_stage(run, cfg, backends, stage)
    tables = {n: run.read_table(n) for n in ("retrievals", "entries", "turns")}
    questions = run.read_table("questions").filter(pl.col("category") < 5)
    with_rel = set(tables["retrievals"].filter(pl.col("circuit") == "relations")["question_id"])
    build = context_builder(cfg.answer.prompt)
    paper = build(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))  # default protocol
    for qid, p in paper.items():
        text = p.messages[-1].content
        assert p.prompt_version == "answer_paper/1" and "Memories of " in text
        assert ("Relations between entities:\n- [" in text) == (qid in with_rel)
        assert "source -> relation -> target" in text  # the relation rule joins the reader
    OmegaConf.update(cfg, "answer.protocol", "reasoned")
    prompts = context_builder(cfg.answer.prompt)(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))
    for qid, p in prompts.items():
        user = p.messages[-1].content
        assert user.startswith("Memories of ") and p.prompt_version == "answer_graph/1"
        assert ("Relations between entities:\n- [" in user) == (qid in with_rel)
        assert " -> walked on " in user or qid not in with_rel


def test_registry_and_config() -> None:
    cfg = graph_cfg()
    stages = stage_registry(graph_cfg())
    assert list(cfg.method.stages) == [
        "load",
        "extract",
        "embed",
        "graph",
        "retrieve",
        "answer",
        "judge",
        "report",
    ]
    assert all(s in stages for s in cfg.method.stages)
    assert stages["graph"] is graph_memory.STAGE and stages["retrieve"] is graph_retrieve.STAGE
    assert list(cfg.extract.perspectives) == ["fact"]
    assert context_builder(cfg.answer.prompt) is graph_retrieve.build_prompts
    assert cfg.graph_memory.turns_per_request == 8  # one wavefront step per 8 turns (mem0: per message)
