"""A-MEM worker: `<systems_dir>/amem/bin/python amem_worker.py` (systems/protocol.py).

Runs A-MEM's LoCoMo experiment code (its repository, pinned commit, exported by `systems
install amem` into `<env>/src`: STRUCTMEM_SYSTEM_SRC) from its own environment: the memory
layer (`memory_layer.py`: `AgenticMemorySystem`, `MemoryNote`, `SimpleEmbeddingRetriever`) and
the agent of its LoCoMo driver (`test_advanced.py`: `advancedMemAgent`), imported from there,
never copied. Every chat call goes to the request's `base_url` (A-MEM's `openai` backend builds
`OpenAI(api_key=...)`; the SDK takes the URL from OPENAI_BASE_URL, set per unit) and every
embedding to `<base_url>/embeddings` (the job's encoder, see below).

Feeding and retrieval follow `test_advanced.py` (`evaluate_dataset`, `advancedMemAgent`): one
agent per conversation; every turn, session by session, becomes one note through
`add_memory("Speaker " + speaker + "says : " + text, time=<session date>)` (A-MEM's string,
its missing space included; the date in LoCoMo's own text form, "1:56 pm on 8 May, 2023",
rendered from the payload's ISO time); each add is one analysis call (keywords, context,
tags) and one evolution call (links to and updates of its 5 nearest notes). A question is
answered from `generate_query_llm(question)` (one chat call: keywords) and the retriever's
top-k for those keywords (`retriever.search`, what `find_related_memories_raw` calls), each
followed by the notes it links to, as `find_related_memories_raw` lists them (at most k+1 per
note; repeats dropped). The hits are those notes (kind "memory", the note's text, its
session's date; score: the cosine similarity A-MEM ranked by, none for a linked note). Our
reader answers, not A-MEM's answer prompts.

What A-MEM imports but its build and search never call is not installed: the worker registers
small stand-in modules first. `sentence_transformers.SentenceTransformer` is a client of the
front's /embeddings (A-MEM hard-codes `SentenceTransformer('all-MiniLM-L6-v2')`, a hub
download; here every embedding is the job's encoder, as for every system); `transformers`
(an unused import), `litellm` (its Ollama backend) and A-MEM's own metrics module `utils`
(rouge, BLEU, BERTScore: it downloads NLTK data and a BERT model at import) raise if used.
`test_advanced.py` checks for NLTK's punkt and wordnet at import and downloads them when
absent: empty marker folders under the worker's home satisfy the check (nothing of NLTK is
used on this path).

The pinned commit's `MemoryNote.analyze_content` calls `re.sub` without importing `re`: the
NameError is swallowed and every note would be stored without keywords, context and tags.
Setting `restore_missing_import` (default true) gives the module its `re`; false runs the
commit as it is (every analysis then counts as a drop).

Drops: A-MEM prints (it does not log) and goes on, so sys.stdout is a line watcher while it
runs (the lines still reach the worker's log). Counted, one per swallowed reply: an analysis
reply it could not use ("Error analyzing content": the note kept, without keywords, context and
tags); an evolution reply that is not JSON ("JSON parsing error": the note kept, not evolved);
an add that raised on a reply (e.g. JSON with other keys: A-MEM's driver would stop; here the
note is lost, counted once, and the conversation goes on; `notes_lost` in the reply); a link
an evolution reply made to no note (skipped when retrieving, where A-MEM's would raise). A
search counts a keyword reply that is not text (that question gets no hits). A failed call to
the front (openai.APIError, which analyze_content would swallow) fails the unit: nothing is
hidden.

Store (per unit, under store_dir), as A-MEM's driver caches a sample: `memory_cache.pkl`
(pickle of `memory_system.memories`, its `MemoryNote`s), `retriever_cache.pkl` and
`retriever_cache_embeddings.npy` (`SimpleEmbeddingRetriever.save`); a search loads them back
the driver's way (`memories = pickle.load`, `retriever.load(...)`), so no embedding is
recomputed. `notes.json` beside them holds what we report per note (its turn's event id,
speaker and ISO session time).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import re
import sys
import tempfile
import types
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "amem"
log = logging.getLogger("structmem.worker")
EMBED_MODEL_NAME = "all-MiniLM-L6-v2"  # what A-MEM asks for (answered by the job's encoder)
TEMPERATURE_C5 = 0.5  # test_advanced.py's default (used only by its answer prompts)
MEMORY_FILE = "memory_cache.pkl"
RETRIEVER_FILE = "retriever_cache.pkl"
EMBEDDINGS_FILE = "retriever_cache_embeddings.npy"
NOTES_FILE = "notes.json"

# What A-MEM prints when it swallows a reply (memory_layer.py at the pinned commit).
PRINT_RULES = [
    ("Error analyzing content", "analyze", "reply not used: note kept without keywords/context/tags"),
    ("JSON parsing error: ", "evolve", "reply not JSON: note kept, not evolved"),
]

_state: dict[str, Any] = {"settings": {}, "ml": None, "ta": None, "prints": None}
_EMBED: dict[str, Any] = {"url": None, "model": None, "last": None, "opener": None}


# --------------------------------------------------------------------------- stand-ins


class _Unavailable:
    """A stand-in for something A-MEM imports but its build and search never use."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._what} is not installed in the amem environment (A-MEM's "
                           f"LoCoMo build and search do not use it)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self


