"""Stage `graph`: the graph memory layer and the igraph PPR it is searched with.

docs/methods.md "SEEM: graph memory layer" describes the layer.

    python jobs/run.py method=seem stages=[graph] seem.graph.node_merge_threshold=null

Quadruple requests for every passage of every conversation go out in ONE batch; facts are
normalised and deduplicated (quadruples.py), entities merged and linked (entities.py,
graph_build.py). Writes `facts`, `entities`, `graph_nodes`, `graph_edges`. One edge row:

    {"conv_id": "sample-1", "src": "p:sample-1:D2:1", "dst": "e:biscuit", "kind": "passage", "weight": 1.0}

This is the only module that imports `igraph` (lazily, in `igraph_graph`): retrieval rebuilds
each conversation's graph from the two tables and runs `personalized_pagerank` on it.

ctx.notes: requests, passages, quadruples, malformed_items, parse_failures, truncated,
passages_without_facts, facts, entities, merged_names, edges_fact, edges_passage,
edges_synonymy, and per-conversation means (entities_per_conv, facts_per_conv,
synonymy_per_conv) for comparison with the paper's Table 9.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core import schemas as core_schemas
from structmem_gpu.core.threads import one_thread
from structmem_gpu.methods.seem.graph_build import (
    ConversationGraph,
    build_graph,
    dedup_facts,
    entity_names,
)
from structmem_gpu.methods.seem.passages import (
    by_conversation,
    passage_list,
    passages_from_turns,
    request_groups,
)
from structmem_gpu.methods.seem.quadruples import build_request, collect_facts
from structmem_gpu.methods.seem.schemas import ENTITIES, FACTS, GRAPH_EDGES, GRAPH_NODES
from structmem_gpu.methods.seem.settings import GraphSettings
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)


# ---- igraph (the reference PPR, docs/methods.md "SEEM: retrieval" step 6) ---------------------


def igraph_graph(node_ids: Sequence[str], edges: Sequence[tuple[str, str, float]]) -> Any:
    """Undirected weighted igraph Graph; parallel edges are kept (their weights add up in PPR)."""
    import igraph

    index = {n: i for i, n in enumerate(node_ids)}
    g = igraph.Graph(n=len(node_ids), edges=[(index[a], index[b]) for a, b, _ in edges], directed=False)
    g.es["weight"] = [float(w) for _, _, w in edges]
    return g


def personalized_pagerank(graph: Any, reset: np.ndarray, damping: float) -> np.ndarray:
    """igraph PPR with prpack; `damping` is the probability of continuing the walk.

    PRPACK's solver runs its sweeps as OpenMP loops: with several threads, the order in which
    they add up their parts depends on how the threads are scheduled, so two runs of the same
    job (a loaded machine most of all) differ around 1e-14 and the retrieval scores, prompts
    and fingerprints after them are not reproducible. One OpenMP thread is one order every
    time (the scores move by that same 1e-14 at most; rankings never did differ). The limit
    holds for this call only: the encoder's threads are untouched."""
    r = np.nan_to_num(np.asarray(reset, dtype=np.float64), nan=0.0)
    r[r < 0] = 0.0
    if r.sum() <= 0:
        raise ValueError("personalized_pagerank: the reset vector has no positive mass")
    with one_thread("openmp"):  # asked after igraph's library is loaded (a graph exists)
        scores = graph.personalized_pagerank(vertices=range(graph.vcount()), directed=False, damping=damping,
                                             weights="weight" if graph.ecount() else None, reset=r.tolist(),
                                             implementation="prpack")
    return np.asarray(scores, dtype=np.float64)


# ---- stage ------------------------------------------------------------------------------------


