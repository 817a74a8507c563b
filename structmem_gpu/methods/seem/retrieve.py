"""Stage `retrieve` for SEEM: query quadruples, fact scores, recognition filter, PPR, RPE
(docs/methods.md "SEEM: retrieval", "SEEM: reverse provenance expansion").

    python jobs/run.py method=seem stages=[retrieve,answer,judge,report] seem.ablation.ppr=false

Two LLM batches over all selected questions: D1 query quadruples, then D4 the recognition
filter (questions whose conversation has facts). Everything else is vector and graph work per
question: fact scores (best cosine over query vectors, min-max), K_top, the HippoRAG 2 reset
vector, igraph PPR (damping 0.5), P_ret = top `p_ret_k` passages, E_ret = their frames,
P_final = P_ret + Reverse Provenance Expansion up to `rpe_factor` x `p_ret_k`. Writes
retrievals (schemas.SEEM_RETRIEVALS) with circuits facts / frames / turns; `in_context`
marks what the ablations leave in the QA context and `context_order` its order (facts by
rank; frames and passages chronological). One row:

    {"question_id": "sample-1:q3", "conv_id": "sample-1", "circuit": "turns", "rank": 5,
     "item_id": "sample-1:D2:2", "score": 0.0132, "source": "rpe", "in_context": true,
     "context_order": 3, "text": "Ana: Biscuit is adorable!", "time": 2024-03-17 19:05,
     "event_ids": ["sample-1:D2:2"]}

ctx.notes: questions, query_requests, query_parse_failures, filter_requests,
filter_parse_failures, dense_fallbacks, ppr_questions, p_ret_mean, rpe_added_mean,
p_final_mean, frames_mean, facts_kept_mean, ablation.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas as core_schemas
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.seem.graph import personalized_pagerank
from structmem_gpu.methods.seem.memory import ConvMemory, load_memories
from structmem_gpu.methods.seem.quadruples import clean_time, normalise
from structmem_gpu.methods.seem.ranking import entity_weights, fact_scores, reset_vector, rpe, top_k
from structmem_gpu.methods.seem.schemas import SEEM_RETRIEVALS
from structmem_gpu.methods.seem.settings import RetrieveSettings
from structmem_gpu.methods.seem.prompts import filter as seem_filter, query as seem_query
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)

STAGE_NAME = "retrieve"
MEMORY_TABLES = ("passages", "frames", "frame_of", "facts", "entities", "graph_nodes", "graph_edges")


@dataclass(frozen=True)
class Question:
    qid: str
    conv_id: str
    text: str
    now: datetime | None


@dataclass(frozen=True)
class Selection:
    """What one question retrieved (indices into its ConvMemory.facts; pids; frame ids)."""

    facts: list[tuple[int, float]]  # kept facts (K_top after the filter), best first
    fact_source: str  # "filter" | "top_k"
    p_ret: list[str]
    source: str  # "ppr" | "bm25" (ppr=false) | "dense" | "dense_fallback"
    scores: dict[str, float]  # passage scores that ranked P_ret (PPR or dense)
    frames: list[str]  # E_ret
    added: list[str]  # RPE passages


def _request(q: Question, kind: str, version: str, messages: Any, schema: dict[str, Any], max_tokens: int,
             temperature: float) -> LLMRequest:
    sampling = Sampling(temperature=temperature, max_tokens=max_tokens)
    rid = request_id(STAGE_NAME, q.qid, kind, version, messages[-1].content, schema, asdict(sampling))
    return LLMRequest(request_id=rid, stage=STAGE_NAME, conv_id=q.conv_id, messages=messages,
                      prompt_version=version, schema=schema, sampling=sampling)


def query_request(q: Question, rs: RetrieveSettings) -> LLMRequest:
    return _request(q, "query", seem_query.VERSION, seem_query.build_messages(q.text, q.now),
                    seem_query.reply_schema(rs.query_max_quadruples, rs.query_max_chars), rs.query_max_tokens,
                    rs.temperature)


def query_texts(q: Question, result: LLMResult) -> list[str]:
    """The raw question, then every extracted quadruple rendered like a fact ("?" slots dropped)."""
    out = [q.text]
    items = result.data.get("quadruples") if result.parse_ok and isinstance(result.data, dict) else None
    for item in items or []:
        if not isinstance(item, dict):
            continue
        parts = [normalise(item.get(k)) for k in ("subject", "relation", "object")]
        text = " ".join(p for p in parts if p)
        tau = clean_time(item.get("time"))
        if text:
            out.append(text + (f" (time: {tau})" if tau else ""))
    return list(dict.fromkeys(out))


def filter_request(q: Question, lines: Sequence[str], rs: RetrieveSettings) -> LLMRequest:
    return _request(q, "filter", seem_filter.VERSION, seem_filter.build_messages(q.text, lines, q.now),
                    seem_filter.reply_schema(len(lines), rs.filter_max), rs.filter_max_tokens, rs.temperature)


def filter_choice(result: LLMResult, n: int, limit: int) -> list[int] | None:
    """0-based chosen candidates in reply order (unique, valid, at most `limit`); None: unusable."""
    if not result.parse_ok or not isinstance(result.data, dict):
        return None
    picked = [i - 1 for i in result.data.get("relevant") or [] if isinstance(i, int) and not isinstance(i, bool)
              and 1 <= i <= n]
    return list(dict.fromkeys(picked))[:limit]


def select(mem: ConvMemory, qvecs: np.ndarray, facts: list[tuple[int, float]], rs: RetrieveSettings,
           passage_query: np.ndarray | None = None, question: str | None = None,
           ) -> tuple[list[str], str, dict[str, float]]:
    """P_ret with its source and the passage scores that ranked it (docs/methods.md
    "SEEM: retrieval" steps 5-7).

    `seem.ablation.ppr=false` is the paper's "w/o relational propagation" (SEEM §5.3): direct
    lexical retrieval, BM25 of the question over the conversation's passages (`lexical.py`)."""
    pids = [p.pid for p in mem.passages]
    pq = qvecs[0] if passage_query is None else passage_query  # the raw question vector
    dense = mem.passage_vecs @ pq
    order = list(range(len(pids)))
    if not rs.ablation.ppr and question is not None:
        lex = mem.lexical().scores(question)
        return [pids[i] for i in top_k(lex, rs.p_ret_k, order)], "bm25", dict(zip(pids, lex.tolist(), strict=True))
    if not rs.ablation.ppr or not facts:
        source = "dense" if not rs.ablation.ppr else "dense_fallback"
        return [pids[i] for i in top_k(dense, rs.p_ret_k, order)], source, dict(zip(pids, dense.tolist(), strict=True))
    seeds = entity_weights([(mem.facts[i].subject_node, mem.facts[i].object_node, s) for i, s in facts],
                           mem.n_passages, rs.entity_seeds_k)
    reset = reset_vector(mem.node_ids, seeds, mem.passage_nodes, dense, rs.passage_weight)
    ppr = personalized_pagerank(mem.graph(), reset, rs.damping)
    index = {n: i for i, n in enumerate(mem.node_ids)}
    pscores = np.array([ppr[index[n]] for n in mem.passage_nodes])
    return [pids[i] for i in top_k(pscores, rs.p_ret_k, order)], "ppr", dict(zip(pids, pscores.tolist(), strict=True))