class SentenceTransformer:
    """`sentence_transformers.SentenceTransformer` as A-MEM uses it (`encode`): the front's
    /embeddings for the unit being served (the job's encoder); the model name is ignored."""

    def __init__(self, model_name_or_path: str | None = None, *args: Any, **kwargs: Any) -> None:
        self.model_name = model_name_or_path

    def encode(self, sentences: Any, batch_size: int = 32, show_progress_bar: Any = None,
               convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               **kwargs: Any) -> Any:
        import numpy as np

        if convert_to_tensor:
            raise RuntimeError("encode(convert_to_tensor=True) needs torch, which the amem "
                               "environment does not install (HybridRetriever only)")
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError(f"encode() takes strings, got {[type(t).__name__ for t in texts]}")
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if _EMBED["url"] is None:
            raise RuntimeError("no unit is being served: no embeddings endpoint")
        body = json.dumps({"model": _EMBED["model"], "input": texts,
                           "encoding_format": "base64"}).encode()
        req = urllib.request.Request(f"{_EMBED['url']}/embeddings", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with _EMBED["opener"].open(req, timeout=600) as resp:
            data = json.loads(resp.read())["data"]
        rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
                for d in sorted(data, key=lambda d: d["index"])]
        out = np.vstack(rows).astype(np.float32)
        _EMBED["last"] = out
        return out[0] if single else out


def _install_stand_ins() -> None:
    st = types.ModuleType("sentence_transformers")
    st.SentenceTransformer = SentenceTransformer  # type: ignore[attr-defined]
    st_util = types.ModuleType("sentence_transformers.util")
    st_util.pytorch_cos_sim = _Unavailable("sentence_transformers.util.pytorch_cos_sim")  # type: ignore[attr-defined]
    st.util = st_util  # type: ignore[attr-defined]
    tr = types.ModuleType("transformers")
    tr.AutoModel = _Unavailable("transformers.AutoModel")  # type: ignore[attr-defined]
    tr.AutoTokenizer = _Unavailable("transformers.AutoTokenizer")  # type: ignore[attr-defined]
    ll = types.ModuleType("litellm")
    ll.completion = _Unavailable("litellm.completion")  # type: ignore[attr-defined]
    metrics = types.ModuleType("utils")  # A-MEM's utils.py: its metrics
    metrics.calculate_metrics = _Unavailable("A-MEM's utils.calculate_metrics")  # type: ignore[attr-defined]
    metrics.aggregate_metrics = _Unavailable("A-MEM's utils.aggregate_metrics")  # type: ignore[attr-defined]
    for mod in (st, st_util, tr, ll, metrics):
        sys.modules[mod.__name__] = mod


