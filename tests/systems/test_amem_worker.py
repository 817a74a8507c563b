"""The A-MEM worker (structmem_gpu/systems/workers/amem_worker.py) run from its own environment
against our recording front with A-MEM's scripted replies: a build makes one note per turn
(analysis + evolution calls), a search in another worker process reads the store back and
returns notes, a rebuild into a fresh store sends the same chat bodies, and replies A-MEM
cannot use are counted as dropped while the conversation completes.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/amem/bin/python and the exported
code in <dir>/amem/src (`python jobs/data.py systems install amem`, STRUCTMEM_OFFICIAL_DIR
pointing at the official checkouts)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.amem import SPEC, scripted_reply
from tests.systems.worker_driver import (
    CONVERSATION,
    UNIT,
    Reply,
    WorkerProcess,
    front,
    hashes,
    needs_env,
    request,
    session,
)

needs_amem = needs_env("amem")
pytestmark = [pytest.mark.systems_heavy]

CLOCK = "2025-01-01T00:00:00"
TURNS = CONVERSATION
SESSIONS = [session(1, "2023-05-08T13:56:00", TURNS, prefix="t")]
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _worker(tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=CLOCK, settings={"top_k": 10})


def _hashes(rows: Any, kind: str) -> list[str]:
    return hashes(rows, "amem", kind)


def _build_once(tmp: Path, name: str, reply: Reply, **settings: Any) -> dict[str, Any]:
    with _worker(tmp, name) as worker:
        assert worker.hello(**settings)["op"] == "ready"
        with front(reply) as f:
            built = worker.ask(request(SPEC, "build", f, tmp / f"store_{name}", sessions=SESSIONS))
    return built


@needs_amem
def test_build_search_in_another_process_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "s1"
    with _worker(tmp_path, "1") as w1:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "0c8039f"
        with front(SPEC) as f:
            built = w1.ask(request(SPEC, "build", f, store, sessions=SESSIONS))
            rows1 = f.take_rows("system_build")
            rebuilt = w1.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
            rows2 = f.take_rows("system_build")

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

    with _worker(tmp_path, "2") as w2:  # the store, read back
        assert w2.hello()["op"] == "ready"
        with front(SPEC) as f:
            found = w2.ask(request(SPEC, "search", f, store, questions=QUESTIONS, k=2))
            rows_s = f.take_rows("system_search")
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
    logs = w1.log_text() + w2.log_text()
    assert "network refused" not in logs


def _not_json(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": "I am not sure what you mean."}


def _wrong_keys(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps({"items": [{"x": 1}]})}


@needs_amem
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


@needs_amem
def test_a_link_to_no_note_is_counted_and_skipped(tmp_path: Path) -> None:
    def far(body: Mapping[str, Any]) -> dict[str, Any]:
        reply = scripted_reply(body)
        out = json.loads(reply["content"])
        if out.get("should_evolve"):
            out["suggested_connections"] = [99]  # no such note: A-MEM's retrieval would raise
        return {"content": json.dumps(out)}

    with _worker(tmp_path, "far") as worker:
        assert worker.hello()["op"] == "ready"
        with front(far) as f:
            built = worker.ask(request(SPEC, "build", f, tmp_path / "s", sessions=SESSIONS))
            found = worker.ask(request(SPEC, "search", f, tmp_path / "s", questions=QUESTIONS,
                                       k=2))
    assert len(built["memories"]) == len(TURNS)
    assert built["drops"] == [{"where": "evolve", "why": "link to no note"}] * (len(TURNS) - 1)
    assert all(m["metadata"]["links"] == [] for m in built["memories"])
    assert all(len(found["results"][q["question_id"]]) == 2 for q in QUESTIONS)


@needs_amem
def test_a_failed_call_to_the_front_fails_the_unit(tmp_path: Path) -> None:
    """A-MEM's analysis swallows every exception; a call the front could not answer still
    fails the conversation (an error reply), and the worker serves the next one."""
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        if "keywords" in _schema_props(body) and "tags" in _schema_props(body):
            raise RuntimeError("the model server is gone")
        return scripted_reply(body)

    with _worker(tmp_path, "broken") as worker:
        assert worker.hello()["op"] == "ready"
        with front(broken) as f:
            bad = worker.call(request(SPEC, "build", f, tmp_path / "s1", sessions=SESSIONS))
        assert bad["op"] == "error" and "InternalServerError" in bad["error"], bad
        with front(SPEC) as f:
            good = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
        assert len(good["memories"]) == len(TURNS)


def _schema_props(body: Mapping[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format") or {}
    return dict(((fmt.get("json_schema") or {}).get("schema") or {}).get("properties") or {})


@needs_amem
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
