"""The stages of a baseline system run from its own code: `system_build`, `system_search`.

    python jobs/data.py systems install mem0
    python jobs/run.py method=mem0 benchmark=sample            # conf/method/mem0.yaml

`system_build` starts the recording front (systems/front.py) on the loopback, forwarding chat
to the job's backend (`llm`) and serving embeddings from the job's encoder, then runs the
system's build per conversation in `system.workers` worker processes of the system's own
environment (systems/pool.py, systems/envs.py). Each conversation's store lives in
`<run>/systems/<name>/store/<conv>`; a finished conversation leaves a marker beside it
(`<run>/systems/<name>/done/build/<conv>.json`, keyed by its input, the system's settings,
the model, the encoder and the lock), so a rerun after a crash or a stop signal rebuilds only
the others. A conversation whose build raises is recorded in `system_units` (error, the
worker's log tail) and the others go on; a forced rerun (`force=true`) retries it. Writes
`memories` (the system's memories as it lists them) and `system_units` (per conversation:
memories kept, memories dropped and where, requests, wall time, error).

`system_search` asks the system, per conversation, for each selected question's top
`system.top_k` memories (the paper's setting: systems/<name>.py `paper_settings`), writing
`system_hits` (text, owner, date, score per hit: what the reader shows) and `retrievals`
(circuit "system", item_id = the system's memory id). Our answer, judge and report stages run
unchanged after it (`answer.prompt: structmem_gpu.systems.answer:build_prompts`).

Every call the front saw becomes a `requests.parquet` row of the stage (prompt_version
"<system>/chat" or "<system>/embeddings"): the report's request counts and build cost cover
the foreign systems too, and a rerun's rows say `cache_hit`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

import polars as pl
from pydantic import Field

from structmem_gpu.config.settings import COUNT, RUN_ROLE, SIZE, Settings
from structmem_gpu.core import preempt, schemas
from structmem_gpu.core.artifacts import atomic_write_text
from structmem_gpu.core.errors import ConfigError, StructMemError
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY, LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate,
    http_backend_of,
)
from structmem_gpu.systems import envs
from structmem_gpu.systems.front import FrontCache, HTTPUpstream, RecordingFront, ScriptedUpstream
from structmem_gpu.systems.pool import WorkerPool
from structmem_gpu.systems.protocol import PROTOCOL_VERSION, unit_url
from structmem_gpu.systems.registry import system_spec
from structmem_gpu.systems.spec import SystemSpec

log = logging.getLogger(__name__)

CIRCUIT = "system"
HITS = "system_hits"
SEARCH_UNITS = "system_search_units"  # system_units rows of the search (phase "search")
# A system's own reader prompt per question, where its harness builds one (the search reply's
# "readers"; LightMem's search_locomo.build_prompt_with_speaker_memories): what
# `answer.prompt=structmem_gpu.systems.answer:own_reader` sends instead of our reader.
READERS = "system_readers"
SYSTEM_READERS: schemas.Schema = {
    "question_id": pl.String(),
    "conv_id": pl.String(),
    "prompt": pl.String(),  # the whole prompt, sent as one system message (as the harness does)
}
SYSTEM_HITS: schemas.Schema = {
    "question_id": pl.String(),
    "conv_id": pl.String(),
    "rank": pl.Int32(),
    "memory_id": pl.String(),
    "owner": pl.String(),
    "kind": pl.String(),  # memory | relation (graph systems)
    "text": pl.String(),
    "created_at": pl.String(),
    "score": pl.Float64(),
}


class SystemRunError(StructMemError):
    """A baseline system failed on every conversation (its environment, its worker, the front)."""


class SystemSettings(Settings):
    """`system:` of a baseline-system method (conf/method/_system.yaml, generated)."""

    node: ClassVar[str] = "system"
    yaml_home: ClassVar[str | None] = "method/_system.yaml"

    name: str = Field("mem0", description=(
        "Which system (structmem_gpu/systems/<name>.py); each method YAML sets its own."))
    top_k: COUNT = Field(10, description=(
        "Memories a search returns per question (mem0: per speaker). The default is the paper's "
        "setting of the method's system (StructMem A.4 / SEEM 5.1); see "
        "docs/methods.md \"Baseline systems from their own code\"."))
    options: dict[str, Any] | None = Field(None, description=(
        "The system's own options for its worker (added to the spec's, e.g. mem0 batch_size); "
        "null = the system's defaults as the paper ran them."))
    clock: str = Field("2025-01-01T00:00:00", description=(
        "The instant the worker freezes datetime.now() at (mem0 writes today's date into its "
        "prompts; the published runs used their wall clock): a fixed value makes a rerun send "
        "the same requests, so the response cache answers them."))
    max_tokens: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Cap on the reply budget of every chat request the system sends (max_tokens / "
        "max_completion_tokens, set where absent); null = the system's own budgets, as "
        "published. debug=ci caps them: SmolLM2 fills a 2,000-token budget with noise."))
    workers: Annotated[SIZE, RUN_ROLE] = Field(4, description=(
        "Worker processes of the system, each building one conversation at a time: the server "
        "sees up to this many conversations' requests at once."))
    unit_timeout_s: Annotated[float, RUN_ROLE, Field(gt=0)] = Field(7200.0, description=(
        "Seconds one conversation's build or search may take before its worker is killed and "
        "the conversation recorded as failed."))


# --- the job side of one system --------------------------------------------------------


def _job_path(job: Any, key: str, env: str, default: str) -> Path:
    """paths.<key> as conf/paths resolves it (its env variable, else its default), absolute:
    workers run with their log folder as working directory."""
    paths = job.root.paths
    value = getattr(paths, key, None) if paths is not None else None
    return Path(str(value or os.environ.get(env) or default)).absolute()


def systems_dir_of_job(job: Any) -> Path:
    """paths.systems_dir (STRUCTMEM_SYSTEMS_DIR, else <root>/.systems)."""
    return _job_path(job, "systems_dir", "STRUCTMEM_SYSTEMS_DIR", ".systems")


def official_dir_of(ctx: StageContext) -> Path:
    """paths.official_dir (STRUCTMEM_OFFICIAL_DIR, else <data_dir>/official)."""
    return _job_path(ctx.job, "official_dir", "STRUCTMEM_OFFICIAL_DIR", "data/official")


def systems_dir_of(ctx: StageContext) -> Path:
    return systems_dir_of_job(ctx.job)


def env_problem(job: Any) -> str | None:
    """Why the job's baseline system cannot run on this machine (its environment missing or
    installed from another lock or commit: one line naming the install command); None when it
    can. The preflight's check and the command tests' skip."""
    try:
        envs.check_env(system_spec(job.settings(SystemSettings).name), systems_dir_of_job(job))
    except ConfigError as err:
        return str(err)
    return None


def _upstream(ctx: StageContext, spec: SystemSpec) -> HTTPUpstream | ScriptedUpstream:
    """The job's chat backend as the front forwards to it: its HTTP endpoint, or the system's
    scripted replies when the job's backend is the scripted LLM (unit tests, debug=scripted)."""
    be = http_backend_of(ctx.llm())
    if be is not None:
        return HTTPUpstream(be.base_url, be.served_name, be.model_id,
                            api_key=getattr(be, "_api_key", None),
                            timeout_s=float(getattr(be, "request_timeout_s", 600.0)),
                            flavor=str(getattr(be, "flavor", "vllm")))
    if spec.scripted_reply is None:
        raise ConfigError(f"system {spec.name} has no scripted replies; run it with an HTTP "
                          f"backend (llm=llamacpp_cpu, vllm_*, or llm.base_url=...)")
    return ScriptedUpstream(spec.scripted_reply)