def _nltk_markers() -> None:
    """test_advanced.py downloads punkt and wordnet unless nltk.data.find finds them."""
    import nltk

    home = os.environ.get("STRUCTMEM_WORKER_HOME") or tempfile.mkdtemp(prefix="amem-home-")
    root = Path(home) / "amem_nltk_data"
    for sub in ("tokenizers/punkt", "wordnet"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    nltk.data.path.insert(0, str(root))


# --------------------------------------------------------------------------- protocol


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    wc.freeze_clock(req.get("clock") or "2025-01-01T00:00:00")
    wc.refuse_network()
    _state["settings"] = dict(req.get("settings") or {})
    src = os.environ.get("STRUCTMEM_SYSTEM_SRC")
    if not src or not (Path(src) / "memory_layer.py").exists():
        raise RuntimeError(f"STRUCTMEM_SYSTEM_SRC={src!r} holds no memory_layer.py: run "
                           f"`python jobs/data.py systems install amem`")
    os.environ.setdefault("OPENAI_API_KEY", "structmem-local")  # A-MEM refuses to start without
    _EMBED["opener"] = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    _install_stand_ins()
    _nltk_markers()
    sys.path.insert(0, src)
    _state["prints"] = wc.PrintWatcher(sys.stdout, PRINT_RULES)
    old, sys.stdout = sys.stdout, _state["prints"]
    try:
        import memory_layer as ml
        import test_advanced as ta
    finally:
        sys.stdout = old
    if _state["settings"].get("restore_missing_import", True) and not hasattr(ml, "re"):
        ml.re = re  # analyze_content's re.sub (see the module docstring)
    _state["ml"], _state["ta"] = ml, ta
    return {}


def _agent(req: dict[str, Any]) -> Any:
    """A-MEM's LoCoMo agent for one unit, its clients pointed at the unit's URL."""
    os.environ["OPENAI_BASE_URL"] = str(req["base_url"])  # read by OpenAI() at construction
    _EMBED.update(url=str(req["base_url"]).rstrip("/"), model=req.get("embed_model"), last=None)
    k = int(req.get("k") or _state["settings"].get("top_k", 10))
    agent = _state["ta"].advancedMemAgent(str(req["model"]), "openai", k, TEMPERATURE_C5)
    return agent


def _close(agent: Any) -> None:
    for controller in (agent.memory_system.llm_controller, agent.retriever_llm):
        client = getattr(controller.llm, "client", None)
        if client is not None:
            client.close()
    _EMBED.update(url=None, model=None, last=None)


def _valid_link(link: Any, n: int) -> bool:
    """Whether A-MEM's `all_memories[link]` finds a note (Python indexing, as its code does)."""
    return isinstance(link, int) and -n <= link < n


def _note_dict(note: Any, index: int, ids: list[str], info: dict[str, Any]) -> dict[str, Any]:
    n = len(ids)
    meta = {"kind": "memory", "index": index, "timestamp": note.timestamp,
            "keywords": note.keywords, "context": note.context, "tags": note.tags,
            "category": note.category,
            "links": [ids[x] for x in note.links if _valid_link(x, n)],
            "event_id": info.get("event_id"), "speaker": info.get("speaker")}
    return {"memory_id": str(note.id), "owner": None, "kind": "memory",
            "text": str(note.content), "created_at": info.get("session_time"),
            "metadata": json.loads(json.dumps(meta, default=str))}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    import openai

    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    store = Path(req["store_dir"])
    store.mkdir(parents=True, exist_ok=True)
    for name in (MEMORY_FILE, RETRIEVER_FILE, EMBEDDINGS_FILE, NOTES_FILE):
        (store / name).unlink(missing_ok=True)  # a rebuild starts empty
    prints: wc.PrintWatcher = _state["prints"]
    prints.take()
    drops: list[dict[str, str]] = []
    notes_lost = 0
    info: dict[str, dict[str, Any]] = {}
    old, sys.stdout = sys.stdout, prints
    agent = None
    try:
        agent = _agent(req)
        ms = agent.memory_system
        failed: list[BaseException] = []
        llm = ms.llm_controller.llm
        real = llm.get_completion

        def get_completion(*args: Any, **kwargs: Any) -> Any:
            # analyze_content swallows every exception: a failed call to the front is seen here
            try:
                return real(*args, **kwargs)
            except openai.APIError as e:
                failed.append(e)
                raise

        llm.get_completion = get_completion  # this instance only
        for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
            when = wc.locomo_time(session.get("session_time"))
            for turn in session["turns"]:
                content = "Speaker " + str(turn["speaker"]) + "says : " + str(turn["text"])
                ids_before = list(ms.memories)
                lost = None
                try:
                    agent.add_memory(content, time=when)
                except openai.APIError:
                    raise  # the front or the model server failed: the unit fails
                except Exception as e:  # noqa: BLE001 - a reply A-MEM could not handle
                    log.warning("add_memory(%s): %s: %s", turn.get("event_id"),
                                type(e).__name__, e)
                    lost = {"where": "add_note", "why": f"{type(e).__name__} on a reply: note lost"}
                    # an add that raised after storing the note left the retriever behind
                    for extra in [i for i in ms.memories if i not in ids_before]:
                        if len(ms.memories) > len(ms.retriever.corpus):
                            del ms.memories[extra]
                if failed:
                    raise failed[0]
                printed = prints.take()
                drops += [lost] if lost else printed  # a lost note counts once
                notes_lost += lost is not None
                for new in [i for i in ms.memories if i not in ids_before]:
                    info[str(new)] = {"event_id": turn.get("event_id"),
                                      "speaker": turn.get("speaker"),
                                      "session_time": session.get("session_time")}
        notes = list(ms.memories.values())
        ids = [str(x.id) for x in notes]
        for note in notes:
            drops += [{"where": "evolve", "why": "link to no note"}
                      for x in note.links if not _valid_link(x, len(notes))]
        # as test_advanced.py caches a sample
        with open(store / MEMORY_FILE, "wb") as f:
            pickle.dump(ms.memories, f)
        ms.retriever.save(str(store / RETRIEVER_FILE), str(store / EMBEDDINGS_FILE))
        (store / NOTES_FILE).write_text(json.dumps(info, indent=1))
        memories = [_note_dict(note, i, ids, info.get(str(note.id), {}))
                    for i, note in enumerate(notes)]
        evolved = int(ms.evo_cnt)
    finally:
        sys.stdout = old
        if agent is not None:
            _close(agent)
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "notes_lost": notes_lost, "evolved": evolved}


