"""LangMem worker: `<systems_dir>/langmem/bin/python langmem_worker.py` (systems/protocol.py).

Runs langmem's released tools from its own environment, the way mem0's evaluation harness
runs LangMem (evaluation/src/langmem.py): per speaker a LangGraph ReAct agent
(`langgraph.prebuilt.create_react_agent`, model "openai:<model>") with LangMem's
`create_manage_memory_tool` and `create_search_memory_tool` on the namespace ("memories",),
its own `InMemoryStore` with an embedding index and its own checkpointer; the system message
of every model call carries the store's search for the latest message (the harness's prompt
function: a helpful-assistant line and the memories between <memories> tags). Each turn of the
conversation, in order, is one `invoke` of its speaker's agent with the user message
"<date> | <speaker>: <text>" (the harness's "<timestamp> | <speaker>: <text>", the date written
as LoCoMo writes it); the agent decides with tool calls what to store. Every LLM and
embedding call goes to the request's `base_url` (the job's recording front); the embeddings
client sends strings (`check_embedding_ctx_length=False`: no tiktoken download, and the front
refuses token ids).

Settings (hello's `settings`): `thread` = "conversation" (the harness: one thread per
conversation, so each agent's history grows with every message), "session" (a new thread per
session) or "message" (no history); `top_k` (40); `recursion_limit` (LangGraph's 25).

Search: per question, each speaker's store searched for the question (`store.search`, the
call the harness's prompt function makes), top-k per speaker with cosine scores. The harness
then lets each agent answer and feeds those answers to its answer prompt; we hand the
memories to our reader instead.

Persistence: `InMemoryStore` has no directory, so after the build the worker writes each
speaker's items (key, value, LangGraph's timestamps, the stored embedding vectors) and what it
recorded about them (the session that created and updated each) to
`<store_dir>/langmem_store.json`; the search reloads them into a fresh `InMemoryStore` with the
same index (no embedding is recomputed: the search sends one embedding per question and
speaker).

Drops (LangMem swallows these silently; counted from the agent's messages and the store after
each invoke): a tool call whose arguments are not JSON (langchain-openai files it under
`invalid_tool_calls`, the tool node never runs it, the agent's turn ends); a `manage_memory`
call that raised (wrong action, an id for "create", none for "update"; or a call of a tool
that does not exist) with no successful `manage_memory` call after it in the same invoke; a
memory stored without content (wrong argument names: the tool's `content` defaults to None
and `{"content": null}` is stored, then left out of memories and hits); a reply that writes
a tool call as text (JSON in the content, no tool call); an agent loop that hit the recursion
limit. A plain reply without a tool call is the agent's choice to
store nothing: reported as `no_tool_call`, not a drop.

Determinism: the clock is frozen (LangGraph stamps items with `datetime.now`, and the prompt
shows them), ids are seeded per unit (`manage_memory` draws its memory keys from
`uuid.uuid4()`, and the tool's reply "created memory <key>" is in the next request), and
`max_concurrency=1` makes parallel tool calls run one after the other in the model's order.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "langmem"
NAMESPACE = ("memories",)  # the harness's namespace (one store per speaker)
STORE_FILE = "langmem_store.json"
STORE_FORMAT = "structmem-langmem-store/1"
TOOL = "manage_memory"
SEARCH_TOOL = "search_memory"
THREADS = ("conversation", "session", "message")

log = logging.getLogger("structmem.worker")
_state: dict[str, Any] = {"settings": {}, "ready": False}


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["ready"]:
        return {}
    _state["settings"] = dict(req.get("settings") or {})
    _state["template"] = harness_template(str(_state["settings"]["harness"]))
    thread = str(_state["settings"].get("thread", "conversation"))
    if thread not in THREADS:
        raise ValueError(f"settings.thread={thread!r}: expected one of {THREADS}")
    clock = req.get("clock")
    if not clock:
        raise ValueError("hello needs a clock (LangGraph stamps items with datetime.now())")
    # pydantic.v1 (imported by langchain-core) subclasses `date` with its own metaclass at
    # import, which the frozen `date` class's metaclass conflicts with: import it first (it
    # only parses dates; nothing of it reads the clock).
    import pydantic.v1  # noqa: F401

    wc.freeze_clock(str(clock))
    for var in ("LANGCHAIN_TRACING_V2", "LANGSMITH_TRACING", "LANGCHAIN_TRACING"):
        os.environ[var] = "false"  # LangSmith: nothing leaves the worker
    for var in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_ORG_ID", "OPENAI_ORGANIZATION",
                "OPENAI_PROXY"):
        os.environ.pop(var, None)  # the request's base_url, nothing from the environment
    wc.refuse_network()
    import langmem  # after the clock freeze and the network switch
    from langchain.chat_models import init_chat_model
    from langchain_openai import OpenAIEmbeddings
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.config import get_store
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent
    from langgraph.store.base import Item
    from langgraph.store.memory import InMemoryStore

    _state.update(langmem=langmem, init_chat_model=init_chat_model,
                  embeddings=OpenAIEmbeddings, saver=InMemorySaver, get_store=get_store,
                  recursion=GraphRecursionError, react=create_react_agent, item=Item,
                  store=InMemoryStore, ready=True)
    return {"version": _version(), "thread": thread}


# --- the harness's steps -----------------------------------------------------------------


def _when(value: Any) -> dt.datetime | None:
    """The session's date: ISO (our payloads) or LoCoMo's "1:56 pm on 8 May, 2023"."""
    if not value:
        return None
    text = str(value).strip()
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            return dt.datetime.strptime(text, "%I:%M %p on %d %B, %Y")
        except ValueError:
            return None


def _stamp(value: Any) -> str:
    """The date as LoCoMo's files write it (the harness's `timestamp` field)."""
    when = _when(value)
    if when is None:
        return str(value or "")
    hour = when.hour % 12 or 12
    return (f"{hour}:{when.minute:02d} {'am' if when.hour < 12 else 'pm'} on {when.day} "
            f"{when.strftime('%B')}, {when.year}")


def harness_template(spec: str) -> str:
    """The agent's system message as mem0's evaluation harness writes it (its f-string with one
    `{memories}` field), read at run time from the official checkout: `spec` is
    "<repo>@<commit>:<path>" under $STRUCTMEM_OFFICIAL_DIR."""
    import re
    import subprocess

    repo_commit, _, path = spec.partition(":")
    repo, _, commit = repo_commit.partition("@")
    where = os.path.join(os.environ.get("STRUCTMEM_OFFICIAL_DIR") or "data/official", repo)
    source = subprocess.run(["git", "-c", f"safe.directory={where}", "-C", where, "show",
                             f"{commit}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    found = re.search(r'system_msg = f"""(.*?)"""', source, re.S)
    if not found or "{memories}" not in found.group(1):
        raise ValueError(f"{spec}: no system_msg f-string with {{memories}} (harness changed?)")
    return found.group(1)


def _prompt(state: dict[str, Any]) -> list[Any]:
    """The system message of every model call: the store's search for the latest message."""
    memories = _state["get_store"]().search(NAMESPACE, query=_content(state["messages"][-1]))
    system = _state["template"].replace("{memories}", str(memories))
    return [{"role": "system", "content": system}, *state["messages"]]


