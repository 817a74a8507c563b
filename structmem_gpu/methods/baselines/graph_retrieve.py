"""Stage `retrieve` and the reader of graph memory (`answer.prompt: graph`).

    python jobs/run.py method=graph_memory stages=[retrieve,answer] retrieve.relations_k=10

Per question: the top `retrieve.entries_k` factual entries (as flat memory), plus the active
relations touching the entities MATCHED in the question, best `retrieve.relations_k` by cosine
between the question and the relation text. An entity matches when its name or an alias
occurs in the question as whole words, or when the cosine of the question and the name is at
least `graph_memory.question_entity_threshold` (best `graph_memory.question_entities_k`). No
LLM: mem0 asks one to extract the question's entities; matching names is free and exact on
the names the graph holds. Relation rows carry their text and dates (extra columns), so the
answer stage's fingerprint covers them. One relation row:

    {"question_id": "sample-1:q0", "conv_id": "sample-1", "circuit": "relations", "rank": 0,
     "item_id": "rel:9a…", "score": 0.58, "relation_text": "Tomas -> adopted -> Biscuit",
     "relation_first": 2024-03-17 19:05, "relation_last": 2024-03-17 19:05,
     "event_ids": ["sample-1:D2:1"]}

The shared answer stage imports this builder from `answer.prompt`
(conf/method/graph_memory.yaml).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

import numpy as np
import polars as pl

from structmem_gpu.core import schemas
from structmem_gpu.eval.answer import AnswerInputs, AnswerPrompt, answer_protocol
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.methods.baselines.graph_state import ACTIVE, normalize
from structmem_gpu.methods.structmem.context import entry_lines, paper_prompts
from structmem_gpu.methods.structmem.embed import embedding_matrix, encode_notes
from structmem_gpu.methods.structmem.retrieve import search_rows
from structmem_gpu.methods.baselines.prompts import answer_graph as P
from structmem_gpu.eval.prompts.answer_structmem import MemoryLine
from structmem_gpu.config.settings import COUNT, RATE, Settings
from structmem_gpu.stage import EMBEDDER_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

PROMPT_NAME = "graph"
CIRCUIT = "relations"
RETRIEVALS: schemas.Schema = {
    **schemas.RETRIEVALS,
    # Not "text"/"time": the shared entry renderer joins entries' own `text` onto these rows.
    "relation_text": pl.String(),
    "relation_first": pl.Datetime("us"),
    "relation_last": pl.Datetime("us"),
    "event_ids": pl.List(pl.String()),  # provenance (turns that stated it)
}


@dataclass(frozen=True)
class EntityNames:
    """One conversation's entity names and aliases, aligned with their unit vectors."""

    owners: list[str]  # entity_id per name
    norms: list[str]  # normalised name per row
    matrix: np.ndarray


def _name_pattern(norm: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(norm)}(?!\w)")


def matched_entities(
    question: str, qvec: np.ndarray, names: EntityNames | None, threshold: float, k: int
) -> set[str]:
    """Entities named in the question (whole words) plus the best k by cosine >= threshold."""
    if names is None or not names.owners:
        return set()
    q = normalize(question)
    hits = {
        o
        for o, n in zip(names.owners, names.norms, strict=True)
        if n and _name_pattern(n).search(q)
    }
    sims = names.matrix @ qvec
    best: dict[str, float] = {}
    for owner, s in zip(names.owners, sims.tolist(), strict=True):
        if s >= threshold and s > best.get(owner, -2.0):
            best[owner] = s
    hits |= {o for o, _ in sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]}
    return hits


def entity_names(ctx: StageContext, entities: pl.DataFrame) -> dict[str, EntityNames]:
    rows = [
        (c, e, n)
        for c, e, name, aliases in entities.select(
            "conv_id", "entity_id", "name", "aliases"
        ).iter_rows()
        for n in [name, *(aliases or [])]
    ]
    if not rows:
        return {}
    mat = ctx.encode([n for _, _, n in rows])
    out: dict[str, EntityNames] = {}
    for conv in dict.fromkeys(c for c, _, _ in rows):
        idx = [i for i, r in enumerate(rows) if r[0] == conv]
        out[conv] = EntityNames(
            [rows[i][1] for i in idx], [normalize(rows[i][2]) for i in idx], mat[idx]
        )
    return out


