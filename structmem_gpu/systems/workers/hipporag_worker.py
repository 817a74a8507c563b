"""HippoRAG 2 worker: `<systems_dir>/hipporag/bin/python hipporag_worker.py` (systems/protocol.py).

Runs hipporag 2.0.0a4's `HippoRAG` from its own environment, one save_dir per unit (the
request's store_dir). Its LLM (OpenIE's NER and triple extraction, the recognition-memory fact
filter) and its embeddings go to the request's `base_url` (the job's recording front): the
embedding model is named "text-embedding-structmem", which makes HippoRAG pick its OpenAI
embedding client; the front serves our encoder whatever the name.

Feeding (SEEM's setting for HippoRAG 2 on LoCoMo: a passage is one dialogue turn, the top-5
chunks are retrieved): every turn becomes one document "<session time> <speaker>: <text>",
all of a conversation's documents go to one `index()` call. A search runs `retrieve(questions,
num_to_retrieve=k)` and returns each retrieved passage as a hit (kind "passage", memory_id =
HippoRAG's chunk id, the md5 of the passage text; score = HippoRAG's doc score: PPR, or the
normalised dense score when no fact survived the filter). Memories: the indexed passages plus
the extracted triples (kind "triple", memory_id = HippoRAG's fact id), read back from the
OpenIE results HippoRAG keeps under save_dir.

Settings (hello's `settings`): `top_k` (5) and any HippoRAG `BaseConfig` field (e.g.
`linking_top_k`, `max_new_tokens`), except the ones the worker sets itself.

Drops: HippoRAG keeps an empty entity or triple list for a reply it cannot parse (a log line at
most, often nothing), and skips triples that are not three items. The worker wraps the OpenIE
instance's `ner` / `triple_extraction` (and the module's triple filter) and counts, per passage,
a reply whose result is empty although the reply is not a well-formed empty answer, and every
triple of another length; at search, a fact-filter reply HippoRAG could not parse (it falls back
to dense retrieval). A call that failed at the front (openai.APIError) fails the unit instead:
HippoRAG would swallow it as an empty extraction.

`hipporag/llm/vllm_offline.py` imports vllm at module level and HippoRAG.py always imports it:
a stub `vllm` package (placeholders that raise if used) is written under the worker's home and
put first on sys.path; the endpoint path never calls it. Nothing is installed into the env.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "hipporag"
EMBED_NAME = "text-embedding-structmem"  # "text-embedding" selects HippoRAG's OpenAI embedder
PASSAGES_FILE = "structmem_passages.json"  # passage id -> speaker, time, event ids (for hits)
# BaseConfig fields the worker sets from the request; settings may not override them.
_OURS = frozenset({"save_dir", "llm_name", "llm_base_url", "embedding_model_name",
                   "embedding_base_url", "azure_endpoint", "azure_embedding_endpoint",
                   "openie_mode"})
VLLM_STUB = '''"""structmem: a stand-in for vllm (hipporag imports it at module level; its endpoint
path never calls it). Written by hipporag_worker.py, never installed."""


class _Absent:
    def __init__(self, *args, **kwargs):
        raise ImportError("vllm is not installed (structmem's stub): HippoRAG's offline vLLM "
                          "mode is not supported")


SamplingParams = LLM = _Absent
'''

log = logging.getLogger("structmem.worker")
_state: dict[str, Any] = {"settings": {}, "HippoRAG": None, "BaseConfig": None}


class _Unit:
    """What one build/search saw: drops, and calls that failed at the front."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drops: list[dict[str, str]] = []
        self.api_errors: list[str] = []
        self.local = threading.local()  # the passage whose triples are being filtered

    def drop(self, where: str, why: str, passage: str | None = None) -> None:
        d = {"where": where, "why": why}
        if passage:
            d["passage"] = passage
        with self.lock:
            self.drops.append(d)


_unit: _Unit | None = None


# --------------------------------------------------------------------------- hello