def worker_env(spec: SystemSpec, home: Path) -> dict[str, str]:
    """The worker's environment: nothing of ours on its path, no network, no telemetry."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "HF_HOME", "HF_HUB_CACHE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update({
        "PYTHONNOUSERSITE": "1", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
        # Any client that honours a proxy goes nowhere; the worker also refuses non-loopback
        # sockets itself (workers/worker_common.refuse_network).
        "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "OPENAI_API_KEY": "structmem-local",  # clients refuse to start without one
        "STRUCTMEM_WORKER_HOME": str(home),
        **spec.env,
    })
    if spec.prepare is not None:
        home.mkdir(parents=True, exist_ok=True)
        env.update(spec.prepare(home))
    return env


def worker_env_for(spec: SystemSpec, home: Path, systems_dir: Path,
                   official_dir: Path) -> dict[str, str]:
    """worker_env plus where a repository-released system's code was exported."""
    env = worker_env(spec, home)
    # The official checkouts (paths.official_dir): a worker reads a harness's text at run time
    # from there (LangMem's agent prompt from mem0's evaluation code), never from a copy.
    env["STRUCTMEM_OFFICIAL_DIR"] = str(official_dir)
    if spec.repository is not None:
        env["STRUCTMEM_SYSTEM_SRC"] = str(envs.source_dir(spec, systems_dir))
    return env


