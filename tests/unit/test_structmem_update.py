"""Stage `update` (the reference's offline update) with the scripted LLM, and the QA view it
feeds (update.read pre | post).

The differential test runs LightMem's own `construct_update_queue_all_entries`,
`offline_update_all_entries` (src/lightmem/memory/lightmem.py) and `_call_update_llm`
(src/lightmem/factory/memory_manager/openai.py), read from the checkout named by
STRUCTMEM_OFFICIAL_DIR (skipped without it), against an in-memory vector store with Qdrant's
search semantics, and compares candidates, request messages and the final store with ours.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import os
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core import schemas
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.structmem import update, update_view
from structmem_gpu.methods.structmem.embed import embeddings_frame
from structmem_gpu.methods.structmem.prompts import update as P_update
from structmem_gpu.prompts import pinned
from structmem_gpu.prompts import sources as S
from tests.unit.test_structmem_stages import FakeBackends, cfg_for, run_stage


def job_for(*overrides: str) -> JobConfig:
    """cfg_for's config as the JobConfig stage code reads."""
    return JobConfig.from_cfg(cfg_for(*overrides))


T0 = datetime(2023, 5, 8, 13, 56)


def _decide(target: str) -> dict[str, Any]:
    """One scripted decision per target text (both sides use it)."""
    k = sum(map(ord, target)) % 3
    if k == 0:
        return {"action": "update", "new_memory": f"{target} (merged)"}
    return {"action": "delete"} if k == 1 else {"action": "ignore"}


def _respond(req: LLMRequest) -> str:
    first = req.messages[-1].content.split("\n", 1)[0]
    return json.dumps(_decide(first.removeprefix("Target memory:")))