def relation_rows(
    qids: Sequence[str],
    conv: str,
    qvecs: np.ndarray,
    questions: Sequence[str],
    names: EntityNames | None,
    rels: pl.DataFrame,
    rel_vecs: np.ndarray,
    rel_cfg: dict[str, Any],
) -> list[dict[str, Any]]:
    """RETRIEVALS rows of one conversation's questions for the relations circuit."""
    out: list[dict[str, Any]] = []
    src, tgt = rels["source_id"].to_list(), rels["target_id"].to_list()
    for qid, qvec, question in zip(qids, qvecs, questions, strict=True):
        ents = matched_entities(question, qvec, names, rel_cfg["threshold"], rel_cfg["entities_k"])
        touch = [i for i in range(rels.height) if src[i] in ents or tgt[i] in ents]
        scores = rel_vecs[touch] @ qvec if touch else np.zeros(0)
        order = sorted(
            range(len(touch)), key=lambda j: (-float(scores[j]), rels["relation_id"][touch[j]])
        )
        for rank, j in enumerate(order[: rel_cfg["k"]]):
            r = rels.row(touch[j], named=True)
            out.append(
                {
                    "question_id": qid,
                    "conv_id": conv,
                    "circuit": CIRCUIT,
                    "rank": rank,
                    "item_id": r["relation_id"],
                    "score": float(scores[j]),
                    "relation_text": r["text"],
                    "relation_first": r["first_time"],
                    "relation_last": r["last_time"],
                    "event_ids": r["event_ids"],
                }
            )
    return out


class GraphRetrieveBudget(Settings):
    entries_k: COUNT  # factual entries per question (as flat memory)
    relations_k: COUNT  # relations per question (touching a matched entity)


class QuestionEntities(Settings):
    """Question -> entity matching (graph_memory.question_*; no LLM); generated into the
    `graph_memory:` block after GraphSettings' build knobs."""

    node: ClassVar[str] = "graph_memory"
    yaml_home: ClassVar[str | None] = "method/graph_memory.yaml"

    question_entity_threshold: RATE = Field(0.5, description=(
        "Question -> entity matching at retrieval (no LLM): whole-word name/alias matches, plus "
        "the best question_entities_k names whose cosine with the question is >= the threshold."))
    question_entities_k: COUNT = Field(3, description=(
        "Names matched by cosine per question (see question_entity_threshold)."))


class GraphRetrieveSettings(Settings):
    """What the graph retrieve stage reads: `retrieve.*` and the question matching knobs of
    `graph_memory` (the build knobs there are the graph stage's)."""

    retrieve: GraphRetrieveBudget
    graph_memory: QuestionEntities


def run_retrieve_graph(ctx: StageContext) -> dict[str, pl.DataFrame]:
    job, s = ctx.job, ctx.settings
    questions = selected_questions(job, ctx.read("questions"))
    index_cfg = {
        "use_gpu": job.root.index.use_gpu,
        "gpu_max_k": job.root.index.gpu_max_k,
    }
    rel_cfg = {
        "k": s.retrieve.relations_k,
        "threshold": s.graph_memory.question_entity_threshold,
        "entities_k": s.graph_memory.question_entities_k,
    }
    emb = ctx.read("entry_embeddings")
    pools = {
        str(c): (p["item_id"].to_list(), embedding_matrix(p))
        for (c,), p in emb.group_by("conv_id", maintain_order=True)
    }
    rels = ctx.read("graph_relations").filter(pl.col("status") == ACTIVE)
    before = encode_notes(ctx) if questions.height else None
    qmat = (
        ctx.encode(questions["question"].to_list(), use="query")
        if questions.height
        else np.zeros((0, 0), np.float32)
    )
    names = entity_names(ctx, ctx.read("graph_entities"))
    rel_mat = ctx.encode(rels["text"].to_list()) if rels.height else np.zeros((0, 0), np.float32)
    rows: list[dict[str, Any]] = []
    for (conv,), part in questions.with_row_index("_pos").group_by("conv_id", maintain_order=True):
        qids, qvec = part["question_id"].to_list(), qmat[part["_pos"].to_numpy()]
        t_index = time.perf_counter()
        rows.extend(
            search_rows(
                "entries",
                qids,
                str(conv),
                qvec,
                pools.get(str(conv)),
                s.retrieve.entries_k,
                index_cfg,
            )
        )
        ctx.index_wall_s += time.perf_counter() - t_index  # FAISS: not framework overhead
        mask = (rels["conv_id"] == conv).to_numpy()
        rows.extend(
            relation_rows(
                qids,
                str(conv),
                qvec,
                part["question"].to_list(),
                names.get(str(conv)),
                rels.filter(mask),
                rel_mat[mask] if rels.height else rel_mat,
                rel_cfg,
            )
        )
    for r in rows:
        for col in ("relation_text", "relation_first", "relation_last", "event_ids"):
            r.setdefault(col, None)
    out = schemas.frame(rows, RETRIEVALS)
    by_q = out.filter(pl.col("circuit") == CIRCUIT).group_by("question_id").len()
    ctx.notes.update(
        questions=questions.height,
        rows_entries=int((out["circuit"] == "entries").sum()),
        rows_relations=int((out["circuit"] == CIRCUIT).sum()),
        questions_with_relations=by_q.height,
        active_relations=rels.height,
        **(encode_notes(ctx, before) if before is not None else {}),
    )
    log.info("graph retrieve: %s", ctx.notes)
    return {"retrievals": out}


