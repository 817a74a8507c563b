"""The A-MEM worker (structmem_gpu/systems/workers/amem_worker.py) run from its own environment
against our recording front with A-MEM's scripted replies: a build makes one note per turn
(analysis + evolution calls), a search in another worker process reads the store back and
returns notes, a rebuild into a fresh store sends the same chat bodies, and replies A-MEM
cannot use are counted as dropped while the conversation completes.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/amem/bin/python and the exported
code in <dir>/amem/src (`python jobs/data.py systems install amem`, STRUCTMEM_OFFICIAL_DIR
pointing at the official checkouts)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.systems.amem import SPEC, scripted_reply
from structmem_gpu.systems.front import RecordingFront, ScriptedUpstream
from structmem_gpu.systems.protocol import unit_url

ROOT = Path(__file__).resolve().parents[2]
# conf/paths/default.yaml: systems_dir = STRUCTMEM_SYSTEMS_DIR, else <root>/.systems
SYSTEMS = Path(os.environ.get("STRUCTMEM_SYSTEMS_DIR") or ROOT / ".systems")
PYTHON = SYSTEMS / "amem" / "bin" / "python"
SRC = SYSTEMS / "amem" / "src"
needs_env = pytest.mark.skipif(
    not (PYTHON.exists() and (SRC / "memory_layer.py").exists()),
    reason=f"no A-MEM environment at {SYSTEMS / 'amem'} (set STRUCTMEM_SYSTEMS_DIR; "
           "`python jobs/data.py systems install amem` with STRUCTMEM_OFFICIAL_DIR)")
pytestmark = [pytest.mark.systems_heavy]

DIMS = 16
UNIT = "conv-t"
CLOCK = "2025-01-01T00:00:00"
TURNS = [
    ("Caroline", "I went to a LGBTQ support group yesterday and it was powerful."),
    ("Melanie", "That sounds brave! I painted a sunrise over the lake last week."),
    ("Caroline", "Lovely! I am researching adoption agencies in Boston."),
    ("Melanie", "Adoption is wonderful. I ran a charity race for mental health."),
    ("Caroline", "The support group made me feel accepted and hopeful."),
    ("Melanie", "My kids loved the painting of the lake sunrise."),
]
SESSIONS = [{"session_index": 1, "session_time": "2023-05-08T13:56:00",
             "turns": [{"event_id": f"t:D1:{i + 1}", "speaker": who, "text": text}
                       for i, (who, text) in enumerate(TURNS)]}]
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _embed(texts: list[str]) -> np.ndarray:
    """Deterministic bag-of-words vectors: texts that share words are close."""
    m = np.zeros((len(texts), DIMS), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            m[i, hashlib.sha256(word.encode()).digest()[0] % DIMS] += 1.0
    m[:, 0] += 1e-3
    return m / np.linalg.norm(m, axis=1, keepdims=True)


class Worker:
    def __init__(self, home: Path, log: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
               "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
               "OPENAI_API_KEY": "structmem-local", "STRUCTMEM_WORKER_HOME": str(home),
               "STRUCTMEM_SYSTEM_SRC": str(SRC), **SPEC.env}
        self.log = log
        self.proc = subprocess.Popen([str(PYTHON), str(SPEC.worker_path)], env=env, cwd=home,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True)

    def ask(self, msg: dict[str, Any], ok: bool = True) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker died:\n{self.log.read_text()[-3000:]}"
        reply = json.loads(line)
        if ok:
            assert reply["op"] != "error", f"{reply['error']}\n{reply.get('log_tail')}"
        return reply

    def hello(self, **settings: Any) -> dict[str, Any]:
        return self.ask({"op": "hello", "system": "amem", "clock": CLOCK,
                         "settings": {**SPEC.options, "top_k": 10, **settings}})

    def close(self) -> int:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=60)


def _request(front: RecordingFront, phase: str, store: Path, **more: Any) -> dict[str, Any]:
    return {"op": phase, "unit": UNIT, "base_url": unit_url(front.url, "amem", phase, UNIT),
            "model": "scripted", "embed_model": "hash-16", "embed_dims": DIMS,
            "store_dir": str(store), "speakers": ["Caroline", "Melanie"], **more}


def _hashes(rows: Any, kind: str) -> list[str]:
    return rows.filter(rows["prompt_version"] == f"amem/{kind}")["messages_hash"].to_list()


def _build_once(tmp: Path, name: str, reply: Callable[[Mapping[str, Any]], dict[str, Any]],
                **settings: Any) -> dict[str, Any]:
    worker = Worker(tmp / f"home_{name}", tmp / f"worker_{name}.log")
    try:
        worker.hello(**settings)
        with RecordingFront(ScriptedUpstream(reply), embed=_embed) as front:
            built = worker.ask(_request(front, "build", tmp / f"store_{name}", sessions=SESSIONS))
    finally:
        assert worker.close() == 0
    return built


@needs_env
def test_build_search_in_another_process_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "s1"
    w1 = Worker(tmp_path / "home1", tmp_path / "worker1.log")
    try:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "0c8039f"
        with RecordingFront(ScriptedUpstream(scripted_reply), embed=_embed) as front:
            built = w1.ask(_request(front, "build", store, sessions=SESSIONS))
            rows1 = front.take_rows("system_build")
            rebuilt = w1.ask(_request(front, "build", tmp_path / "s2", sessions=SESSIONS))
            rows2 = front.take_rows("system_build")
    finally:
        assert w1.close() == 0

    mems = built["memories"]
    assert len(mems) == len(TURNS) and built["dropped"] == 0, built["drops"]
    assert {m["kind"] for m in mems} == {"memory"}
    assert mems[0]["text"] == "Speaker Carolinesays : " + TURNS[0][1]  # A-MEM's own string
    assert {m["created_at"] for m in mems} == {"2023-05-08T13:56:00"}
    meta = mems[1]["metadata"]
    assert meta["timestamp"] == "1:56 pm on 8 May, 2023"  # LoCoMo's text, as A-MEM's driver
    assert meta["keywords"] and meta["context"] != "General"  # the analysis was used
    assert meta["links"] == [mems[0]["memory_id"]]  # the evolution linked it
    assert built["evolved"] == len(TURNS) - 1
    # one analysis + one evolution per note; embeddings: each note's document, and the
    # neighbour search of every note but the first
    assert len(_hashes(rows1, "chat")) == 2 * len(TURNS)
    assert len(_hashes(rows1, "embeddings")) == 2 * len(TURNS) - 1
    assert rows1["error"].null_count() == rows1.height
    # a rebuild into a fresh store: the same bodies in the same order, the same notes
    assert _hashes(rows2, "chat") == _hashes(rows1, "chat")
    assert rebuilt["memories"] == mems
    assert {p.name for p in store.iterdir()} == {
        "memory_cache.pkl", "retriever_cache.pkl", "retriever_cache_embeddings.npy", "notes.json"}

    w2 = Worker(tmp_path / "home2", tmp_path / "worker2.log")  # the store, read back
    try:
        w2.hello()
        with RecordingFront(ScriptedUpstream(scripted_reply), embed=_embed) as front:
            found = w2.ask(_request(front, "search", store, questions=QUESTIONS, k=2))
            rows_s = front.take_rows("system_search")
    finally:
        assert w2.close() == 0
    ids = {m["memory_id"]: m for m in mems}
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        assert hits and all(h["kind"] == "memory" and h["memory_id"] in ids for h in hits)
        assert len({h["memory_id"] for h in hits}) == len(hits)
        ranked = [h for h in hits if h["score"] is not None]
        assert len(ranked) == 2 and isinstance(ranked[0]["score"], float)
        assert hits[0]["text"] == ids[hits[0]["memory_id"]]["text"]
    # per question: the keyword call (chat) and the keywords' embedding
    assert len(_hashes(rows_s, "chat")) == len(QUESTIONS)
    assert len(_hashes(rows_s, "embeddings")) == len(QUESTIONS)
    logs = (tmp_path / "worker1.log").read_text() + (tmp_path / "worker2.log").read_text()
    assert "network refused" not in logs


def _not_json(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": "I am not sure what you mean."}


def _wrong_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps({"items": [{"x": 1}]})}


@needs_env
def test_garbled_replies_are_counted_and_the_unit_completes(tmp_path: Path) -> None:
    # prose: every analysis is swallowed (note kept, no keywords) and every evolution reply is
    # not JSON (note kept, not evolved)
    built = _build_once(tmp_path, "prose", _not_json)
    assert len(built["memories"]) == len(TURNS)
    assert built["notes_lost"] == 0 and built["dropped"] == 2 * len(TURNS)
    assert {d["where"] for d in built["drops"]} == {"analyze", "evolve"}
    assert all(m["metadata"]["keywords"] == [] for m in built["memories"])

    # JSON with other keys: A-MEM raises on it (its driver would stop): each note is lost,
    # counted, and the conversation completes with what is left (nothing)
    built = _build_once(tmp_path, "keys", _wrong_keys)
    assert built["memories"] == [] and built["notes_lost"] == len(TURNS)
    assert built["dropped"] == len(TURNS)
    assert {d["where"] for d in built["drops"]} == {"add_note"}


@needs_env
def test_a_link_to_no_note_is_counted_and_skipped(tmp_path: Path) -> None:
    def far(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        out = json.loads(reply["content"])
        if out.get("should_evolve"):
            out["suggested_connections"] = [99]  # no such note: A-MEM's retrieval would raise
        return {"content": json.dumps(out)}

    worker = Worker(tmp_path / "home", tmp_path / "worker.log")
    try:
        worker.hello()
        with RecordingFront(ScriptedUpstream(far), embed=_embed) as front:
            built = worker.ask(_request(front, "build", tmp_path / "s", sessions=SESSIONS))
            found = worker.ask(_request(front, "search", tmp_path / "s", questions=QUESTIONS,
                                        k=2))
    finally:
        assert worker.close() == 0
    assert len(built["memories"]) == len(TURNS)
    assert built["drops"] == [{"where": "evolve", "why": "link to no note"}] * (len(TURNS) - 1)
    assert all(m["metadata"]["links"] == [] for m in built["memories"])
    assert all(len(found["results"][q["question_id"]]) == 2 for q in QUESTIONS)


@needs_env
def test_a_failed_call_to_the_front_fails_the_unit(tmp_path: Path) -> None:
    """A-MEM's analysis swallows every exception; a call the front could not answer still
    fails the conversation (an error reply), and the worker serves the next one."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if "keywords" in _schema_props(body) and "tags" in _schema_props(body):
            raise RuntimeError("the model server is gone")
        return scripted_reply(body)

    worker = Worker(tmp_path / "home", tmp_path / "worker.log")
    try:
        worker.hello()
        with RecordingFront(ScriptedUpstream(broken), embed=_embed) as front:
            bad = worker.ask(_request(front, "build", tmp_path / "s1", sessions=SESSIONS),
                             ok=False)
        assert bad["op"] == "error" and "InternalServerError" in bad["error"], bad
        with RecordingFront(ScriptedUpstream(scripted_reply), embed=_embed) as front:
            good = worker.ask(_request(front, "build", tmp_path / "s2", sessions=SESSIONS))
        assert len(good["memories"]) == len(TURNS)
    finally:
        assert worker.close() == 0


