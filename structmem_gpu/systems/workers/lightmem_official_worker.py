"""LightMem's own StructMem pipeline as a worker:
`<systems_dir>/lightmem_official/bin/python lightmem_official_worker.py` (systems/protocol.py).

Runs zjunlp/LightMem at the pinned commit (exported by `systems install lightmem_official`
into `<env>/src`: STRUCTMEM_SYSTEM_SRC) from its own environment. Nothing of LightMem is
copied or re-implemented: the worker imports its LoCoMo drivers, experiments/locomo/
add_locomo.py (build) and search_locomo.py + retrievers.py (search), and the `lightmem`
package from `<src>/src`.

Build: one call of add_locomo's `process_single_sample(sample, api_key, args)` per
conversation, with `args` the readme's StructMem command (system.options: extraction_mode,
enable_summary, summary_time_window, summary_top_k_seeds). The sample is the conversation in
LoCoMo's own shape, rebuilt from the request (speaker_a/speaker_b: the request's, else the
speakers in order of appearance; session_<n> turns with
their `blip_caption`, session_<n>_date_time in LoCoMo's text form), so the driver's own
`extract_locomo_sessions` and `parse_locomo_timestamp` read it. The driver works in the
current directory (./logs, ./qdrant_pre_update, ./qdrant_post_update, as its readme runs it):
the worker changes into the unit's store directory for the call, so its stores are the
unit's.

What the worker sets, as add_locomo's readme asks a user to edit its configuration section:
API_BASE_URL (the unit's front URL), LLM_MODEL (system.options.llm_model; the front serves the
job's model whatever the name), LLMLINGUA_MODEL_PATH (system.options.llmlingua_model). And
three changes to the config `load_lightmem` builds, applied by wrapping `LightMemory.from_config`
in the driver's namespace (LightMem's code unchanged):
- `device_map` / `model_kwargs.device` "cuda" -> system.options.device (auto: cuda when torch
  sees one, else cpu; the CPU profile has no GPU);
- `text_embedder` -> LightMem's own `openai` embedder (`TextEmbedderOpenAI`) at the front, i.e.
  the job's encoder, in place of a local `huggingface` model path (the readme's published
  StructMem table used text-embedding-3-small through that same embedder); the stores'
  `embedding_model_dims` become the encoder's width;
- nothing else: prompts, batching, the 16,000-token reply budget, compression rate, segmenter
  layers, offline update threshold are the driver's.

Attribution: LightMem sends every step through one client, so the worker names the step in the
URL path while it runs (worker_common.SubPhases): `build.extract` (`add_memory`: extraction,
and the embedding of new entries), `build.consolidate` (`summarize`), `build.update`
(`construct_update_queue_all_entries`, `offline_update_all_entries`), `search.retrieve`
(question embeddings). `jobs/report.py differential` compares per step.

Search: the stores are read the way search_locomo.py reads them (`QdrantEntryLoader`,
summary suffix "_summary", with vectors), its `VectorRetriever` over LightMem's `openai`
embedder, then its `retrieve_combined` (top-k entries, system.top_k = the readme's
--total-limit 60) and `retrieve_summaries` (system.options.summary_limit, --summary-limit 5)
per question. system.options.read: "pre" (search_locomo.py's default directory; the syntheses
are written beside it) or "post" (the readme's QA command's directory: no syntheses there).
Each question's reply also carries search_locomo's own reader prompt
(`build_prompt_with_speaker_memories` over the same retrieved entries and summaries:
ANSWER_PROMPT_StructMem with --enable-summary), which the method sends by default
(`answer.prompt=structmem_gpu.systems.answer:own_reader`; our reader:
`answer.prompt=structmem_gpu.systems.answer:build_prompts`).

Memories: the entries of both stores and the syntheses, each once per store
(memory_id "<store>:<point id>"; metadata.store = pre | post | summary), so memory sizes before
and after the update are both on file; hits name the store read.

Each conversation is built in a child process forked from the worker after its imports
(worker_common.run_forked), as in a fresh process: LightMem keeps per-process state between
conversations (its global topic counter, lightmem.memory.lightmem.GLOBAL_TOPIC_IDX, numbers the
"--- Topic <n> ---" blocks of the extraction prompts; a second build in one process also split
consolidation windows differently), so without it a conversation's requests would depend on
which conversations its worker served before. (add_locomo's pool of 5 processes reuses them:
there conversations 6-10 continue a predecessor's topic count, in scheduling order.)

Drops: LightMem prints (not logs) what it swallows; counted per unit: a reply that is not JSON
("JSON decoding error": that batch's items, or that window's synthesis, lost), an extraction
call that raised ("Error processing API call": its batch lost), and, silent in LightMem, an
extraction reply that is JSON without a "data" list (its items lost; `{"data": []}` is a
reply that found nothing, not a drop). A failed call to the front
(openai.APIError) fails the unit, as for every system: nothing hidden.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "lightmem_official"
API_KEY = "structmem-local"  # the front needs none; LightMem's clients refuse an empty one
log = logging.getLogger("structmem.worker")

_EMPTY_DATA = re.compile(r'"data"\s*:\s*\[\s*\]')  # a reply that found nothing: no drop
PRINT_RULES = [
    ("JSON decoding error", "parse", "reply not JSON: its items (or synthesis) lost"),
    ("Error processing API call", "extract", "extraction call raised: its batch lost"),
]

_state: dict[str, Any] = {"settings": {}, "add": None, "search": None, "retrievers": None,
                          "lm": None, "phases": None, "prints": None, "failed": [],
                          "unit": {}}


def _device(wanted: str) -> str:
    if wanted != "auto":
        return wanted
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _adapt(config: dict[str, Any]) -> dict[str, Any]:
    """load_lightmem's config with the worker's three changes (module docstring)."""
    unit = _state["unit"]
    cfg = copy.deepcopy(config)
    device = _device(str(_state["settings"].get("device", "auto")))
    lingua = ((cfg.get("pre_compressor") or {}).get("configs") or {}).get("llmlingua_config")
    if isinstance(lingua, dict) and "device_map" in lingua:
        lingua["device_map"] = device
    dims = int(unit["embed_dims"])
    cfg["text_embedder"] = {"model_name": "openai", "configs": {
        "model": unit["embed_model"], "api_key": API_KEY, "embedding_dims": dims,
        "openai_base_url": unit["base_url"]}}
    for key in ("embedding_retriever", "summary_retriever"):
        store = (cfg.get(key) or {}).get("configs")
        if isinstance(store, dict) and "embedding_model_dims" in store:
            store["embedding_model_dims"] = dims
    return cfg


def _wrap_steps(lm_cls: Any, phases: wc.SubPhases) -> None:
    """Each LightMemory step runs under its sub-phase name (module docstring)."""
    steps = {"add_memory": "extract", "summarize": "consolidate",
             "construct_update_queue_all_entries": "update",
             "offline_update_all_entries": "update"}
    for method, step in steps.items():
        real = getattr(lm_cls, method)

        def wrapped(self: Any, *args: Any, _real: Any = real, _step: str = step,
                    **kwargs: Any) -> Any:
            with phases.step(_step):
                return _real(self, *args, **kwargs)

        setattr(lm_cls, method, wrapped)


def _watch_api_errors(manager_cls: Any) -> None:
    """A call the front refused or could not answer raises openai.APIError inside LightMem's
    thread pool, which prints and swallows it: remember it, so the unit fails."""
    import openai

    real = manager_cls.generate_response

    def generate_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return real(self, *args, **kwargs)
        except openai.APIError as e:
            _state["failed"].append(e)
            raise

    manager_cls.generate_response = generate_response


def _count_silent_drops(manager_module: Any) -> None:
    """LightMem's clean_response returns [] for JSON without a "data" list (or a list) and says
    nothing: count it as a drop, beside the printed ones (one count per reply: a reply that is
    not JSON was counted by its print)."""
    real = manager_module.clean_response
    prints: wc.PrintWatcher = _state["prints"]

    def clean_response(response: str) -> Any:
        before = len(prints.drops)
        out = real(response)
        if not out and len(prints.drops) == before and not _EMPTY_DATA.search(response or ""):
            prints.drops.append({"where": "parse", "why": "JSON without a data list: its items lost"})
        return out

    manager_module.clean_response = clean_response


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    wc.freeze_clock(req.get("clock") or "2025-01-01T00:00:00")
    wc.refuse_network()
    _state["settings"] = dict(req.get("settings") or {})
    src = Path(os.environ.get("STRUCTMEM_SYSTEM_SRC") or "")
    driver = src / "experiments" / "locomo"
    if not (driver / "add_locomo.py").is_file():
        raise RuntimeError(f"STRUCTMEM_SYSTEM_SRC={str(src)!r} holds no experiments/locomo/"
                           f"add_locomo.py: run `python jobs/data.py systems install {SYSTEM}`")
    os.environ.setdefault("OPENAI_API_KEY", API_KEY)
    # The drivers make ./logs/<time> and the store folders at import: a scratch directory
    home = Path(os.environ.get("STRUCTMEM_WORKER_HOME") or tempfile.mkdtemp(prefix="lm-home-"))
    scratch = home / "lightmem_import_cwd"
    scratch.mkdir(parents=True, exist_ok=True)
    os.chdir(scratch)
    sys.path[:0] = [str(src / "src"), str(driver)]
    _state["prints"] = wc.PrintWatcher(sys.stdout, PRINT_RULES)
    _state["phases"] = wc.SubPhases()
    _state["phases"].install()
    old, sys.stdout = sys.stdout, _state["prints"]
    try:
        import add_locomo
        import retrievers
        import search_locomo
        from lightmem.factory.memory_manager import openai as manager_module
        from lightmem.factory.memory_manager.openai import OpenaiManager
        from lightmem.memory.lightmem import LightMemory
    finally:
        sys.stdout = old
    _wrap_steps(LightMemory, _state["phases"])
    _watch_api_errors(OpenaiManager)
    _count_silent_drops(manager_module)

    class _LightMemory:
        """add_locomo's `LightMemory`, its config adapted (module docstring)."""

        @staticmethod
        def from_config(config: dict[str, Any]) -> Any:
            return LightMemory.from_config(_adapt(config))

    add_locomo.LightMemory = _LightMemory
    _state.update(add=add_locomo, search=search_locomo, retrievers=retrievers, lm=LightMemory)
    return {}


