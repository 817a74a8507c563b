"""Pure ranking steps of SEEM retrieval (docs/methods.md "SEEM: retrieval" steps 3-7 and
"SEEM: reverse provenance expansion"), numpy only.

Fact scores (best cosine over the query vectors, min-max over the conversation's facts), the
reset vector of HippoRAG 2 (averaged entity seeds divided by their passage counts, top-k
kept, plus `passage_weight` x min-max dense passage scores), and Reverse Provenance
Expansion. Example of RPE with |P_ret| = 2 and a budget of 4:

    >>> rpe(["c:D1:2", "c:D3:1"], {"c:D1:2": "f1", "c:D3:1": "f2"},
    ...     {"f1": ["c:D1:1", "c:D1:2", "c:D1:3"], "f2": ["c:D3:1", "c:D3:4"]},
    ...     {"c:D1:1": 0.2, "c:D1:3": 0.1, "c:D3:4": 0.3}, budget=4, position={...})
    (['f1', 'f2'], ['c:D3:4', 'c:D1:1'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def minmax(x: np.ndarray) -> np.ndarray:
    """(x - min) / (max - min); all ones when every value is equal (HippoRAG 2's rule)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    lo, hi = float(x.min()), float(x.max())
    return np.ones_like(x) if hi - lo == 0 else (x - lo) / (hi - lo)


def fact_scores(query_vecs: np.ndarray, fact_vecs: np.ndarray) -> np.ndarray:
    """Best cosine of each fact over the query vectors, min-max normalised over the facts."""
    if fact_vecs.shape[0] == 0 or query_vecs.shape[0] == 0:
        return np.zeros(fact_vecs.shape[0])
    return minmax((query_vecs @ fact_vecs.T).max(axis=0))


def top_k(scores: np.ndarray, k: int, order: Sequence[int] | None = None) -> list[int]:
    """Indices of the k highest scores, best first; ties go to the smaller `order` (default index)."""
    if k <= 0 or len(scores) == 0:
        return []
    tie = np.arange(len(scores)) if order is None else np.asarray(order)
    return [int(i) for i in np.lexsort((tie, -np.asarray(scores)))[:k]]


def entity_weights(facts: Sequence[tuple[str, str, float]], n_passages: Mapping[str, int],
                   seeds_k: int) -> dict[str, float]:
    """HippoRAG 2 entity seeds: per (subject node, object node, fact score), add
    score / n_passages(node) to the node and count it; average; keep the top `seeds_k`."""
    sums: dict[str, float] = {}
    occurs: dict[str, int] = {}
    for subj, obj, score in facts:
        for node in (subj, obj):
            if node not in n_passages:
                continue  # not a vertex
            n = n_passages[node]
            sums[node] = sums.get(node, 0.0) + (score / n if n > 0 else score)
            occurs[node] = occurs.get(node, 0) + 1
    weights = {node: sums[node] / occurs[node] for node in sums}
    best = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[: max(seeds_k, 0)]
    return dict(best)


def reset_vector(node_ids: Sequence[str], entity_w: Mapping[str, float], passage_nodes: Sequence[str],
                 dense: np.ndarray, passage_weight: float) -> np.ndarray:
    """Entity seeds plus passage_weight x min-max dense scores; NaN and negatives -> 0."""
    index = {n: i for i, n in enumerate(node_ids)}
    r = np.zeros(len(node_ids), dtype=np.float64)
    for node, w in entity_w.items():
        r[index[node]] += w
    for node, w in zip(passage_nodes, minmax(dense) * passage_weight, strict=True):
        r[index[node]] += w
    r = np.nan_to_num(r, nan=0.0)
    r[r < 0] = 0.0
    return r


def rpe(p_ret: Sequence[str], frame_of: Mapping[str, str], provenance: Mapping[str, Sequence[str]],
        score: Mapping[str, float], budget: int, position: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """(E_ret, passages added). E_ret = frames of P_ret, ordered by their best passage's rank;
    added = their other passages by score (then chronology), up to `budget` - |P_ret|."""
    frames = list(dict.fromkeys(frame_of[p] for p in p_ret if p in frame_of))
    seen = set(p_ret)
    cand = list(dict.fromkeys(p for f in frames for p in provenance.get(f, ()) if p not in seen))
    cand.sort(key=lambda p: (-score.get(p, 0.0), position.get(p, 0)))
    return frames, cand[: max(0, budget - len(p_ret))]
