"""SEEM graph memory layer: normalisation, fact dedup, node merging, edges, igraph PPR vs hand values."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

import numpy as np
import pytest
from omegaconf import OmegaConf

from structmem_gpu.llm.types import LLMRequest, LLMResult, Message
from structmem_gpu.methods.seem.entities import (
    merge_entities,
    near_duplicate_groups,
    synonymy_pairs,
)
from structmem_gpu.methods.seem.graph import igraph_graph, personalized_pagerank
from structmem_gpu.methods.seem.graph_build import build_graph
from structmem_gpu.methods.seem.passages import Passage
from structmem_gpu.methods.seem.quadruples import (
    Fact,
    clean_quad,
    collect_facts,
    fact_text,
    normalise,
)
from structmem_gpu.methods.seem.settings import GraphSettings

GRAPH_CFG = {"max_quadruples": 4, "max_chars": 40, "max_tokens": 128, "temperature": 0.0,
             "node_merge_threshold": 0.9, "synonymy_threshold": 0.8, "synonymy_k": 2047,
             "synonymy_max_per_entity": 100, "synonymy_min_alnum": 3, "edge_doubling": True,
             "fact_dedup_threshold": None}


def graph_settings(**kw: object) -> GraphSettings:
    return GraphSettings.from_cfg(OmegaConf.create({"seem": {"graph": {**GRAPH_CFG, **kw}}}))


# ---- PPR ---------------------------------------------------------------------------------------


def test_ppr_two_nodes_matches_hand_computation() -> None:
    # pi_a = 0.5 + 0.5 pi_b, pi_b = 0.5 pi_a  ->  pi = (2/3, 1/3)
    g = igraph_graph(["a", "b"], [("a", "b", 1.0)])
    np.testing.assert_allclose(personalized_pagerank(g, np.array([1.0, 0.0]), 0.5), [2 / 3, 1 / 3], atol=1e-9)


def test_ppr_path_matches_hand_computation_and_ranking() -> None:
    # a - b - c, restart at a: pi_a = 1/2 + pi_b/4, pi_b = (pi_a + pi_c)/2, pi_c = pi_b/4
    # -> pi = (7/12, 4/12, 1/12)
    g = igraph_graph(["a", "b", "c"], [("a", "b", 1.0), ("b", "c", 1.0)])
    pi = personalized_pagerank(g, np.array([1.0, 0.0, 0.0]), 0.5)
    np.testing.assert_allclose(pi, [7 / 12, 4 / 12, 1 / 12], atol=1e-9)
    assert list(np.argsort(-pi)) == [0, 1, 2]


def _closed_form(n: int, edges: list[tuple[int, int, float]], reset: np.ndarray, d: float) -> np.ndarray:
    """pi = (1-d) r + d pi P with P = D^-1 W (parallel edges summed, dangling rows -> r)."""
    w = np.zeros((n, n))
    for a, b, x in edges:
        w[a, b] += x
        w[b, a] += x
    r = reset / reset.sum()
    deg = w.sum(axis=1)
    p = np.where(deg[:, None] > 0, w / np.maximum(deg[:, None], 1e-300), r[None, :])
    pi = np.linalg.solve((np.eye(n) - d * p).T, (1 - d) * r)
    return pi / pi.sum()


def test_ppr_with_parallel_edges_weights_and_isolated_vertex() -> None:
    names = ["e:lena", "e:marathon", "e:shoes", "p:x", "p:isolated"]
    edges = [("e:lena", "e:marathon", 1.0), ("e:marathon", "e:lena", 1.0),  # doubled fact edge
             ("e:marathon", "e:shoes", 2.0), ("p:x", "e:lena", 1.0)]
    reset = np.array([0.6, 0.0, 0.1, 0.05, 0.05])
    pi = personalized_pagerank(igraph_graph(names, edges), reset, 0.5)
    idx = {n: i for i, n in enumerate(names)}
    expected = _closed_form(5, [(idx[a], idx[b], w) for a, b, w in edges], reset, 0.5)
    np.testing.assert_allclose(pi, expected, atol=1e-9)
    assert list(np.argsort(-pi)[:2]) == [idx["e:lena"], idx["e:marathon"]]


def test_ppr_rejects_a_reset_without_mass() -> None:
    g = igraph_graph(["a", "b"], [("a", "b", 1.0)])
    with pytest.raises(ValueError, match="no positive mass"):
        personalized_pagerank(g, np.array([0.0, -1.0]), 0.5)


def _random_graph(n: int = 3000, m: int = 12000) -> tuple[object, np.ndarray]:
    """A graph large enough that PRPACK's OpenMP loops split their work across threads."""
    rng = np.random.default_rng(0)
    ids = [f"n{i}" for i in range(n)]
    edges = [(ids[a], ids[b], float(w)) for (a, b), w in zip(rng.integers(0, n, size=(m, 2)), rng.random(m))]
    reset = np.zeros(n)
    reset[rng.integers(0, n, 20)] = rng.random(20)
    return igraph_graph(ids, edges), reset