def _sample(req: dict[str, Any]) -> dict[str, Any]:
    """The conversation in LoCoMo's JSON shape (what add_locomo reads), from the request."""
    named = [req.get("speaker_a"), req.get("speaker_b")]  # the benchmark's roles, when sent
    speakers = named if all(named) else list(req.get("speakers") or [])
    conv: dict[str, Any] = {"speaker_a": speakers[0] if speakers else "Speaker_A",
                            "speaker_b": speakers[1] if len(speakers) > 1 else "Speaker_B"}
    for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
        n = int(session["session_index"])
        turns = []
        for turn in session["turns"]:
            item = {"speaker": turn["speaker"], "dia_id": turn.get("event_id"),
                    "text": turn.get("raw_text", turn["text"])}
            if turn.get("image_caption"):
                item["blip_caption"] = turn["image_caption"]
            turns.append(item)
        conv[f"session_{n}"] = turns
        conv[f"session_{n}_date_time"] = wc.locomo_time(session.get("session_time")) or ""
    return {"sample_id": str(req["unit"]), "conversation": conv, "qa": []}


def _args() -> argparse.Namespace:
    s = _state["settings"]
    return argparse.Namespace(
        extraction_mode=str(s.get("extraction_mode", "event")),
        enable_summary=bool(s.get("enable_summary", True)),
        summary_time_window=int(s.get("summary_time_window", 3600)),
        summary_top_k_seeds=int(s.get("summary_top_k_seeds", 15)), workers=1)


