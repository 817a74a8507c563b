"""MiniRAG worker: `<systems_dir>/minirag/bin/python minirag_worker.py` (systems/protocol.py).

Runs MiniRAG (its repository at the pinned commit, exported by `systems install minirag` into
`<env>/src`: STRUCTMEM_SYSTEM_SRC) from its own environment with its default storages (JSON
KV, NanoVectorDB, NetworkX), one `working_dir` per unit (the request's store_dir: MiniRAG's
default name holds datetime.now()). Every LLM and embedding call goes to the request's
`base_url` (the job's recording front) through MiniRAG's own OpenAI client functions
(`minirag.llm.openai`). Settings (hello's `settings`): `mode` (QueryParam.mode, "mini"),
`top_k` (20, StructMem A.4), `one_insert` (true).

Feeding: each session is one document, "Session on <session_time>:" then one
"<speaker>: <text>" line per turn, as our LightRAG worker feeds its sibling (MiniRAG takes text
only, so the time goes into the document's first line; MiniRAG's own dialogue data, LiHua-World,
is likewise one document per span of chat). All of a conversation's sessions go to one
`ainsert(documents, ids=...)` call, in conversation order: MiniRAG's `ainsert` extracts the
chunks of *every* document already processed, not only the new ones (minirag.py, "Perform
additional entity extraction"), so one call per session, as its main.py loops over its files,
would send session 1's extraction once per session and merge it again each time (its edge
weights summed anew, its descriptions joined with themselves): the graph would depend on the
number of sessions. `one_insert=false` runs that loop as published.

Build reply: the entities and relations of the unit's graph (kind "entity" / "relation").
Drops (MiniRAG logs nothing for most of them): a session none of whose chunks yielded an
entity (a reply without MiniRAG's records); a record the model meant as an entity or a
relationship that MiniRAG's parser rejected (too few fields, no name, no quotes); a unit
without any relationship (MiniRAG then returns before indexing its entities: nothing is
retrievable); embeddings not one per item (logged and skipped by NanoVectorDB's upsert).
A call that failed at the front fails the unit.

Search reply: one hit per question (kind "context"), the context MiniRAG's "mini" query would
give its answer prompt (`only_need_context=True`); none when MiniRAG found nothing (it returns
None or its fail_response). A keyword reply MiniRAG cannot use is counted (`dropped`) and that
question gets no hit: MiniRAG raises on JSON that is not an object (AttributeError) or names
no entity (an unbound local in `_build_mini_query_context`), and prints and gives up on a reply
json_repair cannot read.

Not installed, stubbed (each raises if called; MiniRAG's build and search never call them):
`minirag.llm.hf` (transformers and torch: imported by `minirag.llm`'s package init, used only
by MiniRAG's local HuggingFace backend), `sentence_transformers`, `rouge` and
`sklearn.feature_extraction.text` (imported by minirag/utils.py for similarity methods the
"mini" query does not select: it calls the default, Levenshtein through nltk, installed).

Offline: tiktoken's o200k_base (gpt-4o-mini's encoding, MiniRAG's chunking and context
budgets) must already be in TIKTOKEN_CACHE_DIR (the job's `prepare`); pipmaster's run-time
installs are replaced by a refusal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "minirag"
API_KEY = "structmem-local"  # the front needs none; the SDK wants one
SEP = "<SEP>"
# What MiniRAG writes into a working_dir (its JSON KV and doc status stores, NanoVectorDB
# files, the NetworkX graph, its log).
STORE_FILES = ("kv_store_*.json", "vdb_*.json", "graph_*.graphml", "minirag.log")  # minirag/prompt.py GRAPH_FIELD_SEP: merged descriptions and source ids

# What MiniRAG logs when it loses what was extracted (minirag/operate.py, kg/nano_vector_db_impl.py).
_MR = "minirag"
LOG_DROP_RULES = [
    (_MR, "Didn't extract any relationships", "index",
     "no relationship in the unit: MiniRAG returned before indexing its entities"),
    (_MR, "embedding is not 1-1 with data", "index", "embeddings not one per item: batch not indexed"),
]
NO_ENTITY = {"where": "extraction", "why": "session without entities (reply not in MiniRAG's format?)"}
ROW_REJECTED = {"where": "extraction", "why": "entity or relationship record rejected by MiniRAG's parser"}

_state: dict[str, Any] = {"settings": {}, "loop": None, "logs": None, "rows": []}


# --------------------------------------------------------------------------- stand-ins


class _Unavailable:
    """A stand-in for something MiniRAG imports but its build and search never use."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._what} is not installed in the minirag environment "
                           "(MiniRAG's build and \"mini\" search do not use it)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self


