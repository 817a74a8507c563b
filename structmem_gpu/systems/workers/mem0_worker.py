"""Mem0 worker: `<systems_dir>/mem0/bin/python mem0_worker.py` (systems/protocol.py).

Runs mem0ai's open-source `Memory` from its own environment. Every LLM and embedding call
goes to the request's `base_url` (the job's recording front). Settings (hello's `settings`):
`graph` (Mem0^g: Kùzu graph store), `batch_size` (messages per add(), 2 as in mem0's
evaluation add.py), `top_k` (10), `add_attempts` (3, as add.py retries).

Feeding follows mem0's evaluation harness (evaluation/src/memzero/add.py): per speaker a user
id, each session's turns as "<speaker>: <text>" with role "user" for that speaker's turns and
"assistant" for the other's, `batch_size` messages per add(), metadata {"timestamp": session
time}. The harness adds both speakers in two threads; here speaker A then B, so the seeded ids
and the request order are the same on every run.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "mem0"
ALL = 10**6  # get_all's limit (mem0 defaults to 100; a LoCoMo conversation makes more)

# mem0 1.0.5 logs these and goes on without the memories (mem0/memory/main.py
# Memory._add_to_vector_store, mem0/memory/kuzu_memory.py MemoryGraph._retrieve_nodes_from_data).
_MAIN, _KUZU = "mem0.memory.main", "mem0.memory.kuzu_memory"
DROP_RULES = [
    (_MAIN, "Error in new_retrieved_facts", "facts", "reply not parsed"),
    (_MAIN, "Error in new memory actions response", "update", "call failed"),
    (_MAIN, "Empty response from LLM, no memories to extract", "update", "empty reply"),
    (_MAIN, "Invalid JSON response", "update", "reply not JSON"),
    (_MAIN, "Error iterating new_memories_with_actions", "update", "reply not a memory list"),
    (_MAIN, "Error processing memory action", "update", "action failed (unknown id?)"),
    (_MAIN, "Skipping memory entry because of empty `text` field", "update", "action without text"),
    (_KUZU, "Error in search tool", "graph", "entity tool call not parsed"),
]
CALL_FAILED = {"where": "update", "why": "call failed"}  # mem0 swallows the exception, then
EMPTY_REPLY = {"where": "update", "why": "empty reply"}  # logs "Empty response" for it too
# Logged (DEBUG) after every add() whose facts list came out empty: a parsed `{"facts": []}`,
# an empty reply or one not parsed (that one is also a drop). Not a drop by itself (a batch may
# hold no fact): reported as `empty_facts`.
EMPTY_FACTS = [(_MAIN, "No new facts retrieved from input", "facts", "no facts")]

_state: dict[str, Any] = {"settings": {}, "mem0": None, "drops": None, "empty": None}


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["mem0"] is not None:
        return {}  # a second hello: mem0 is imported, its prompts fixed
    _state["settings"] = dict(req.get("settings") or {})
    clock = req.get("clock")
    if not clock:
        raise ValueError("hello needs a clock (mem0 puts today's date into its prompts)")
    wc.freeze_clock(str(clock))
    os.environ["MEM0_TELEMETRY"] = "False"  # read once, at mem0's import
    os.environ.pop("OPENROUTER_API_KEY", None)  # else mem0's LLM goes to OpenRouter
    if not os.environ.get("MEM0_DIR"):
        # mem0 creates config.json and a second qdrant store (migrations_qdrant, locked by its
        # process) there at import, so one directory per worker process: under the job's
        # worker home by slot (a restarted worker reuses its dead predecessor's), else a
        # temporary one (no store_dir is known before the import).
        home = os.environ.get("STRUCTMEM_WORKER_HOME")
        slot = os.environ.get("STRUCTMEM_WORKER_SLOT") or os.getpid()
        if home:
            d = str(Path(home) / f"mem0_dir_{slot}")
        else:
            d = tempfile.mkdtemp(prefix="structmem_mem0_")
            atexit.register(shutil.rmtree, d, True)
        os.environ["MEM0_DIR"] = d
    Path(os.environ["MEM0_DIR"]).mkdir(parents=True, exist_ok=True)
    wc.refuse_network()
    import mem0
    from mem0 import Memory

    _state["mem0"] = Memory
    _state["drops"] = wc.DropCounter(DROP_RULES)
    _state["empty"] = wc.DropCounter(EMPTY_FACTS)
    main_log = logging.getLogger(_MAIN)
    main_log.setLevel(logging.DEBUG)  # to see EMPTY_FACTS; the stderr handler stays at INFO
    main_log.addHandler(_state["empty"])
    for name in (_MAIN, _KUZU):
        logging.getLogger(name).addHandler(_state["drops"])
    return {"version": mem0.__version__,
            "graph": bool(_state["settings"].get("graph", False))}


def _safe(unit: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", unit)


def _user_id(speaker: str, unit: str) -> str:
    return f"{speaker}_{unit}"  # add.py: f"{speaker}_{idx}"


def _open(req: dict[str, Any]) -> Any:
    """One mem0 Memory over this unit's store (build and search use the same config)."""
    store = Path(req["store_dir"])
    store.mkdir(parents=True, exist_ok=True)
    key = "structmem"  # the front needs none; the SDK wants one
    cfg: dict[str, Any] = {
        "llm": {"provider": "openai", "config": {
            "model": req["model"], "openai_base_url": req["base_url"], "api_key": key}},
        "embedder": {"provider": "openai", "config": {
            "model": req["embed_model"], "openai_base_url": req["base_url"], "api_key": key,
            "embedding_dims": int(req["embed_dims"])}},
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": f"mem0_{_safe(str(req['unit']))}", "path": str(store / "qdrant"),
            "on_disk": True, "embedding_model_dims": int(req["embed_dims"])}},
        "history_db_path": str(store / "history.db"),
    }
    if _state["settings"].get("graph"):
        cfg["graph_store"] = {"provider": "kuzu", "config": {"db": str(store / "graph.kuzu")}}
    return _state["mem0"].from_config(cfg)


