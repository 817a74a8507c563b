"""MemoryOS worker: `<systems_dir>/memoryos/bin/python memoryos_worker.py` (systems/protocol.py).

Runs MemoryOS's LoCoMo evaluation code (BAI-LAB/MemoryOS `eval/`, pinned commit, exported by
`systems install memoryos` into `<env>/src`: STRUCTMEM_SYSTEM_SRC) from its own environment:
its memory modules (`short_term_memory`, `mid_term_memory`, `long_term_memory`,
`dynamic_update`, `retrieval_and_answer`, `utils`) and its driver `main_loco_parse`, imported
from `src/eval`, never copied.

Build, as `main_loco_parse.main()` runs a sample: the payload becomes a LoCoMo conversation
(speaker_a, speaker_b, `session_<n>` turns with their `session_<n>_date_time` in LoCoMo's text
form, a turn's image caption back in `blip_caption`: the payload's `image_caption` where it
carries one apart, else the " [image: ...]" suffix of its `text`) that the driver's own `process_conversation` pairs
into pages (a speaker_a turn and the speaker_b turn after it; a speaker_b turn with no speaker_a
turn before it in its pair replaces the earlier reply, and a page without both halves is never
stored: MemoryOS's eviction skips it, counted as `unpaired` in the reply, not as a drop). Each
page goes through `ShortTermMemory(max_capacity=1)` (`short_term_capacity`), so the driver's
`bulk_evict_and_update_mid_term` moves it at once into the mid-term memory (a continuity call
and a meta-summary call per page, one topic-summary call, then per theme the closest segment
or a new one, with keyword calls), and after every page the driver's
`update_user_profile_from_top_segment` analyses a segment whose heat reached its threshold
(5.0) into the long-term memory: the user profile, user knowledge (one entry per line of the
analysis) and assistant knowledge. The driver's settings are kept (mid-term capacity 2000,
topic similarity threshold 0.6); the profile is kept under the unit's id (the driver's
sample_id).

speaker_a / speaker_b are the payload's `speaker_a` / `speaker_b` (the load stage's
conversations table: LoCoMo's named roles, LongMemEval's user and assistant), so pages pair
LoCoMo's speaker_a turn with the reply after it even where speaker_b speaks first (conv-30, 41,
42, 43, 47, 49: that opening turn has no speaker_a turn before it and is left unpaired, as the
driver leaves it). A payload without them (a run loaded before that table) falls back to the
speakers in first-appearance order.

Search, as the driver answers a question: `RetrievalAndAnswer(queue_capacity=k).retrieve(q,
segment_threshold=0.1, page_threshold=0.1, knowledge_threshold=0.1)` over the store read back;
the mid-term search takes `segments` segments (its top_k, default 5) and the long-term search
`knowledge` entries (default 10). The hits are what the driver's answer prompt shows, in its
order: the short-term memory whole (kind "passage"; empty with capacity 1, as in the driver),
the retrieved pages (kind "passage": both halves and the page's conversation-chain overview,
the page's session date, MemoryOS's page similarity as score; a page two themes stored twice is
listed once), the user profile (kind "context"), the retrieved user knowledge (kind "memory",
owner speaker_a) and all assistant knowledge (kind "memory", owner speaker_b, one hit per
line), with the driver's renaming applied ("user"/"assistant" -> the speakers, "I" -> speaker_b
in assistant knowledge). MemoryOS's answer prompt is not sent: our reader answers.

What the worker changes around MemoryOS, never in its files:
- `openai.OpenAI` is replaced before MemoryOS is imported: every client it builds (its
  module-level `OpenAI(api_key='', base_url='https://...')`, whose explicit URL would beat
  OPENAI_BASE_URL) forwards to a client of the unit's front URL. `model="gpt-4o-mini"` is sent
  as it is (the front maps it to the served model).
- `sentence_transformers` is a stand-in module: MemoryOS's `get_embedding` builds
  `SentenceTransformer('all-MiniLM-L6-v2')` on every call; here that is a client of the front's
  /embeddings (the job's encoder, as for every system). Texts embedded once are remembered per
  unit (MemoryOS re-embeds every page of a matched segment for every question): the encoder is
  deterministic, so only the request count changes.
- `get_timestamp` (wall-clock `time.strftime`, not covered by the frozen `datetime.now()`) is
  the frozen clock (`system.clock`) in every MemoryOS module that imported it: segment times,
  visit times and knowledge times are the same on every rerun (the answer prompt shows the
  assistant knowledge's time; `datetime.now()` recency is frozen by worker_common).

Drops, counted where MemoryOS swallows or the driver would stop: a topic-summary reply that is
not a non-empty JSON array (`gpt_generate_multi_summary` returns no themes: the evicted pages
are never stored), an eviction that raised on a reply (e.g. themes that are not objects: the
pages are lost and the conversation goes on, where the driver would stop) and a persona update
that raised on a reply. A failed call to the front (openai.APIError) fails the unit.

Store (per unit, under store_dir): MemoryOS's own files (`short_term.json`, `mid_term.json`,
`long_term.json`: each memory saves itself there and loads itself back) and `unit.json` (the
speakers, the profile key, and each LoCoMo session time's ISO form for the hits' dates).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import re
import sys
import types
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import worker_common as wc

SYSTEM = "memoryos"
log = logging.getLogger("structmem.worker")
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # MemoryOS's get_timestamp format
SHORT_FILE, MID_FILE, LONG_FILE, UNIT_FILE = ("short_term.json", "mid_term.json",
                                              "long_term.json", "unit.json")
# main_loco_parse.main()'s settings at the pinned commit
MID_CAPACITY = 2000
TOPIC_SIMILARITY = 0.6
RETRIEVE_THRESHOLD = 0.1  # its retrieve() call's segment, page and knowledge thresholds
MODULES = ("utils", "short_term_memory", "mid_term_memory", "long_term_memory",
           "dynamic_update", "retrieval_and_answer", "main_loco_parse")

_state: dict[str, Any] = {"settings": {}, "mods": {}, "client": None, "real_openai": None,
                          "drops": []}
_EMBED: dict[str, Any] = {"url": None, "model": None, "opener": None, "memo": {}}


# --------------------------------------------------------------------------- stand-ins


class _FrontClient:
    """What `openai.OpenAI(...)` builds inside MemoryOS: the URL and key it is given are
    ignored; every attribute is the unit's client, pointed at the front."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        client = _state["client"]
        if client is None:
            raise RuntimeError("no unit is being served: no front URL for MemoryOS's client")
        return getattr(client, name)


