"""The LangMem worker (structmem_gpu/systems/workers/langmem_worker.py) run from its own
environment against our recording front with LangMem's scripted replies: a build stores one
memory per (long enough) message through the agent's `manage_memory` tool calls, a search in
another worker process reads the store back from disk and returns scored hits per speaker, a
rebuild into a fresh store sends byte-identical chat bodies, and garbled tool calls are
counted as dropped while the unit completes.

Needs the environment: $STRUCTMEM_SYSTEMS_DIR/langmem/bin/python
(`python jobs/data.py systems install langmem`); the scripted replies are checked without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.systems.front import RecordingFront, ScriptedUpstream
from structmem_gpu.systems.langmem import SPEC, TOOL, scripted_reply
from structmem_gpu.systems.protocol import unit_url

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS_DIR = Path(os.environ.get("STRUCTMEM_SYSTEMS_DIR") or ROOT / ".systems")
PYTHON = SYSTEMS_DIR / "langmem" / "bin" / "python"
needs_env = pytest.mark.skipif(
    not PYTHON.exists(),
    reason=f"no LangMem environment at {PYTHON} (set STRUCTMEM_SYSTEMS_DIR; "
           "`python jobs/data.py systems install langmem`)")
pytestmark = [pytest.mark.systems]

CLOCK = "2025-01-01T00:00:00"
DIMS = 16
UNIT = "conv-t"
SPEAKERS = ["Caroline", "Melanie"]
SESSIONS = [
    {"session_index": 1, "session_time": "2023-05-08T13:56:00", "turns": [
        {"event_id": "t:D1:1", "speaker": "Caroline", "text": "I went to a LGBTQ support group yesterday."},
        {"event_id": "t:D1:2", "speaker": "Melanie", "text": "That sounds brave! How did it go?"},
        {"event_id": "t:D1:3", "speaker": "Caroline", "text": "Great, thanks!"}]},
    {"session_index": 2, "session_time": "2023-05-25T09:10:00", "turns": [
        {"event_id": "t:D2:1", "speaker": "Melanie", "text": "I painted a sunrise over the lake last week."},
        {"event_id": "t:D2:2", "speaker": "Caroline", "text": "Lovely! Are you selling your paintings?"}]},
]
LONG = 4  # turns of three words or more: the scripted agent stores one memory for each
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


OFFICIAL = os.environ.get("STRUCTMEM_OFFICIAL_DIR", "")
if not (Path(OFFICIAL) / "mem0.git").exists():
    pytestmark = [*pytestmark, pytest.mark.skip(
        reason="STRUCTMEM_OFFICIAL_DIR holds no mem0.git: the LangMem worker reads the "
               "harness's agent prompt from it (python jobs/data.py official)")]


class Worker:
    def __init__(self, home: Path, name: str) -> None:
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "PYTHONNOUSERSITE": "1", "PYTHONHASHSEED": "0",
               "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
               "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
               "OPENAI_API_KEY": "structmem-local", "STRUCTMEM_WORKER_HOME": str(home),
               # the agent's system message is read from mem0's harness at run time
               "STRUCTMEM_OFFICIAL_DIR": OFFICIAL,
               **SPEC.env}
        self.log = home / f"worker_{name}.log"
        self.proc = subprocess.Popen([str(PYTHON), str(SPEC.worker_path)], env=env, cwd=home,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), text=True)

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"worker died:\n{self.log.read_text()[-3000:]}"
        reply = json.loads(line)
        assert reply["op"] != "error", f"{reply['error']}\n{reply.get('log_tail')}"
        return reply

    def hello(self, **settings: Any) -> dict[str, Any]:
        return self.ask({"op": "hello", "system": "langmem", "clock": CLOCK,
                         "settings": {**SPEC.options, "top_k": 40, **settings}})

    def close(self) -> int:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
        self.proc.stdin.flush()
        code = self.proc.wait(timeout=60)
        assert "network refused" not in self.log.read_text()
        return code


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "home", "a")
    try:
        ready = w.hello()
        assert ready["op"] == "ready" and ready["version"] == "0.0.29", ready
        yield w
    finally:
        assert w.close() == 0


def _request(front: RecordingFront, phase: str, store: Path, **more: Any) -> dict[str, Any]:
    return {"op": phase, "unit": UNIT, "base_url": unit_url(front.url, "langmem", phase, UNIT),
            "model": "scripted", "embed_model": "hash-16", "embed_dims": DIMS,
            "store_dir": str(store), "speakers": SPEAKERS, **more}


def _chat_hashes(rows: Any) -> list[str]:
    return rows.filter(rows["prompt_version"] == "langmem/chat")["messages_hash"].to_list()


def _build(worker: Worker, store: Path, reply: Any = scripted_reply) -> tuple[dict[str, Any], Any]:
    with RecordingFront(ScriptedUpstream(reply), embed=_embed) as front:
        built = worker.ask(_request(front, "build", store, sessions=SESSIONS))
        return built, front.take_rows("system_build")


@needs_env
def test_build_search_in_another_process_and_a_byte_identical_rebuild(tmp_path: Path,
                                                                      worker: Worker) -> None:
    built, rows = _build(worker, tmp_path / "s1")
    mems = built["memories"]
    assert len(mems) == LONG and {m["owner"] for m in mems} == set(SPEAKERS)
    assert all(m["kind"] == "memory" and m["text"] for m in mems)
    assert {m["created_at"] for m in mems} == {s["session_time"] for s in SESSIONS}
    assert built["dropped"] == 0 and built["drops"] == [] and built["no_tool_call"] == 1
    chat = _chat_hashes(rows)
    assert len(chat) == 2 * LONG + 1  # tool call + acknowledgement; one plain reply
    assert rows["error"].null_count() == rows.height  # nothing failed at the front
    assert (tmp_path / "s1" / "langmem_store.json").exists()

    # The search in a fresh process reads the store back from disk: no chat, one embedding
    # per question and speaker.
    other = Worker(tmp_path / "home2", "b")
    try:
        other.hello()
        with RecordingFront(ScriptedUpstream(scripted_reply), embed=_embed) as front:
            found = other.ask(_request(front, "search", tmp_path / "s1", questions=QUESTIONS,
                                       k=40))
            search_rows = front.take_rows("system_search")
    finally:
        assert other.close() == 0
    assert _chat_hashes(search_rows) == []
    assert search_rows.height == len(QUESTIONS) * len(SPEAKERS)
    ids = {m["memory_id"] for m in mems}
    for q in QUESTIONS:
        hits = found["results"][q["question_id"]]
        assert {h["memory_id"] for h in hits} == ids  # k=40 per speaker: all of them
        assert all(isinstance(h["score"], float) and h["kind"] == "memory" for h in hits)
    painted = found["results"][f"{UNIT}:q1"]
    best = max((h for h in painted if h["owner"] == "Melanie"), key=lambda h: h["score"])
    assert "painted" in best["text"]

    # A rebuild into a fresh store (same worker, ids seeded per unit, clock frozen): the same
    # chat bodies byte for byte, the same memory ids.
    rebuilt, rows2 = _build(worker, tmp_path / "s2")
    assert _chat_hashes(rows2) == chat
    assert rebuilt["memories"] == mems


@needs_env
def test_thread_per_message_sends_no_history(tmp_path: Path) -> None:
    w = Worker(tmp_path / "home", "m")
    try:
        assert w.hello(thread="message")["thread"] == "message"
        bodies: list[Mapping[str, Any]] = []

        def record(body: Mapping[str, Any]) -> dict[str, Any]:
            bodies.append(body)
            return scripted_reply(body)

        built, _ = _build(w, tmp_path / "s", record)
    finally:
        assert w.close() == 0
    assert len(built["memories"]) == LONG
    # system + user (+ the tool call and its result on the second call): nothing earlier
    assert max(len(b["messages"]) for b in bodies) == 4


Reply = Callable[[Mapping[str, Any]], dict[str, Any]]


def _garble(args: str | None = None, content: str | None = None) -> Reply:
    """The scripted replies with the memory-writing tool calls' arguments replaced (or the
    tool call replaced by text)."""
    def reply(body: Mapping[str, Any]) -> dict[str, Any]:
        good = scripted_reply(body)
        if not good.get("tool_calls"):
            return good
        if content is not None:
            return {"content": content}
        for call in good["tool_calls"]:
            call["function"]["arguments"] = args
        return good
    return reply


GARBLED = {
    "arguments not JSON": (_garble('{"content": "Caroline went to'), "tool_call",
                           f"{TOOL} arguments not JSON"),
    "wrong keys": (_garble('{"items": [{"x": 1}]}'), TOOL, "memory without content"),
    "update without an id": (_garble('{"content": "x", "action": "update"}'), TOOL,
                             "tool raised, not retried"),
    "tool call as text": (_garble(content='{"content": "Caroline went to a group"}'), "agent",
                          "tool call written as text"),
}


@needs_env
@pytest.mark.parametrize("kind", list(GARBLED))
def test_garbled_tool_calls_are_counted_as_dropped(kind: str, tmp_path: Path,
                                                   worker: Worker) -> None:
    reply, where, why = GARBLED[kind]
    built, rows = _build(worker, tmp_path / "s", reply)
    assert built["op"] == "built" and built["memories"] == []
    assert built["dropped"] == LONG, built["drops"]
    assert built["drops"] == [{"where": where, "why": why}] * LONG
    assert rows["error"].null_count() == rows.height


# --- the scripted replies (no environment needed) ------------------------------------------

def _tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": TOOL}},
            {"type": "function", "function": {"name": "search_memory"}}]


def test_scripted_reply_answers_the_agent() -> None:
    user = {"role": "user", "content": "1:56 pm on 8 May, 2023 | Caroline: I went to a LGBTQ "
                                       "support group yesterday."}
    first = scripted_reply({"messages": [{"role": "system", "content": "..."}, user],
                            "tools": _tools()})
    (call,) = first["tool_calls"]
    assert call["function"]["name"] == TOOL and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {
        "content": "Caroline (1:56 pm on 8 May, 2023): I went to a LGBTQ support group "
                   "yesterday.", "action": "create"}
    assert scripted_reply({"messages": [user], "tools": _tools()}) == first  # deterministic
    tool = {"role": "tool", "content": "created memory 1", "tool_call_id": call["id"]}
    assert scripted_reply({"messages": [user, tool], "tools": _tools()}) == {"content": "Noted."}
    short = {"role": "user", "content": "1:56 pm on 8 May, 2023 | Caroline: Great!"}
    assert "tool_calls" not in scripted_reply({"messages": [short], "tools": _tools()})


@needs_env
def test_an_agent_that_never_stops_calling_tools_is_a_drop(tmp_path: Path) -> None:
    """A model that keeps searching hits LangGraph's recursion limit (GraphRecursionError):
    the message's memory is lost, the unit goes on."""
    def searching(body: Mapping[str, Any]) -> dict[str, Any]:
        n = len(body["messages"])
        return {"tool_calls": [{"id": f"call_s{n}", "type": "function", "function": {
            "name": "search_memory", "arguments": json.dumps({"query": "support group"})}}]}

    w = Worker(tmp_path / "home", "r")
    try:
        w.hello(recursion_limit=5)
        built, _ = _build(w, tmp_path / "s", searching)
    finally:
        assert w.close() == 0
    n = sum(len(s["turns"]) for s in SESSIONS)
    assert built["memories"] == [] and built["dropped"] == n
    assert built["drops"] == [{"where": "agent", "why": "recursion limit"}] * n
    assert built["no_tool_call"] == 0