def _safe(unit: str) -> str:
    digest = hashlib.sha256(unit.encode()).hexdigest()[:8]
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in unit)[:80] + "-" + digest


def _unit_key(spec: SystemSpec, settings: SystemSettings, model_id: str, encoder_id: str,
              payload: Mapping[str, Any]) -> str:
    canon = json.dumps({"protocol": PROTOCOL_VERSION, "system": spec.name,
                        "lock": envs.lock_sha256(spec), "repository": spec.repository,
                        "options": _options(spec, settings),
                        "top_k": settings.top_k, "clock": settings.clock, "model": model_id,
                        "max_tokens": settings.max_tokens,
                        "encoder": encoder_id, "payload": payload}, sort_keys=True, default=str)
    return hashlib.sha256(canon.encode()).hexdigest()


def _options(spec: SystemSpec, settings: SystemSettings) -> dict[str, Any]:
    return {**dict(spec.options), **dict(settings.options or {})}


@contextlib.contextmanager
def _front(ctx: StageContext, spec: SystemSpec) -> Iterator[RecordingFront]:
    cache_dir = ctx.backends._cache_dir("llm")
    cache = FrontCache(cache_dir / "system_responses.seg") if cache_dir is not None else None

    def embed(texts: Sequence[str]) -> Any:
        return ctx.encode(list(texts))

    with RecordingFront(_upstream(ctx, spec), embed=embed, cache=cache, stage=ctx.stage.name,
                        max_tokens=ctx.settings.max_tokens) as front:
        yield front


