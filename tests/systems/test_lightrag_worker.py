"""The LightRAG worker (structmem_gpu/systems/workers/lightrag_worker.py) run from its own
environment against our recording front with LightRAG's scripted replies: a build extracts
entities, a search returns a context per question, a rebuild sends the same chat bodies, and
a reply without LightRAG's delimiters is counted as dropped.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/lightrag/bin/python
(`python jobs/data.py systems install lightrag`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from structmem_gpu.systems.lightrag import SPEC, TUPLE, scripted_reply
from tests.systems.worker_driver import WorkerProcess, front, hashes, needs_env, request, session

pytestmark = [pytest.mark.systems, needs_env("lightrag")]

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
QUESTIONS = [{"question_id": "conv-t:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": "conv-t:q1", "question": "What did Melanie paint?"}]


def _garbage(body: Mapping[str, Any]) -> dict[str, Any]:
    """LightRAG's replies, except that an extraction comes back as prose without delimiters."""
    reply = scripted_reply(body)
    if TUPLE in str(reply.get("content") or ""):
        return {"content": "Caroline and Melanie talk about a support group and painting."}
    return reply


def _chat(rows: Any) -> list[str]:
    return hashes(rows, "lightrag")


def test_build_search_rebuild_and_a_garbage_extraction(tmp_path):
    with WorkerProcess(SPEC, tmp_path, "a", clock="2025-01-01T00:00:00") as worker:
        ready = worker.hello(top_k=20)
        assert ready["op"] == "ready" and ready["version"] == "1.5.7"

        with front(SPEC) as f:
            built = worker.ask(request(SPEC, "build", f, tmp_path / "s1", sessions=SESSIONS))
            rows1 = f.take_rows("system_build")
            found = worker.ask(request(SPEC, "search", f, tmp_path / "s1", questions=QUESTIONS,
                                       k=20))
            rows_search = f.take_rows("system_search")
            rebuilt = worker.ask(request(SPEC, "build", f, tmp_path / "s2", sessions=SESSIONS))
            rows2 = f.take_rows("system_build")

        names = {m["text"].split(":")[0] for m in built["memories"] if m["kind"] == "entity"}
        assert {"Caroline", "Melanie"} <= names
        assert any(m["kind"] == "relation" for m in built["memories"])
        assert built["dropped"] == 0, built["drops"]
        for q in QUESTIONS:
            (hit,) = found["results"][q["question_id"]]
            assert hit["kind"] == "context" and hit["memory_id"] == f"context:{q['question_id']}"
            assert "Caroline" in hit["text"] or "Melanie" in hit["text"]
        assert len(_chat(rows1)) == 2 * len(SESSIONS)  # extraction + one gleaning each
        assert len(_chat(rows_search)) == len(QUESTIONS)  # keywords (context only)
        assert rows1["error"].null_count() == rows1.height  # nothing failed at the front
        # the same bodies (sorted: LightRAG merges entities concurrently, so summary calls may
        # arrive in another order): a rerun is answered from the front's cache
        assert sorted(_chat(rows2)) == sorted(_chat(rows1))
        assert rebuilt["memories"] == built["memories"]

        with front(_garbage) as f:
            bad = worker.ask(request(SPEC, "build", f, tmp_path / "s3", sessions=SESSIONS))
        assert bad["dropped"] == len(SESSIONS) and bad["memories"] == []
        assert all(d["where"] == "extraction" for d in bad["drops"])
