"""The MiniRAG worker (structmem_gpu/systems/workers/minirag_worker.py) run from its own
environment against our recording front with MiniRAG's scripted replies: a build extracts
entities and relations (one extraction and one follow-up per session chunk, each sent once), a
search in another worker process reads the store back and returns MiniRAG's "mini" context per
question, a rebuild into a fresh store sends the same chat bodies, and replies MiniRAG cannot
use are counted as dropped while the unit completes.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/minirag/bin/python and the
exported code in <dir>/minirag/src (`python jobs/data.py systems install minirag`, with
STRUCTMEM_OFFICIAL_DIR holding minirag.git)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.minirag import COMPLETE, SPEC, TUPLE, scripted_reply
from tests.systems.worker_driver import (
    UNIT,
    WorkerProcess,
    front,
    hashes,
    needs_env,
    official_dir,
    request,
    session,
)

_MIRRORED = bool(official_dir()) and (Path(official_dir()) / "minirag.git").exists()
pytestmark = [pytest.mark.systems_heavy]


def needs_minirag(test: Any) -> Any:
    """Skip unless MiniRAG's repository is mirrored and its environment installed (the mirror
    first: pytest reports the first skip condition that holds, the innermost mark)."""
    test = pytest.mark.skipif(not _MIRRORED, reason=(
        "MiniRAG is not mirrored: clone https://github.com/HKUDS/MiniRAG as a bare repository "
        "into $STRUCTMEM_OFFICIAL_DIR/minirag.git"))(test)
    return needs_env("minirag")(test)

CLOCK = "2025-01-01T00:00:00"
SESSIONS = [
    session(1, "2023-05-08T13:56:00", [
        ("Caroline", "I went to a LGBTQ support group yesterday."),
        ("Melanie", "That sounds brave! How did it go?"),
        ("Caroline", "It was powerful, I felt accepted.")], prefix="t"),
    session(2, "2023-05-25T09:10:00", [
        ("Melanie", "I painted a sunrise over the lake last week."),
        ("Caroline", "Lovely! Are you selling your paintings?"),
        ("Melanie", "Not yet, I paint for my kids.")], prefix="t"),
]
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _worker(tmp: Path, name: str, **settings: Any) -> WorkerProcess:
    return WorkerProcess(SPEC, tmp, name, clock=CLOCK, settings={"top_k": 20, **settings})


def _chat(rows: Any) -> list[str]:
    return hashes(rows, "minirag")


@needs_minirag
def test_build_search_in_another_process_and_rebuild(tmp_path: Path) -> None:
    store = tmp_path / "s1"
    with _worker(tmp_path, "1") as w1:
        ready = w1.hello()
        assert ready["op"] == "ready" and ready["version"] == "4fe2fba"
        with front(SPEC) as f:
            built = w1.ask(request(SPEC, "build", f, store, sessions=SESSIONS))
            rows1 = f.take_rows("system_build")
            rebuilt = w1.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
            rows2 = f.take_rows("system_build")

    mems = built["memories"]
    assert built["dropped"] == 0, built["drops"]
    entities = {m["text"].split(":")[0] for m in mems if m["kind"] == "entity"}
    assert {"CAROLINE", "MELANIE"} <= entities  # MiniRAG upper-cases entity names
    assert any(m["kind"] == "relation" and {m["metadata"]["source"], m["metadata"]["target"]}
               == {"CAROLINE", "MELANIE"} for m in mems)
    # one extraction and one "entities were missed" follow-up per session (one chunk each),
    # each sent once: all sessions go to one ainsert
    assert len(_chat(rows1)) == 2 * len(SESSIONS)
    assert rows1["error"].null_count() == rows1.height  # nothing failed at the front
    # a rebuild into a fresh store: the same bodies (extraction runs concurrently), the same graph
    assert sorted(_chat(rows2)) == sorted(_chat(rows1))
    assert rebuilt["memories"] == mems
    assert (store / "graph_chunk_entity_relation.graphml").exists()

    with _worker(tmp_path, "2") as w2:  # the store, read back by another process
        assert w2.hello()["op"] == "ready"
        with front(SPEC) as f:
            found = w2.ask(request(SPEC, "search", f, store, questions=QUESTIONS, k=20))
            rows_s = f.take_rows("system_search")
    assert found["dropped"] == 0, found["drops"]
    for q in QUESTIONS:
        (hit,) = found["results"][q["question_id"]]
        assert hit["kind"] == "context" and hit["memory_id"] == f"context:{q['question_id']}"
        assert "-----Entities-----" in hit["text"] and "-----Sources-----" in hit["text"]
        assert "Session on 2023-05-" in hit["text"]  # a session document among the sources
    assert len(_chat(rows_s)) == len(QUESTIONS)  # the keyword call (context only, no answer)
    logs = w1.log_text() + w2.log_text()
    assert "network refused" not in logs and "Traceback" not in logs


@needs_minirag
def test_inserting_session_by_session_re_extracts_earlier_sessions(tmp_path: Path) -> None:
    """one_insert=false runs MiniRAG's main.py loop (one ainsert per document): each ainsert
    extracts every document inserted so far again (1 + 2 extractions for 2 sessions)."""
    with _worker(tmp_path, "loop", one_insert=False) as worker:
        assert worker.hello()["op"] == "ready"
        with front(SPEC) as f:
            built = worker.ask(request(SPEC, "build", f, tmp_path / "s", sessions=SESSIONS))
            rows = f.take_rows("system_build")
    assert len(_chat(rows)) == 2 * (1 + 2)
    assert len(set(_chat(rows))) == 2 * len(SESSIONS)  # the repeats are the same bodies
    assert built["dropped"] == 0 and built["memories"]


def _prose(body: Mapping[str, Any]) -> dict[str, Any]:
    return {"content": "Caroline and Melanie talk about a support group and painting."}


def _short_rows(body: Mapping[str, Any]) -> dict[str, Any]:
    """MiniRAG's replies, except that every entity record lacks its description field."""
    reply = scripted_reply(body)
    text = str(reply.get("content") or "")
    if TUPLE not in text:
        return reply
    rows = [r for r in text.replace(COMPLETE, "").split("##") if r.strip()]
    cut = [TUPLE.join(r.split(TUPLE)[:3]) + ")" if r.startswith('("entity"') else r for r in rows]
    return {"content": "##".join(cut) + "##" + COMPLETE}


