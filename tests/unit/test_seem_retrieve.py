"""SEEM retrieval: RPE cap and provenance, reset vector, and what each ablation switch changes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.eval.answer import AnswerInputs, context_builder
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.seem import context as seem_context
from structmem_gpu.methods.seem import retrieve
from structmem_gpu.methods.seem.ranking import (
    entity_weights,
    fact_scores,
    minmax,
    reset_vector,
    rpe,
    top_k,
)
from tests.unit.test_seem_stages import FakeBackends, build_memory, new_run, run_stage, seem_cfg

# ---- pure ranking ------------------------------------------------------------------------------


def test_rpe_example() -> None:
    frames, added = rpe(["c:2", "c:7"], {"c:2": "f1", "c:7": "f2"},
                        {"f1": ["c:1", "c:2", "c:3"], "f2": ["c:7", "c:9"]},
                        {"c:1": 0.2, "c:3": 0.1, "c:9": 0.3}, budget=4, position={"c:1": 1, "c:3": 3, "c:9": 9})
    assert frames == ["f1", "f2"] and added == ["c:9", "c:1"]


def test_rpe_never_exceeds_cap_and_only_adds_frame_passages() -> None:
    rng = random.Random(7)
    for _ in range(300):
        pids = [f"c:{i}" for i in range(40)]
        frame_of, prov = {}, {}
        shuffled = pids[:]
        rng.shuffle(shuffled)
        i = 0
        while i < len(shuffled):  # a random partition into frames of 1..10 passages
            size = rng.randint(1, 10)
            fid = f"f{i}"
            prov[fid] = sorted(shuffled[i : i + size], key=lambda p: int(p[2:]))
            frame_of.update({p: fid for p in prov[fid]})
            i += size
        k = rng.randint(1, 8)
        p_ret = rng.sample(pids, k)
        scores = {p: rng.random() for p in pids}
        budget = 2 * k
        frames, added = rpe(p_ret, frame_of, prov, scores, budget, {p: int(p[2:]) for p in pids})
        assert len(p_ret) + len(added) <= budget
        assert not set(added) & set(p_ret) and len(set(added)) == len(added)
        linked = {p for f in frames for p in prov[f]}
        assert set(added) <= linked and frames == list(dict.fromkeys(frame_of[p] for p in p_ret))
        assert [scores[p] for p in added] == sorted((scores[p] for p in added), reverse=True)
        if len(linked - set(p_ret)) >= budget - k:
            assert len(added) == budget - k  # fills the budget when it can


def test_reset_vector_follows_hipporag() -> None:
    facts = [("e:a", "e:b", 1.0), ("e:a", "e:c", 0.5), ("e:x", "e:b", 0.9)]  # e:x is not a vertex
    w = entity_weights(facts, {"e:a": 2, "e:b": 1, "e:c": 4}, seeds_k=2)
    # a: (1/2 + 0.5/2) / 2 = 0.375; b: (1/1 + 0.9/1) / 2 = 0.95; c: 0.5/4 = 0.125 (dropped: top 2)
    assert w == pytest.approx({"e:b": 0.95, "e:a": 0.375})
    r = reset_vector(["e:a", "e:b", "e:c", "p:1", "p:2"], w, ["p:1", "p:2"], np.array([0.2, 0.6]), 0.05)
    np.testing.assert_allclose(r, [0.375, 0.95, 0.0, 0.0, 0.05])
    np.testing.assert_allclose(minmax(np.array([3.0, 3.0])), [1.0, 1.0])
    q = np.eye(3, dtype=np.float32)[:2]
    np.testing.assert_allclose(fact_scores(q, np.eye(3, dtype=np.float32)), [1.0, 1.0, 0.0])
    assert top_k(np.array([0.5, 0.9, 0.9]), 2) == [1, 2]


# ---- ablations on the sample memory (built once) ------------------------------------------------

SWITCHES = ("fact_context", "ppr", "rpe", "eef")


@pytest.fixture(scope="module")
def ablation_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[pl.DataFrame, dict[str, str]]]:
    from structmem_gpu.data import sample_path

    base = new_run(tmp_path_factory.mktemp("seem-ablation"), sample_path())
    backends = FakeBackends()
    build_memory(base, seem_cfg(), backends)
    out = {}
    for name in ("full", *SWITCHES):
        overrides = () if name == "full" else (f"seem.ablation.{name}=false",)
        cfg = seem_cfg(*overrides)
        run_stage(base, cfg, backends, retrieve.STAGE)
        ret = base.read_table("retrievals")
        questions = base.read_table("questions").filter(pl.col("category").is_in([1, 2, 3, 4]))
        tables = {"retrievals": ret, "turns": base.read_table("turns")}
        prompts = context_builder(cfg.answer.prompt)(AnswerInputs(JobConfig.from_cfg(cfg), questions, tables))
        out[name] = (ret, {q: p.messages[-1].content for q, p in prompts.items()})
    return out


def _part(ret: pl.DataFrame, circuit: str, *, sources: tuple[str, ...] | None = None) -> pl.DataFrame:
    df = ret.filter(pl.col("circuit") == circuit)
    if sources is not None:
        df = df.filter(pl.col("source").is_in(list(sources)))
    return df.drop("in_context").sort("question_id", "rank")


def test_full_model_uses_ppr_and_rpe(ablation_runs: dict) -> None:
    ret, _ = ablation_runs["full"]
    turns = ret.filter(pl.col("circuit") == "turns")
    assert set(turns["source"]) >= {"ppr", "rpe"} and ret["in_context"].all()
    per_q = turns.group_by("question_id").len()["len"]
    assert per_q.max() <= 10 and per_q.min() >= 5


def test_fact_context_switch_only_hides_facts(ablation_runs: dict) -> None:
    (full, fp), (abl, ap) = ablation_runs["full"], ablation_runs["fact_context"]
    assert full.drop("in_context").equals(abl.drop("in_context"))  # same retrieval, facts still seed PPR
    assert not abl.filter(pl.col("circuit") == "facts")["in_context"].any()
    assert abl.filter(pl.col("circuit") != "facts")["in_context"].all()
    for q in fp:
        assert "Relevant facts" not in ap[q]
        assert ap[q].split("Episodic memories:")[-1] == fp[q].split("Episodic memories:")[-1]


def test_ppr_switch_only_changes_the_passage_ranking(ablation_runs: dict) -> None:
    (full, _), (abl, _) = ablation_runs["full"], ablation_runs["ppr"]
    assert _part(full, "facts").equals(_part(abl, "facts"))
    turns = abl.filter(pl.col("circuit") == "turns")
    # the paper's "w/o relational propagation" = direct lexical retrieval (BM25)
    assert set(turns["source"]) <= {"bm25", "rpe"} and "bm25" in set(turns["source"])
    assert abl["in_context"].all()


def test_bm25_ablation_retrieves_by_lexical_overlap() -> None:
    from structmem_gpu.methods.seem.lexical import LexicalIndex

    idx = LexicalIndex([
        "Lena: I ran the Lyon half marathon in spring.",
        "Tomas: Biscuit the beagle chewed my slippers again.",
        "Lena: The weather in Lyon was lovely.",
    ])
    s = idx.scores("What did the beagle Biscuit chew?")
    assert s.argmax() == 1 and s[0] == 0 and s[2] == 0  # only the passage sharing terms scores
    lyon = idx.scores("Lyon half marathon")
    assert lyon[0] > lyon[2] > 0 == lyon[1]  # more shared (rarer) terms rank higher
    assert not idx.scores("zebra").any() and LexicalIndex([]).scores("x").size == 0


def test_rpe_switch_only_drops_expanded_passages(ablation_runs: dict) -> None:
    (full, _), (abl, _) = ablation_runs["full"], ablation_runs["rpe"]
    assert _part(full, "facts").equals(_part(abl, "facts"))
    assert _part(full, "frames").equals(_part(abl, "frames"))
    assert _part(full, "turns", sources=("ppr", "dense_fallback")).drop("context_order").equals(
        _part(abl, "turns").drop("context_order"))
    assert "rpe" not in set(abl["source"])


def test_eef_switch_hides_frames_and_turns_off_rpe(ablation_runs: dict) -> None:
    (full, fp), (abl, ap) = ablation_runs["full"], ablation_runs["eef"]
    assert _part(full, "facts").equals(_part(abl, "facts"))
    assert _part(full, "frames").equals(_part(abl, "frames"))  # E_ret still recorded ...
    assert not abl.filter(pl.col("circuit") == "frames")["in_context"].any()  # ... but not shown
    assert "rpe" not in set(abl["source"])
    for q in fp:
        assert "Episodic memories:" in fp[q] and "Episodic memories:" not in ap[q]
        assert ("Relevant facts" in fp[q]) == ("Relevant facts" in ap[q])


def test_answer_stage_resolves_the_seem_builder(tmp_path: Path, sample_path: Path) -> None:
    assert stage_registry(seem_cfg())["answer"].name == "answer"
    assert context_builder(seem_cfg().answer.prompt) is seem_context.build_prompts


def test_builder_refuses_retrievals_of_another_method(tmp_path: Path, sample_path: Path) -> None:
    from structmem_gpu.core.errors import MissingTableError

    questions = new_run(tmp_path / "r", sample_path).read_table("questions")
    ret = pl.DataFrame({"question_id": ["x"], "circuit": ["entries"], "item_id": ["e"], "rank": [0]})
    with pytest.raises(MissingTableError, match="SEEM's retrieve stage"):
        cfg = seem_cfg()
        context_builder(cfg.answer.prompt)(AnswerInputs(JobConfig.from_cfg(cfg), questions, {"retrievals": ret}))


def test_context_truncation_drops_rpe_passages_first_never_frames() -> None:
    It = seem_context.Item
    items = [
        It("facts", 0, 0, "f" * 10), It("facts", 1, 1, "g" * 10),
        It("frames", 0, 0, "F" * 50), It("frames", 1, 1, "G" * 50),
        It("turns", 0, 0, "p" * 20), It("turns", 1, 1, "q" * 20),  # P_ret
        It("turns", 2, 2, "r" * 20), It("turns", 3, 3, "s" * 20),  # RPE (rank after P_ret)
    ]
    def texts(kept: list) -> set[str]:
        return {i.text[0] for i in kept}
    full = sum(len(i.text) + 1 for i in items)
    assert texts(seem_context.fit(items, full)) == set("fgFGpqrs")
    assert texts(seem_context.fit(items, full - 21)) == set("fgFGpqr")  # lowest RPE first
    assert texts(seem_context.fit(items, full - 63)) == set("fgFGp")  # then P_ret from the bottom
    assert texts(seem_context.fit(items, full - 95)) == set("fFG")  # then facts
    assert texts(seem_context.fit(items, 10)) == set("FG")  # frames are never dropped


def test_without_eef_both_readings(tmp_path: Path) -> None:
    from structmem_gpu.data import sample_path

    base = new_run(tmp_path, sample_path())
    backends = FakeBackends()
    build_memory(base, seem_cfg(), backends)
    got = {}
    for name, overrides in (
        ("no_rpe", ("seem.ablation.eef=false",)),
        ("rpe", ("seem.ablation.eef=false", "seem.ablation.rpe_without_eef=true")),
    ):
        run_stage(base, seem_cfg(*overrides), backends, retrieve.STAGE)
        got[name] = base.read_table("retrievals")
    for ret in got.values():  # frames never reach the context in either reading
        assert not ret.filter(pl.col("circuit") == "frames")["in_context"].any()
    src = {k: set(v.filter(pl.col("circuit") == "turns")["source"]) for k, v in got.items()}
    assert "rpe" not in src["no_rpe"] and "rpe" in src["rpe"]