def _close(m: Any) -> None:
    """Release the unit's stores: qdrant's local mode locks its folder (the next unit's Memory
    reopens MEM0_DIR/migrations_qdrant in this process) and Kùzu holds its file."""
    for store in (getattr(m, "vector_store", None), getattr(m, "_telemetry_vector_store", None)):
        client = getattr(store, "client", None)
        if client is not None:
            client.close()
    if getattr(m, "db", None) is not None:
        m.db.close()
    graph = getattr(m, "graph", None)
    if graph is not None:
        for obj in (getattr(graph, "graph", None), getattr(graph, "db", None)):
            if obj is not None and hasattr(obj, "close"):
                obj.close()


def _add(m: Any, messages: list[dict[str, str]], user_id: str, metadata: dict[str, Any],
         attempts: int) -> list[dict[str, str]]:
    """add.py's add_memory: retried. Returns this batch's drops: those logged by the attempt
    that went through (a failed attempt's are discarded: the batch is tried again), or one
    "add" drop when every attempt raised for a reason other than the front (e.g. Mem0^g's graph
    tool arguments not JSON: mem0 raises) so the unit goes on without that batch."""
    import openai

    why = ""
    for attempt in range(max(1, attempts)):
        _state["drops"].take()
        try:
            m.add(messages, user_id=user_id, metadata=metadata)
            drops = _state["drops"].take()
            if CALL_FAILED in drops and EMPTY_REPLY in drops:
                drops.remove(EMPTY_REPLY)  # mem0 logs a failed update call twice: count once
            return drops
        except openai.APIError:
            raise  # the front or the model server failed: the unit fails, nothing is hidden
        except Exception as e:  # noqa: BLE001 - mem0's own failure on a model reply
            why = f"{type(e).__name__} raised by add() {attempt + 1} times"
            logging.getLogger("structmem.worker").warning(
                "add(%s) attempt %d/%d: %s: %s", user_id, attempt + 1, attempts,
                type(e).__name__, e)
            if attempt + 1 < attempts:
                time.sleep(1)  # as add.py
    _state["drops"].take()
    return [{"where": "add", "why": why}]


def _memory(item: dict[str, Any], owner: str) -> dict[str, Any]:
    meta = dict(item.get("metadata") or {})
    ts = meta.pop("timestamp", None)
    meta.update({k: item.get(k) for k in ("user_id", "hash", "updated_at") if item.get(k)})
    meta["mem0_created_at"] = item.get("created_at")  # mem0's clock (frozen), not the session's
    meta["kind"] = "memory"
    return {"memory_id": str(item["id"]), "owner": owner, "kind": "memory",
            "text": str(item.get("memory", "")), "created_at": ts, "metadata": meta}