def expand(mem: ConvMemory, p_ret: list[str], scores: dict[str, float], rs: RetrieveSettings
           ) -> tuple[list[str], list[str]]:
    """(E_ret, RPE passages); RPE when `rpe` is on and `eef` too, or `rpe_without_eef`
    (docs/methods.md "SEEM: ablations")."""
    provenance = {f: info.provenance for f, info in mem.frames.items()}
    budget = rs.budget if rs.ablation.expands else len(p_ret)
    return rpe(p_ret, mem.frame_of, provenance, scores, budget, mem.position)


def question_rows(q: Question, mem: ConvMemory, sel: Selection, rs: RetrieveSettings) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"question_id": q.qid, "conv_id": q.conv_id}
    rows: list[dict[str, Any]] = [{**base, "circuit": "facts", "rank": r, "item_id": mem.facts[i].fact_id, "score": s,
             "source": sel.fact_source, "in_context": rs.ablation.fact_context, "context_order": r,
             "text": mem.facts[i].line, "time": None, "event_ids": list(mem.facts[i].provenance)}
            for r, (i, s) in enumerate(sel.facts)]
    by_pid = {p.pid: p for p in mem.passages}
    frames = [mem.frames[f] for f in sel.frames if f in mem.frames]
    best = {f.frame_id: max((sel.scores.get(p, 0.0) for p in f.provenance if p in sel.p_ret), default=0.0)
            for f in frames}
    chrono = sorted(range(len(frames)), key=lambda i: (frames[i].time_start or datetime.min, i))
    for r, f in enumerate(frames):
        rows.append({**base, "circuit": "frames", "rank": r, "item_id": f.frame_id, "score": best[f.frame_id],
                     "source": "eef", "in_context": rs.ablation.eef, "context_order": chrono.index(r),
                     "text": f.rendering, "time": f.time_start, "event_ids": list(f.provenance)})
    final = [*[(p, sel.source) for p in sel.p_ret], *[(p, "rpe") for p in sel.added]]
    pos = sorted(range(len(final)), key=lambda i: by_pid[final[i][0]].position)
    for r, (pid, source) in enumerate(final):
        p = by_pid[pid]
        rows.append({**base, "circuit": "turns", "rank": r, "item_id": pid, "score": sel.scores.get(pid, 0.0),
                     "source": source, "in_context": True, "context_order": pos.index(r),
                     "text": f"{p.speaker}: {p.display}", "time": p.session_time, "event_ids": [pid]})
    return rows


