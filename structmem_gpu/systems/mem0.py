"""Mem0 (mem0ai 1.0.5, open-source `Memory`) and Mem0^g (the same with its Kùzu graph store).

The worker (systems/workers/mem0_worker.py) feeds a conversation the way mem0's own LoCoMo
harness (evaluation/src/memzero/add.py, search.py) does: one user id per speaker, each
session's turns as "<speaker>: <text>" (the speaker's own turns as role "user", the other's as
"assistant"), `batch_size` messages per `add()`, metadata {"timestamp": session time}; search
takes the top-k memories of each speaker's user id. Differences from that harness: it calls
the hosted platform (MemoryClient, with a project-level custom instruction) while we run the
released open-source `Memory` with its default prompts, and it adds both speakers in parallel
threads while we add them one after the other (seeded ids stay reproducible).

`scripted_reply` answers mem0's own prompts without a model (unit tests, the CI tier): facts
from the user-role lines, ADD for every new fact, graph tool calls built from capitalised words.
Standard library only: this module is imported by our package, not by the worker.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from structmem_gpu.systems.spec import SystemSpec

VERSION = "1.0.5"
REQUIREMENTS = ("mem0ai==1.0.5", "kuzu==0.11.3", "rank-bm25==0.2.2")
ENV = {
    "MEM0_TELEMETRY": "False",  # posthog: off (the worker also forces it before the import)
    # mem0's OpenAI LLM goes to OpenRouter whenever this is set: empty = the front's URL
    "OPENROUTER_API_KEY": "",
}

# What identifies each of mem0's prompts (mem0/configs/prompts.py, mem0/graphs/utils.py and
# the tool names of mem0/graphs/tools.py, as of 1.0.5).
_FACTS_MARK = 'with a key as "facts"'
_UPDATE_MARK = "The new retrieved facts are mentioned in the triple backticks"
_OLD_MEMORY_MARK = "Below is the current content of my memory"
_FACT_WORDS = 12
# Capitalised words that are not entities (sentence starts, pronouns).
_STOP = frozenset([
    "I", "I'm", "I've", "I'd", "I'll", "It", "It's", "The", "A", "An", "And", "But", "So", "Oh",
    "Yes", "No", "Hi", "Hey", "Wow", "That", "This", "What", "When", "Where", "Why", "How",
    "Who", "Which", "Do", "Did", "Does", "Are", "Is", "Was", "Were", "Have", "Has", "Had", "My",
    "Me", "We", "You", "Your", "Our", "They", "Thanks", "Thank", "Sure", "Well", "Really",
    "Just",
])


def _code_block_after(text: str, mark: str) -> str | None:
    """The first ``` ... ``` block after `mark` in `text` (mem0 puts its lists there)."""
    at = text.find(mark)
    if at < 0:
        return None
    m = re.search(r"```\s*\n(.*?)\n\s*```", text[at:], re.DOTALL)
    return m.group(1).strip() if m else None


def _literal(block: str | None) -> Any:
    """mem0 formats its lists with Python's str() (single quotes), not JSON."""
    if not block:
        return []
    try:
        return ast.literal_eval(block)
    except (ValueError, SyntaxError):
        return []


def _facts(user_prompt: str) -> list[str]:
    """One fact per user-role line ("user: <Speaker>: <text>"): the text, first words."""
    facts = []
    for line in user_prompt.splitlines():
        if not line.startswith("user: "):
            continue
        text = line[len("user: "):]
        if re.match(r"^[^:]{1,40}: ", text):
            text = text.split(": ", 1)[1]
        words = text.split()
        if words:
            facts.append(" ".join(words[:_FACT_WORDS]))
    return facts


def _update(prompt: str) -> dict[str, Any]:
    old = _literal(_code_block_after(prompt, _OLD_MEMORY_MARK))
    new = _literal(_code_block_after(prompt, _UPDATE_MARK))
    known = {str(m.get("text")): str(m.get("id")) for m in old if isinstance(m, dict)}
    actions = [{"id": mid, "text": text, "event": "NONE"} for text, mid in known.items()]
    n = len(known)
    for fact in new:
        if str(fact) in known:
            continue
        known[str(fact)] = str(n)
        actions.append({"id": str(n), "text": str(fact), "event": "ADD"})
        n += 1
    return {"memory": actions}


def _entities(text: str) -> list[str]:
    """Speaker names ("Name: ...") and capitalised words, first seen first, at most 6."""
    out: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^([A-Z][\w'-]{0,30}): ", line)
        if m:
            out.append(m.group(1))
    out += [w for w in re.findall(r"\b[A-Z][a-z][\w'-]*", text) if w not in _STOP]
    seen: dict[str, None] = {}
    for e in out:
        seen.setdefault(e.lower(), None)
    return list(seen)[:6]


def _tool_call(i: int, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def scripted_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message for one of mem0's chat bodies (see the module docstring)."""
    messages = body.get("messages") or []
    texts = [str(m.get("content") or "") for m in messages if isinstance(m, Mapping)]
    system = "\n".join(t for m, t in zip(messages, texts) if m.get("role") == "system")
    last = texts[-1] if texts else ""
    tools = {str((t.get("function") or {}).get("name")) for t in body.get("tools") or []}
    if "extract_entities" in tools:
        names = _entities(last)
        ents = [{"entity": e, "entity_type": "person" if i == 0 else "thing"}
                for i, e in enumerate(names)]
        return {"tool_calls": [_tool_call(0, "extract_entities", {"entities": ents})]}
    if tools & {"establish_relationships", "establish_relations"}:
        m = re.search(r"List of entities: (\[.*?\])\.", last, re.DOTALL)
        names = [str(x) for x in _literal(m.group(1))] if m else []
        rels = [{"source": names[0], "relationship": "mentions", "destination": other}
                for other in names[1:]]
        name = ("establish_relationships" if "establish_relationships" in tools
                else "establish_relations")
        return {"tool_calls": [_tool_call(0, name, {"entities": rels})]}
    if "delete_graph_memory" in tools:
        return {"content": "Nothing to delete."}  # no tool call: mem0 deletes nothing
    if _FACTS_MARK in system:
        user = "\n".join(t for m, t in zip(messages, texts) if m.get("role") == "user")
        return {"content": json.dumps({"facts": _facts(user)})}
    if _UPDATE_MARK in last:
        return {"content": json.dumps(_update(last))}
    return {"content": "A scripted reply."}


SPEC = SystemSpec(
    name="mem0",
    title="Mem0",
    requirements=REQUIREMENTS,
    worker="mem0_worker.py",
    source=f"pypi:mem0ai=={VERSION}",
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="top-10 memories per speaker (StructMem A.4; SEEM §5.1: top-10)",
    options={"graph": False},
)

GRAPH_SPEC = SystemSpec(
    name="mem0_graph",
    title="Mem0^g",
    requirements=REQUIREMENTS,
    worker="mem0_worker.py",
    source=f"pypi:mem0ai=={VERSION}",
    env=ENV,
    scripted_reply=scripted_reply,
    paper_settings="Kùzu graph store; top-10 memories (and graph relations) per speaker "
                   "(StructMem A.4; SEEM §5.1: top-10)",
    options={"graph": True},
    shares_env_of="mem0",
)