def _relation(rel: dict[str, Any], owner: str, user_id: str) -> dict[str, Any]:
    dest = rel.get("destination", rel.get("target"))
    text = f"{rel.get('source')} -- {rel.get('relationship')} -- {dest}"
    return {"memory_id": f"rel:{user_id}:{text}", "owner": owner, "kind": "relation",
            "text": text, "created_at": None,
            "metadata": {"kind": "relation", "user_id": user_id, "source": rel.get("source"),
                         "relationship": rel.get("relationship"), "destination": dest}}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    settings = _state["settings"]
    batch = int(settings.get("batch_size", 2))
    attempts = int(settings.get("add_attempts", 3))
    store = Path(req["store_dir"])
    for old in ("qdrant", "history.db", "graph.kuzu", "graph.kuzu.wal"):  # a rebuild starts empty
        p = store / old
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    speakers = [str(s) for s in req["speakers"]]  # LoCoMo: two; any number works
    users = {s: _user_id(s, unit) for s in speakers}
    _state["empty"].take()
    drops: list[dict[str, str]] = []
    m = _open(req)
    try:
        for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
            own: dict[str, list[dict[str, str]]] = {s: [] for s in speakers}
            for turn in session["turns"]:
                who = str(turn["speaker"])
                if who not in users:
                    raise ValueError(f"{unit}: turn {turn.get('event_id')} by {who!r}, "
                                     f"not one of the speakers {speakers}")
                line = f"{who}: {turn['text']}"
                for speaker in speakers:
                    own[speaker].append({"role": "user" if who == speaker else "assistant",
                                         "content": line})
            meta = {"timestamp": session["session_time"]}
            for speaker in speakers:  # add.py: both at once in two threads
                msgs = own[speaker]
                for i in range(0, len(msgs), batch):
                    drops += _add(m, msgs[i:i + batch], users[speaker], dict(meta), attempts)
        memories = []
        for speaker in speakers:
            got = m.get_all(user_id=users[speaker], limit=ALL)
            memories += [_memory(x, speaker) for x in got.get("results", [])]
            memories += [_relation(r, speaker, users[speaker]) for r in got.get("relations") or []]
    finally:
        _close(m)
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "empty_facts": len(_state["empty"].take())}


def _search(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    k = int(req.get("k") or _state["settings"].get("top_k", 10))
    speakers = [str(s) for s in req["speakers"]]
    results: dict[str, list[dict[str, Any]]] = {}
    drops: list[dict[str, Any]] = []
    m = _open(req)
    try:
        for q in req["questions"]:
            hits: list[dict[str, Any]] = []
            for speaker in speakers:
                uid = _user_id(speaker, unit)
                found = _search_one(m, q["question"], uid, k, drops)
                for x in found.get("results", []):
                    hit = _memory(x, speaker)
                    hit["score"] = x.get("score")
                    hits.append(hit)
                for r in found.get("relations") or []:
                    hit = _relation(r, speaker, uid)
                    hit["score"] = None  # BM25 order, no score
                    hits.append(hit)
            results[str(q["question_id"])] = hits
    finally:
        _close(m)
    return {"op": "found", "unit": unit, "results": results, "calls": 0,
            "dropped": len(drops), "drops": drops}


def _search_one(m: Any, query: str, uid: str, k: int, drops: list[dict[str, Any]]) -> dict[str, Any]:
    """One speaker's search. mem0's graph search raises when the model's entity tool call is
    not JSON (its vector search only logs): then this question gets the vector memories alone
    and the lost relations are counted, as a build drop is. A failure of the call itself
    (openai.APIError: the front or the server) still fails the unit."""
    import openai

    try:
        return m.search(query, user_id=uid, limit=k)
    except openai.APIError:
        raise
    except Exception as err:  # noqa: BLE001 - mem0's graph parsing raises anything (JSON, KeyError)
        if not getattr(m, "enable_graph", False):
            raise
        drops.append({"where": "graph search", "why": f"{type(err).__name__}: {err}"[:200]})
        m.enable_graph = False  # this call only: mem0 reads the flag per search
        try:
            return m.search(query, user_id=uid, limit=k)
        finally:
            m.enable_graph = True


def _version() -> str:
    return wc.package_version("mem0ai")


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, _version())
