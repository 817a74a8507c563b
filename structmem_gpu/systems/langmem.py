"""LangMem (langmem 0.0.29, LangChain's memory tools on a LangGraph store) as LangMem's row.

The worker (systems/workers/langmem_worker.py) runs LangMem the way mem0's evaluation harness
runs it (evaluation/src/langmem.py): per speaker one LangGraph ReAct agent with LangMem's
`manage_memory` and `search_memory` tools over its own in-memory store (namespace
("memories",), embedding index), one conversation thread; every message goes to its speaker's
agent as one user message "<date> | <speaker>: <text>", and the agent decides with tool calls
what to store. The harness then asks each agent the question and hands the agents' replies to
its answer prompt; we take the store's own search instead (the memories the agent's prompt
gets, top-k per speaker: StructMem A.4's top-40) and our reader answers from them.

Every chat call of this system carries tools (the agent's model is bound to both tools), so
the front must answer tool calls. `scripted_reply` answers without a model (unit tests, the CI
tier): a message's first reply creates one memory from the message's words, the reply after a
tool result is a short acknowledgement (no tool call: the agent's turn ends).
Standard library only: this module is imported by our package, not by the worker.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

VERSION = "0.0.29"
REQUIREMENTS = (f"langmem=={VERSION}", "langchain-openai")  # resolved: langchain-openai 0.3.35
ENV = {
    # LangSmith tracing off (langchain reads both names); the worker forces them too
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
}

TOOL = "manage_memory"  # langmem.create_manage_memory_tool's default name
_FACT_WORDS = 12
# "<date> | <speaker>: <text>": the message the worker sends its speaker's agent
_MESSAGE = re.compile(r"^(?P<date>[^|\n]*?)\s*\|\s*(?P<speaker>[^:\n]{1,60}?):\s*(?P<text>.*)$",
                      re.DOTALL)


def _tool_names(body: Mapping[str, Any]) -> set[str]:
    return {str((t.get("function") or {}).get("name")) for t in body.get("tools") or []}


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content or "")


def _memory(message: str) -> str | None:
    """The memory a message makes: its speaker, date and first words (None: too short)."""
    m = _MESSAGE.match(message.strip())
    speaker, date, text = (m["speaker"], m["date"], m["text"]) if m else ("", "", message)
    words = text.split()
    if len(words) < 3:
        return None  # chit-chat: nothing to remember (the agent answers without a tool)
    head = " ".join(words[:_FACT_WORDS])
    who = f"{speaker} ({date})" if date else speaker
    return f"{who}: {head}" if who else head


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """A deterministic reply to one of LangMem's agent calls (see the module docstring)."""
    messages = list(body.get("messages") or [])
    last = messages[-1] if messages else {}
    if TOOL not in _tool_names(body):
        return {"content": "A scripted reply."}
    if last.get("role") == "user":
        memory = _memory(_text(last))
        if memory is None:
            return {"content": "Nice to hear."}
        call_id = "call_" + hashlib.sha256(_text(last).encode()).hexdigest()[:16]
        return {"tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": TOOL,
                         "arguments": json.dumps({"content": memory, "action": "create"})}}]}
    if last.get("role") == "tool":
        return {"content": "Noted."}
    return {"content": "OK."}


SPEC = SystemSpec(
    name="langmem",
    title="LangMem",
    requirements=REQUIREMENTS,
    worker="langmem_worker.py",
    source=f"pypi:langmem=={VERSION}",
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="top-40 memories per speaker (StructMem A.4: A-Mem/LangMem top-40)",
    # harness: where the worker reads the agent's system prompt at run time (mem0's evaluation
    # code for LangMem, at the pinned commit under paths.official_dir; never copied here).
    options={"thread": "conversation",
             "harness": "mem0.git@b3ede5b7c0ac0e847b03786a603c107ac943b3ee:evaluation/src/langmem.py"},
)