def _run_units(ctx: StageContext, spec: SystemSpec, phase: str,
               payloads: Mapping[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Send each unit's payload to the system (resuming finished ones); (replies, unit rows)."""
    s: SystemSettings = ctx.settings
    python = envs.env_python(spec, systems_dir_of(ctx))
    envs.check_env(spec, systems_dir_of(ctx))
    base = ctx.run.root.absolute() / "systems" / spec.name  # workers run elsewhere
    enc = ctx.encoder()
    replies: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    with _front(ctx, spec) as front:
        model_id = front.upstream.model_id
        todo: list[dict[str, Any]] = []
        keys: dict[str, str] = {}
        for unit, payload in payloads.items():
            key = _unit_key(spec, s, model_id, enc.model_id, payload)
            marker = base / "done" / phase / f"{_safe(unit)}.json"
            if marker.exists():  # like the response cache: force=true keeps finished units
                saved = json.loads(marker.read_text())
                if saved.get("key") == key:
                    replies[unit] = saved["reply"]
                    rows.append(_unit_row(unit, phase, saved["reply"], "resumed", 0, 0.0))
                    continue
            store = base / "store" / _safe(unit)
            if phase == "build" and store.exists():
                shutil.rmtree(store)  # a build that did not finish: start it again
            keys[unit] = key
            todo.append({**payload, "op": phase, "unit": unit,
                         "base_url": unit_url(front.url, spec.name, phase, unit),
                         "model": getattr(front.upstream, "served_name", model_id),
                         "embed_model": enc.model_id, "embed_dims": int(enc.dim),
                         "store_dir": str(store), "k": s.top_k})
        hello = {"op": "hello", "system": spec.name, "settings": {**_options(spec, s),
                 "top_k": s.top_k}, "clock": s.clock}
        t0 = time.perf_counter()
        with WorkerPool(spec, python, n=s.workers,
                        env=worker_env_for(spec, base / "home", systems_dir_of(ctx),
                                           official_dir_of(ctx)),
                        log_dir=ctx.run.logs_dir, hello=hello,
                        unit_timeout_s=s.unit_timeout_s) as pool:
            progress = _progress(len(todo), f"{spec.name} {phase}")
            for unit, reply in pool.run(todo):
                progress.update(1)
                calls = front.stats.by_unit.get(unit, 0)
                status = "ok" if reply.get("op") in ("built", "found") else "error"
                if status == "ok":
                    replies[unit] = reply
                    atomic_write_text(base / "done" / phase / f"{_safe(unit)}.json",
                                      json.dumps({"key": keys[unit], "reply": reply}))
                else:
                    log.warning("%s %s %s failed: %s", spec.name, phase, unit, reply.get("error"))
                rows.append(_unit_row(unit, phase, reply, status, calls,
                                      time.perf_counter() - t0))
            progress.close()
        ctx.request_frames.append(front.take_rows(ctx.stage.name))
        ctx.llm_wall_s += time.perf_counter() - t0
        ctx.notes.update(system=spec.name, version=pool.version, workers=s.workers,
                         units=len(payloads), resumed=len(payloads) - len(todo),
                         failed=sum(r["status"] == "error" for r in rows),
                         chat_requests=front.stats.chat, embedding_requests=front.stats.embeddings,
                         cache_hits=front.stats.cache_hits, front_errors=front.stats.errors,
                         worker_restarts=pool.restarts)
    preempt.check(ctx.stage.name)  # stopped: finished units are kept (markers) for the requeue
    failed = [r for r in rows if r["status"] == "error"]
    if todo and len(failed) == len(todo):  # nothing worked: a setup problem, not a bad reply
        first = failed[0]
        raise SystemRunError(
            f"system {spec.name}: every conversation's {phase} failed (logs/system_{spec.name}_*.log); "
            f"first, {first['conv_id']}: {first['error']}\n{first['log_tail'] or ''}")
    return replies, rows


def _progress(total: int, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="conv", disable=total == 0 or not sys.stderr.isatty())


def _unit_row(unit: str, phase: str, reply: Mapping[str, Any], status: str, calls: int,
              wall_s: float) -> dict[str, Any]:
    if phase == "build":
        kept = len(reply.get("memories") or [])
    else:
        kept = sum(len(v) for v in (reply.get("results") or {}).values())
    return {"conv_id": unit, "phase": phase, "status": status,
            "memories": kept if status != "error" else None,
            "dropped": int(reply.get("dropped") or 0),
            "drops": json.dumps(reply.get("drops") or []),
            "requests": calls, "error": reply.get("error"), "log_tail": reply.get("log_tail"),
            "wall_s": round(wall_s, 3)}


# --- system_build ----------------------------------------------------------------------


def build_payloads(turns: pl.DataFrame,
                   conversations: pl.DataFrame | None = None) -> dict[str, dict[str, Any]]:
    """Per conversation: its speakers (first-appearance order), its speaker_a and speaker_b
    when `conversations` (the load stage's table) names both, and dated sessions of turns."""
    named = {} if conversations is None else {
        str(c): {"speaker_a": a, "speaker_b": b}
        for c, a, b in conversations.select("conv_id", "speaker_a", "speaker_b").iter_rows()
        if a is not None and b is not None}
    out: dict[str, dict[str, Any]] = {}
    ordered = turns.sort("conv_id", "session_index", "turn_index")
    for (conv,), part in ordered.group_by("conv_id", maintain_order=True):
        sessions = []
        for (idx,), sess in part.group_by("session_index", maintain_order=True):
            when = sess["session_time"][0]
            sessions.append({
                "session_index": int(idx),
                "session_time": when.isoformat() if when is not None else None,
                # text: what the systems read (caption inline); raw_text + image_caption:
                # for a system's own LoCoMo driver that renders the caption its way
                "turns": [{"event_id": e, "speaker": sp,
                           "text": (t or "") + (f" [image: {c}]" if c else ""),
                           "raw_text": t or "", "image_caption": c}
                          for e, sp, t, c in sess.select("event_id", "speaker", "text",
                                                         "image_caption").iter_rows()],
            })
        speakers = list(dict.fromkeys(part["speaker"].to_list()))
        # a run loaded before the conversations table: no speaker_a / speaker_b keys (the
        # payload, and so each unit's resume key, as it was)
        out[str(conv)] = {"speakers": speakers, **named.get(str(conv), {}), "sessions": sessions}
    return out


def run_build(ctx: StageContext) -> dict[str, pl.DataFrame]:
    spec = system_spec(ctx.settings.name)
    payloads = build_payloads(ctx.read("turns"), ctx.read_optional("conversations"))
    replies, rows = _run_units(ctx, spec, "build", payloads)
    memories = [{"conv_id": unit, "memory_id": str(m.get("memory_id")), "owner": m.get("owner"),
                 "text": str(m.get("text") or ""), "created_at": m.get("created_at"),
                 "metadata": json.dumps(m.get("metadata") or {}, sort_keys=True, default=str)}
                for unit, reply in sorted(replies.items()) for m in reply.get("memories") or []]
    units = schemas.frame(sorted(rows, key=lambda r: r["conv_id"]), schemas.SYSTEM_UNITS)
    ctx.notes.update(memories=len(memories), dropped=int(units["dropped"].sum() or 0))
    return {"memories": schemas.frame(memories, schemas.MEMORIES), "system_units": units}


# --- system_search ---------------------------------------------------------------------


def run_search(ctx: StageContext) -> dict[str, pl.DataFrame]:
    spec = system_spec(ctx.settings.name)
    questions = selected_questions(ctx.job, ctx.read("questions"))
    turns = ctx.read("turns")
    speakers = {str(c): list(dict.fromkeys(p.sort("session_index", "turn_index")["speaker"].to_list()))
                for (c,), p in turns.group_by("conv_id", maintain_order=True)}
    payloads = {
        str(conv): {"speakers": speakers.get(str(conv), []),
                    "questions": [{"question_id": q, "question": t}
                                  for q, t in part.select("question_id", "question").iter_rows()]}
        for (conv,), part in questions.group_by("conv_id", maintain_order=True)
    }
    replies, rows = _run_units(ctx, spec, "search", payloads)
    hits: list[dict[str, Any]] = []
    readers = [{"question_id": str(qid), "conv_id": unit, "prompt": str(prompt)}
               for unit, reply in sorted(replies.items())
               for qid, prompt in (reply.get("readers") or {}).items()]
    for unit, reply in sorted(replies.items()):
        for qid, found in (reply.get("results") or {}).items():
            for rank, h in enumerate(found):
                hits.append({"question_id": qid, "conv_id": unit, "rank": rank,
                             "memory_id": str(h.get("memory_id")), "owner": h.get("owner"),
                             "kind": h.get("kind") or "memory", "text": str(h.get("text") or ""),
                             "created_at": h.get("created_at"),
                             "score": None if h.get("score") is None else float(h["score"])})
    hits_df = schemas.frame(hits, SYSTEM_HITS)
    retrievals = hits_df.select(
        "question_id", "conv_id", pl.lit(CIRCUIT).alias("circuit"), "rank",
        pl.col("memory_id").alias("item_id"), pl.col("score").fill_null(0.0))
    units = schemas.frame(sorted(rows, key=lambda r: r["conv_id"]), schemas.SYSTEM_UNITS)
    ctx.notes.update(questions=questions.height, hits=hits_df.height, readers=len(readers))
    return {HITS: hits_df, "retrievals": schemas.conform(retrievals, schemas.RETRIEVALS),
            SEARCH_UNITS: units, READERS: schemas.frame(readers, SYSTEM_READERS)}


def _estimate(phase: str) -> Any:
    def estimate(inp: EstimateInputs) -> StageEstimate:
        name = inp.job.settings(SystemSettings).name
        convs = inp.turns["conv_id"].n_unique() if inp.turns.height else 0
        if phase == "search":
            # No READERS stand-in: the system's own reader prompts (answer.prompt=...:own_reader)
            # exist only after a real search, so the answer estimate uses the template.
            inp.stand_ins[HITS] = schemas.empty(SYSTEM_HITS)
        return StageEstimate(f"system_{phase}", None, None, None,
                             f"not estimated: external system {name} ({convs} conversations)",
                             build=phase == "build")
    return estimate


def _lock_fingerprint(job: Any) -> Any:
    spec = system_spec(job.settings(SystemSettings).name)
    if spec.repository is None:  # the fingerprint of every package-released system: as before
        return envs.lock_sha256(spec)
    return [envs.lock_sha256(spec), list(spec.repository)]


BUILD_STAGE = Stage(
    name="system_build", run=run_build, reads=("turns",), optional_reads=("conversations",),
    writes=("memories", "system_units"),
    settings=SystemSettings, depends=(*LLM_IDENTITY, *EMBEDDER_IDENTITY),
    extra_fingerprint=_lock_fingerprint, uses=("llm", "encoder"), estimate=_estimate("build"),
)
SEARCH_STAGE = Stage(
    name="system_search", run=run_search, reads=("questions", "turns", "memories"),
    writes=(HITS, "retrievals", SEARCH_UNITS, READERS), settings=SystemSettings,
    depends=("benchmark.categories", *LLM_IDENTITY, *EMBEDDER_IDENTITY),
    extra_fingerprint=_lock_fingerprint, uses=("llm", "encoder"), estimate=_estimate("search"),
)
