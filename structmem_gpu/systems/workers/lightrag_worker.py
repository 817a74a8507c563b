"""LightRAG worker: `<systems_dir>/lightrag/bin/python lightrag_worker.py` (systems/protocol.py).

Runs lightrag-hku's `LightRAG` from its own environment with its default storages (JSON KV,
NanoVectorDB, NetworkX) in each unit's `store_dir`, one `workspace` per unit: LightRAG keeps
process-wide state per workspace (pipeline status, locks), and equal documents of two units in
one workspace are dropped as duplicates. Every LLM and embedding call goes to the request's
`base_url` (the job's recording front). Settings (hello's `settings`): `mode` (QueryParam.mode,
"hybrid" as StructMem A.4), `top_k` (20), `llm_timeout_s` (LightRAG's own default, 240).

Feeding: each session is one document, "Session on <session_time>:" then one
"<speaker>: <text>" line per turn. LightMem's memory_toolkits (the StructMem harness) has no
LightRAG layer; its NaiveRAG layer adds one turn at a time with the session time as metadata.
LightRAG takes text only, so the time goes into the document's first line. Sessions are
inserted one after the other: the graph then grows in conversation order and the merge
prompts (entity summaries) come out the same on every run, so the front's cache answers a rerun.

Build reply: the entities and relations in the unit's graph (kind "entity" / "relation"),
`dropped` = sessions whose extraction yielded no entity (LightRAG marks such a document
processed without a word: a reply without its delimiters) plus rows LightRAG logged and
skipped. Search reply: one hit per question, the context string LightRAG would give its LLM.

Offline: tiktoken's o200k_base (LightRAG's default tokenizer) must already be in
TIKTOKEN_CACHE_DIR (the job's `prepare`, systems/lightrag.py); pipmaster's run-time installs
are replaced by a refusal.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "lightrag"
API_KEY = "structmem-local"  # the front needs none; the SDK wants one

# lightrag 1.5.7 (lightrag/operate.py) logs these and skips the row.
_LR = "lightrag"
ROW_DROP_RULES = [
    (_LR, "LLM output format error; found", "extraction", "row with wrong field count"),
    (_LR, "Entity extraction error", "extraction", "entity row rejected"),
    (_LR, "Relationship extraction error", "extraction", "relation row rejected"),
]
NO_ENTITY = {"where": "extraction", "why": "session without entities (reply not in LightRAG's format?)"}

_state: dict[str, Any] = {"settings": {}, "loop": None, "drops": None}


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["loop"] is not None:
        return {}
    _state["settings"] = dict(req.get("settings") or {})
    wc.freeze_clock(str(req.get("clock") or "2025-01-01T00:00:00"))  # track ids, timestamps
    wc.require_o200k("structmem_gpu.systems.lightrag.prepare()")
    wc.refuse_network()
    wc.refuse_pipmaster("lightrag.txt")
    import lightrag
    import lightrag.llm.openai  # imported now: a failure shows at hello

    # LightRAG's logger does not propagate and prints to the console: send its records to the
    # worker's log (and the error replies' tail) instead.
    lr_log = logging.getLogger(_LR)
    for h in list(lr_log.handlers):
        lr_log.removeHandler(h)
    lr_log.propagate = True
    _state["drops"] = wc.DropCounter(ROW_DROP_RULES)
    lr_log.addHandler(_state["drops"])
    # One loop for the worker's life: LightRAG's shared locks and queues bind to a loop.
    _state["loop"] = asyncio.new_event_loop()
    asyncio.set_event_loop(_state["loop"])
    return {"version": lightrag.__version__}


def _workspace(unit: str) -> str:
    """A directory-safe, unique workspace name per unit."""
    digest = hashlib.sha256(unit.encode()).hexdigest()[:8]
    return re.sub(r"[^A-Za-z0-9_]", "_", unit)[:60] + "_" + digest


def _rag(req: dict[str, Any]) -> Any:
    from functools import partial

    from lightrag import LightRAG
    from lightrag.llm.openai import openai_complete_if_cache, openai_embed
    from lightrag.utils import EmbeddingFunc

    base_url, model = str(req["base_url"]), str(req["model"])

    async def llm(prompt: str, system_prompt: str | None = None,
                  history_messages: list[dict[str, Any]] | None = None, **kw: Any) -> str:
        return await openai_complete_if_cache(model, prompt, system_prompt=system_prompt,
                                              history_messages=history_messages,
                                              base_url=base_url, api_key=API_KEY, **kw)

    # openai_embed unwrapped (.func, as LightRAG's README does): no max_token_size, so it does
    # not ask tiktoken for the embedding model's encoding (a cl100k download).
    embed = EmbeddingFunc(embedding_dim=int(req["embed_dims"]),
                          func=partial(openai_embed.func, model=str(req["embed_model"]),
                                       base_url=base_url, api_key=API_KEY))
    store = Path(req["store_dir"])
    store.mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {}
    if _state["settings"].get("llm_timeout_s"):
        extra["default_llm_timeout"] = int(_state["settings"]["llm_timeout_s"])
    return LightRAG(working_dir=str(store), workspace=_workspace(str(req["unit"])),
                    llm_model_func=llm, llm_model_name=model, embedding_func=embed, **extra)


async def _close(rag: Any) -> None:
    """Flush the unit's storages, then drop LightRAG's process-wide state (its JSON stores'
    data, pipeline status and locks live in module globals keyed by workspace, not by
    working_dir): a later unit, or the same unit rebuilt into a fresh store_dir, starts from
    its files alone instead of seeing this one's documents as duplicates. The next LightRAG()
    initializes the shared state again."""
    from lightrag.kg.shared_storage import finalize_share_data

    try:
        await rag.finalize_storages()
    finally:
        finalize_share_data()


def _document(session: dict[str, Any]) -> str:
    lines = [f"Session on {session['session_time']}:"]
    lines += [f"{t['speaker']}: {t['text']}" for t in session["turns"]]
    return "\n".join(lines)


async def _abuild(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    rag = _rag(req)
    drops: list[dict[str, str]] = []
    memories: list[dict[str, Any]] = []
    try:
        await rag.initialize_storages()
        _state["drops"].take()
        for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
            doc_id = f"doc-{_workspace(unit)}-s{session['session_index']}"
            await rag.ainsert(_document(session), ids=doc_id)
            status = await rag.doc_status.get_by_id(doc_id) or {}
            state = getattr(status.get("status"), "value", status.get("status"))
            if state != "processed":
                # LightRAG logs a failed call (the front, the model server: after its own
                # retries) and marks the document failed: the unit fails, nothing is hidden
                raise RuntimeError(f"session {session['session_index']}: LightRAG left the "
                                   f"document {state}: {status.get('error_msg') or status}")
            got = await rag.full_entities.get_by_id(doc_id) or {}
            if not got.get("count"):
                drops.append(dict(NO_ENTITY, session_index=str(session["session_index"])))
        drops += _state["drops"].take()
        graph = rag.chunk_entity_relation_graph
        for node in sorted(await graph.get_all_nodes(), key=lambda n: str(n["id"])):
            memories.append({
                "memory_id": f"entity:{node['id']}", "owner": None, "kind": "entity",
                "text": f"{node['id']}: {node.get('description', '')}", "created_at": None,
                "metadata": {"kind": "entity", "entity_type": node.get("entity_type")}})
        for edge in sorted(await graph.get_all_edges(),
                           key=lambda e: (str(e["source"]), str(e["target"]))):
            memories.append({
                "memory_id": f"relation:{edge['source']}|{edge['target']}", "owner": None,
                "kind": "relation",
                "text": f"{edge['source']} -- {edge.get('keywords', '')} -- {edge['target']}: "
                        f"{edge.get('description', '')}",
                "created_at": None,
                "metadata": {"kind": "relation", "source": edge["source"],
                             "target": edge["target"], "keywords": edge.get("keywords")}})
    finally:
        await _close(rag)
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops}


async def _asearch(req: dict[str, Any]) -> dict[str, Any]:
    from lightrag import QueryParam
    from lightrag.prompt import PROMPTS

    unit = str(req["unit"])
    k = int(req.get("k") or _state["settings"].get("top_k", 20))
    mode = str(_state["settings"].get("mode", "hybrid"))
    rag = _rag(req)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        await rag.initialize_storages()
        for q in req["questions"]:
            # no reranker is configured: enable_rerank off says so instead of a warning a query
            param = QueryParam(mode=mode, top_k=k, only_need_context=True, enable_rerank=False)
            context = str(await rag.aquery(str(q["question"]), param=param) or "")
            qid = str(q["question_id"])
            # Nothing retrieved: LightRAG returns its fail_response ("Sorry, I'm not able to
            # provide an answer ... [no-context]") as the context; that is no memory.
            if not context.strip() or context == PROMPTS["fail_response"]:
                results[qid] = []
                continue
            results[qid] = [{"memory_id": f"context:{qid}", "owner": None, "kind": "context",
                             "text": context, "created_at": None, "score": None}]
    finally:
        await _close(rag)
    return {"op": "found", "unit": unit, "results": results, "calls": 0}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"build:{req['unit']}")
    return _state["loop"].run_until_complete(_abuild(req))


def _search(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"search:{req['unit']}")
    return _state["loop"].run_until_complete(_asearch(req))


def _version() -> str:
    return wc.package_version("lightrag-hku")


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, _version())