def _install_stand_ins() -> None:
    mods: list[types.ModuleType] = []

    def module(name: str, **attrs: Any) -> None:
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        mods.append(mod)

    module("minirag.llm.hf", hf_model_complete=_Unavailable("minirag.llm.hf.hf_model_complete"),
           hf_embed=_Unavailable("minirag.llm.hf.hf_embed"))
    module("sentence_transformers",
           SentenceTransformer=_Unavailable("sentence_transformers.SentenceTransformer"))
    module("rouge", Rouge=_Unavailable("rouge.Rouge"))
    module("sklearn")
    module("sklearn.feature_extraction")
    module("sklearn.feature_extraction.text",
           TfidfVectorizer=_Unavailable("sklearn.feature_extraction.text.TfidfVectorizer"))
    for mod in mods:
        sys.modules[mod.__name__] = mod


def _count_rejected_rows() -> None:
    """Wrap MiniRAG's relationship-record parser, which sees every record the entity parser
    did not take: a record whose first field names an entity or a relationship and that it
    rejects too is a row the model meant and MiniRAG dropped without a word."""
    from minirag import operate

    real = operate._handle_single_relationship_extraction

    async def relationship(record_attributes: list[str], chunk_key: str) -> Any:
        got = await real(record_attributes, chunk_key)
        head = str(record_attributes[0] if record_attributes else "").strip().strip("\"'").lower()
        if got is None and head in ("entity", "relationship"):
            _state["rows"].append(dict(ROW_REJECTED, chunk=chunk_key))
        return got

    operate._handle_single_relationship_extraction = relationship


# --------------------------------------------------------------------------- protocol


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["loop"] is not None:
        return {}
    _state["settings"] = dict(req.get("settings") or {})
    wc.freeze_clock(str(req.get("clock") or "2025-01-01T00:00:00"))  # doc status timestamps
    src = os.environ.get("STRUCTMEM_SYSTEM_SRC")
    if not src or not (Path(src) / "minirag" / "minirag.py").exists():
        raise RuntimeError(f"STRUCTMEM_SYSTEM_SRC={src!r} holds no minirag/minirag.py: run "
                           "`python jobs/data.py systems install minirag`")
    wc.require_o200k("structmem_gpu.systems.minirag SPEC.prepare")
    wc.refuse_network()
    wc.refuse_pipmaster("minirag.txt")
    _install_stand_ins()
    sys.path.insert(0, src)
    import minirag
    import minirag.llm.openai  # imported now: a failure shows at hello

    # MiniRAG's logger gets a file handler in the first working_dir it sees (set_logger adds
    # one only while the logger has none): the drop counter is its handler instead, and its
    # records go on to the worker's log.
    mr_log = logging.getLogger(_MR)
    for h in list(mr_log.handlers):
        mr_log.removeHandler(h)
    mr_log.propagate = True
    _state["logs"] = wc.DropCounter(LOG_DROP_RULES)
    mr_log.addHandler(_state["logs"])
    _count_rejected_rows()
    # One loop for the worker's life: MiniRAG's storages keep asyncio locks.
    _state["loop"] = asyncio.new_event_loop()
    asyncio.set_event_loop(_state["loop"])
    return {"version": wc.repository_version(), "package": str(minirag.__version__)}


def _rag(req: dict[str, Any], extra_llm: Any = None) -> Any:
    from functools import partial

    from minirag import MiniRAG
    from minirag.llm.openai import openai_complete_if_cache, openai_embed
    from minirag.utils import EmbeddingFunc

    base_url, model = str(req["base_url"]), str(req["model"])

    async def llm(prompt: str, system_prompt: str | None = None,
                  history_messages: list[dict[str, Any]] | None = None, **kw: Any) -> str:
        reply = await openai_complete_if_cache(model, prompt, system_prompt=system_prompt,
                                               history_messages=history_messages or [],
                                               base_url=base_url, api_key=API_KEY, **kw)
        if extra_llm is not None:
            extra_llm(prompt, reply)
        return reply

    # openai_embed unwrapped (.func): its EmbeddingFunc wrapper declares OpenAI's 1536 dims
    embed = EmbeddingFunc(embedding_dim=int(req["embed_dims"]), max_token_size=8192,
                          func=partial(openai_embed.func, model=str(req["embed_model"]),
                                       base_url=base_url, api_key=API_KEY))
    store = Path(req["store_dir"])
    store.mkdir(parents=True, exist_ok=True)
    return MiniRAG(working_dir=str(store), llm_model_func=llm, llm_model_name=model,
                   embedding_func=embed)


def _document(session: dict[str, Any]) -> str:
    lines = [f"Session on {session['session_time']}:"]
    lines += [f"{t['speaker']}: {t['text']}" for t in session["turns"]]
    return "\n".join(lines)


def _doc_id(session: dict[str, Any]) -> str:
    return f"doc-s{session['session_index']}"


def _name(node: str) -> str:
    return str(node).strip().strip('"')


