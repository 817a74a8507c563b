"""The LightRAG worker (structmem_gpu/systems/workers/lightrag_worker.py) run from its own
environment against our recording front with LightRAG's scripted replies: a build extracts
entities, a search returns a context per question, a rebuild sends the same chat bodies, and
a reply without LightRAG's delimiters is counted as dropped.

Needs the environment: STRUCTMEM_SYSTEMS_DIR=<dir> with <dir>/lightrag/bin/python
(`python jobs/data.py systems install lightrag`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.systems.front import RecordingFront, ScriptedUpstream
from structmem_gpu.systems.lightrag import SPEC, TUPLE, prepare, scripted_reply
from structmem_gpu.systems.protocol import unit_url

SYSTEMS = os.environ.get("STRUCTMEM_SYSTEMS_DIR", "")
PYTHON = Path(SYSTEMS or "/nonexistent") / "lightrag" / "bin" / "python"
pytestmark = [pytest.mark.systems, pytest.mark.skipif(
    not PYTHON.exists(),
    reason="no LightRAG environment: set STRUCTMEM_SYSTEMS_DIR to a directory holding "
           "lightrag/bin/python (python jobs/data.py systems install lightrag)")]

DIMS = 16
UNIT = "conv-t"
SESSIONS = [
    {"session_index": 1, "session_time": "2023-05-08T13:56:00", "turns": [
        {"event_id": "t:D1:1", "speaker": "Caroline", "text": "I went to a LGBTQ support group yesterday."},
        {"event_id": "t:D1:2", "speaker": "Melanie", "text": "That sounds brave! How did it go?"},
        {"event_id": "t:D1:3", "speaker": "Caroline", "text": "It was powerful, I felt accepted."}]},
    {"session_index": 2, "session_time": "2023-05-25T09:10:00", "turns": [
        {"event_id": "t:D2:1", "speaker": "Melanie", "text": "I painted a sunrise over the lake last week."},
        {"event_id": "t:D2:2", "speaker": "Caroline", "text": "Lovely! Are you selling your paintings?"},
        {"event_id": "t:D2:3", "speaker": "Melanie", "text": "Not yet, I paint for my kids."}]},
]
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


def _embed(texts: list[str]) -> np.ndarray:
    """Deterministic bag-of-words vectors (each word hashed to one of DIMS buckets): texts that
    share words are close, so LightRAG's cosine threshold (0.2) lets the graph's rows through."""
    m = np.zeros((len(texts), DIMS), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            m[i, hashlib.sha256(word.encode()).digest()[0] % DIMS] += 1.0
    m[:, 0] += 1e-3  # no zero vector
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _garbage(body: Mapping[str, Any]) -> dict[str, Any]:
    """LightRAG's replies, except that an extraction comes back as prose without delimiters."""
    reply = scripted_reply(body)
    if TUPLE in str(reply.get("content") or ""):
        return {"content": "Caroline and Melanie talk about a support group and painting."}
    return reply


class Worker:
    def __init__(self, home: Path, log: Path) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
               "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
               "OPENAI_API_KEY": "structmem-local", "STRUCTMEM_WORKER_HOME": str(home),
               **SPEC.env, **prepare(home)}
        self.log = log
        self.proc = subprocess.Popen([str(PYTHON), str(SPEC.worker_path)], env=env, cwd=home,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True)

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker died:\n{self.log.read_text()[-3000:]}"
        reply = json.loads(line)
        assert reply["op"] != "error", f"{reply['error']}\n{reply.get('log_tail')}"
        return reply

    def close(self) -> int:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=60)


def _request(front: RecordingFront, phase: str, store: Path, **more: Any) -> dict[str, Any]:
    return {"op": phase, "unit": UNIT, "base_url": unit_url(front.url, "lightrag", phase, UNIT),
            "model": "scripted", "embed_model": "hash-16", "embed_dims": DIMS,
            "store_dir": str(store), "speakers": ["Caroline", "Melanie"], **more}


def _chat_hashes(rows: Any) -> list[str]:
    return rows.filter(rows["prompt_version"] == "lightrag/chat")["messages_hash"].to_list()


def test_build_search_rebuild_and_a_garbage_extraction(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    worker = Worker(home, tmp_path / "worker.log")
    try:
        ready = worker.ask({"op": "hello", "system": "lightrag", "clock": "2025-01-01T00:00:00",
                            "settings": {**SPEC.options, "top_k": 20}})
        assert ready["op"] == "ready" and ready["version"] == "1.5.7"

        with RecordingFront(ScriptedUpstream(scripted_reply), embed=_embed) as front:
            built = worker.ask(_request(front, "build", tmp_path / "s1", sessions=SESSIONS))
            rows1 = front.take_rows("system_build")
            found = worker.ask(_request(front, "search", tmp_path / "s1", questions=QUESTIONS, k=20))
            rows_search = front.take_rows("system_search")
            rebuilt = worker.ask(_request(front, "build", tmp_path / "s2", sessions=SESSIONS))
            rows2 = front.take_rows("system_build")

        names = {m["text"].split(":")[0] for m in built["memories"] if m["kind"] == "entity"}
        assert {"Caroline", "Melanie"} <= names
        assert any(m["kind"] == "relation" for m in built["memories"])
        assert built["dropped"] == 0, built["drops"]
        for q in QUESTIONS:
            (hit,) = found["results"][q["question_id"]]
            assert hit["kind"] == "context" and hit["memory_id"] == f"context:{q['question_id']}"
            assert "Caroline" in hit["text"] or "Melanie" in hit["text"]
        assert len(_chat_hashes(rows1)) == 2 * len(SESSIONS)  # extraction + one gleaning each
        assert len(_chat_hashes(rows_search)) == len(QUESTIONS)  # keywords (context only)
        assert rows1["error"].null_count() == rows1.height  # nothing failed at the front
        # the same bodies (sorted: LightRAG merges entities concurrently, so summary calls may
        # arrive in another order): a rerun is answered from the front's cache
        assert sorted(_chat_hashes(rows2)) == sorted(_chat_hashes(rows1))
        assert rebuilt["memories"] == built["memories"]

        with RecordingFront(ScriptedUpstream(_garbage), embed=_embed) as front:
            bad = worker.ask(_request(front, "build", tmp_path / "s3", sessions=SESSIONS))
        assert bad["dropped"] == len(SESSIONS) and bad["memories"] == []
        assert all(d["where"] == "extraction" for d in bad["drops"])
    finally:
        assert worker.close() == 0