class _Recording:
    """An igraph graph that records the OpenMP thread limit in force while PPR runs."""

    def __init__(self, graph: object) -> None:
        self.graph, self.threads = graph, []

    def __getattr__(self, name: str) -> object:
        return getattr(self.graph, name)

    def personalized_pagerank(self, **kw: object) -> list[float]:
        from threadpoolctl import threadpool_info

        self.threads += [i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp"]
        return self.graph.personalized_pagerank(**kw)


def test_ppr_runs_on_one_openmp_thread() -> None:
    """Several OpenMP threads add PRPACK's sums in a scheduling-dependent order (scores moved
    ~1e-14 between two runs of one job); one thread is one order. The limit is lifted after."""
    from threadpoolctl import threadpool_info

    graph, reset = _random_graph(200, 600)
    rec = _Recording(graph)
    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp"]
    personalized_pagerank(rec, reset, 0.5)
    assert rec.threads and set(rec.threads) == {1}
    assert before == [i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp"]


_PPR_DIGEST = """
import hashlib, sys, threading
sys.path.insert(0, sys.argv[1])
from tests.unit.test_seem_graph import _random_graph
from structmem_gpu.methods.seem.graph import personalized_pagerank
graph, reset = _random_graph()
stop = []
def busy():  # a loaded machine: the schedule that made multi-threaded sums differ
    while not stop:
        pass
t = threading.Thread(target=busy)
t.start()
h = hashlib.sha256()
for _ in range(15):
    h.update(personalized_pagerank(graph, reset, 0.5).tobytes())
stop.append(1)
t.join()
print(h.hexdigest())
"""


@pytest.mark.e2e  # e2e: job subprocesses
def test_ppr_scores_are_bit_identical_across_processes() -> None:
    """Two processes with different PYTHONHASHSEED, 15 PPRs each beside a busy thread: the
    same bytes every time (before one OpenMP thread, 15 of 40 repeats differed under load)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        env.pop("OMP_NUM_THREADS", None)
        out = subprocess.run([sys.executable, "-c", _PPR_DIGEST, root], env=env, cwd=root,
                             capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    one = set()
    graph, reset = _random_graph()
    for _ in range(15):
        one.add(personalized_pagerank(graph, reset, 0.5).tobytes())
    assert len(digests) == 1 and len(one) == 1


# ---- quadruples --------------------------------------------------------------------------------


def test_normalisation_and_cleaning() -> None:
    assert normalise("Lena's  Half-Marathon!") == "lena s half marathon"
    assert clean_quad({"subject": "Lena", "relation": "ran", "object": "?!", "time": None}) is None
    q = clean_quad({"subject": "Lena", "relation": "Ran", "object": "Riverside HM", "time": " unknown "})
    assert q is not None and (q.s, q.r, q.o, q.tau) == ("lena", "ran", "riverside hm", None)
    assert fact_text("lena", "ran", "hm", "2024-05") == "lena ran hm (time: 2024-05)"
    # the reader sees the original wording; normalised forms only key dedup and the graph
    shown = clean_quad({"subject": "Lena's coach", "relation": "signed up for", "object": "Riverside Half-Marathon",
                        "time": "2024-05-12"})
    assert shown is not None and shown.shown == "Lena's coach | signed up for | Riverside Half-Marathon | 2024-05-12"


def _passages(n: int, conv: str = "c") -> list[Passage]:
    return [Passage(f"{conv}:D1:{i + 1}", conv, i, 1, i, datetime(2024, 3, 3), "Lena" if i % 2 == 0 else "Tomas",
                    f"text {i}", None) for i in range(n)]


def _result(rid: str, data: object, ok: bool = True) -> LLMResult:
    return LLMResult(rid, "", data, ok, 0, 0, None, 0.0, "stop", False, 1, "", "m")


def test_collect_facts_dedups_with_provenance_union() -> None:
    ps = _passages(3)
    reqs = [LLMRequest(f"r{i}", "graph", (Message("user", "x"),), "v") for i in range(2)]
    quad = {"subject": "Lena", "relation": "ran", "object": "the marathon", "time": "2024-05-18"}
    results = [_result("r0", {"messages": [{"quadruples": [quad]}, {"quadruples": [quad, {"subject": ""}]}]}),
               _result("r1", {"quadruples": [dict(quad, subject="LENA")]})]
    facts, counts = collect_facts([ps[:2], ps[2:]], reqs, results)
    assert len(facts) == 1 and facts[0].provenance == ("c:D1:1", "c:D1:2", "c:D1:3")
    assert facts[0].request_ids == ("r0", "r1") and counts.malformed == 1 and counts.quadruples == 3


# ---- entities and edges ------------------------------------------------------------------------


def _unit(rows: list[list[float]]) -> np.ndarray:
    m = np.array(rows, dtype=np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_node_merging_never_joins_two_speakers() -> None:
    names = ["lena", "lena k", "tomas"]
    vecs = _unit([[1, 0.05, 0], [1, 0.0, 0], [1, 0.1, 0]])  # all pairs above 0.9
    canon = merge_entities(names, vecs, 0.9, {"lena", "tomas"}, {"lena": 3, "lena k": 1, "tomas": 2})
    assert canon["tomas"] == "tomas" and canon["lena"] == "lena"
    assert canon["lena k"] in {"lena", "tomas"}  # joined one speaker, never both
    assert merge_entities(names, vecs, None, set(), {}) == {n: n for n in names}


def test_node_merging_has_no_chains() -> None:
    # a ~ b (cos 0.95) and b ~ c (0.95) but a ~ c only 0.81: single linkage would merge all
    # three; merging by similarity to the canonical name keeps c apart.
    ang = np.deg2rad([0.0, 18.2, 36.4])
    vecs = _unit([[np.cos(a), np.sin(a)] for a in ang])
    assert (vecs[0] @ vecs[1]) > 0.9 and (vecs[1] @ vecs[2]) > 0.9 and (vecs[0] @ vecs[2]) < 0.9
    canon = merge_entities(["lena", "lenna", "jenna"], vecs, 0.9, set(), {"lena": 3, "lenna": 2, "jenna": 1})
    assert canon == {"lena": "lena", "lenna": "lena", "jenna": "jenna"}
    # a name joins the canonical it is most similar to
    two = merge_entities(["x", "y", "z"], _unit([[1, 0], [0, 1], [0.1, 1]]), 0.9, set(), {"x": 5, "y": 4, "z": 1})
    assert two == {"x": "x", "y": "y", "z": "y"}


def test_canonical_is_the_most_frequent_surface_form() -> None:
    canon = merge_entities(["biscuit the beagle", "biscuit"], _unit([[1, 0], [1, 0.01]]), 0.9, set(),
                           {"biscuit": 4, "biscuit the beagle": 1})
    assert canon == {"biscuit the beagle": "biscuit", "biscuit": "biscuit"}


def test_synonymy_pairs_walk_knn_above_threshold() -> None:
    names = ["dog", "puppy", "cat", "ok"]
    vecs = _unit([[1, 0.3, 0], [1, 0.35, 0], [0, 1, 0], [1, 0.3, 0]])
    pairs = synonymy_pairs(names, vecs, 0.8, 2047, 100, 3)
    found = {(names[i], names[j]) for i, j, _ in pairs}
    assert ("dog", "puppy") in found and ("puppy", "dog") in found and ("dog", "ok") in found
    assert all(names[i] != "ok" for i, _, _ in pairs)  # <= 2 alphanumerics: no query
    assert not any("cat" in p for p in found)
    assert len(synonymy_pairs(names, vecs, 0.8, 2047, 1, 3)) == 2  # one neighbour per query entity
    assert near_duplicate_groups(vecs, 0.99) == [[0, 1, 3], [2]]


def test_graph_edges_and_vertices() -> None:
    ps = _passages(3)
    facts = [Fact("f1", "c", "lena", "ran", "marathon", None, ("c:D1:1",), ("r",)),
             Fact("f2", "c", "marathon", "in", "lena", "2024", ("c:D1:1", "c:D1:2"), ("r",)),
             Fact("f3", "c", "lena", "is", "lena", None, ("c:D1:2",), ("r",))]
    names, counts = ["lena", "marathon"], Counter({"lena": 4, "marathon": 2})
    vecs = _unit([[1, 0], [0, 1]])
    g = build_graph("c", ps, facts, names, counts, vecs, graph_settings())
    fact_edges = [e for e in g.edges if e["kind"] == "fact"]
    assert sorted((e["src"], e["dst"], e["weight"]) for e in fact_edges) == [
        ("e:lena", "e:marathon", 2.0), ("e:marathon", "e:lena", 2.0)]  # 2 facts, doubled, no self-loop
    passage_edges = {(e["src"], e["dst"]) for e in g.edges if e["kind"] == "passage"}
    assert passage_edges == {("p:c:D1:1", "e:lena"), ("p:c:D1:1", "e:marathon"), ("p:c:D1:2", "e:lena"),
                             ("p:c:D1:2", "e:marathon")}
    assert [n["node_id"] for n in g.nodes if n["kind"] == "passage"] == ["p:c:D1:1", "p:c:D1:2", "p:c:D1:3"]
    ents = {e["canonical"]: e for e in g.entities}
    assert ents["lena"]["n_passages"] == 2 and ents["lena"]["passages"] == ["c:D1:1", "c:D1:2"]
    single = build_graph("c", ps, facts, names, counts, vecs, graph_settings(edge_doubling=False))
    assert [(e["weight"]) for e in single.edges if e["kind"] == "fact"] == [2.0]