def _content(message: Any) -> str:
    content = getattr(message, "content", "")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p)
                        for p in content)
    return str(content or "")


def _new_store(req: dict[str, Any]) -> Any:
    """The harness's InMemoryStore: an embedding index over the whole value ("$")."""
    embed = _state["embeddings"](
        model=req["embed_model"], base_url=req["base_url"], api_key="structmem",
        check_embedding_ctx_length=False,  # strings, not token ids; no tiktoken download
    )
    return _state["store"](index={"dims": int(req["embed_dims"]), "embed": embed})


def _agent(req: dict[str, Any], store: Any) -> Any:
    from langmem import create_manage_memory_tool, create_search_memory_tool

    model = _state["init_chat_model"](f"openai:{req['model']}", base_url=req["base_url"],
                                      api_key="structmem")  # the front needs no key
    return _state["react"](
        model, prompt=_prompt,
        tools=[create_manage_memory_tool(namespace=NAMESPACE),
               create_search_memory_tool(namespace=NAMESPACE)],
        store=store, checkpointer=_state["saver"]())


def _snapshot(store: Any) -> dict[str, Any]:
    return {k: item.value for k, item in store._data.get(NAMESPACE, {}).items()}


def _empty(value: Any) -> bool:
    content = value.get("content") if isinstance(value, dict) else value
    return content is None or (isinstance(content, str) and not content.strip())


