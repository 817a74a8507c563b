"""Stage order, skipping finished stages, and the per-stage manifest entry.

    python jobs/run.py benchmark=sample method=structmem          # all stages of the method
    python jobs/run.py stages=[judge,report] judge=other ...      # re-judge an existing run

A stage is skipped when its manifest entry is `done` with the same fingerprint (stage version,
its settings and dependencies, the hashes of its input tables) and its output tables are intact.
`force=true` recomputes every listed stage; the LLM and embedding caches still apply.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.memtrim import release_free_memory
from structmem_gpu.core.artifacts import RunDir, git_commit, now_iso, package_versions
from structmem_gpu.core import preempt
from structmem_gpu.config.identity import FINGERPRINT_VERSION, identity
from structmem_gpu.core.errors import (
    ConfigError,
    GpuPlanError,
    MissingTableError,
    StageIncompleteError,
)
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.prompts.official import manifest as official_manifest
from structmem_gpu.core.runlock import hold_run_dir
from structmem_gpu.config.settings import externals
from structmem_gpu.stage import Backends, Stage, StageContext, backend_keys

# Every function here takes the job's configuration as a JobConfig (config/job.py) or as the
# entry point's config, which it checks into one (JobConfig.from_cfg returns a JobConfig as it
# is). The stage contract's backends and contexts (stage.py) receive the JobConfig.

log = logging.getLogger(__name__)


def config_hash(cfg: Any, registry: Mapping[str, Stage] | None = None) -> str:
    """Hash of everything that changes results (shards of one job must share it): the identity
    (config/identity.py) of the job's root nodes and of the settings of every stage of
    `registry` (default: every stage the job's method maps, whichever of them run). Role "run"
    fields (paths, stages, force, shards, dry_run, preempt, the llm's connection and speed
    settings) are in none of them, nor is Hydra's own node."""
    job = JobConfig.from_cfg(cfg)
    if registry is None:
        from structmem_gpu.methods.registry import stage_registry

        registry = stage_registry(job)
    nodes: dict[str, Any] = {"": identity(job.root)}
    for stage in registry.values():
        if stage.settings is not None:
            nodes[f"{stage.settings.node}:{stage.settings.__name__}"] = identity(job.settings(stage.settings))
    return stable_hash(FINGERPRINT_VERSION, nodes)


def depends_value(job: JobConfig, key: str) -> Any:
    """The identity of the value at dotted `key` of the job's typed root: a node such as "llm"
    gives its identity, a leaf such as "benchmark.categories" its value as plain data (every
    `depends` key is a typed key of the job: tests/unit/test_config_schema.py)."""
    node: Any = job.root
    for part in key.split("."):
        node = getattr(node, part)
    return identity(node)


def stage_config(stage: Stage, cfg: Any) -> dict[str, Any]:
    """What a stage's output depends on in the config, as the manifest records it: its
    settings' identity under their node ("" = at the top), the fields it reads from outside
    the node under their own dotted keys, then its `depends` keys' identities."""
    job = JobConfig.from_cfg(cfg)
    out: dict[str, Any] = {}
    if stage.settings is not None:
        values = identity(job.settings(stage.settings))
        ext = externals(stage.settings)
        outside = {ext[name]: values.pop(name) for name in list(values) if name in ext}
        out.update({stage.settings.node: values} if stage.settings.node else values)
        out.update(outside)
    out.update({key: depends_value(job, key) for key in stage.depends})
    return out


def fingerprint(stage: Stage, cfg: Any, run: RunDir) -> str:
    job = JobConfig.from_cfg(cfg)
    inputs = {}
    for name in stage.reads:
        digest = run.table_sha256(name)  # either layout of `turns` (turns_store.py)
        if digest is None:
            raise MissingTableError(
                f"stage '{stage.name}' needs table '{name}' ({run.table_path(name)}), which no "
                f"finished stage of this run directory wrote; run the stage that writes it first"
            )
        inputs[name] = digest
    for name in stage.optional_reads:
        if run.has_table(name):
            inputs[name] = run.table_sha256(name)
    values = stage_config(stage, job)
    extra = stage.extra_fingerprint(job) if stage.extra_fingerprint else None
    return stable_hash(FINGERPRINT_VERSION, stage.name, stage.version, values, inputs, extra)


@dataclass(frozen=True)
class StageOutcome:
    name: str
    skipped: bool
    wall_s: float


def build_cost(frames: Sequence[pl.DataFrame]) -> dict[str, Any]:
    if not frames:
        return {"calls": 0, "cache_hits": 0, "prompt_tokens": 0, "completion_tokens": 0, "parse_failures": 0}
    df = pl.concat(frames)
    return {
        "calls": df.height,
        "cache_hits": int(df["cache_hit"].sum()),
        "prompt_tokens": int(df["prompt_tokens"].fill_null(0).sum()),
        "completion_tokens": int(df["completion_tokens"].fill_null(0).sum()),
        "parse_failures": int((~df["parse_ok"]).sum()),
        "truncated": int((df["finish_reason"] == "length").sum()),
    }


def weights(job: JobConfig, stages: Sequence[Stage], previous: Any = None) -> list[dict[str, Any]]:
    """The manifest's `weights`: per model role the job loads, its repository, requested
    revision and resolved snapshot (model_refs.weights_record); roles this job does not load
    keep what an earlier job of the run directory recorded (a re-judge keeps the answer LLM's)."""
    from structmem_gpu.node.model_refs import named_models, weights_record

    now = weights_record(named_models(job, stages))
    roles = {w["role"] for w in now}
    return [w for w in previous or [] if isinstance(w, dict) and w.get("role") not in roles] + now


def run_header(cfg: Any, stages: Sequence[Stage] = (), run: RunDir | None = None,
               registry: Mapping[str, Stage] | None = None) -> dict[str, Any]:
    job = JobConfig.from_cfg(cfg)
    root = job.root
    previous = run.load_manifest().get("weights") if run is not None else None
    return {
        "config_hash": config_hash(job, registry),
        "method": root.method.name,
        "benchmark": root.benchmark.name,
        "shard_index": root.shard_index,
        "num_shards": root.num_shards,
        "git_commit": git_commit(),
        "packages": package_versions(),
        "official_texts": official_manifest(job),  # prompts.sources.*: commits, text hashes
        "weights": weights(job, stages, previous),  # per model role: repository, revision, snapshot
        "updated": now_iso(),
    }


def finished(cfg: Any, run: RunDir, name: str, fp: str) -> bool:
    """True when stage `name` may be skipped: done with fingerprint `fp`, outputs intact, and
    `force` not set."""
    entry = run.stage_entry(name)
    return bool(not JobConfig.from_cfg(cfg).root.force and entry and entry.get("status") == "done"
                and entry.get("fingerprint") == fp and run.outputs_intact(entry))


def job_stage_names(cfg: Any) -> list[str]:
    """The stages this job runs, in order: `stages` when given, else the method's list."""
    return JobConfig.from_cfg(cfg).stage_names


def stages_to_run(cfg: Any, run_dir: str | Path, registry: Mapping[str, Stage]) -> list[str]:
    """The job's stages that will (re)compute their tables, predicted before any runs: those
    not finished with today's fingerprint, and every later stage reading a table one of them
    writes (its input hash changes then)."""
    job = JobConfig.from_cfg(cfg)
    run = RunDir(run_dir)
    out: list[str] = []
    rewritten: set[str] = set()
    for name in job_stage_names(job):
        stage = registry.get(name)
        if stage is None:
            continue
        reads = set(stage.reads) | set(stage.optional_reads)
        try:
            fresh = not (reads & rewritten) and finished(job, run, name, fingerprint(stage, job, run))
        except MissingTableError:
            fresh = False
        if not fresh:
            out.append(name)
            rewritten |= set(stage.writes)
    return out


# Python's cyclic collector runs a young-generation pass every 700 net allocations and a full
# pass every 100 of those; a stage that builds tens of thousands of requests, replies and rows
# holds a large heap, so those passes rescanned it over and over: ~0.1 ms per request of the
# framework's CPU in the paced bench (docs/performance.md "GPU-paced builds"). Stages make few
# reference cycles (plain rows, frozen dataclasses); objects are still freed by reference
# counting as before, and cycles are still collected, only less often.
GC_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Within the block, the collector's first threshold is at least GC_YOUNG_THRESHOLD."""
    saved = gc.get_threshold()
    gc.set_threshold(max(saved[0], GC_YOUNG_THRESHOLD), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def run_stages(cfg: Any, run_dir: str | Path, registry: Mapping[str, Stage]) -> list[StageOutcome]:
    """Run the configured stages in order. A server or the encoder stays open only while a
    remaining stage uses it (Stage.uses): after each stage the backends no later stage uses
    are released, and before a stage the GPU plan's evictions (gpu_plan.py); the plan refuses
    a job that cannot fit before any stage runs. `cfg`: the entry point's config or its
    JobConfig."""
    job = JobConfig.from_cfg(cfg)
    names = job_stage_names(job)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ConfigError(f"method '{job.root.method.name}' has no stage(s) {unknown}; it has {sorted(registry)}")
    # Imported now: a stage that cannot be imported stops the job before any stage runs.
    stages = [registry[name] for name in names]
    # Config-only fingerprint material now (official texts from checkouts, the input file's
    # hash): a missing official text stops the job before the first stage, not hours later.
    for stage in stages:
        if stage.extra_fingerprint is not None:
            stage.extra_fingerprint(job)
    from structmem_gpu.node.gpu_plan import plan as gpu_plan

    memory = gpu_plan(job, stages)
    if memory.refusal:
        raise GpuPlanError(memory.refusal)
    log.info("%s", memory.format())
    # What each stage and every later one opens: a backend leaves once no later stage uses it.
    uses = [backend_keys(job, s.uses) for s in stages]
    run = RunDir(run_dir)
    outcomes = []
    # One job per run directory (a requeued task racing its predecessor, a command launched
    # twice): the second one stops here, before it reads or writes anything.
    with hold_run_dir(run.root), fewer_collections():
        header = run_header(job, stages, run, registry)
        _refuse_after_incomplete(run, names)
        with Backends(job, run) as backends:
            for i, (name, stage) in enumerate(zip(names, stages)):
                preempt.check(name)
                backends.release(memory.evict_before(name))
                backends.stage_name, backends.stage_uses = name, stage.uses
                outcomes.append(_run_one(stage, job, run, backends, header))
                backends.stage_uses = None
                backends.release(backends.open_keys() - set().union(*uses[i + 1:]))
                release_free_memory()  # the next stage starts low (core/memtrim.py)
    return outcomes


def _run_one(stage: Stage, job: JobConfig, run: RunDir, backends: Backends,
             header: Mapping[str, Any]) -> StageOutcome:
    fp = fingerprint(stage, job, run)
    if finished(job, run, stage.name, fp):
        log.info("stage %-12s skipped (finished, same fingerprint %s)", stage.name, fp)
        return StageOutcome(stage.name, True, 0.0)
    log.info("stage %-12s running", stage.name)
    ctx = StageContext(job=job, run=run, stage=stage, backends=backends)
    started = now_iso()
    t0 = time.perf_counter()
    tables = dict(stage.run(ctx))
    preempt.check(stage.name)  # stopping: no table, no manifest entry; the cache has the replies
    if ctx.unanswered_endpoints:
        _record_incomplete(stage, job, run, ctx, fp, started, header)
    if set(tables) != set(stage.writes):
        raise RuntimeError(f"stage '{stage.name}' returned tables {sorted(tables)}, declared {sorted(stage.writes)}")
    for name, df in tables.items():
        run.write_table(name, df)
    if ctx.request_frames:
        run.replace_requests(stage.name, pl.concat(ctx.request_frames))
    wall = time.perf_counter() - t0
    cost = build_cost(ctx.request_frames)
    cost.update(wall_s=round(wall, 3), llm_wall_s=round(ctx.llm_wall_s, 3),
                encoder_wall_s=round(ctx.encoder_wall_s, 3), index_wall_s=round(ctx.index_wall_s, 3),
                batches=ctx.batches)
    busy = ctx.llm_wall_s + ctx.encoder_wall_s + ctx.index_wall_s  # LLM server, encoder, FAISS
    cost["overhead_share"] = round(max(wall - busy, 0.0) / wall, 4) if wall > 0 else 0.0
    run.record_stage(stage.name, {
        "status": "done", "fingerprint": fp, "version": stage.version, "part": stage.kind,
        "started": started, "finished": now_iso(), "config": stage_config(stage, job),
        "outputs": run.output_info(list(stage.writes)), "build_cost": cost, "notes": ctx.notes,
    }, header)
    log.info("stage %-12s done in %.1fs (%d LLM calls, %d cached)", stage.name, wall, cost["calls"], cost["cache_hits"])
    return StageOutcome(stage.name, False, wall)


def _record_incomplete(stage: Stage, job: JobConfig, run: RunDir, ctx: StageContext, fp: str,
                       started: str, header: Mapping[str, Any]) -> None:
    """Requests without a reply: log them (requests.parquet), mark the stage incomplete in the
    manifest (so a rerun runs it again, reusing cached replies), write none of its tables."""
    log_rows = pl.concat(ctx.request_frames)
    run.replace_requests(stage.name, log_rows)
    lost = log_rows.filter(pl.col("unanswered"))
    ids = lost["request_id"].unique(maintain_order=True).to_list()
    errors = lost["error"].head(3).to_list()
    endpoints = sorted(ctx.unanswered_endpoints)
    run.record_stage(stage.name, {
        "status": "incomplete", "fingerprint": fp, "version": stage.version, "part": stage.kind,
        "started": started, "finished": now_iso(), "config": stage_config(stage, job),
        "unanswered": len(ids), "requests": log_rows.height, "unanswered_request_ids": ids[:100],
        "errors": errors, "endpoints": endpoints, "notes": ctx.notes,
    }, header)
    raise StageIncompleteError(
        f"stage '{stage.name}' incomplete: {len(ids)} of {log_rows.height} requests got no reply "
        f"from {', '.join(endpoints)} (first error: {errors[0]}); none of "
        f"its tables written; rerun the same command to resume (cached replies are reused, "
        f"only the {len(ids)} unanswered requests are re-sent)"
    )


def _refuse_after_incomplete(run: RunDir, names: Sequence[str]) -> None:
    """A stage left incomplete by an earlier job must run again before anything else uses the
    run directory (its tables, if any, are from an older run)."""
    stages = run.load_manifest().get("stages", {})
    stale = [s for s, e in stages.items() if e.get("status") == "incomplete" and s not in names]
    if stale:
        raise StageIncompleteError(
            f"{run.root}: stage(s) {stale} of this run directory are incomplete (requests without "
            f"a reply); rerun with them in `stages` (or all stages) first"
        )