def _by_conv(facts: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in facts:
        out.setdefault(f.conv_id, []).append(f)
    return out


def _frames(graphs: Sequence[ConversationGraph]) -> dict[str, pl.DataFrame]:
    return {
        "facts": core_schemas.frame((r for g in graphs for r in g.facts), FACTS),
        "entities": core_schemas.frame((r for g in graphs for r in g.entities), ENTITIES),
        "graph_nodes": core_schemas.frame((r for g in graphs for r in g.nodes), GRAPH_NODES),
        "graph_edges": core_schemas.frame((r for g in graphs for r in g.edges), GRAPH_EDGES),
    }


def run_graph(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: GraphSettings = ctx.settings
    passages = passage_list(ctx.read("passages"))
    groups = request_groups(passages, s.passages_per_request)
    requests = [build_request(g, s) for g in groups]
    results = ctx.generate(requests, desc="seem quadruples")  # one batch, all conversations
    facts, counts = collect_facts(groups, requests, results)
    convs, facts_by_conv = by_conversation(passages), _by_conv(facts)
    order = {p.pid: p.position for p in passages}
    if s.fact_dedup_threshold is not None and facts:
        vecs = ctx.encode([f.text for f in facts])
        pos = {id(f): i for i, f in enumerate(facts)}
        facts_by_conv = {c: dedup_facts(fs, vecs[[pos[id(f)] for f in fs]], s.fact_dedup_threshold, order)
                         for c, fs in facts_by_conv.items()}
    names = {c: entity_names(facts_by_conv.get(c, [])) for c in convs}
    flat = [n for c in convs for n in names[c][0]]
    vecs = ctx.encode(flat) if flat else np.zeros((0, 1), dtype=np.float32)  # one encoder call
    graphs, start = [], 0
    for c, ps in convs.items():
        ns, cnt = names[c]
        graphs.append(build_graph(c, ps, facts_by_conv.get(c, []), ns, cnt, vecs[start : start + len(ns)], s))
        start += len(ns)
    tables = _frames(graphs)
    edges = tables["graph_edges"]
    n_conv = max(len(convs), 1)
    ctx.notes.update(
        requests=len(requests), passages=len(passages), quadruples=counts.quadruples,
        malformed_items=counts.malformed, parse_failures=counts.parse_failures, truncated=counts.truncated,
        passages_without_facts=counts.passages_without_facts, facts=tables["facts"].height,
        entities=tables["entities"].height, merged_names=sum(g.merged_names for g in graphs),
        **{f"edges_{k}": int((edges["kind"] == k).sum()) for k in ("fact", "passage", "synonymy")},
        entities_per_conv=round(tables["entities"].height / n_conv, 1),
        facts_per_conv=round(tables["facts"].height / n_conv, 1),
        synonymy_per_conv=round(int((edges["kind"] == "synonymy").sum()) / n_conv, 1))
    log.info("graph: %s", ctx.notes)
    return tables


# ---- dry run (Stage.estimate) ------------------------------------------------------------

QUADRUPLE_TOKENS = 30  # one quadruple in JSON (subject, relation, object, time)


def stand_in_facts(turns: pl.DataFrame, s: GraphSettings) -> pl.DataFrame:
    """Facts as the reader and the fact filter show them (`fact_line`), one per passage:
    the speaker as subject, relation and object short phrases of the passage's words
    (fusion.ROLE_CHARS, at most max_chars: a quadruple slot is a phrase like a frame role),
    the session day as time. One per passage is enough: retrieve shows at most facts_k of
    a conversation's facts, and their length is what its prompts hold."""
    from structmem_gpu.methods.seem.fusion import ROLE_CHARS, filled
    from structmem_gpu.methods.seem.quadruples import fact_line

    rows = []
    for p in passage_list(passages_from_turns(turns)):
        phrase = filled(p.display, min(ROLE_CHARS, s.max_chars))
        day = p.session_time.strftime("%Y-%m-%d") if p.session_time is not None else None
        rows.append({"conv_id": p.conv_id, "pid": p.pid,
                     "line": fact_line(p.speaker[: s.max_chars], phrase, phrase, day)})
    return pl.DataFrame(rows, schema={"conv_id": pl.String, "pid": pl.String, "line": pl.String})


def estimate_graph(inp: EstimateInputs) -> StageEstimate:
    """Exact: the stage's own passage groups and quadruple request builder on the loaded
    turns. Completion: max_quadruples quadruples per passage, capped at max_tokens."""
    s = inp.job.settings(GraphSettings)
    groups = request_groups(passage_list(passages_from_turns(inp.turns)), s.passages_per_request)
    prompt = completion = over = 0
    for g in groups:
        req = build_request(g, s)
        prompt += inp.counter.messages(req.messages)
        over += inp.over(req.messages, s.max_tokens)
        completion += min(s.max_tokens, len(g) * s.max_quadruples * QUADRUPLE_TOKENS)
    inp.stand_ins["facts"] = stand_in_facts(inp.turns, s)
    return StageEstimate("graph", len(groups), prompt, completion,
                         f"{sum(map(len, groups))} passages in groups of <= {s.passages_per_request} (exact prompts)",
                         over if inp.checked else None, build=True)


STAGE = Stage(
    name="graph", run=run_graph, reads=("passages",),
    writes=("facts", "entities", "graph_nodes", "graph_edges"),
    settings=GraphSettings, depends=(*EMBEDDER_IDENTITY, *LLM_IDENTITY),
    uses=("llm", "encoder"), estimate=estimate_graph,
)
