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

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.systems.langmem import SPEC, TOOL, scripted_reply
from tests.systems.worker_driver import (
    SPEAKERS,
    UNIT,
    Reply,
    WorkerProcess,
    front,
    hashes,
    needs_env,
    needs_official,
    request,
    session,
)

pytestmark = [pytest.mark.systems, needs_official(
    "mem0.git", "the LangMem worker reads the harness's agent prompt from it")]
needs_langmem = needs_env("langmem")

CLOCK = "2025-01-01T00:00:00"
SESSIONS = [
    session(1, "2023-05-08T13:56:00", [
        ("Caroline", "I went to a LGBTQ support group yesterday."),
        ("Melanie", "That sounds brave! How did it go?"),
        ("Caroline", "Great, thanks!")], prefix="t"),
    session(2, "2023-05-25T09:10:00", [
        ("Melanie", "I painted a sunrise over the lake last week."),
        ("Caroline", "Lovely! Are you selling your paintings?")], prefix="t"),
]
LONG = 4  # turns of three words or more: the scripted agent stores one memory for each
QUESTIONS = [{"question_id": f"{UNIT}:q0", "question": "When did Caroline go to the support group?"},
             {"question_id": f"{UNIT}:q1", "question": "What did Melanie paint?"}]


class Worker(WorkerProcess):
    """A LangMem worker (top_k 40) whose log shows no refused network call at its exit."""

    def __init__(self, tmp: Path, name: str) -> None:
        super().__init__(SPEC, tmp, name, clock=CLOCK, settings={"top_k": 40})

    def close(self) -> int:
        code = super().close()
        assert "network refused" not in self.log_text()
        return code


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    with Worker(tmp_path, "a") as w:
        ready = w.hello()
        assert ready["op"] == "ready" and ready["version"] == "0.0.29", ready
        yield w


def _chat(rows: Any) -> list[str]:
    return hashes(rows, "langmem")


def _build(worker: Worker, store: Path, reply: Reply = scripted_reply) -> tuple[dict[str, Any], Any]:
    with front(reply) as f:
        built = worker.ask(request(SPEC, "build", f, store, sessions=SESSIONS))
        return built, f.take_rows("system_build")


@needs_langmem
def test_build_search_in_another_process_and_a_byte_identical_rebuild(tmp_path: Path,
                                                                      worker: Worker) -> None:
    built, rows = _build(worker, tmp_path / "s1")
    mems = built["memories"]
    assert len(mems) == LONG and {m["owner"] for m in mems} == set(SPEAKERS)
    assert all(m["kind"] == "memory" and m["text"] for m in mems)
    assert {m["created_at"] for m in mems} == {s["session_time"] for s in SESSIONS}
    assert built["dropped"] == 0 and built["drops"] == [] and built["no_tool_call"] == 1
    chat = _chat(rows)
    assert len(chat) == 2 * LONG + 1  # tool call + acknowledgement; one plain reply
    assert rows["error"].null_count() == rows.height  # nothing failed at the front
    assert (tmp_path / "s1" / "langmem_store.json").exists()

    # The search in a fresh process reads the store back from disk: no chat, one embedding
    # per question and speaker.
    with Worker(tmp_path, "b") as other:
        assert other.hello()["op"] == "ready"
        with front(SPEC) as f:
            found = other.ask(request(SPEC, "search", f, tmp_path / "s1", questions=QUESTIONS,
                                      k=40))
            search_rows = f.take_rows("system_search")
    assert _chat(search_rows) == []
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
    assert _chat(rows2) == chat
    assert rebuilt["memories"] == mems


@needs_langmem
def test_thread_per_message_sends_no_history(tmp_path: Path) -> None:
    with Worker(tmp_path, "m") as w:
        assert w.hello(thread="message")["thread"] == "message"
        bodies: list[Mapping[str, Any]] = []

        def record(body: Mapping[str, Any]) -> dict[str, Any]:
            bodies.append(body)
            return scripted_reply(body)

        built, _ = _build(w, tmp_path / "s", record)
    assert len(built["memories"]) == LONG
    # system + user (+ the tool call and its result on the second call): nothing earlier
    assert max(len(b["messages"]) for b in bodies) == 4


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


@needs_langmem
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


@needs_langmem
def test_an_agent_that_never_stops_calling_tools_is_a_drop(tmp_path: Path) -> None:
    """A model that keeps searching hits LangGraph's recursion limit (GraphRecursionError):
    the message's memory is lost, the unit goes on."""
    def searching(body: Mapping[str, Any]) -> dict[str, Any]:
        n = len(body["messages"])
        return {"tool_calls": [{"id": f"call_s{n}", "type": "function", "function": {
            "name": "search_memory", "arguments": json.dumps({"query": "support group"})}}]}

    with Worker(tmp_path, "r") as w:
        assert w.hello(recursion_limit=5)["op"] == "ready"
        built, _ = _build(w, tmp_path / "s", searching)
    n = sum(len(s["turns"]) for s in SESSIONS)
    assert built["memories"] == [] and built["dropped"] == n
    assert built["drops"] == [{"where": "agent", "why": "recursion limit"}] * n
    assert built["no_tool_call"] == 0