def _vllm_stub_dir() -> Path:
    """A folder holding the vllm stub package: under the worker home (shared by the pool's
    workers: written atomically, once), else a temporary one."""
    home = os.environ.get("STRUCTMEM_WORKER_HOME")
    root = Path(home) / "hipporag_stub" if home else Path(tempfile.mkdtemp(prefix="hipporag_stub_"))
    pkg = root / "vllm"
    init = pkg / "__init__.py"
    if not init.is_file() or init.read_text() != VLLM_STUB:
        pkg.mkdir(parents=True, exist_ok=True)
        tmp = pkg / f".__init__.{os.getpid()}.tmp"
        tmp.write_text(VLLM_STUB)
        os.replace(tmp, init)
    return root


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    if _state["HippoRAG"] is not None:
        return {}
    _state["settings"] = dict(req.get("settings") or {})
    wc.refuse_network()
    # Libraries that cannot be imported after the freeze, imported before it (none reads the
    # clock at import; HippoRAG itself calls no datetime function at all):
    # - pydantic.v1 (openai 1.91's _compat) defines `class ConstrainedDate(date,
    #   metaclass=ConstrainedNumberMeta)`: against the frozen `date` (which has its own
    #   metaclass) that is a metaclass conflict;
    # - pandas and pyarrow's Cython modules import `datetime.date/datetime` as C types by module
    #   attribute: the frozen subclasses (a larger struct) make pyarrow warn "size changed" and
    #   pandas hang at import (pyarrow.dataset: imported when HippoRAG reads its parquet stores).
    import pandas  # noqa: F401
    import pyarrow.dataset
    import pyarrow.parquet  # noqa: F401
    import pydantic.v1  # noqa: F401
    wc.freeze_clock(str(req.get("clock") or "2025-01-01T00:00:00"))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read at litellm's import
    os.environ.setdefault("OPENAI_API_KEY", "structmem-local")  # the SDK wants one
    # First on the path: a real vllm, if someone installed one, is not imported either
    sys.path.insert(0, str(_vllm_stub_dir()))
    from hipporag import HippoRAG
    from hipporag.utils.config_utils import BaseConfig

    _state["HippoRAG"], _state["BaseConfig"] = HippoRAG, BaseConfig
    fields = {f.name for f in dataclasses.fields(BaseConfig)}
    unknown = sorted(k for k in _state["settings"] if k != "top_k" and k not in fields)
    if unknown or _OURS & set(_state["settings"]):
        raise ValueError(f"settings {unknown or sorted(_OURS & set(_state['settings']))}: "
                         f"expected top_k or a HippoRAG BaseConfig field other than {sorted(_OURS)}")
    return {"version": _version()}


# --------------------------------------------------------------------------- one HippoRAG


def _config(req: dict[str, Any]) -> Any:
    cfg = _state["BaseConfig"]()
    for key, value in _state["settings"].items():
        if key != "top_k":
            setattr(cfg, key, value)
    cfg.save_dir = str(Path(req["store_dir"]))
    cfg.llm_name = str(req["model"])
    cfg.llm_base_url = str(req["base_url"])
    cfg.embedding_model_name = EMBED_NAME
    cfg.embedding_base_url = str(req["base_url"])
    return cfg


def _is_api_error(e: BaseException) -> bool:
    """An openai.APIError, also inside tenacity's RetryError (HippoRAG's infer retries)."""
    import openai

    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, openai.APIError):
            return True
        last = getattr(e, "last_attempt", None)  # tenacity.RetryError
        nxt = last.exception() if last is not None and last.failed else None
        e = nxt or e.__cause__ or e.__context__
        seen += 1
    return False


