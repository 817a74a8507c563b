"""SEEM's released code as a worker: `<systems_dir>/seem_skill/bin/python seem_skill_worker.py`
(systems/protocol.py).

Runs RyanToleco/seem-skill at the pinned commit (exported by `systems install seem_skill` into
`<env>/src`: STRUCTMEM_SYSTEM_SRC) from its own environment. Nothing of the skill is copied or
re-implemented: the worker imports `SEEMSkill`, `SEEMConfig`, `RecallMode`, `RetrieveStrategy`
and `format_structured_text` from `<src>/SEEM` and calls the skill's public API.

Build, per conversation, as the skill's Python API documents it (README, SKILL.md): one
`SEEMSkill(SEEMConfig(...))`; every turn, session by session, one `store(observation)` with
`dialogue_id` (the turn's event id), `speaker`, `text` (the turn's own text), `timestamp` (the
session's ISO date-time) and, for a turn with an image, `image` = {img_id, caption, no path}
(the skill adds "[Image: <caption>]" to its prompts; without a path it embeds text only). Each
store extracts an episodic frame (summary + 5W1H events), embeds it and the turn, extracts
fact triples into its NetworkX graph, links entities, and every `integration_window`
observations runs one batched fusion judgment; `flush()` judges the last window, then
`save_to_disk()` (flush does not save) writes the skill's own files into the unit's store.

Search, per conversation: a new `SEEMSkill` loads the store (as the skill's CLI recalls), then
per question `recall({"text": question}, top_k=k, mode=<system.options.mode>)`: its memories
(the structured text it hands an agent) and its fact triples are the hits, in its order.

Settings: `SEEMConfig` fields from system.options by name (retrieve_strategy,
integration_window, top_k_facts, ppr_damping, ...; the spec's OPTIONS are SEEMConfig()'s own
defaults), `mode` (recall's mode: lite | pro | max) and system.top_k (recall's top_k).
The LLM client and the "multimodal" encoder (`LLMClient`, `MMEmbedEncoder`: OpenAI clients)
get the unit's front URL as base_url and the job's model and encoder names: every chat call
goes to the job's model, every `mm_encoder.encode_text` to the front's /v1/embeddings (the
job's encoder), unchanged otherwise (temperature 0.1, JSON mode, one embedding per call).

What the worker changes, each needed to run it reproducibly and offline:
- `generate_memory_id` (SEEM/core/utils.py: md5 of `datetime.now().isoformat()`): under the
  frozen clock every memory would get the same id and each store would overwrite the last;
  the id is drawn from the unit's seeded uuid stream instead (16 hex characters, as theirs).
- `save_to_disk` / `load_from_disk` default to the unit's store (theirs: `SEEM/data` beside the
  code, shared by every worker); a search does not save (recall saves the whole store after
  every question, which would rewrite the built store with only its recall counter changed).
- `nltk.download` (called at every BM25 rebuild, i.e. every store, for punkt_tab and stopwords)
  is a local check: punkt_tab is written under the worker's home from our copy (NLTK_DATA,
  systems/seem_skill.py `prepare`); stopwords are never read on this path.
Nothing else: prompts, caches, thresholds, merge rules are theirs. Its LRU cache of
embeddings expires entries after 300 s of wall time, so a slow build may send an embedding
request again (the same body, answered by the front's cache), never a different one. The skill
iterates sets of names (`_link_entities`, mode max's backfill): the job runs every worker with
PYTHONHASHSEED=0 (stages.worker_env), so their order, and the requests, repeat. Its state lives
in its `SEEMSkill` instance, one per unit (no module state a later unit would see): the worker
builds in-process, no fork per unit (a rebuild in the same worker sends the same requests:
tests/systems/test_seem_skill_worker.py).

Attribution: one client serves every step, so the worker names the step in the URL path
(worker_common.SubPhases) with our `seem` method's stage names: `build.frames` (`store`: frame
extraction, frame and turn embeddings), `build.fusion` (`_flush_integrations`: the batch judge
and the merged frames' embeddings), `build.graph` (`_build_fact_graph`, `_link_entities`: fact
extraction, fact and entity embeddings), `search.retrieve` (`recall`: the question's embedding
and, with hybrid_rrf, its 5W1H request). `jobs/report.py differential` compares them per stage.

Drops: the skill prints (not logs) what it swallows; counted per unit: a frame reply it could
not use ("Episodic extraction failed": the frame is the turn's first 200 characters, no
events), a fact reply ("Fact extraction with LLM failed": no facts from that turn), a judge
reply ("batch judgment failed": the window stays unmerged; "unknown member ID": a member left
out of its group), a 5W1H reply ("5W1H extraction failed": the question is the BM25 query), a
PPR that raised (dense retrieval instead). Silent in the skill, counted here: a frame reply
without "events", a fact reply without a "facts" list or with items that are not triples, a
judge reply without "merge_groups", a 5W1H reply with none of its six keys. A failed call to the
front (openai.APIError, which LLMClient turns into a plain Exception the skill swallows) fails
the unit, as for every system: nothing hidden.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import shutil
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "seem_skill"
API_KEY = "structmem-local"  # the front needs none; the OpenAI client refuses an empty one
log = logging.getLogger("structmem.worker")
NOT_CONFIG = frozenset({"top_k", "mode"})  # settings that are not SEEMConfig fields
SET_BY_WORKER = frozenset({"llm_api_key", "llm_model", "llm_base_url", "mm_encoder_api_key",
                           "mm_encoder_model", "mm_encoder_base_url"})

# What the skill prints when it swallows a reply or a failure (SEEM/core/seem_skill.py).
PRINT_RULES = [
    ("Warning: Episodic extraction failed", "frames",
     "reply unusable: frame = the turn's first 200 characters, no events"),
    ("Warning: Fact extraction with LLM failed", "graph", "reply unusable: no facts from this turn"),
    ("[batch_judge] Warning: batch judgment failed", "fusion",
     "reply unusable: the window left unmerged"),
    ("[batch_judge] Warning: unknown member ID", "fusion", "unknown member id: left out of its group"),
    ("Warning: 5W1H extraction failed", "retrieve",
     "reply unusable: the question itself is the BM25 query"),
    ("Warning: PPR failed", "retrieve", "PPR raised: dense retrieval instead"),
]
# Each step's methods (module docstring): SEEMSkill method -> sub-phase
STEPS = {"store": "frames", "_flush_integrations": "fusion", "_build_fact_graph": "graph",
         "_link_entities": "graph", "recall": "retrieve"}
QUERY_KEYS = ("who", "what", "when", "where", "why", "how")

_state: dict[str, Any] = {"settings": {}, "seem": None, "prompts": None, "phases": None,
                          "prints": None, "failed": [], "data_dir": None, "read_only": False,
                          "loaded": None, "retrieved": None}


# --------------------------------------------------------------------------- patches


def _memory_id() -> str:
    """generate_memory_id's form (16 hex characters) from the unit's seeded uuid stream."""
    return uuid.uuid4().hex[:16]


def _drop(where: str, why: str) -> None:
    _state["prints"].drops.append({"where": where, "why": why})


def _silent_drops(system_prompt: str, reply: str) -> None:
    """Count the replies the skill drops without a word (module docstring). A reply that is
    not a JSON object is not counted here: the skill prints it (PRINT_RULES)."""
    p = _state["prompts"]
    try:
        data = json.loads(reply)
    except (TypeError, ValueError):
        return
    if not isinstance(data, dict):
        return
    if system_prompt is p.EPISODIC_EXTRACTION_SYSTEM_PROMPT:
        if "summary" in data and "events" not in data:
            _drop("frames", "JSON without events: frame kept without events")
        return
    if system_prompt is p.FACT_EXTRACTION_SYSTEM_PROMPT:
        facts = data.get("facts")
        if not isinstance(facts, list):
            _drop("graph", "JSON without a facts list: no facts from this turn")
            return
        for item in facts:
            ok = isinstance(item, (list, tuple)) and len(item) >= 3 and all(
                str(x).strip() for x in item[:3])
            if not ok:
                _drop("graph", "fact item not a triple: skipped")
    elif system_prompt is p.BATCH_JUDGE_INTEGRATE_SYSTEM_PROMPT and "merge_groups" not in data:
        _drop("fusion", "JSON without merge_groups: the window left unmerged")
    elif system_prompt is p.QUERY_5W1H_SYSTEM_PROMPT and not any(k in data for k in QUERY_KEYS):
        _drop("retrieve", "JSON without 5W1H keys: an empty BM25 query")


def _patch_llm(utils: Any) -> None:
    """LLMClient.generate: a failed call to the front is remembered (the unit fails), and the
    silent drops of each reply are counted."""
    import openai

    real = utils.LLMClient.generate

    def generate(self: Any, system_prompt: str, user_prompt: str, *args: Any,
                 **kwargs: Any) -> Any:
        try:
            reply = real(self, system_prompt, user_prompt, *args, **kwargs)
        except Exception as e:
            cause = e.__context__
            if isinstance(cause, openai.APIError):
                _state["failed"].append(cause)
            raise
        _silent_drops(system_prompt, reply)
        return reply

    utils.LLMClient.generate = generate


def _patch_skill(skill_cls: Any, module: Any, phases: wc.SubPhases) -> None:
    """The step names, the memory ids, the store location (module docstring)."""
    for method, step in STEPS.items():
        real = getattr(skill_cls, method)

        def wrapped(self: Any, *args: Any, _real: Any = real, _step: str = step,
                    **kwargs: Any) -> Any:
            with phases.step(_step):
                return _real(self, *args, **kwargs)

        setattr(skill_cls, method, wrapped)
    module.generate_memory_id = _memory_id
    real_save, real_load = skill_cls.save_to_disk, skill_cls.load_from_disk

    def _where(data_dir: str | None) -> str:
        if data_dir is not None:
            return data_dir
        if _state["data_dir"] is None:
            raise RuntimeError("no unit is being served: the skill has no store")
        return str(_state["data_dir"])

    def save_to_disk(self: Any, data_dir: str | None = None) -> None:
        if _state["read_only"]:
            return None
        return real_save(self, _where(data_dir))

    def load_from_disk(self: Any, data_dir: str | None = None) -> Any:
        _state["loaded"] = real_load(self, _where(data_dir))
        return _state["loaded"]

    real_results = skill_cls._build_recall_results

    def build_recall_results(self: Any, retrieved_chunks: Any, *args: Any, **kwargs: Any) -> Any:
        _state["retrieved"] = list(retrieved_chunks)  # the scores recall does not return
        return real_results(self, retrieved_chunks, *args, **kwargs)

    skill_cls.save_to_disk = save_to_disk
    skill_cls.load_from_disk = load_from_disk
    skill_cls._build_recall_results = build_recall_results


def _offline_nltk() -> None:
    """nltk.download -> whether the resource is here (the skill ignores the answer)."""
    import nltk

    where = {"punkt_tab": "tokenizers/punkt_tab/english/", "stopwords": "corpora/stopwords"}

    def download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        try:
            nltk.data.find(where.get(str(info_or_id), str(info_or_id)))
        except LookupError:
            return False
        return True

    nltk.download = download
    nltk.data.find("tokenizers/punkt_tab/english/")  # LookupError now, not at the first store


# --------------------------------------------------------------------------- protocol


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    wc.freeze_clock(req.get("clock") or "2025-01-01T00:00:00")
    wc.refuse_network()
    _state["settings"] = dict(req.get("settings") or {})
    src = Path(os.environ.get("STRUCTMEM_SYSTEM_SRC") or "")
    if not (src / "SEEM" / "core" / "seem_skill.py").is_file():
        raise RuntimeError(f"STRUCTMEM_SYSTEM_SRC={str(src)!r} holds no SEEM/core/seem_skill.py: "
                           f"run `python jobs/data.py systems install {SYSTEM}`")
    sys.path.insert(0, str(src))
    _state["prints"] = wc.PrintWatcher(sys.stdout, PRINT_RULES)
    _state["phases"] = wc.SubPhases()
    _state["phases"].install()
    old, sys.stdout = sys.stdout, _state["prints"]
    try:
        import SEEM
        from SEEM.core import prompts, schema, utils
        from SEEM.core import seem_skill as module
        # SEEM/config.py, as the name SEEM/core/utils.py imported it by (its sys.path entry)
        skill_config = importlib.import_module("config")
    finally:
        sys.stdout = old
    _offline_nltk()
    _patch_llm(utils)
    _patch_skill(module.SEEMSkill, module, _state["phases"])
    _state.update(seem=SEEM, prompts=prompts, schema=schema)
    fields = {f.name for f in dataclasses.fields(schema.SEEMConfig)}
    bad = sorted(set(_state["settings"]) - NOT_CONFIG - fields)
    if bad or set(_state["settings"]) & SET_BY_WORKER:
        raise ValueError(f"system.options {bad or sorted(set(_state['settings']) & SET_BY_WORKER)}"
                         f": expected SEEMConfig fields (but the LLM and encoder ones, set per "
                         f"unit) or mode")
    schema.RecallMode(str(_state["settings"].get("mode", "lite")))  # ValueError: no such mode
    # What the released code calls its defaults, for the record (docs/methods.md)
    klass = schema.SEEMConfig()
    defaults = {"class": {"retrieve_strategy": str(klass.retrieve_strategy.value),
                          "integration_window": klass.integration_window},
                "config_file": {k: skill_config.SEEM_DEFAULT_CONFIG[k]
                                for k in ("retrieve_strategy", "integration_window")}}
    return {"defaults": defaults}


def _config(req: dict[str, Any]) -> Any:
    schema = _state["schema"]
    options = {k: v for k, v in _state["settings"].items() if k not in NOT_CONFIG}
    if "retrieve_strategy" in options:
        options["retrieve_strategy"] = schema.RetrieveStrategy(str(options["retrieve_strategy"]))
    return schema.SEEMConfig(
        llm_api_key=API_KEY, llm_model=str(req["model"]), llm_base_url=str(req["base_url"]),
        mm_encoder_api_key=API_KEY, mm_encoder_model=str(req.get("embed_model")),
        mm_encoder_base_url=str(req["base_url"]), **options)


def _begin(req: dict[str, Any], store: Path, read_only: bool) -> None:
    _state.update(data_dir=store, read_only=read_only, failed=[], loaded=None, retrieved=None)
    _state["phases"].unit(str(req["base_url"]))
    _state["prints"].take()


def _end() -> None:
    _state["phases"].unit(None)
    _state.update(data_dir=None, read_only=False)


def _raise_failed() -> None:
    if _state["failed"]:
        raise _state["failed"][0]


def _observation(turn: dict[str, Any], when: str | None) -> dict[str, Any]:
    obs: dict[str, Any] = {"dialogue_id": str(turn["event_id"]), "speaker": str(turn["speaker"]),
                           "text": str(turn.get("raw_text", turn["text"]))}
    if when:
        obs["timestamp"] = when
    if turn.get("image_caption"):
        obs["image"] = {"img_id": f"{turn['event_id']}:image", "caption": turn["image_caption"],
                        "path": None}
    return obs


def _chunk_time(skill: Any, chunk_id: str | None) -> str | None:
    return (skill.chunk_store.get(chunk_id) or {}).get("timestamp") if chunk_id else None


def _memory_of(skill: Any, chunk_id: str) -> Any:
    """The first memory holding the chunk (the skill's own lookup in _build_recall_results)."""
    return next((m for m in skill.memories.values() if chunk_id in m.chunk_ids), None)


def _fact_text(subject: str, predicate: str, obj: str, time: str | None) -> str:
    return f"{subject} -- {predicate} -- {obj}" + (f" ({time})" if time else "")


def _memories(skill: Any) -> list[dict[str, Any]]:
    """The skill's store as memories: its episodic memories, fact triples and raw chunks."""
    fmt = _state["seem"].format_structured_text
    out = []
    for mid, mem in skill.memories.items():
        meta = {"kind": "episodic", "chunk_ids": list(mem.chunk_ids), "summary": mem.summary,
                "events": mem.events, "image_ids": list(mem.image_ids)}
        out.append({"memory_id": str(mid), "owner": None, "kind": "memory",
                    "text": fmt(mem.summary, mem.events),
                    "created_at": _chunk_time(skill, mem.chunk_ids[0] if mem.chunk_ids else None),
                    "metadata": json.loads(json.dumps(meta, default=str))})
    for i, fact in enumerate(skill.facts):
        meta = {"kind": "fact", "subject": fact.subject, "predicate": fact.predicate,
                "object": fact.obj, "time": fact.time, "chunk_id": fact.chunk_id,
                "confidence": fact.confidence}
        out.append({"memory_id": f"fact:{i}", "owner": None, "kind": "relation",
                    "text": _fact_text(fact.subject, fact.predicate, fact.obj, fact.time),
                    "created_at": _chunk_time(skill, fact.chunk_id), "metadata": meta})
    for cid, chunk in skill.chunk_store.items():
        mem = _memory_of(skill, cid)
        meta = {"kind": "chunk", "dialogue_id": chunk.get("dialogue_id"),
                "memory_id": mem.memory_id if mem else None,
                "embedded": cid in skill.chunk_embeddings,
                "image": chunk.get("image")}
        out.append({"memory_id": f"chunk:{cid}", "owner": chunk.get("speaker"), "kind": "passage",
                    "text": str(chunk.get("text") or ""), "created_at": chunk.get("timestamp"),
                    "metadata": json.loads(json.dumps(meta, default=str))})
    return out


def _graph_counts(skill: Any) -> dict[str, Any]:
    g = skill.nx_graph
    nodes = Counter(str(d.get("node_type")) for _, d in g.nodes(data=True))
    edges = Counter(str(d.get("edge_type")) for _, _, d in g.edges(data=True))
    return {"nodes": dict(sorted(nodes.items())), "edges": dict(sorted(edges.items())),
            "stats": skill.get_stats()}


def _build(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    store = Path(req["store_dir"]).absolute()
    shutil.rmtree(store, ignore_errors=True)  # a rebuild starts empty
    store.mkdir(parents=True)
    prints: wc.PrintWatcher = _state["prints"]
    _begin(req, store, read_only=False)
    old, sys.stdout = sys.stdout, prints
    try:
        skill = _state["seem"].SEEMSkill(_config(req))
        for session in sorted(req["sessions"], key=lambda s: s["session_index"]):
            for turn in session["turns"]:
                skill.store(_observation(turn, session.get("session_time")))
                _raise_failed()
        skill.flush()
        _raise_failed()
        skill.save_to_disk()  # flush() does not save
        memories = _memories(skill)
        counts = _graph_counts(skill)
    finally:
        sys.stdout = old
        _end()
    drops = prints.take()
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "counts": json.loads(json.dumps(counts))}


def _hits(skill: Any, found: dict[str, Any]) -> list[dict[str, Any]]:
    """recall's memories (its text, verbatim) then its facts, in its order."""
    scores = {str(c): float(s) for c, s in _state["retrieved"] or []}
    lite = str(_state["settings"].get("mode", "lite")) == "lite"
    hits = []
    for item in found.get("memories") or []:
        cid = str(item.get("dialogue_id"))
        mem = _memory_of(skill, cid)
        mid = (mem.memory_id if mem else cid) if lite else f"chunk:{cid}"
        hits.append({"memory_id": str(mid), "owner": None, "kind": "memory",
                     "text": str(item.get("text") or ""), "created_at": _chunk_time(skill, cid),
                     "score": scores.get(cid)})
    for fact in found.get("facts") or []:
        key = (fact.get("subject"), fact.get("predicate"), fact.get("object"), fact.get("chunk_id"))
        index = next((i for i, f in enumerate(skill.facts)
                      if (f.subject, f.predicate, f.obj, f.chunk_id) == key), None)
        hits.append({"memory_id": f"fact:{index}", "owner": None, "kind": "relation",
                     "text": _fact_text(str(fact.get("subject")), str(fact.get("predicate")),
                                        str(fact.get("object")), fact.get("time")),
                     "created_at": _chunk_time(skill, fact.get("chunk_id")),
                     "score": None if fact.get("score") is None else float(fact["score"])})
    return hits


def _search(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    store = Path(req["store_dir"]).absolute()
    if not (store / "memories.json").is_file():
        raise FileNotFoundError(f"{store / 'memories.json'}: no SEEM store (build first)")
    s = _state["settings"]
    k = int(req.get("k") or s.get("top_k") or 3)
    mode = _state["schema"].RecallMode(str(s.get("mode", "lite")))
    prints: wc.PrintWatcher = _state["prints"]
    results: dict[str, list[dict[str, Any]]] = {}
    _begin(req, store, read_only=True)
    old, sys.stdout = sys.stdout, prints
    try:
        skill = _state["seem"].SEEMSkill(_config(req))  # loads the store (enable_cache)
        if _state["loaded"] is None:  # enable_cache=false: the skill loads nothing itself
            skill.load_from_disk()
        if _state["loaded"] is not True:
            raise RuntimeError(f"{store}: the skill could not load its store (see the log)")
        for q in req["questions"]:
            _state["retrieved"] = None
            found = skill.recall({"text": str(q["question"])}, top_k=k, mode=mode)
            _raise_failed()
            results[str(q["question_id"])] = _hits(skill, found)
    finally:
        sys.stdout = old
        _end()
    drops = prints.take()
    return {"op": "found", "unit": unit, "results": results, "calls": 0,
            "dropped": len(drops), "drops": drops}


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, wc.repository_version())