def _begin(req: dict[str, Any], store: Path) -> None:
    """Point the driver at this unit: its URL, model names, and the unit's store as its cwd."""
    s = _state["settings"]
    al = _state["add"]
    _state["unit"] = {"base_url": str(req["base_url"]), "embed_model": req.get("embed_model"),
                      "embed_dims": int(req.get("embed_dims") or 384)}
    al.API_BASE_URL = str(req["base_url"])
    al.LLM_MODEL = str(s.get("llm_model", "gpt-4o-mini"))
    al.LLMLINGUA_MODEL_PATH = str(s.get("llmlingua_model"))
    store.mkdir(parents=True, exist_ok=True)
    os.chdir(store)
    for folder in (al.RUN_LOG_DIR, al.QDRANT_PRE_UPDATE_DIR, al.QDRANT_POST_UPDATE_DIR):
        os.makedirs(folder, exist_ok=True)
    _state["phases"].unit(str(req["base_url"]))
    _state["failed"] = []
    _state["prints"].take()


def _end() -> None:
    _state["phases"].unit(None)
    _state["unit"] = {}


def _loader(store: Path, which: str) -> Any:
    folder = store / ("qdrant_pre_update" if which == "pre" else "qdrant_post_update")
    return _state["retrievers"].QdrantEntryLoader(str(folder), summary_suffix="_summary")