def _hits(notes: list[Any], ids: list[str], info: dict[str, Any], indices: list[int],
          scores: Any, k: int) -> list[dict[str, Any]]:
    """The notes `find_related_memories_raw` lists for `indices`, in its order: each retrieved
    note, then the notes it links to (at most k+1); a note listed twice is kept once."""
    hits: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(index: int, score: float | None) -> None:
        note = notes[index]
        if str(note.id) in seen:
            return
        seen.add(str(note.id))
        hit = _note_dict(note, index % len(notes), ids, info.get(str(note.id), {}))
        hit.pop("metadata")
        hit["score"] = score
        hits.append(hit)

    for i in indices:
        add(i, None if scores is None else float(scores[i]))
        j = 0
        for link in notes[i].links:
            if not _valid_link(link, len(notes)):
                continue  # counted when built
            add(link, None)
            if j >= k:
                break
            j += 1
    return hits


def _search(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    from sklearn.metrics.pairwise import cosine_similarity

    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    store = Path(req["store_dir"])
    if not (store / MEMORY_FILE).exists():
        raise FileNotFoundError(f"{store / MEMORY_FILE}: no A-MEM store (build first)")
    k = int(req.get("k") or _state["settings"].get("top_k", 10))
    info = json.loads((store / NOTES_FILE).read_text()) if (store / NOTES_FILE).exists() else {}
    prints: wc.PrintWatcher = _state["prints"]
    old, sys.stdout = sys.stdout, prints
    agent = None
    results: dict[str, list[dict[str, Any]]] = {}
    drops: list[dict[str, str]] = []
    try:
        agent = _agent(req)
        ms = agent.memory_system
        with open(store / MEMORY_FILE, "rb") as f:  # as test_advanced.py loads a cached sample
            ms.memories = pickle.load(f)
        ms.retriever = ms.retriever.load(str(store / RETRIEVER_FILE), str(store / EMBEDDINGS_FILE))
        notes = list(ms.memories.values())
        ids = [str(x.id) for x in notes]
        for q in req["questions"]:
            qid = str(q["question_id"])
            keywords = agent.generate_query_llm(q["question"])
            if not isinstance(keywords, str):
                drops.append({"where": "query", "why": "keywords not text: no retrieval"})
                results[qid] = []
                continue
            _EMBED["last"] = None
            indices = [int(i) for i in ms.retriever.search(keywords, k)]
            scores = None
            if indices and _EMBED["last"] is not None and ms.retriever.embeddings is not None:
                scores = cosine_similarity(np.asarray(_EMBED["last"][:1]),
                                           ms.retriever.embeddings)[0]
            results[qid] = _hits(notes, ids, info, indices, scores, k)
    finally:
        sys.stdout = old
        if agent is not None:
            _close(agent)
    return {"op": "found", "unit": unit, "results": results, "calls": 0,
            "dropped": len(drops), "drops": drops}


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, wc.repository_version())
