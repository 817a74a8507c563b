"""`jobs/bench.py build` and `schedule`: per-stage build cost, and batched vs reference schedule.

    python jobs/bench.py build schedule

build: one real run (bundled sample, real LLM server + encoder, no LLM cache, fresh cache dir)
and, per stage from its manifest.json `build_cost`: requests, tokens, wall time, LLM and
encoder wall time (model load included), FAISS wall time, embeddings/s and `overhead_share` =
share of wall time outside the LLM server, the encoder and FAISS (framework overhead; < 5 %).

schedule: the same conversations built twice, caches off for both (cache.llm=false and a
fresh cache dir each):
- batched: the pipeline as it is (extract = one batch, consolidate = one batch);
- reference: the same stages, every batch sent one request at a time in the reference code's
  order (harness.reference_schedule), consolidations sequential.
Reported: wall time of the build stages and of the LLM stages, requests/s and output tokens/s
of each, their ratio (reference / batched) and the replies that differ (temperature 0 should
give none; llama.cpp's prefix-cache reuse can still flip a token now and then).
On llama.cpp the ratio is about 1 (it serialises requests; docs/design.md "Backend notes"): the
gain needs a continuous-batching server (vLLM), which is what the GPU run measures.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.bench.fit import rate, share
from structmem_gpu.bench.harness import (
    BenchSettings,
    llm_stages,
    manifest_stages,
    reference_schedule,
    run_pipeline,
)
from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import StructMemError

log = logging.getLogger(__name__)


def schedule_stages() -> tuple[str, ...]:
    """StructMem's build (its input and build stages, as they declare themselves): what the
    batched and reference schedules both run."""
    from structmem_gpu.methods.registry import method_stages
    from structmem_gpu.core.stage_parts import BUILD, INPUT

    return method_stages("structmem", INPUT, BUILD)


OVERHEAD_TARGET = 0.05
_COST_KEYS = (
    "calls",
    "cache_hits",
    "prompt_tokens",
    "completion_tokens",
    "wall_s",
    "llm_wall_s",
    "encoder_wall_s",
    "index_wall_s",
    "overhead_share",
    "batches",
)


def summarize_build(run_dir: Path, order: Sequence[str] = ()) -> dict[str, Any]:
    """Per-stage build cost from the manifest (in `order`, then the rest) plus totals and the
    overall overhead share."""
    stages = manifest_stages(run_dir)
    names = [s for s in order if s in stages] + sorted(s for s in stages if s not in order)
    rows = []
    for name in names:
        cost = stages[name]
        row: dict[str, Any] = {"stage": name, **{k: cost.get(k) for k in _COST_KEYS}}
        notes = cost.get("notes") or {}
        row["embeddings_per_s"] = notes.get("embeddings_per_s")
        row["embedded"] = notes.get("embedded_new")
        row["requests_per_s"] = rate(cost.get("calls", 0), cost.get("llm_wall_s", 0.0))
        row["output_tokens_per_s"] = rate(
            cost.get("completion_tokens", 0), cost.get("llm_wall_s", 0.0)
        )
        rows.append(row)
    wall = sum(float(r["wall_s"] or 0) for r in rows)
    llm = sum(float(r["llm_wall_s"] or 0) for r in rows)
    enc = sum(float(r["encoder_wall_s"] or 0) for r in rows)
    idx = sum(float(r["index_wall_s"] or 0) for r in rows)
    total = {
        "calls": sum(int(r["calls"] or 0) for r in rows),
        "prompt_tokens": sum(int(r["prompt_tokens"] or 0) for r in rows),
        "completion_tokens": sum(int(r["completion_tokens"] or 0) for r in rows),
        "wall_s": round(wall, 3),
        "llm_wall_s": round(llm, 3),
        "encoder_wall_s": round(enc, 3),
        "index_wall_s": round(idx, 3),
        "overhead_s": round(max(wall - llm - enc - idx, 0.0), 3),
        "overhead_share": share(max(wall - llm - enc - idx, 0.0), wall),
    }
    return {
        "run_dir": str(run_dir),
        "stages": rows,
        "total": total,
        "overhead_target": OVERHEAD_TARGET,
        "meets_target": total["overhead_share"] is not None
        and total["overhead_share"] < OVERHEAD_TARGET,
    }


def run_build(
    settings: BenchSettings,
    dataset: Sequence[str],
    stages: Sequence[str] | None,
    name: str = "build",
) -> dict[str, Any]:
    """One cold real run (LLM cache off, fresh cache dir); returns summarize_build + wall."""
    run_dir = settings.out_dir / "runs" / name
    extra = [*dataset, *([f"stages=[{','.join(stages)}]"] if stages else [])]
    job = settings.compose(extra, cache_off=True, cache_dir=settings.out_dir / "cache" / name)
    error: str | None = None
    wall: float | None
    try:
        wall = run_pipeline(job, run_dir)
    except StructMemError as e:
        # e.g. the report stage refusing a run whose parse-failure rate is too high (after
        # writing its files): the finished stages' costs are still what the bench reports.
        if not (run_dir / "manifest.json").exists():
            raise
        log.warning("build run %s ended with an error: %s", run_dir, e)
        error, wall = f"{type(e).__name__}: {e}", None
    from structmem_gpu.run.pipeline import job_stage_names

    out = summarize_build(run_dir, job_stage_names(job))
    out["job_wall_s"] = None if wall is None else round(wall, 3)
    out["pipeline_error"] = error
    out["llm"] = str(job.root.llm.served_name)
    out["encoder"] = job.root.embedder.model or "packaged all-MiniLM-L6-v2"
    return out


def _leg(run_dir: Path, stages: Sequence[str], llm: Sequence[str]) -> dict[str, Any]:
    costs = manifest_stages(run_dir)
    missing = [s for s in stages if s not in costs]
    if missing:
        raise RuntimeError(f"{run_dir}: stages {missing} did not run")
    sel = [costs[s] for s in stages]
    llm_sel = [costs[s] for s in stages if s in llm]
    wall = sum(float(c["wall_s"]) for c in sel)
    llm_wall = sum(float(c["wall_s"]) for c in llm_sel)
    calls = sum(int(c["calls"]) for c in llm_sel)
    out_tok = sum(int(c["completion_tokens"]) for c in llm_sel)
    return {
        "run_dir": str(run_dir),
        "wall_s": round(wall, 3),
        "llm_stages_wall_s": round(llm_wall, 3),
        "requests": calls,
        "completion_tokens": out_tok,
        "requests_per_s": rate(calls, llm_wall),
        "output_tokens_per_s": rate(out_tok, llm_wall),
    }


def differing_replies(a: Path, b: Path, stages: Sequence[str]) -> dict[str, Any]:
    """Per stage: requests matched by request_id (content-derived), replies that differ, and
    requests present in one run only (their prompts differ because an upstream reply did)."""
    ra = pl.read_parquet(a / "tables" / "requests.parquet", glob=False)
    rb = pl.read_parquet(b / "tables" / "requests.parquet", glob=False)
    out: dict[str, Any] = {}
    for stage in stages:
        x = ra.filter(pl.col("stage") == stage).select("request_id", pl.col("reply").alias("a"))
        y = rb.filter(pl.col("stage") == stage).select("request_id", pl.col("reply").alias("b"))
        if x.height == 0 and y.height == 0:
            continue
        both = x.join(y, on="request_id", how="inner")
        out[stage] = {
            "matched": both.height,
            "differing": int((both["a"] != both["b"]).sum()) if both.height else 0,
            "unmatched": x.height + y.height - 2 * both.height,
        }
    out["total_differing"] = sum(
        v["differing"] + v["unmatched"] for v in out.values() if isinstance(v, dict)
    )
    return out


def slice_overrides(job: JobConfig, conversations: int, max_sessions: int) -> list[str]:
    """Overrides that cut the configured benchmark to its first conversations and sessions
    (the reference schedule sends one request at a time: a whole GPU-sized build would take
    hours that way)."""
    from structmem_gpu.data import load_benchmark

    b = job.root.benchmark
    turns, _ = load_benchmark(b.name, b.path, None, None)
    ids = list(dict.fromkeys(turns["conv_id"].to_list()))[:conversations]
    return [f"benchmark.conversations=[{','.join(ids)}]", f"benchmark.max_sessions={max_sessions}"]


def _load1() -> float:
    return round(os.getloadavg()[0], 2)


def run_schedule(settings: BenchSettings, dataset: Sequence[str]) -> dict[str, Any]:
    """Batched vs reference schedule on the same conversations (caches off for both), the two
    legs back to back so that both see the same machine load (recorded per leg)."""
    stages = list(schedule_stages())
    load: dict[str, list[float]] = {"batched": [_load1()]}
    batched_run = Path(run_build(settings, dataset, stages, name="schedule-batched")["run_dir"])
    load["batched"].append(_load1())
    ref_dir = settings.out_dir / "runs" / "schedule-reference"
    cfg = settings.compose(
        [*dataset, f"stages=[{','.join(stages)}]"],
        cache_off=True,
        cache_dir=settings.out_dir / "cache" / "schedule-reference",
    )
    load["reference"] = [_load1()]
    with reference_schedule():
        run_pipeline(cfg, ref_dir)
    load["reference"].append(_load1())
    llm = llm_stages(cfg, stages)  # the stages whose `uses` name an LLM role
    batched, reference = _leg(batched_run, stages, llm), _leg(ref_dir, stages, llm)
    for name, leg in (("batched", batched), ("reference", reference)):
        leg["loadavg_start_end"] = load[name]  # unequal load = a ratio to distrust
    return {
        "stages": stages,
        "batched": batched,
        "reference": reference,
        "ratio": round(reference["wall_s"] / batched["wall_s"], 4) if batched["wall_s"] else None,
        "llm_stages_ratio": (
            round(reference["llm_stages_wall_s"] / batched["llm_stages_wall_s"], 4)
            if batched["llm_stages_wall_s"]
            else None
        ),
        "differences": differing_replies(batched_run, ref_dir, llm),
        "max_in_flight": cfg.root.llm.max_in_flight,
    }