def _questions(df: pl.DataFrame) -> list[Question]:
    return [Question(qid, conv, text, now) for qid, conv, text, now in
            df.select("question_id", "conv_id", "question", "question_time").iter_rows()]


def _mean(values: Sequence[int]) -> float:
    return round(float(np.mean(values)), 2) if values else 0.0


def run_retrieve(ctx: StageContext) -> dict[str, pl.DataFrame]:
    rs: RetrieveSettings = ctx.settings
    questions = _questions(selected_questions(ctx.job, ctx.read("questions")))
    mems = load_memories({t: ctx.read(t) for t in MEMORY_TABLES}, {q.conv_id for q in questions}, ctx.encode)
    questions = [q for q in questions if q.conv_id in mems]
    # D1 + D2: query quadruples for every question in one batch, all query texts in one encoder call.
    qres = ctx.generate([query_request(q, rs) for q in questions], desc="seem query quadruples")
    texts = [query_texts(q, r) for q, r in zip(questions, qres, strict=True)]
    # Query texts against facts with the fact instruction, the question against passages with
    # the passage one (HippoRAG 2's query_to_fact / query_to_passage; embedder.instructions).
    flat = ctx.encode([t for ts in texts for t in ts], use="fact") if questions else np.zeros((0, 1), dtype=np.float32)
    bounds = np.cumsum([0, *(len(ts) for ts in texts)])
    qvecs = [flat[a:b] for a, b in itertools.pairwise(bounds)]
    pq = ctx.encode([q.text for q in questions], use="passage") if questions else flat[:0]
    # D3: K_top per question.
    scored = []
    for q, v in zip(questions, qvecs, strict=True):
        scores = fact_scores(v, mems[q.conv_id].fact_vecs)
        scored.append([(i, float(scores[i])) for i in top_k(scores, rs.facts_k)])
    # D4: the recognition filter, one batch over the questions that have candidates.
    need = [i for i, c in enumerate(scored) if c and rs.fact_filter]
    fres = ctx.generate([filter_request(questions[i], [mems[questions[i].conv_id].facts[j].line
                                                       for j, _ in scored[i]], rs) for i in need],
                        desc="seem fact filter")
    kept = {i: list(c) for i, c in enumerate(scored)}
    filter_failures = 0
    for i, res in zip(need, fres, strict=True):
        choice = filter_choice(res, len(scored[i]), rs.filter_max)
        filter_failures += choice is None
        kept[i] = [scored[i][j] for j in choice or []]  # unusable reply = nothing kept (dense fallback)
    # D5-E: propagation and expansion.
    rows, sels, filtered = [], [], set(need)
    for i, q in enumerate(questions):
        mem = mems[q.conv_id]
        p_ret, source, pscores = select(mem, qvecs[i], kept[i], rs, pq[i], q.text)
        frames, added = expand(mem, p_ret, pscores, rs)
        sel = Selection(kept[i], "filter" if i in filtered else "top_k", p_ret, source, pscores, frames, added)
        sels.append(sel)
        rows.extend(question_rows(q, mem, sel, rs))
    ctx.notes.update(
        questions=len(questions), query_requests=len(qres), query_parse_failures=sum(not r.parse_ok for r in qres),
        filter_requests=len(fres), filter_parse_failures=filter_failures,
        dense_fallbacks=sum(s.source == "dense_fallback" for s in sels),
        ppr_questions=sum(s.source == "ppr" for s in sels), p_ret_mean=_mean([len(s.p_ret) for s in sels]),
        rpe_added_mean=_mean([len(s.added) for s in sels]),
        p_final_mean=_mean([len(s.p_ret) + len(s.added) for s in sels]), frames_mean=_mean([len(s.frames) for s in sels]),
        facts_kept_mean=_mean([len(s.facts) for s in sels]), ablation=rs.ablation.model_dump())
    log.info("seem retrieve: %s", ctx.notes)
    return {"retrievals": core_schemas.frame(rows, SEEM_RETRIEVALS)}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