def build_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    """Entries as flat memory renders them, then the question's relations in time order."""
    retrievals = inputs.require("retrievals", PROMPT_NAME)
    entries = inputs.require("entries", PROMPT_NAME)
    qids = inputs.questions["question_id"].to_list()
    mine = retrievals.filter(pl.col("question_id").is_in(qids))
    lines = entry_lines(mine.select(list(schemas.RETRIEVALS)), entries, MemoryLine)
    rel: dict[str, list[P.RelationLine]] = {}
    if "relation_text" in mine.columns:
        hits = mine.filter(pl.col("circuit") == CIRCUIT).sort(
            "question_id", "relation_first", "rank", nulls_last=True
        )
        for qid, a, b, text in hits.select(
            "question_id", "relation_first", "relation_last", "relation_text"
        ).iter_rows():
            rel.setdefault(qid, []).append(P.RelationLine(a, b, text))
    if answer_protocol(inputs.job) == "paper":  # the StructMem reader + the relations block
        return paper_prompts(
            inputs,
            mine.select(list(schemas.RETRIEVALS)),
            entries,
            lambda q: [P.render((), rel[q])] if rel.get(q) else [],
            P.SYSTEM_RELATION_RULE,
        )
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        out[qid] = AnswerPrompt(
            P.build_messages(question, lines.get(qid, []), rel.get(qid, []), now), P.VERSION
        )
    return out


def estimate_retrieve_graph(inp: EstimateInputs) -> StageEstimate:
    """No LLM. Leaves stand-in retrievals for the graph reader: per selected question the
    first entries_k of extract's stand-in entries of its conversation (as StructMem's
    retrieve) and relations_k of the graph hook's stand-in relations, spread over the
    conversation (which relations touch the question's entities needs the encoder; how many
    the prompt holds is at most relations_k)."""
    s = inp.job.settings(GraphRetrieveSettings)
    entries, rels = inp.stand_ins.get("entries"), inp.stand_ins.get("graph_relations")
    ent_ids = ({str(c): part["entry_id"].to_list() for (c,), part in entries.group_by("conv_id", maintain_order=True)}
               if entries is not None else {})
    rel_rows = ({str(c): part.to_dicts() for (c,), part in rels.group_by("conv_id", maintain_order=True)}
                if rels is not None else {})
    rows: list[dict[str, Any]] = []
    for qid, conv in inp.selected.select("question_id", "conv_id").iter_rows():
        rows.extend({"question_id": qid, "conv_id": conv, "circuit": "entries", "rank": r,
                     "item_id": item, "score": 0.0}
                    for r, item in enumerate(ent_ids.get(str(conv), [])[: s.retrieve.entries_k]))
        mine = rel_rows.get(str(conv), [])
        k = s.retrieve.relations_k
        picked = mine if len(mine) <= k else [mine[i * len(mine) // k] for i in range(k)]
        rows.extend({"question_id": qid, "conv_id": conv, "circuit": CIRCUIT, "rank": r,
                     "item_id": x["relation_id"], "score": 0.0, "relation_text": x["text"],
                     "relation_first": x["first_time"], "relation_last": x["last_time"],
                     "event_ids": x["event_ids"]}
                    for r, x in enumerate(picked))
    for r in rows:
        for col in ("relation_text", "relation_first", "relation_last", "event_ids"):
            r.setdefault(col, None)
    inp.stand_ins["retrievals"] = schemas.frame(rows, RETRIEVALS)
    return StageEstimate("retrieve", 0, 0, 0, "no LLM", 0)


STAGE = Stage(
    name="retrieve",
    run=run_retrieve_graph,
    reads=("questions", "entries", "entry_embeddings", "graph_entities", "graph_relations"),
    writes=("retrievals",),
    settings=GraphRetrieveSettings,
    depends=("benchmark.categories", *EMBEDDER_IDENTITY),
    uses=("encoder",),
    estimate=estimate_retrieve_graph,
    loads=("faiss",),
)