class SentenceTransformer:
    """`sentence_transformers.SentenceTransformer` as MemoryOS's `get_embedding` uses it
    (`encode([text], convert_to_numpy=True)`): the front's /embeddings for the unit being
    served; the model name is ignored."""

    def __init__(self, model_name_or_path: str | None = None, *args: Any, **kwargs: Any) -> None:
        self.model_name = model_name_or_path

    def encode(self, sentences: Any, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError(f"encode() takes strings, got {[type(t).__name__ for t in texts]}")
        memo: dict[str, Any] = _EMBED["memo"]
        todo = list(dict.fromkeys(t for t in texts if t not in memo))
        if todo:
            if _EMBED["url"] is None:
                raise RuntimeError("no unit is being served: no embeddings endpoint")
            body = json.dumps({"model": _EMBED["model"], "input": todo,
                               "encoding_format": "base64"}).encode()
            req = urllib.request.Request(f"{_EMBED['url']}/embeddings", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
            with _EMBED["opener"].open(req, timeout=600) as resp:
                data = json.loads(resp.read())["data"]
            for d in sorted(data, key=lambda d: d["index"]):
                memo[todo[d["index"]]] = np.frombuffer(base64.b64decode(d["embedding"]),
                                                       dtype="<f4").astype(np.float32)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        out = np.vstack([memo[t] for t in texts])
        return out[0] if single else out


def _install_stand_ins() -> None:
    import openai

    if _state["real_openai"] is None:
        _state["real_openai"] = openai.OpenAI
    openai.OpenAI = _FrontClient  # type: ignore[misc,assignment]
    st = types.ModuleType("sentence_transformers")
    st.SentenceTransformer = SentenceTransformer  # type: ignore[attr-defined]
    sys.modules["sentence_transformers"] = st


def _timestamp() -> str:
    """MemoryOS's get_timestamp on the frozen clock (datetime.now() is frozen; time is not)."""
    return dt.datetime.now().strftime(TIME_FORMAT)


# --------------------------------------------------------------------------- protocol


def _hello(req: dict[str, Any]) -> dict[str, Any]:
    wc.freeze_clock(req.get("clock") or "2025-01-01T00:00:00")
    wc.refuse_network()
    _state["settings"] = dict(req.get("settings") or {})
    src = os.environ.get("STRUCTMEM_SYSTEM_SRC")
    eval_dir = Path(src or "") / "eval"
    if not src or not (eval_dir / "main_loco_parse.py").exists():
        raise RuntimeError(f"STRUCTMEM_SYSTEM_SRC={src!r} holds no eval/main_loco_parse.py: run "
                           f"`python jobs/data.py systems install memoryos`")
    _EMBED["opener"] = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    _install_stand_ins()
    sys.path.insert(0, str(eval_dir))
    import importlib

    mods = {name: importlib.import_module(name) for name in MODULES}
    stamp = mods["utils"].get_timestamp
    for mod in mods.values():
        if getattr(mod, "get_timestamp", None) is stamp:
            mod.get_timestamp = _timestamp
    updater = mods["dynamic_update"]
    if not hasattr(updater.gpt_generate_multi_summary, "counts_drops"):  # a second hello
        updater.gpt_generate_multi_summary = _counted_themes(updater.gpt_generate_multi_summary)
    _state["mods"] = mods
    return {}


def _counted_themes(real: Any) -> Any:
    def themes(text: str, client: Any) -> Any:
        out = real(text, client)
        if not out.get("summaries"):  # unparsed or empty: the evicted pages go nowhere
            _state["drops"].append({"where": "summary", "why": "topic reply not a non-empty "
                                    "JSON array of themes: its pages not stored"})
        return out
    themes.counts_drops = True  # type: ignore[attr-defined]
    return themes


def _open_unit(req: dict[str, Any]) -> None:
    _state["client"] = _state["real_openai"](base_url=str(req["base_url"]),
                                             api_key=os.environ.get("OPENAI_API_KEY") or "x")
    _EMBED.update(url=str(req["base_url"]).rstrip("/"), model=req.get("embed_model"), memo={})


def _close_unit() -> None:
    client, _state["client"] = _state["client"], None
    if client is not None:
        client.close()
    _EMBED.update(url=None, model=None, memo={})


def _locomo_time(value: str | None) -> str:
    """The session time as LoCoMo writes it ("1:56 pm on 8 May, 2023"), which is what the
    driver stores with each page; a value that is not ISO goes as it is."""
    if not value:
        return ""
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError:
        return value
    hour = t.hour % 12 or 12
    return f"{hour}:{t.minute:02d} {'am' if t.hour < 12 else 'pm'} on {t.day} {t:%B}, {t.year}"


_IMAGE = re.compile(r"(.*) \[image: (.*)\]", re.DOTALL)  # stages.build_payloads' caption suffix


def _dialog(turn: dict[str, Any]) -> dict[str, Any]:
    if "raw_text" in turn:  # a payload that carries the turn's text and caption apart
        out = {"speaker": turn["speaker"], "text": str(turn.get("raw_text") or "")}
        if turn.get("image_caption"):
            out["blip_caption"] = str(turn["image_caption"])
        return out
    text = str(turn.get("text") or "")
    m = _IMAGE.fullmatch(text)
    if m:  # the caption back in LoCoMo's field, for process_conversation to format its way
        return {"speaker": turn["speaker"], "text": m.group(1), "blip_caption": m.group(2)}
    return {"speaker": turn["speaker"], "text": text}


def _conversation(sessions: list[dict[str, Any]],
                  speakers: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The payload as a LoCoMo `conversation` record, and LoCoMo session time -> ISO."""
    who = [*speakers, "", ""][:2]
    conv: dict[str, Any] = {"speaker_a": who[0], "speaker_b": who[1]}
    times: dict[str, str] = {}
    for s in sorted(sessions, key=lambda s: s["session_index"]):
        idx = int(s["session_index"])
        when = _locomo_time(s.get("session_time"))
        if s.get("session_time"):
            times.setdefault(when, str(s["session_time"]))
        conv[f"session_{idx}_date_time"] = when
        conv[f"session_{idx}"] = [_dialog(t) for t in s["turns"]]
    return conv, times


def _memories(store: Path) -> tuple[Any, Any, Any, Any]:
    """The driver's memory modules on the unit's files (each loads what is there)."""
    m = _state["mods"]
    cap = int(_state["settings"].get("short_term_capacity", 1))
    short = m["short_term_memory"].ShortTermMemory(max_capacity=cap,
                                                   file_path=str(store / SHORT_FILE))
    mid = m["mid_term_memory"].MidTermMemory(max_capacity=MID_CAPACITY,
                                             file_path=str(store / MID_FILE))
    long = m["long_term_memory"].LongTermMemory(file_path=str(store / LONG_FILE))
    updater = m["dynamic_update"].DynamicUpdate(short, mid, long,
                                                topic_similarity_threshold=TOPIC_SIMILARITY,
                                                client=m["main_loco_parse"].client)
    return short, mid, long, updater


def _page_text(page: dict[str, Any], a: str, b: str) -> str:
    """A page as the driver's answer prompt lists it (both halves, the chain overview)."""
    text = f"{a}: {page.get('user_input', '')}\n{b}: {page.get('agent_response', '')}"
    if page.get("meta_info"):
        text += f"\nConversation chain overview: {page['meta_info']}"
    return text


def _lines(text: str) -> list[str]:
    return [ln.strip().removeprefix("- ").strip() for ln in str(text).splitlines()
            if ln.strip().removeprefix("- ").strip()]


def _as_speakers(text: str, a: str, b: str) -> str:
    """The driver's renaming of the user profile and knowledge before its answer prompt."""
    text = re.sub(r"(?i)\buser\b", a, text)
    return re.sub(r"(?i)\bassistant\b", b, text)


def _build(req: dict[str, Any]) -> dict[str, Any]:
    import openai

    unit = str(req["unit"])
    wc.seed_ids(f"build:{unit}")
    store = Path(req["store_dir"])
    store.mkdir(parents=True, exist_ok=True)
    for name in (SHORT_FILE, MID_FILE, LONG_FILE, UNIT_FILE):
        (store / name).unlink(missing_ok=True)  # a rebuild starts empty (they load what is there)
    named = [req.get("speaker_a"), req.get("speaker_b")]
    speakers = ([str(s) for s in named] if all(named)  # the benchmark's roles
                else [str(s) for s in req.get("speakers") or []])  # first-appearance order
    conv, times = _conversation(req["sessions"], speakers)
    a, b = conv["speaker_a"], conv["speaker_b"]
    main = _state["mods"]["main_loco_parse"]
    drops: list[dict[str, str]] = []
    _state["drops"] = drops
    _open_unit(req)
    try:
        short, mid, long, updater = _memories(store)
        dialogs = main.process_conversation(conv)
        unpaired = sum(1 for d in dialogs if not (d.get("user_input") and d.get("agent_response")))
        for dialog in dialogs:  # main_loco_parse.main()'s loop over a sample's pages
            try:
                short.add_qa_pair(dialog)
                if short.is_full():
                    updater.bulk_evict_and_update_mid_term()
            except openai.APIError:
                raise  # the front or the model server failed: the unit fails
            except Exception as e:  # noqa: BLE001 - a reply MemoryOS could not handle
                log.warning("eviction: %s: %s", type(e).__name__, e)
                drops.append({"where": "evict", "why": f"{type(e).__name__} on a reply: the "
                              "evicted pages not stored"})
            try:
                main.update_user_profile_from_top_segment(mid, long, unit, main.client)
            except openai.APIError:
                raise
            except Exception as e:  # noqa: BLE001
                log.warning("profile update: %s: %s", type(e).__name__, e)
                drops.append({"where": "profile", "why": f"{type(e).__name__} on a reply: "
                              "persona not updated"})
        for memory in (short, mid, long):
            memory.save()
        (store / UNIT_FILE).write_text(json.dumps(
            {"sample_id": unit, "speakers": [a, b], "times": times}, indent=1))
        memories = _memory_rows(unit, short, mid, long, a, b, times)
    finally:
        _close_unit()
    pages = sum(1 for m in memories if m["metadata"]["kind"] == "page")
    return {"op": "built", "unit": unit, "memories": memories, "calls": 0,
            "dropped": len(drops), "drops": drops, "pages": pages,
            "segments": len(mid.sessions), "unpaired": unpaired}


def _row(memory_id: str, owner: str | None, text: str, created_at: str | None,
         meta: dict[str, Any]) -> dict[str, Any]:
    return {"memory_id": memory_id, "owner": owner, "text": text, "created_at": created_at,
            "metadata": json.loads(json.dumps(meta, default=str))}


def _memory_rows(unit: str, short: Any, mid: Any, long: Any, a: str, b: str,
                 times: dict[str, str]) -> list[dict[str, Any]]:
    """What the unit's store holds, as memories (empty texts left out)."""
    rows: list[dict[str, Any]] = []
    for i, qa in enumerate(short.get_all()):
        rows.append(_row(f"short_term:{i}", None, _page_text(qa, a, b),
                         times.get(str(qa.get("timestamp"))),
                         {"kind": "short_term", "timestamp": qa.get("timestamp")}))
    pages: dict[str, dict[str, Any]] = {}
    for sid, seg in mid.sessions.items():
        if str(seg.get("summary") or "").strip():
            rows.append(_row(str(sid), None, str(seg["summary"]), None, {
                "kind": "segment", "keywords": seg.get("summary_keywords"),
                "pages": len(seg.get("details") or []), "heat": seg.get("H_segment")}))
        for page in seg.get("details") or []:
            pid = str(page.get("page_id"))
            if pid in pages:  # one page stored under two themes
                pages[pid]["metadata"]["segments"].append(str(sid))
                continue
            pages[pid] = _row(pid, None, _page_text(page, a, b),
                              times.get(str(page.get("timestamp"))), {
                "kind": "page", "segments": [str(sid)], "timestamp": page.get("timestamp"),
                "keywords": page.get("page_keywords"), "meta_info": page.get("meta_info"),
                "pre_page": page.get("pre_page"), "next_page": page.get("next_page"),
                "analyzed": page.get("analyzed")})
            rows.append(pages[pid])
    profile = long.get_raw_user_profile(unit)
    if str(profile or "").strip():
        rows.append(_row(f"profile:{unit}", a, str(profile), None, {"kind": "profile"}))
    for i, entry in enumerate(long.get_knowledge()):
        if str(entry.get("knowledge") or "").strip():
            rows.append(_row(f"knowledge:{i}", a, str(entry["knowledge"]), None,
                             {"kind": "knowledge", "timestamp": entry.get("timestamp")}))
    for i, entry in enumerate(long.get_assistant_knowledge()):
        if str(entry.get("knowledge") or "").strip():
            rows.append(_row(f"assistant:{i}", b, str(entry["knowledge"]), None,
                             {"kind": "assistant_knowledge", "timestamp": entry.get("timestamp")}))
    return rows


def _search(req: dict[str, Any]) -> dict[str, Any]:
    unit = str(req["unit"])
    wc.seed_ids(f"search:{unit}")
    store = Path(req["store_dir"])
    if not (store / UNIT_FILE).exists():
        raise FileNotFoundError(f"{store / UNIT_FILE}: no MemoryOS store (build first)")
    info = json.loads((store / UNIT_FILE).read_text())
    a, b = info["speakers"]
    times: dict[str, str] = info.get("times") or {}
    settings = _state["settings"]
    k = int(req.get("k") or settings.get("top_k", 10))
    segments = int(settings.get("segments", 5))
    knowledge = int(settings.get("knowledge", 10))
    mods = _state["mods"]
    main = mods["main_loco_parse"]
    results: dict[str, list[dict[str, Any]]] = {}
    _open_unit(req)
    try:
        short, mid, long, updater = _memories(store)
        retrieval = mods["retrieval_and_answer"].RetrievalAndAnswer(
            short, mid, long, updater, queue_capacity=k)
        scores: dict[str, float] = {}
        search_segments = mid.search_sessions_by_summary
        search_knowledge = long.search_knowledge

        def segments_search(query: str, client: Any, segment_threshold: float = 0.8,
                            page_threshold: float = 0.7, top_k: int = segments,
                            **kw: Any) -> Any:
            found = search_segments(query, client, segment_threshold, page_threshold,
                                    top_k=top_k, **kw)
            for item in found:
                for page, score in item["matched_pages"]:
                    pid = str(page.get("page_id"))
                    scores[pid] = max(float(score), scores.get(pid, float("-inf")))
            return found

        def knowledge_search(query: str, threshold: float = 0.1, top_k: int = knowledge) -> Any:
            return search_knowledge(query, threshold=threshold, top_k=top_k)

        # instance attributes: retrieve() calls these; the depths are the paper's settings
        mid.search_sessions_by_summary = segments_search
        long.search_knowledge = knowledge_search
        index = {id(e): i for i, e in enumerate(long.get_knowledge())}
        for q in req["questions"]:
            scores.clear()
            found = retrieval.retrieve(q["question"], segment_threshold=RETRIEVE_THRESHOLD,
                                       page_threshold=RETRIEVE_THRESHOLD,
                                       knowledge_threshold=RETRIEVE_THRESHOLD, client=main.client)
            results[str(q["question_id"])] = _hits(found, short, long, unit, a, b, times,
                                                   scores, index)
    finally:
        _close_unit()
    return {"op": "found", "unit": unit, "results": results, "calls": 0, "dropped": 0,
            "drops": []}


def _hits(found: dict[str, Any], short: Any, long: Any, unit: str, a: str, b: str,
          times: dict[str, str], scores: dict[str, float],
          index: dict[int, int]) -> list[dict[str, Any]]:
    """What the driver's answer prompt shows for one question, in its order."""
    hits: list[dict[str, Any]] = []

    def hit(memory_id: str, owner: str | None, kind: str, text: str, when: str | None,
            score: float | None = None) -> None:
        hits.append({"memory_id": memory_id, "owner": owner, "kind": kind, "text": text,
                     "created_at": when, "score": score})

    for i, qa in enumerate(short.get_all()):
        hit(f"short_term:{i}", None, "passage", _page_text(qa, a, b),
            times.get(str(qa.get("timestamp"))))
    seen: set[str] = set()
    for page in found["retrieval_queue"]:
        pid = str(page.get("page_id"))
        if pid in seen:
            continue
        seen.add(pid)
        hit(pid, None, "passage", _page_text(page, a, b), times.get(str(page.get("timestamp"))),
            scores.get(pid))
    profile = long.get_user_profile(unit)
    if profile and str(profile.get("data") or "").strip():
        hit(f"profile:{unit}", a, "context",
            f"User profile of {a}:\n{_as_speakers(str(profile['data']), a, b)}", None)
    for entry in found["long_term_knowledge"]:
        text = _as_speakers(str(entry.get("knowledge") or ""), a, b).strip()
        text = text.removeprefix("- ").strip()  # one line of the analysis' list; render bullets
        if text:
            hit(f"knowledge:{index.get(id(entry), -1)}", a, "memory", text, None)
    for i, entry in enumerate(long.get_assistant_knowledge()):
        for j, line in enumerate(_lines(entry.get("knowledge") or "")):
            hit(f"assistant:{i}:{j}", b, "memory", re.sub(r"\bI\b", b, line), None)
    return hits


if __name__ == "__main__":
    wc.serve({"hello": _hello, "build": _build, "search": _search}, SYSTEM, wc.repository_version())