def _looks_like_a_call(text: str) -> bool:
    t = text.strip().strip("`").strip()
    return t.startswith(("{", "[")) or TOOL in t or t.lower().startswith("json")


def _check(new: list[Any], before: dict[str, Any],
           after: dict[str, Any]) -> tuple[list[dict[str, str]], bool]:
    """This invoke's drops, judged from its new messages and the store; and whether the agent
    called no tool at all."""
    drops: list[dict[str, str]] = []
    calls = 0
    failed = False
    for msg in new:
        kind = getattr(msg, "type", "")
        if kind == "ai":
            calls += len(getattr(msg, "tool_calls", None) or [])
            for bad in getattr(msg, "invalid_tool_calls", None) or []:
                calls += 1
                drops.append({"where": "tool_call",
                              "why": f"{bad.get('name') or 'tool'} arguments not JSON"})
        elif kind == "tool" and getattr(msg, "name", "") != SEARCH_TOOL:
            if getattr(msg, "status", "success") == "error":
                failed = True  # manage_memory raised, or a tool of another name was called
            elif getattr(msg, "name", "") == TOOL:
                failed = False  # a later call went through: the model recovered
    if failed:
        drops.append({"where": TOOL, "why": "tool raised, not retried"})
    for key, value in after.items():
        if _empty(value) and (key not in before or before[key] != value):
            drops.append({"where": TOOL, "why": "memory without content"})
    if calls == 0:
        last = next((m for m in reversed(new) if getattr(m, "type", "") == "ai"), None)
        if last is not None and _looks_like_a_call(_content(last)):
            drops.append({"where": "agent", "why": "tool call written as text"})
            return drops, False
    return drops, calls == 0


def _messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation's turns in order, each with its session."""
    out = []
    for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
        stamp = _stamp(session.get("session_time"))
        for turn in session["turns"]:
            text = f"{stamp} | {turn['speaker']}: {turn['text']}"
            out.append({"speaker": str(turn["speaker"]), "text": text,
                        "session_index": int(session["session_index"]),
                        "session_time": session.get("session_time"),
                        "event_id": turn.get("event_id")})
    return out


def _build(req: dict[str, Any]) -> dict[str, Any]:
    import openai

    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    settings = _state["settings"]
    thread = str(settings.get("thread", "conversation"))
    limit = int(settings.get("recursion_limit", 25))
    store_dir = Path(req["store_dir"])
    store_dir.mkdir(parents=True, exist_ok=True)
    (store_dir / STORE_FILE).unlink(missing_ok=True)  # a rebuild starts empty
    speakers = [str(s) for s in req["speakers"]]
    stores = {s: _new_store(req) for s in speakers}
    agents = {s: _agent(req, stores[s]) for s in speakers}
    info: dict[str, dict[str, dict[str, Any]]] = {s: {} for s in speakers}
    history: dict[str, int] = {}  # messages already in each speaker's thread
    drops: list[dict[str, str]] = []
    no_tool = 0
    for msg in _messages(req):
        who = msg["speaker"]
        if who not in agents:
            raise ValueError(f"{unit}: turn {msg['event_id']} by {who!r}, not one of the "
                             f"speakers {speakers}")
        thread_id = {"conversation": f"thread-{unit}",
                     "session": f"thread-{unit}-{msg['session_index']}",
                     "message": f"thread-{unit}-{msg['event_id']}"}[thread]
        config = {"configurable": {"thread_id": thread_id}, "recursion_limit": limit,
                  "max_concurrency": 1}  # parallel tool calls in the model's order
        key = f"{who}\0{thread_id}"
        before = _snapshot(stores[who])
        try:
            out = agents[who].invoke({"messages": [{"role": "user", "content": msg["text"]}]},
                                     config=config)
            new = out["messages"][history.get(key, 0):]
            history[key] = len(out["messages"])
        except openai.APIError:
            raise  # the front or the model server failed: the unit fails, nothing is hidden
        except _state["recursion"]:
            log.warning("%s %s: the agent hit the recursion limit (%d)", unit, msg["event_id"],
                        limit)
            snap = agents[who].get_state(config).values.get("messages", [])
            new = snap[history.get(key, 0):]
            history[key] = len(snap)
            drops.append({"where": "agent", "why": "recursion limit"})
        after = _snapshot(stores[who])
        got, none = _check(new, before, after)
        drops += got
        no_tool += none
        for k, value in after.items():  # which session made or changed each memory
            if k not in before:
                info[who][k] = {"session_time": msg["session_time"],
                                "session_index": msg["session_index"],
                                "event_id": msg["event_id"], "updated": []}
            elif before[k] != value:
                info[who].setdefault(k, {"session_time": None, "updated": []})["updated"].append(
                    {"session_time": msg["session_time"], "event_id": msg["event_id"]})
    _save(store_dir, speakers, stores, info)
    memories = [_memory(item, who, info[who].get(item.key, {}))
                for who in speakers for item in stores[who]._data.get(NAMESPACE, {}).values()
                if not _empty(item.value)]
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "no_tool_call": no_tool}