@needs_minirag
def test_garbled_replies_are_counted_and_the_unit_completes(tmp_path: Path) -> None:
    with _worker(tmp_path, "bad") as worker:
        assert worker.hello()["op"] == "ready"
        # prose: no record at all, every session without entities, nothing indexed
        with front(_prose) as f:
            bad = worker.ask(request(SPEC, "build", f, tmp_path / "s1", sessions=SESSIONS))
            none = worker.ask(request(SPEC, "search", f, tmp_path / "s1", questions=QUESTIONS))
        assert bad["memories"] == []
        assert [d["where"] for d in bad["drops"]] == ["extraction"] * len(SESSIONS)
        # a prose keyword reply is not JSON: counted, no hit, no traceback
        assert none["dropped"] == len(QUESTIONS)
        assert all(found == [] for found in none["results"].values())

        # entity records with a field missing: MiniRAG's parser rejects each (no word in its
        # log); the relationships still make their endpoints nodes (type UNKNOWN)
        with front(_short_rows) as f:
            short = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
        rejected = [d for d in short["drops"] if "rejected" in d["why"]]
        assert len(rejected) == 3 * len(SESSIONS)  # 2 speakers + the session, per session
        assert short["memories"]

        # keyword replies that name no entity: MiniRAG would raise; counted instead
        def no_entities(body: Mapping[str, Any]) -> dict[str, Any]:
            if len(body["messages"]) == 1 and "Query:" in body["messages"][0]["content"][-400:]:
                return {"content": json.dumps({"answer_type_keywords": ["PERSON"],
                                               "entities_from_query": []})}
            return scripted_reply(body)

        with front(no_entities) as f:
            worker.ask(request(SPEC, "build", f, tmp_path / "s3", sessions=SESSIONS))
            empty = worker.ask(request(SPEC, "search", f, tmp_path / "s3", questions=QUESTIONS))
        assert empty["dropped"] == len(QUESTIONS)
        assert {d["where"] for d in empty["drops"]} == {"query"}
    assert "Traceback" not in worker.log_text()


@needs_minirag
def test_a_failed_call_to_the_front_fails_the_unit(tmp_path: Path) -> None:
    def broken(body: Mapping[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the model server is gone")

    with _worker(tmp_path, "broken") as worker:
        assert worker.hello()["op"] == "ready"
        with front(broken) as f:
            bad = worker.call(request(SPEC, "build", f, tmp_path / "s1", sessions=SESSIONS))
        assert bad["op"] == "error" and "InternalServerError" in bad["error"], bad
        with front(SPEC) as f:
            good = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
        assert good["memories"] and good["dropped"] == 0


def test_scripted_reply_tells_minirag_requests_by_their_structure() -> None:
    data = "\n######################\n"
    extraction = ("-Examples-\nText: an example\n-Real Data-" + data + "Entity_types: person\n"
                  "Text: Session on 2023-05-08T13:56:00:\nCaroline: I went to a support group."
                  "\nMelanie: Brave!" + data + "Output:\n")
    reply = scripted_reply({"messages": [{"role": "user", "content": extraction}]})["content"]
    assert reply.endswith(COMPLETE)
    assert f'("entity"{TUPLE}"Caroline"{TUPLE}"person"' in reply
    assert f'("relationship"{TUPLE}"Caroline"{TUPLE}"Melanie"' in reply
    assert "an example" not in reply
    follow_up = scripted_reply({"messages": [{"role": "user", "content": extraction},
                                             {"role": "assistant", "content": reply},
                                             {"role": "user", "content": "more?"}]})
    assert follow_up["content"] == COMPLETE
    query = ("-Real Data-" + data + 'Query: What did Melanie paint?\nAnswer type pool:{}'
             + data + "Output:\n\n")
    keywords = json.loads(scripted_reply({"messages": [{"role": "user", "content": query}]})
                          ["content"])
    assert keywords["entities_from_query"] == ["Melanie"]
    assert keywords["answer_type_keywords"]
