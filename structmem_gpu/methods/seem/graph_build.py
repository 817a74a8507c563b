"""Vertices and weighted edges of one conversation's graph, no igraph.

docs/methods.md "SEEM: graph memory layer" describes the rules.

Entity vertices `e:<canonical>` and passage vertices `p:<pid>` (every passage, with or
without facts). Edges, as HippoRAG 2 builds them:

    fact      e:lena     - e:riverside half marathon   weight = facts linking the pair
    passage   p:sample-1:D1:1 - e:lena                 weight 1.0
    synonymy  e:biscuit  - e:biscuit the beagle        weight = cosine (>= threshold)

With `edge_doubling` (default) fact and synonymy pairs appear once per direction, i.e. as two
parallel undirected edges, which is what HippoRAG 2's graph ends up with; passage edges once.
Self-loops are dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from structmem_gpu.methods.seem.entities import (
    merge_entities,
    near_duplicate_groups,
    synonymy_pairs,
)
from structmem_gpu.methods.seem.passages import Passage
from structmem_gpu.methods.seem.quadruples import Fact, fact_line, normalise
from structmem_gpu.methods.seem.settings import GraphSettings


@dataclass(frozen=True)
class ConversationGraph:
    facts: list[dict[str, Any]]
    entities: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    merged_names: int  # surface forms merged into another node


def entity_id(canonical: str) -> str:
    return f"e:{canonical}"


def passage_node(pid: str) -> str:
    return f"p:{pid}"


def entity_names(facts: Sequence[Fact]) -> tuple[list[str], Counter[str]]:
    """Distinct subject/object strings (first-seen order) and how often each occurs."""
    counts: Counter[str] = Counter()
    for f in facts:
        counts[f.s] += 1
        counts[f.o] += 1
    return list(counts), counts


def dedup_facts(facts: Sequence[Fact], vecs: np.ndarray, threshold: float | None, order: dict[str, int]
                ) -> list[Fact]:
    """Optional near-duplicate merge (cos >= threshold): the first fact keeps the union of provenance."""
    if threshold is None or len(facts) < 2:
        return list(facts)
    out = []
    for group in near_duplicate_groups(vecs, threshold):
        head = facts[group[0]]
        prov = sorted({p for i in group for p in facts[i].provenance}, key=lambda p: order[p])
        rids = tuple(dict.fromkeys(r for i in group for r in facts[i].request_ids))
        out.append(replace(head, provenance=tuple(prov), request_ids=rids))
    return out


def _pair(a: str, b: str) -> tuple[str, str]:
    """An unordered pair as a sorted tuple."""
    return (a, b) if a <= b else (b, a)


def _pair_edges(kind: str, pairs: dict[tuple[str, str], float], doubling: bool) -> list[dict[str, Any]]:
    rows = []
    for (a, b), w in sorted(pairs.items()):
        rows.append({"src": a, "dst": b, "kind": kind, "weight": w})
        if doubling:
            rows.append({"src": b, "dst": a, "kind": kind, "weight": w})
    return rows


def build_graph(conv_id: str, passages: Sequence[Passage], facts: Sequence[Fact], names: Sequence[str],
                counts: Counter[str], vecs: np.ndarray, s: GraphSettings) -> ConversationGraph:
    """One conversation's facts/entities/nodes/edges rows; `vecs` are the unit vectors of `names`."""
    speakers = {normalise(p.speaker) for p in passages}
    canon = merge_entities(names, vecs, s.node_merge_threshold, speakers, counts)
    order = {p.pid: p.position for p in passages}
    ent_passages: dict[str, set[str]] = {}
    fact_rows: list[dict[str, Any]] = []
    fact_pairs: Counter[tuple[str, str]] = Counter()
    by_passage: dict[str, set[str]] = {}
    for f in facts:
        cs, co = canon[f.s], canon[f.o]
        for e in (cs, co):
            ent_passages.setdefault(e, set()).update(f.provenance)
        for pid in f.provenance:
            by_passage.setdefault(pid, set()).update((cs, co))
        if cs != co:
            fact_pairs[_pair(entity_id(cs), entity_id(co))] += 1
        fact_rows.append({"fact_id": f.fact_id, "conv_id": conv_id, "s": f.s, "r": f.r, "o": f.o, "tau": f.tau,
                          "provenance": list(f.provenance), "text": f.text, "subject_node": entity_id(cs),
                          "object_node": entity_id(co), "request_ids": list(f.request_ids),
                          "shown": f.shown or fact_line(f.s, f.r, f.o, f.tau)})
    canonicals = sorted(ent_passages)
    entities = [{"entity_id": entity_id(c), "conv_id": conv_id, "canonical": c,
                 "aliases": sorted(n for n in names if canon[n] == c and n != c),
                 "passages": sorted(ent_passages[c], key=order.__getitem__), "n_passages": len(ent_passages[c])}
                for c in canonicals]
    edges: list[dict[str, Any]] = _pair_edges("fact", {k: float(v) for k, v in fact_pairs.items()}, s.edge_doubling)
    edges += [{"src": passage_node(pid), "dst": entity_id(e), "kind": "passage", "weight": 1.0}
              for pid in sorted(by_passage, key=order.__getitem__) for e in sorted(by_passage[pid])]
    edges += _synonymy_edges(canonicals, names, vecs, s)
    nodes = [{"conv_id": conv_id, "node_id": entity_id(c), "kind": "entity", "name": c} for c in canonicals]
    nodes += [{"conv_id": conv_id, "node_id": passage_node(p.pid), "kind": "passage", "name": p.pid}
              for p in sorted(passages, key=lambda p: p.position)]
    for edge in edges:
        edge["conv_id"] = conv_id
    return ConversationGraph(fact_rows, entities, nodes, edges, len(names) - len(canonicals))


def _synonymy_edges(canonicals: Sequence[str], names: Sequence[str], vecs: np.ndarray,
                    s: GraphSettings) -> list[dict[str, Any]]:
    """Synonymy edges between merged nodes, each node represented by its canonical name's vector."""
    if not canonicals:
        return []
    row = {n: i for i, n in enumerate(names)}
    cvecs = vecs[[row[c] for c in canonicals]]
    found = synonymy_pairs(canonicals, cvecs, s.synonymy_threshold, s.synonymy_k, s.synonymy_max_per_entity,
                           s.synonymy_min_alnum)
    if s.edge_doubling:  # HippoRAG 2: every directed find is its own (parallel) edge
        return [{"src": entity_id(canonicals[i]), "dst": entity_id(canonicals[j]), "kind": "synonymy",
                 "weight": w} for i, j, w in found]
    pairs: dict[tuple[str, str], float] = {}
    for i, j, w in found:
        key = _pair(entity_id(canonicals[i]), entity_id(canonicals[j]))
        pairs[key] = max(w, pairs.get(key, 0.0))
    return _pair_edges("synonymy", pairs, False)