async def _abuild(req: dict[str, Any]) -> dict[str, Any]:
    from minirag.base import DocStatus

    unit = str(req["unit"])
    store = Path(req["store_dir"])
    # A rebuild starts empty: MiniRAG would load its files and extract their documents again.
    for pattern in STORE_FILES:
        for f in store.glob(pattern):
            f.unlink()
    rag = _rag(req)
    _state["logs"].take()
    _state["rows"].clear()
    sessions = sorted(req["sessions"], key=lambda s: s["session_index"])
    docs, ids = [_document(s) for s in sessions], [_doc_id(s) for s in sessions]
    if _state["settings"].get("one_insert", True):
        await rag.ainsert(docs, ids=ids)
    else:
        for doc, doc_id in zip(docs, ids):
            await rag.ainsert(doc, ids=doc_id)
    for doc_id in ids:
        status = await rag.doc_status.get_by_id(doc_id) or {}
        if status.get("status") != DocStatus.PROCESSED:
            raise RuntimeError(f"{doc_id}: MiniRAG left the document {status.get('status')}")

    graph = rag.chunk_entity_relation_graph._graph
    sourced: set[str] = set()
    for _, data in graph.nodes(data=True):
        sourced.update(str(data.get("source_id") or "").split(SEP))
    chunks = rag.text_chunks._data
    drops: list[dict[str, str]] = []
    for session, doc_id in zip(sessions, ids):
        mine = {k for k, v in chunks.items() if v.get("full_doc_id") == doc_id}
        if not mine & sourced:
            drops.append(dict(NO_ENTITY, session_index=str(session["session_index"])))
    drops += _state["rows"] + _state["logs"].take()
    _state["rows"].clear()

    memories: list[dict[str, Any]] = []
    for node, data in sorted(graph.nodes(data=True), key=lambda n: str(n[0])):
        memories.append({
            "memory_id": f"entity:{node}", "owner": None, "kind": "entity",
            "text": f"{_name(node)}: {data.get('description', '')}", "created_at": None,
            "metadata": {"kind": "entity", "entity_type": _name(data.get("entity_type", ""))}})
    edges = [(*sorted((str(a), str(b))), d) for a, b, d in graph.edges(data=True)]
    for a, b, data in sorted(edges, key=lambda e: (e[0], e[1])):
        memories.append({
            "memory_id": f"relation:{a}|{b}", "owner": None, "kind": "relation",
            "text": f"{_name(a)} -- {data.get('keywords', '')} -- {_name(b)}: "
                    f"{data.get('description', '')}",
            "created_at": None,
            "metadata": {"kind": "relation", "source": _name(a), "target": _name(b),
                         "keywords": data.get("keywords"), "weight": data.get("weight")}})
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops}


def _usable_keywords(reply: str | None) -> bool:
    """Whether MiniRAG's "mini" query can use a keyword reply: json_repair reads an object
    naming at least one entity (else it raises, see the module docstring)."""
    import json_repair

    try:
        data = json_repair.loads(reply or "")
    except Exception:  # noqa: BLE001 - unreadable is unusable
        return False
    if not isinstance(data, dict):
        return False
    entities = data.get("entities_from_query")
    return isinstance(entities, (list, str)) and len(entities) > 0


async def _asearch(req: dict[str, Any]) -> dict[str, Any]:
    from minirag import QueryParam
    from minirag.prompt import PROMPTS

    unit = str(req["unit"])
    if not (Path(req["store_dir"]) / "kv_store_doc_status.json").exists():
        raise FileNotFoundError(f"{req['store_dir']}: no MiniRAG store (build first)")
    k = int(req.get("k") or _state["settings"].get("top_k", 20))
    mode = str(_state["settings"].get("mode", "mini"))
    replies: list[str] = []
    rag = _rag(req, extra_llm=lambda prompt, reply: replies.append(reply))
    results: dict[str, list[dict[str, Any]]] = {}
    drops: list[dict[str, str]] = []
    for q in req["questions"]:
        qid = str(q["question_id"])
        replies.clear()
        param = QueryParam(mode=mode, top_k=k, only_need_context=True)
        try:
            context = await rag.aquery(str(q["question"]), param=param)
        except (AttributeError, UnboundLocalError, TypeError) as e:
            if replies and not _usable_keywords(replies[-1]):
                logging.getLogger("structmem.worker").warning(
                    "%s: keyword reply not usable (%s: %s)", qid, type(e).__name__, e)
                drops.append({"where": "query", "why": "keyword reply without entities: no retrieval"})
                results[qid] = []
                continue
            raise
        if context == PROMPTS["fail_response"]:
            drops.append({"where": "query", "why": "keyword reply not JSON: no retrieval"})
            results[qid] = []
            continue
        if not isinstance(context, str) or not context.strip():
            results[qid] = []  # MiniRAG found nothing (no entity or relation matched)
            continue
        results[qid] = [{"memory_id": f"context:{qid}", "owner": None, "kind": "context",
                         "text": context.strip(), "created_at": None, "score": None}]
    return {"op": "found", "unit": unit, "results": results, "calls": 0,
            "dropped": len(drops), "drops": drops}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"build:{req['unit']}")
    return _state["loop"].run_until_complete(_abuild(req))


def _search(req: dict[str, Any]) -> dict[str, Any]:
    wc.seed_ids(f"search:{req['unit']}")
    return _state["loop"].run_until_complete(_asearch(req))


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, wc.repository_version())