def _memory(seed: int = 0, n: int = 40, convs: int = 2) -> tuple[pl.DataFrame, np.ndarray]:
    """Entries with clusters of near-duplicate vectors (cosines around and above 0.9), some
    sharing a timestamp, over `convs` conversations."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, 16))
    rows, vecs = [], []
    for i in range(n):
        v = centres[i % 6] + rng.normal(scale=rng.choice([0.15, 0.3, 0.6]), size=16)
        vecs.append(v / np.linalg.norm(v))
        conv = f"c{i % convs}"
        rows.append({
            "entry_id": f"e{i:03d}", "conv_id": conv, "event_id": f"{conv}:D{i // 3}",
            "dia_id": f"D{i // 3}", "session_index": 1, "turn_index": i // 3,
            "event_time": T0 + timedelta(seconds=i // 3),  # three entries per timestamp
            "speaker": "A", "kind": "fact", "text": f"memory number {i} about topic {i % 6}",
            "request_id": "x", "prompt_version": "factual/3", "model": "m",
        })
    return schemas.frame(rows, schemas.ENTRIES), np.asarray(vecs, dtype=np.float32)


def _run_dir(tmp_path: Path, entries: pl.DataFrame, mat: np.ndarray) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.write_table("entries", entries)
    run.write_table("entry_embeddings", embeddings_frame(
        entries["entry_id"].to_list(), entries["conv_id"].to_list(), entries["text"].to_list(),
        mat, "fake"))
    return run


# ---- the queue and the candidates, by hand ---------------------------------------------------


def test_queue_holds_earlier_or_equal_neighbours_without_itself() -> None:
    mat = np.eye(3, dtype=np.float32)[[0, 0, 1, 0]]  # entries 0, 1, 3 identical
    times = np.array([0, 1, 1, 2])
    q = update.update_queues(mat, times, top_k=20, keep=10)
    assert q[0] == []  # nothing earlier
    assert [j for j, _ in q[1]] == [0, 2]  # equal time counts (2), never itself, best first
    assert [j for j, _ in q[3]][:2] == [0, 1] and q[3][0][1] == pytest.approx(1.0)
    # the search's top_k counts the entry itself (then dropped): e2's 2 hits are itself and e0
    assert update.update_queues(mat, times, top_k=2, keep=10)[2] == [(0, pytest.approx(0.0))]
    assert len(update.update_queues(mat, times, top_k=20, keep=1)[3]) == 1
    cands = update.candidates_of("c", ["a", "b", "c", "d"], list("ABCD"), q, 0.9)
    assert [(c.entry_id, c.sources) for c in cands] == [("a", ("b", "d")), ("b", ("d",))]


# ---- the stage ------------------------------------------------------------------------------


def test_update_stage_one_batch_keyed_by_original_ids(tmp_path: Path) -> None:
    entries, mat = _memory()
    run = _run_dir(tmp_path, entries, mat)
    ctx = run_stage(run, cfg_for("update.enabled=true"), FakeBackends({"update": _respond}),
                    update.STAGE)
    out = run.read_table("entry_updates")
    assert ctx.batches == 1 and out.height == ctx.notes["candidates"] == ctx.notes["requests"] > 0
    assert set(out["entry_id"]) <= set(entries["entry_id"])  # original ids, never renamed
    texts = dict(zip(entries["entry_id"], entries["text"], strict=True))
    for r in out.iter_rows(named=True):
        assert r["old_text"] == texts[r["entry_id"]] and r["parse_ok"]
        want = _decide(r["old_text"])
        assert r["decision"] == want["action"] and r["new_text"] == want.get("new_memory")
        assert r["max_score"] >= 0.9 and r["entry_id"] not in r["source_entry_ids"]
    assert {ctx.notes[a] for a in ("update", "delete", "ignore")} != {0}
    assert ctx.request_frames[0]["request_id"].to_list() == out["request_id"].to_list()
    assert ctx.request_frames[0]["prompt_version"].unique().to_list() == ["update/1"]


def test_unparsed_reply_is_recorded_as_ignore_never_dropped(tmp_path: Path) -> None:
    entries, mat = _memory()
    run = _run_dir(tmp_path, entries, mat)
    ctx = run_stage(run, cfg_for("update.enabled=true"),
                    FakeBackends({"update": lambda r: "no JSON here"}), update.STAGE)
    out = run.read_table("entry_updates")
    assert out.height == ctx.notes["parse_failures"] > 0
    assert set(out["decision"]) == {"ignore"} and not out["parse_ok"].any()
    assert set(ctx.request_frames[0]["attempts"]) == {2}  # retried once, then recorded


def test_disabled_update_sends_nothing(tmp_path: Path) -> None:
    entries, mat = _memory()
    run = _run_dir(tmp_path, entries, mat)
    ctx = run_stage(run, cfg_for("update.enabled=false"), FakeBackends(), update.STAGE)
    assert ctx.batches == 0 and run.read_table("entry_updates").height == 0


# ---- the QA view ----------------------------------------------------------------------------


def _updates() -> pl.DataFrame:
    rows = [("e001", "delete", None), ("e002", "update", "new two"), ("e003", "ignore", None),
            ("e004", "update", None)]
    return schemas.frame([{"entry_id": e, "conv_id": "c0", "old_text": "o", "new_text": t,
                           "decision": d, "source_entry_ids": [], "max_score": 0.95,
                           "request_id": "r", "prompt_version": "v", "parse_ok": True}
                          for e, d, t in rows], schemas.ENTRY_UPDATES)


def test_post_view_drops_deleted_and_shows_new_texts_pre_changes_nothing() -> None:
    entries, _ = _memory(n=6, convs=1)
    post = job_for("update.read=post")
    view = update_view.qa_entries(post, entries, _updates())
    assert "e001" not in set(view["entry_id"]) and view.height == entries.height - 1
    got = dict(zip(view["entry_id"], view["text"], strict=True))
    assert got["e002"] == "new two" and got["e004"] == entries["text"][4]  # no text: old kept
    assert view.drop("text").equals(entries.filter(pl.col("entry_id") != "e001").drop("text"))
    pre = job_for("update.read=pre")
    assert update_view.qa_entries(pre, entries, _updates()).equals(entries)
    assert update_view.view_fingerprint(pre) is None and update_view.keeps_syntheses(pre)
    assert not update_view.keeps_syntheses(post)
    assert update_view.keeps_syntheses(job_for("update.read=post", "update.post_syntheses=true"))
    with pytest.raises(ConfigError, match="no entry_updates table"):
        update_view.qa_entries(post, entries, None)


def test_reference_profile_lists_update_and_reads_pre_by_default() -> None:
    cfg = cfg_for("experiment=structmem_locomo_reference_code", "prompts.sources.lightmem=null",
                  "prompts.sources.mem0=null", "prompts.sources.longmemeval=null")
    stages = list(cfg.method.stages)
    assert stages.index("consolidate") < stages.index("update") < stages.index("retrieve")
    upd = cfg["update"]  # (DictConfig.update is a method)
    assert upd.enabled and upd.read == "pre" and not upd.post_syntheses
    assert "update" not in cfg_for("experiment=structmem_locomo", "prompts.sources.lightmem=null",
                                   "prompts.sources.mem0=null",
                                   "prompts.sources.longmemeval=null").method.stages


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_pre_store_leaves_every_other_request_unchanged(tmp_path: Path) -> None:
    """update.read=pre (the reference profile's default): listing the stage adds its own
    requests and changes no other request of the job (the QA view is the store as built)."""
    from tests.fixtures.pipeline import run_pipeline

    base = ["debug=scripted", "embedder=minilm", "benchmark=sample",
            "benchmark.conversations=[sample-1]", f"paths.cache_dir={tmp_path / 'cache'}",
            "report.plots=false"]
    run_pipeline([*base, "method=structmem"], tmp_path / "off")
    run_pipeline([*base, "method=structmem", "stages=[load,extract,embed,consolidate,update,"
                  "retrieve,answer,judge,report]"], tmp_path / "on")

    def ids(run: str, stage: str) -> list[str]:
        reqs = RunDir(tmp_path / run).read_table("requests")
        return sorted(reqs.filter(pl.col("stage") == stage)["request_id"].to_list())

    for stage in ("extract", "consolidate", "answer", "judge"):
        assert ids("off", stage) == ids("on", stage) != [], stage
    assert ids("off", "update") == [] and len(ids("on", "update")) == RunDir(
        tmp_path / "on").read_table("entry_updates").height
    assert RunDir(tmp_path / "off").read_table("retrievals").equals(
        RunDir(tmp_path / "on").read_table("retrievals"))


# ---- against the reference code -------------------------------------------------------------


class QdrantLike:
    """The few calls the reference makes on its vector store, with Qdrant's semantics: cosine
    scores, `lte` range filters, `limit` best hits; get_all in insertion order."""

    def __init__(self, ids: list[str], mat: np.ndarray, payloads: list[dict[str, Any]]) -> None:
        self.points = {i: {"id": i, "vector": v, "payload": dict(p)}
                       for i, v, p in zip(ids, mat, payloads, strict=True)}
        self.lock = threading.Lock()

    def get_all(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"id": p["id"], "vector": p["vector"], "payload": dict(p["payload"])}
                    for p in self.points.values()]

    def search(self, query_vector: Any, limit: int, filters: dict[str, Any]) -> list[dict[str, Any]]:
        (key, cond), = filters.items()
        with self.lock:
            pool = [p for p in self.points.values() if p["payload"][key] <= cond["lte"]]
        scored = sorted(((float(np.dot(query_vector, p["vector"])), p["id"]) for p in pool),
                        key=lambda s: -s[0])
        return [{"id": i, "score": s} for s, i in scored[:limit]]

    def update(self, vector_id: str, vector: Any, payload: dict[str, Any]) -> None:
        with self.lock:
            self.points[vector_id] = {"id": vector_id, "vector": vector, "payload": payload}

    def delete(self, vector_id: str) -> None:
        with self.lock:
            del self.points[vector_id]


class _Log:
    def info(self, *a: Any) -> None: ...
    debug = warning = info


def _methods(text: str, cls: str, names: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    tree = ast.parse(text)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    keep = [f for f in body if isinstance(f, ast.FunctionDef) and f.name in names]
    assert len(keep) == len(names)
    # the official code runs here, in the test only, to be the yardstick
    exec(compile(ast.Module(body=keep, type_ignores=[]), "<official>", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture
def lightmem_spec() -> str:
    root = os.environ.get("STRUCTMEM_OFFICIAL_DIR")
    if not root:
        pytest.skip("STRUCTMEM_OFFICIAL_DIR not set: no LightMem checkout to compare with")
    spec = pinned.source("lightmem", root)
    if not Path(spec.rpartition("@")[0]).is_dir():
        pytest.skip(f"{spec}: no such checkout ({pinned.FETCH_COMMAND})")
    return spec


@pytest.mark.parametrize("seed", [0, 1])
def test_update_equals_lightmem_offline_update(tmp_path: Path, lightmem_spec: str, seed: int) -> None:
    src = S.parse("lightmem", lightmem_spec)
    prompt = S.string_constant(src, "src/lightmem/memory/prompts.py", "UPDATE_PROMPT", "update")
    ns = _methods(S.read_file(src, "src/lightmem/memory/lightmem.py"), "LightMemory",
                  ["construct_update_queue_all_entries", "offline_update_all_entries"],
                  {"datetime": datetime, "threading": threading, "concurrent": concurrent,
                   "UPDATE_PROMPT": prompt})
    _methods(S.read_file(src, "src/lightmem/factory/memory_manager/openai.py"), "OpenaiManager",
             ["_call_update_llm"], ns := ns | {"json": json})
    entries, mat = _memory(seed)
    sent: list[tuple[str, list[dict[str, str]]]] = []

    class Manager:
        _call_update_llm = ns["_call_update_llm"]

        def generate_response(self, messages: list[dict[str, str]], response_format: Any) -> Any:
            target = messages[1]["content"].split("\n", 1)[0].removeprefix("Target memory:")
            sent.append((target, messages))
            return json.dumps(_decide(target)), {"prompt_tokens": 1, "completion_tokens": 1}

    final: dict[str, str] = {}
    for (conv,), part in entries.with_row_index("_i").group_by("conv_id", maintain_order=True):
        idx = part["_i"].to_numpy()
        store = QdrantLike(part["entry_id"].to_list(), mat[idx], [
            {"memory": t, "float_time_stamp": ts.timestamp()}
            for t, ts in zip(part["text"], part["event_time"], strict=True)])
        me = type("LightMemoryStub", (), {
            "construct_update_queue_all_entries": ns["construct_update_queue_all_entries"],
            "offline_update_all_entries": ns["offline_update_all_entries"]})()
        me.embedding_retriever, me.logger, me.manager = store, _Log(), Manager()
        me.token_stats = {f"update_{k}": 0 for k in ("calls", "prompt_tokens",
                                                     "completion_tokens", "total_tokens")}
        me.construct_update_queue_all_entries()  # add_locomo.py: top_k 20, keep 10
        me.offline_update_all_entries(score_threshold=0.9)
        final.update({p["id"]: p["payload"]["memory"] for p in store.get_all()})

    run = _run_dir(tmp_path, entries, mat)
    cfg = cfg_for("update.enabled=true", f"prompts.sources.lightmem={lightmem_spec}")
    ctx = run_stage(run, cfg, FakeBackends({"update": _respond}), update.STAGE)
    ours = run.read_table("entry_updates")
    assert ours.height == len(sent) > 0
    want = sorted((t, m) for t, m in ((t, [dict(x) for x in m]) for t, m in sent))
    log = ctx.request_frames[0]
    assert log["prompt_version"].unique().to_list()[0].startswith("official-update/")
    reqs = update.requests_for(update.plan(entries, run.read_table("entry_embeddings"),
                                           ctx.settings)[0], ctx.settings)
    got = sorted((r.messages[-1].content.split("\n", 1)[0].removeprefix("Target memory:"),
                  [m.as_dict() for m in r.messages]) for r in reqs)
    assert got == want  # the same candidates, each with the same system and user message
    view = update_view.qa_entries(job_for("update.read=post"), entries, ours)
    assert dict(zip(view["entry_id"], view["text"], strict=True)) == final


# ---- presets (item 6) -----------------------------------------------------------------------


def test_table5_row_matches_the_gpt_oss_120b_command_only() -> None:
    """SEEM Table 5's SEEM row is reached by the advertised command (docs/evaluation.md "Evaluation
    protocols"), and not by the same experiment on another backbone."""
    from structmem_gpu.eval.published import matching_rows
    from tests.fixtures.pipeline import compose_cfg

    oss = compose_cfg(["experiment=seem_locomo", "llm=vllm_gpt_oss_120b",
                       "judge=deepseek_v3_2_endpoint"])
    assert "seem-table5-seem" in {r.id for r in matching_rows(oss)}
    qwen = compose_cfg(["experiment=seem_locomo", "llm=vllm_qwen3_8b"])
    ids = {r.id for r in matching_rows(qwen)}
    assert "seem-table5-seem" not in ids and "seem-table1-locomo-seem" in ids
    judge = oss["judge"]
    assert judge.llm.api_key_env == "DEEPSEEK_API_KEY" and judge.protocol == "paper"
    assert oss.llm.weights_gb == 65.3 and oss.llm.tensor_parallel_size == 1


def test_replication_profile_reads_the_official_texts_with_no_sources_argument(
    lightmem_spec: str,
) -> None:
    """With STRUCTMEM_OFFICIAL_DIR (the mirrors standing in for a fetch), the reference
    profile's requests carry LightMem's texts; `prompts.sources.lightmem=null` = ours."""
    cfg = cfg_for("experiment=structmem_locomo_reference_code")
    assert cfg.prompts.sources.lightmem == lightmem_spec
    system, version = update.system_prompt(update.UpdateSettings.from_cfg(cfg))
    src = S.parse("lightmem", lightmem_spec)
    assert system == S.string_constant(src, "src/lightmem/memory/prompts.py", "UPDATE_PROMPT", "")
    assert version.startswith("official-update/")
    from structmem_gpu.prompts.official import texts_protocol

    assert texts_protocol(JobConfig.from_cfg(cfg)) == ("official: lightmem@8fc9a91, mem0@b3ede5b, "
                                   "longmemeval@9e0b455")
    ours = cfg_for("experiment=structmem_locomo_reference_code", "prompts.sources.lightmem=null",
                   "prompts.sources.mem0=null", "prompts.sources.longmemeval=null")
    assert update.system_prompt(update.UpdateSettings.from_cfg(ours)) == (
        P_update.SYSTEM, P_update.VERSION) and texts_protocol(JobConfig.from_cfg(ours)) == "ours"