QUERY_QUADRUPLE_TOKENS = 30  # one query quadruple in JSON
FILTER_COMPLETION = 12  # {"relevant": [1, 3]}


def spread(items: Sequence[Any], k: int) -> list[Any]:
    """k items evenly spread over the sequence (all when it has no more): a stand-in for a
    ranking that needs the encoder, with the sequence's mean length rather than its
    opening's."""
    n = len(items)
    return list(items) if n <= k else [items[i * n // k] for i in range(k)]


def stand_in_retrievals(inp: EstimateInputs, rs: RetrieveSettings) -> pl.DataFrame:
    """SEEM_RETRIEVALS rows as `question_rows` writes them, on the stand-ins the frames,
    fusion and graph hooks left (EstimateInputs.stand_ins: frames, facts; built here when a
    job lists retrieve alone): per selected question p_ret_k of its conversation's passages
    (`spread`), E_ret = their frames and the RPE passages by the stage's own `rpe` (the
    unmerged stand-in frames add none: fusion's estimate merges nothing), and the most facts
    the context holds (filter_max after the filter, else facts_k), so that the answer
    estimate renders SEEM's own reader on them."""
    from structmem_gpu.methods.seem.fusion import stand_in_frames
    from structmem_gpu.methods.seem.graph import stand_in_facts
    from structmem_gpu.methods.seem.passages import by_conversation, passage_list, passages_from_turns
    from structmem_gpu.methods.seem.settings import FrameSettings, GraphSettings

    frames = inp.stand_ins.get("frames")
    if frames is None:
        frames = stand_in_frames(inp.turns, inp.job.settings(FrameSettings))
    facts = inp.stand_ins.get("facts")
    if facts is None:
        facts = stand_in_facts(inp.turns, inp.job.settings(GraphSettings))
    passages = by_conversation(passage_list(passages_from_turns(inp.turns)))
    frame_rows = {r["frame_id"]: r for r in frames.iter_rows(named=True)}
    frame_of = {p: r["frame_id"] for r in frame_rows.values() for p in r["provenance"]}
    provenance = {f: r["provenance"] for f, r in frame_rows.items()}
    lines = {str(c): part["line"].to_list() for (c,), part in facts.group_by("conv_id", maintain_order=True)}
    kept_k = min(rs.filter_max, rs.facts_k) if rs.fact_filter else rs.facts_k
    rows: list[dict[str, Any]] = []
    for qid, conv in inp.selected.select("question_id", "conv_id").iter_rows():
        ps = passages.get(str(conv), [])
        if not ps:
            continue
        base = {"question_id": qid, "conv_id": conv}
        by_pid = {p.pid: p for p in ps}
        p_ret = [p.pid for p in spread(ps, rs.p_ret_k)]
        budget = rs.budget if rs.ablation.expands else len(p_ret)
        e_ret, added = rpe(p_ret, frame_of, provenance, {}, budget, {p.pid: p.position for p in ps})
        for r, line in enumerate(lines.get(str(conv), [])[:kept_k]):
            rows.append({**base, "circuit": "facts", "rank": r, "item_id": f"fact:{r}", "score": 0.0,
                         "source": "filter" if rs.fact_filter else "top_k", "in_context": rs.ablation.fact_context,
                         "context_order": r, "text": line, "time": None, "event_ids": []})
        chrono = sorted(range(len(e_ret)), key=lambda i: (frame_rows[e_ret[i]]["time_start"] or datetime.min, i))
        for r, f in enumerate(e_ret):
            fr = frame_rows[f]
            rows.append({**base, "circuit": "frames", "rank": r, "item_id": f, "score": 0.0, "source": "eef",
                         "in_context": rs.ablation.eef, "context_order": chrono.index(r),
                         "text": fr["rendering"], "time": fr["time_start"], "event_ids": fr["provenance"]})
        final = [*p_ret, *added]
        pos = sorted(range(len(final)), key=lambda i: by_pid[final[i]].position)
        for r, pid in enumerate(final):
            p = by_pid[pid]
            rows.append({**base, "circuit": "turns", "rank": r, "item_id": pid, "score": 0.0,
                         "source": "rpe" if r >= len(p_ret) else "ppr", "in_context": True,
                         "context_order": pos.index(r), "text": f"{p.speaker}: {p.display}",
                         "time": p.session_time, "event_ids": [pid]})
    return core_schemas.frame(rows, SEEM_RETRIEVALS)


def estimate_retrieve(inp: EstimateInputs) -> StageEstimate:
    """An UPPER BOUND: one query-quadruple request per selected question (exact) and, with
    fact_filter, one filter request per question whose fact search returns candidates (the
    facts come from `graph`'s replies: at most every question). Filter prompts list facts_k
    of the graph hook's stand-in facts. Leaves stand-in retrievals for SEEM's reader
    (`stand_in_retrievals`)."""
    from structmem_gpu.methods.seem.graph import stand_in_facts
    from structmem_gpu.methods.seem.settings import GraphSettings

    rs = inp.job.settings(RetrieveSettings)
    facts = inp.stand_ins.get("facts")
    if facts is None:
        facts = stand_in_facts(inp.turns, inp.job.settings(GraphSettings))
    texts = {str(c): part["line"].to_list() for (c,), part in facts.group_by("conv_id", maintain_order=True)}
    questions = [q for q in _questions(inp.selected) if q.conv_id in texts]
    reqs = [query_request(q, rs) for q in questions]
    completion = len(reqs) * min(rs.query_max_tokens, rs.query_max_quadruples * QUERY_QUADRUPLE_TOKENS)
    if rs.fact_filter and rs.facts_k:
        filters = [filter_request(q, texts[q.conv_id][: rs.facts_k], rs) for q in questions]
        reqs += filters
        completion += len(filters) * min(rs.filter_max_tokens, FILTER_COMPLETION)
    prompt = sum(inp.counter.messages(r.messages) for r in reqs)
    over = sum(inp.over(r.messages, r.sampling.max_tokens) for r in reqs)
    inp.stand_ins["retrievals"] = stand_in_retrievals(inp, rs)
    return StageEstimate(
        STAGE_NAME, len(reqs), prompt, completion,
        f"upper bound: {len(questions)} query requests"
        + (f" + at most {len(questions)} fact filters" if rs.fact_filter and rs.facts_k else ""),
        over if inp.checked else None, bound=bool(rs.fact_filter and rs.facts_k),
    )


STAGE = Stage(
    name=STAGE_NAME, run=run_retrieve, reads=("questions", *MEMORY_TABLES), writes=("retrievals",),
    settings=RetrieveSettings, depends=("benchmark.categories", *EMBEDDER_IDENTITY, *LLM_IDENTITY),
    uses=("llm", "encoder"), estimate=estimate_retrieve,
)