def _guard_infer(fn: Callable[..., Any]) -> Callable[..., Any]:
    def infer(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if _unit is not None and _is_api_error(e):
                with _unit.lock:
                    _unit.api_errors.append(f"{type(e).__name__}: {e}")
            raise
    return infer


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None


def _says_empty(reply: str, key: str) -> bool:
    """Whether `reply` holds an object {key: []}: a well-formed empty answer, not a lost one."""
    for m in re.finditer(r"\{\s*[\"']" + re.escape(key) + r"[\"']\s*:", reply or ""):
        end = reply.find("}", m.end())
        while end >= 0:
            value = _literal(reply[m.start():end + 1])
            if isinstance(value, dict) and key in value:
                return value[key] == []
            end = reply.find("}", end + 1)
    return False


def _open(req: dict[str, Any]) -> Any:
    """One HippoRAG over the unit's save_dir, its LLM calls guarded and its OpenIE counted."""
    from hipporag.information_extraction import openie_openai

    rag = _state["HippoRAG"](global_config=_config(req))
    guarded = _guard_infer(rag.llm_model.infer)
    rag.llm_model.infer = guarded  # OpenIE calls self.llm_model.infer
    rag.rerank_filter.llm_infer_fn = guarded  # the filter bound it at construction
    ie = rag.openie
    ner, triples = ie.ner, ie.triple_extraction

    def count_empty(out: Any, found: Any, where: str, key: str, chunk_key: str) -> Any:
        """An empty extraction is a drop unless the reply said so itself (an empty list)."""
        if not found and _unit is not None:
            if out.metadata.get("error"):
                _unit.drop(where, "reply not parsed", chunk_key)
            elif not _says_empty(str(out.response or ""), key):
                _unit.drop(where, f"no {key} list in the reply", chunk_key)
        return out

    def counted_ner(chunk_key: str, passage: str) -> Any:
        out = ner(chunk_key, passage)
        return count_empty(out, out.unique_entities, "ner", "named_entities", chunk_key)

    def counted_triples(chunk_key: str, passage: str, named_entities: list[str]) -> Any:
        if _unit is not None:
            _unit.local.passage = chunk_key
        try:
            out = triples(chunk_key, passage, named_entities)
        finally:
            if _unit is not None:
                _unit.local.passage = None
        return count_empty(out, out.triples, "triples", "triples", chunk_key)

    ie.ner, ie.triple_extraction = counted_ner, counted_triples
    if not getattr(openie_openai, "_structmem_counted", False):
        real_filter = openie_openai.filter_invalid_triples

        def counted_filter(triples: list[Any]) -> list[Any]:
            # HippoRAG skips a triple that is not three items, silently
            passage = getattr(_unit.local, "passage", None) if _unit is not None else None
            if passage:
                for t in triples:
                    if not isinstance(t, (list, tuple)) or len(t) != 3:
                        _unit.drop("triples", "triple not of 3 items", passage)
            return real_filter(triples)

        openie_openai.filter_invalid_triples = counted_filter
        openie_openai._structmem_counted = True

    parse = rag.rerank_filter.parse_filter

    def counted_parse(response: str) -> Any:
        facts = parse(response)
        if not facts and _unit is not None:
            section = str(response or "").split("[[ ## fact_after_filter ## ]]", 1)
            body = section[1].split("[[ ## ", 1)[0].strip() if len(section) == 2 else ""
            value = _literal(body)
            if not (isinstance(value, dict) and value.get("fact") == []):
                _unit.drop("rerank", "fact filter reply not parsed (dense retrieval instead)")
        return facts

    rag.rerank_filter.parse_filter = counted_parse
    return rag


def _close(rag: Any) -> None:
    """Release the unit's HTTP clients (HippoRAG writes its stores as it goes: parquet files,
    the graph pickle, the OpenIE JSON; its SQLite LLM cache opens per call)."""
    for client in (getattr(getattr(rag, "llm_model", None), "openai_client", None),
                   getattr(getattr(rag, "embedding_model", None), "client", None)):
        if client is not None and hasattr(client, "close"):
            client.close()


def _check_front(unit: _Unit) -> None:
    if unit.api_errors:
        raise RuntimeError(f"{len(unit.api_errors)} call(s) failed at the front; first: "
                           f"{unit.api_errors[0]}")


# --------------------------------------------------------------------------- build / search


def _passages(sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One document per turn, "<session time> <speaker>: <text>" (SEEM: a passage is one turn).
    HippoRAG keys a passage by its text: identical documents are one passage (both event ids)."""
    from hipporag.utils.misc_utils import compute_mdhash_id

    out: dict[str, dict[str, Any]] = {}
    for session in sorted(sessions, key=lambda s: s["session_index"]):
        when = session.get("session_time")
        for turn in session["turns"]:
            line = f"{turn['speaker']}: {turn['text']}"
            text = f"{when} {line}" if when else line
            pid = compute_mdhash_id(text, prefix="chunk-")
            if pid in out:
                out[pid]["event_ids"].append(turn.get("event_id"))
                continue
            out[pid] = {"id": pid, "text": text, "speaker": turn["speaker"],
                        "session_time": when, "session_index": session["session_index"],
                        "event_ids": [turn.get("event_id")]}
    return list(out.values())


def _triple_memories(rag: Any, passages: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    from hipporag.utils.misc_utils import compute_mdhash_id, text_processing

    path = Path(rag.openie_results_path)
    docs = json.loads(path.read_text()).get("docs", []) if path.is_file() else []
    by_id = {d["idx"]: d for d in docs}
    facts: dict[str, dict[str, Any]] = {}
    for pid, p in passages.items():  # passage order: the conversation's
        doc = by_id.get(pid) or {}
        p["entities"] = list(doc.get("extracted_entities") or [])
        for t in doc.get("extracted_triples") or []:
            if len(t) != 3:
                continue
            fact = tuple(text_processing([str(x) for x in t]))
            fid = compute_mdhash_id(str(fact), prefix="fact-")  # HippoRAG's fact store key
            if fid in facts:
                facts[fid]["metadata"]["passages"].append(pid)
                continue
            facts[fid] = {"memory_id": fid, "owner": None, "kind": "triple",
                          "text": " ".join(str(x) for x in t), "created_at": p["session_time"],
                          "metadata": {"kind": "triple", "triple": [str(x) for x in t],
                                       "normalised": list(fact), "passages": [pid]}}
    return list(facts.values())


def _passage_memory(p: dict[str, Any]) -> dict[str, Any]:
    return {"memory_id": p["id"], "owner": p["speaker"], "kind": "passage", "text": p["text"],
            "created_at": p["session_time"],
            "metadata": {"kind": "passage", "event_ids": p["event_ids"],
                         "session_index": p["session_index"],
                         "entities": p.get("entities", [])}}


def _wipe(store: Path) -> None:
    if store.exists():
        shutil.rmtree(store)  # a rebuild starts empty (HippoRAG would reuse OpenIE and its cache)
    store.mkdir(parents=True, exist_ok=True)


def _build(req: dict[str, Any]) -> dict[str, Any]:
    global _unit
    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    store = Path(req["store_dir"])
    _wipe(store)
    passages = {p["id"]: p for p in _passages(req["sessions"])}
    (store / PASSAGES_FILE).write_text(json.dumps(passages, sort_keys=True))
    _unit = state = _Unit()
    rag = _open(req)
    try:
        if passages:
            rag.index([p["text"] for p in passages.values()])
        _check_front(state)
        triples = _triple_memories(rag, passages) if passages else []
    finally:
        _close(rag)
        _unit = None
    memories = [_passage_memory(p) for p in passages.values()] + triples
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(state.drops), "drops": state.drops,
            "passages": len(passages), "triples": len(triples)}


def _search(req: dict[str, Any]) -> dict[str, Any]:
    global _unit
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    k = int(req.get("k") or _state["settings"].get("top_k", 5))
    store = Path(req["store_dir"])
    meta_path = store / PASSAGES_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"{unit}: no HippoRAG index at {store} (build it first)")
    passages = json.loads(meta_path.read_text())
    questions = [(str(q["question_id"]), str(q["question"])) for q in req["questions"]]
    results: dict[str, list[dict[str, Any]]] = {qid: [] for qid, _ in questions}
    if not passages or not questions:
        return {"op": "found", "unit": unit, "results": results, "calls": 0,
                "dropped": 0, "drops": []}
    from hipporag.utils.misc_utils import compute_mdhash_id

    _unit = state = _Unit()
    rag = _open(req)
    try:
        # one retrieve() per distinct question text (HippoRAG keys query embeddings by text)
        texts = list(dict.fromkeys(t for _, t in questions))
        solutions = {s.question: s for s in rag.retrieve(texts, num_to_retrieve=k)}
        _check_front(state)
    finally:
        _close(rag)
        _unit = None
    for qid, text in questions:
        sol = solutions[text]
        scores = list(sol.doc_scores) if sol.doc_scores is not None else [None] * len(sol.docs)
        for doc, score in zip(sol.docs, scores):
            pid = compute_mdhash_id(doc, prefix="chunk-")
            p = passages.get(pid) or {}
            results[qid].append({
                "memory_id": pid, "owner": p.get("speaker"), "kind": "passage", "text": doc,
                "created_at": p.get("session_time"),
                "score": None if score is None else float(score),
                "metadata": {"event_ids": p.get("event_ids", [])}})
    return {"op": "found", "unit": unit, "results": results, "calls": 0,
            "dropped": len(state.drops), "drops": state.drops}


def _version() -> str:
    return wc.package_version("hipporag")


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, _version())