def _text(value: Any) -> str:
    content = value.get("content") if isinstance(value, dict) else value
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, sort_keys=True)  # a structured memory


def _memory(item: Any, owner: str, made: dict[str, Any]) -> dict[str, Any]:
    meta = {"kind": "memory", "namespace": list(item.namespace),
            "langgraph_created_at": item.created_at.isoformat(),  # the frozen clock
            "langgraph_updated_at": item.updated_at.isoformat(),
            "event_id": made.get("event_id"), "session_index": made.get("session_index"),
            "updated": made.get("updated") or []}
    return {"memory_id": str(item.key), "owner": owner, "kind": "memory",
            "text": _text(item.value), "created_at": made.get("session_time"),
            "metadata": meta}


# --- the store on disk -------------------------------------------------------------------


def _save(store_dir: Path, speakers: list[str], stores: dict[str, Any],
          info: dict[str, dict[str, dict[str, Any]]]) -> None:
    doc = {"format": STORE_FORMAT, "namespace": list(NAMESPACE), "speakers": []}
    for who in speakers:
        store = stores[who]
        vectors = store._vectors.get(NAMESPACE, {})
        items = [{"key": item.key, "value": item.value,
                  "created_at": item.created_at.isoformat(),
                  "updated_at": item.updated_at.isoformat(),
                  "vectors": dict(vectors.get(item.key, {})),
                  "made": info[who].get(item.key, {})}
                 for item in store._data.get(NAMESPACE, {}).values()]
        doc["speakers"].append({"speaker": who, "items": items})
    tmp = store_dir / (STORE_FILE + ".part")
    tmp.write_text(json.dumps(doc, ensure_ascii=False))
    os.replace(tmp, store_dir / STORE_FILE)


def _load(req: dict[str, Any]) -> dict[str, tuple[Any, dict[str, dict[str, Any]]]]:
    """Each speaker's store as the build left it (items and their vectors), and its records."""
    path = Path(req["store_dir"]) / STORE_FILE
    doc = json.loads(path.read_text())
    if doc.get("format") != STORE_FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {STORE_FORMAT!r}")
    out = {}
    for part in doc["speakers"]:
        store = _new_store(req)
        made: dict[str, dict[str, Any]] = {}
        for it in part["items"]:
            store._data[NAMESPACE][it["key"]] = _state["item"](
                value=it["value"], key=it["key"], namespace=NAMESPACE,
                created_at=dt.datetime.fromisoformat(it["created_at"]),
                updated_at=dt.datetime.fromisoformat(it["updated_at"]))
            if it["vectors"]:
                store._vectors[NAMESPACE][it["key"]] = dict(it["vectors"])
            made[it["key"]] = it.get("made") or {}
        out[part["speaker"]] = (store, made)
    return out


def _search(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    k = int(req.get("k") or _state["settings"].get("top_k", 40))
    loaded = _load(req)
    speakers = [str(s) for s in req["speakers"] if str(s) in loaded] or list(loaded)
    results: dict[str, list[dict[str, Any]]] = {}
    for q in req["questions"]:
        hits: list[dict[str, Any]] = []
        for who in speakers:
            store, made = loaded[who]
            for item in store.search(NAMESPACE, query=str(q["question"]), limit=k):
                if _empty(item.value):
                    continue  # counted as dropped at the build; nothing to read
                hit = _memory(item, who, made.get(item.key, {}))
                hit["score"] = item.score
                hits.append(hit)
        results[str(q["question_id"])] = hits
    return {"op": "found", "unit": unit, "results": results, "calls": 0}


def _version() -> str:
    return wc.package_version("langmem")


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, _version())