def _memory(point: dict[str, Any], store: str) -> dict[str, Any]:
    payload = dict(point.get("payload") or {})
    text = payload.get("summary") if store == "summary" else None
    text = text or payload.get("memory") or ""
    meta = {k: payload.get(k) for k in ("time_stamp", "weekday", "speaker_name", "topic_id",
                                        "entry_type", "source_id", "consolidated") if k in payload}
    meta.update(store=store, kind="synthesis" if store == "summary" else "memory")
    return {"memory_id": f"{store}:{point.get('id')}", "owner": payload.get("speaker_name"),
            "kind": meta["kind"], "text": str(text), "created_at": payload.get("time_stamp"),
            "metadata": json.loads(json.dumps(meta, default=str))}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    store = Path(req["store_dir"]).absolute()
    shutil.rmtree(store, ignore_errors=True)  # a rebuild starts empty

    def run() -> dict[str, Any]:
        prints: wc.PrintWatcher = _state["prints"]
        old, sys.stdout = sys.stdout, prints
        try:
            _begin(req, store)
            result = _state["add"].process_single_sample(_sample(req), API_KEY, _args())
        finally:
            sys.stdout = old
            _end()
        if _state["failed"]:
            raise _state["failed"][0]
        if result.get("status") != "success":
            raise RuntimeError(f"add_locomo.process_single_sample({unit}): {result.get('error')}")
        return {"result": result, "drops": prints.take()}

    cwd = os.getcwd()
    try:
        # a fresh process per conversation (module docstring: per-process state)
        done = wc.run_forked(run)
    finally:
        os.chdir(cwd)
    result, drops = done["result"], done["drops"]
    memories = []
    for which in ("pre", "post"):
        memories += [_memory(p, which) for p in _loader(store, which).load_entries(unit)]
    memories += [_memory(p, "summary") for p in _loader(store, "pre").load_summaries(unit)]
    counts = {k: result.get(k) for k in ("pre_update_count", "post_update_count", "num_summaries",
                                         "add_calls", "summarize_calls", "update_calls")}
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "counts": counts}


def _hit(item: dict[str, Any], store: str) -> dict[str, Any]:
    m = _memory({"id": item.get("id"), "payload": item.get("payload")}, store)
    m.pop("metadata")
    m["score"] = float(item.get("score") or 0.0)
    return m


def _search(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    s = _state["settings"]
    read = str(s.get("read", "pre"))
    if read not in ("pre", "post"):
        raise ValueError(f"system.options.read={read!r}: expected pre or post")
    store = Path(req["store_dir"]).absolute()
    folder = store / ("qdrant_pre_update" if read == "pre" else "qdrant_post_update")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no LightMem store (build first)")
    sl = _state["search"]
    k = int(req.get("k") or s.get("top_k", 60))
    cwd = os.getcwd()
    results: dict[str, list[dict[str, Any]]] = {}
    readers: dict[str, str] = {}
    try:
        _begin(req, store)
        from lightmem.configs.text_embedder.base_config import BaseTextEmbedderConfig
        from lightmem.factory.text_embedder.openai import TextEmbedderOpenAI

        unit_cfg = _state["unit"]
        embedder = TextEmbedderOpenAI(BaseTextEmbedderConfig(
            model=unit_cfg["embed_model"], api_key=API_KEY,
            embedding_dims=unit_cfg["embed_dims"], openai_base_url=unit_cfg["base_url"]))
        retriever = _state["retrievers"].VectorRetriever(embedder)
        loader = _loader(store, read)
        entries = loader.load_entries(unit, with_vectors=True)
        summaries = (loader.load_summaries(unit, with_vectors=True)
                     if s.get("enable_summary", True) else [])
        with_summary = bool(s.get("enable_summary", True))
        with _state["phases"].step("retrieve"):
            for q in req["questions"]:
                qid, question = str(q["question_id"]), str(q["question"])
                combined = sl.retrieve_combined(entries, retriever, question, k)
                summed = (sl.retrieve_summaries(summaries, retriever, question,
                                                int(s.get("summary_limit", 5)))
                          if summaries else [])
                results[qid] = ([_hit(x, read) for x in combined]
                                + [_hit(x, "summary") for x in summed])
                # search_locomo's own reader prompt from the same retrieval (its process_sample
                # calls this with --enable-summary and what retrieve_summaries returned).
                readers[qid] = sl.build_prompt_with_speaker_memories(
                    question, combined, enable_summary=with_summary, summaries=summed)
    finally:
        os.chdir(cwd)
        _end()
    if _state["failed"]:
        raise _state["failed"][0]
    return {"op": "found", "unit": unit, "results": results, "readers": readers, "calls": 0,
            "dropped": 0, "drops": []}


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, wc.repository_version())
