"""Entity node merging, synonymy edges and near-duplicate facts, numpy only.

docs/methods.md "SEEM: graph memory layer" describes the rules.

All functions work on one conversation's unit vectors. Node merging assigns each entity to
the most similar canonical name with cosine >= `node_merge_threshold` (canonical names are
the most frequent surface forms, visited first), never joining two different speaker names;
similarity to the canonical name only, so no chains. Synonymy edges follow HippoRAG 2: the KNN of every entity with more
than two alphanumeric characters, walked in decreasing score while the score is above the
threshold, at most `max_per_entity` neighbours. Example:

    >>> merge_entities(["lena", "lena k", "tomas"], vecs, 0.9, protected={"lena", "tomas"},
    ...                counts={"lena": 5, "lena k": 1, "tomas": 4})
    {"lena": "lena", "lena k": "lena", "tomas": "tomas"}
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

_ALNUM = re.compile(r"[^A-Za-z0-9]")


class UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        root, child = (ra, rb) if ra < rb else (rb, ra)  # smaller index as root: deterministic
        self.parent[child] = root
        return root


def _pairs_above(vecs: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """(i, j, cos) with i < j and cos >= threshold, most similar first (ties by index)."""
    if vecs.shape[0] < 2:
        return []
    sims = vecs @ vecs.T
    ii, jj = np.nonzero(np.triu(sims >= threshold, k=1))
    pairs = [(int(i), int(j), float(sims[i, j])) for i, j in zip(ii, jj, strict=True)]
    return sorted(pairs, key=lambda p: (-p[2], p[0], p[1]))


def merge_entities(names: Sequence[str], vecs: np.ndarray, threshold: float | None, protected: set[str],
                   counts: Mapping[str, int]) -> dict[str, str]:
    """name -> canonical name. threshold None: every name is its own node (HippoRAG 2).

    Names are visited most frequent first (then shorter, then alphabetical); each joins the
    canonical name it is most similar to when that cosine is >= threshold, else it becomes a
    canonical name itself. Similarity is always to the canonical name, never to another member,
    so no chain of pairwise-similar names can merge distinct entities (single linkage could:
    "lena k" ~ "lena" ~ "lenna" ~ "jenna"). Two speaker names never share a node."""
    if threshold is None:
        return {n: n for n in names}
    order = sorted(range(len(names)), key=lambda i: (-counts.get(names[i], 0), len(names[i]), names[i]))
    canon: list[int] = []  # indices of canonical names, in creation order
    speaker: dict[int, str | None] = {}  # canonical index -> the speaker name in its node
    out: dict[str, str] = {}
    for i in order:
        name = names[i]
        best, best_sim = None, threshold
        if canon:
            sims = vecs[canon] @ vecs[i]
            for c, sim in zip(canon, sims.tolist(), strict=True):
                clash = name in protected and speaker[c] is not None and speaker[c] != name
                if sim >= best_sim and not clash and (best is None or sim > best_sim):
                    best, best_sim = c, sim
        if best is None:
            canon.append(i)
            speaker[i] = name if name in protected else None
            out[name] = name
        else:
            out[name] = names[best]
            if name in protected:
                speaker[best] = name
    return {n: out[n] for n in names}


def alnum_len(text: str) -> int:
    return len(_ALNUM.sub("", text))


def synonymy_pairs(names: Sequence[str], vecs: np.ndarray, threshold: float, k: int, max_per_entity: int,
                   min_alnum: int) -> list[tuple[int, int, float]]:
    """Directed (query, neighbour, cos) pairs; a pair found from both sides appears twice."""
    n = len(names)
    if n < 2:
        return []
    sims = vecs @ vecs.T
    k = min(k, n)
    out = []
    for i in range(n):
        if alnum_len(names[i]) < min_alnum:
            continue
        row = sims[i]
        top = np.argpartition(-row, k - 1)[:k] if k < n else np.arange(n)
        order = top[np.lexsort((top, -row[top]))]  # decreasing score, ties by index
        found = 0
        for j in order:
            if row[j] < threshold or found >= max_per_entity:
                break
            if j == i:
                continue
            out.append((i, int(j), float(row[j])))
            found += 1
    return out


def near_duplicate_groups(vecs: np.ndarray, threshold: float) -> list[list[int]]:
    """Groups of row indices whose cosine links them at >= threshold (each group ascending)."""
    uf = UnionFind(vecs.shape[0])
    for i, j, _ in _pairs_above(vecs, threshold):
        uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(vecs.shape[0]):
        groups.setdefault(uf.find(i), []).append(i)
    return sorted(groups.values())