def _schema_props(body: Mapping[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format") or {}
    return dict(((fmt.get("json_schema") or {}).get("schema") or {}).get("properties") or {})


@needs_env
def test_the_commits_missing_import_left_as_it_is(tmp_path: Path) -> None:
    """restore_missing_import=false runs the pinned commit literally: analyze_content's re.sub
    raises NameError, which it swallows: every note is stored without its analysis."""
    built = _build_once(tmp_path, "literal", scripted_reply, restore_missing_import=False)
    assert len(built["memories"]) == len(TURNS)
    assert [d["where"] for d in built["drops"]] == ["analyze"] * len(TURNS)
    assert all(m["metadata"]["context"] == "General" for m in built["memories"])


def test_scripted_reply_tells_amem_requests_by_their_schema() -> None:
    def body(props: dict[str, Any], prompt: str) -> dict[str, Any]:
        return {"messages": [{"role": "system", "content": "x"},
                             {"role": "user", "content": prompt}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "response", "schema": {"type": "object", "properties": props}}}}

    analysis = json.loads(scripted_reply(body(
        {"keywords": {}, "context": {}, "tags": {}},
        "...\nContent for analysis:\n Speaker Melaniesays : I painted a lake sunrise."))["content"])
    assert analysis["keywords"] == ["painted", "lake", "sunrise"]
    assert analysis["tags"][:2] == ["conversation", "melanie"]
    evo = json.loads(scripted_reply(body(
        {"should_evolve": {}},
        "content: x\nkeywords: ['lake']\n\nmemory index:3\t talk start time:t\t memory content: "
        "c\t memory context: Art\t memory keywords: ['a']\t memory tags: ['art']\n"))["content"])
    assert evo["should_evolve"] and evo["suggested_connections"] == [3]
    assert evo["new_context_neighborhood"] == ["Art"]
    assert evo["new_tags_neighborhood"] == [["art", "linked"]]
    none = json.loads(scripted_reply(body({"should_evolve": {}}, "no neighbours"))["content"])
    assert none["should_evolve"] is False
    query = json.loads(scripted_reply(body(
        {"keywords": {"type": "string"}},
        "Question: What did Melanie paint?\n\nFormat ..."))["content"])
    assert query == {"keywords": "melanie, paint"}
