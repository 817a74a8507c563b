"""`jobs/bench.py scale`: stage time and peak memory from 10 to 1,000 conversations.

    python jobs/bench.py scale --sizes 10,100,1000
    python jobs/bench.py scale --scale-encoder configured embedder.device=cuda    # GPU node

Three measurements, each size in a fresh process (scale_worker.py) on synthetic LoCoMo-format
conversations (synthetic.py; 4 sessions x 6 turns each by default):

1. scripted: every StructMem stage up to judge with the scripted LLM (llm=scripted) and, by
   default, the hashing stand-in encoder (harness.hashing_encoder) so that 1,000
   conversations (24,000 turns, ~30,000 texts to embed) fit the CPU time limit; per stage and
   in total: seconds per conversation at each size, a least-squares line, the log-log growth
   exponent between the two largest sizes (1.0 = linear) and the peak RSS of each stage.
2. real LLM on a small slice (1 and 2 one-session conversations) through the bench's server.
3. haystack: conversations that share sessions (LongMemEval-style, a pool of sessions drawn
   by every conversation) through `extract` with the response cache off (cache.llm=false):
   the extract stage builds every window of every conversation and the backend layer
   (llm/dedup.py, used with or without the cache) sends each distinct request once per
   batch; reported: requests built, requests sent, requests saved, unique sessions.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.bench.fit import scaling_summary
from structmem_gpu.bench.harness import BenchSettings
from structmem_gpu.bench.synthetic import SyntheticSpec, unique_pool_sessions, write_locomo
from structmem_gpu.methods.registry import method_stages
from structmem_gpu.core.stage_parts import BUILD, INPUT, QUESTION

log = logging.getLogger(__name__)


def scripted_stages() -> tuple[str, ...]:
    """StructMem's stages up to the judge (its report aside): the scripted scale points."""
    return method_stages("structmem", INPUT, BUILD, QUESTION)


def real_stages() -> tuple[str, ...]:
    """StructMem's build (input and build stages): the real-model scale points."""
    return method_stages("structmem", INPUT, BUILD)


def run_worker(
    settings: BenchSettings, name: str, overrides: Sequence[str], encoder: str, timeout_s: float
) -> dict[str, Any]:
    """One scale_worker process; its result, or {"error": ...} (never raises on a failed size)."""
    run_dir = settings.out_dir / "runs" / name
    out = settings.path("scale", f"{name}.json")
    argv = [
        sys.executable,
        "-m",
        "structmem_gpu.bench.scale_worker",
        "--conf-dir",
        str(settings.conf_dir),
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
        "--encoder",
        encoder,
        "--",
        *overrides,
    ]
    log.info("scale: %s", name)
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, cwd=settings.conf_dir.parent
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").splitlines()[-15:])
        log.error("scale worker %s failed (exit %d):\n%s", name, proc.returncode, tail)
        return {"error": f"exit {proc.returncode}: {tail[-600:]}"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _dataset(path: Path) -> list[str]:
    return [
        "benchmark=locomo",
        f"benchmark.path={path}",
        "benchmark.conversations=null",
        "benchmark.max_sessions=null",
    ]


def _fit_rows(points: list[dict[str, Any]], stages: Sequence[str]) -> list[dict[str, Any]]:
    """One row per stage + total: seconds/conversation per size, fit, exponent, peak memory."""
    ok = [p for p in points if "error" not in p["result"]]
    if not ok:
        return []
    xs = [float(p["conversations"]) for p in ok]
    rows = []
    for stage in [*stages, "total"]:
        if stage == "total":
            ys = [sum(float(s["wall_s"] or 0) for s in p["result"]["stages"].values()) for p in ok]
            peaks = [
                max((s.get("peak_rss_mb") or 0) for s in p["result"]["stages"].values()) for p in ok
            ]
        else:
            if not all(stage in p["result"]["stages"] for p in ok):
                continue
            ys = [float(p["result"]["stages"][stage]["wall_s"] or 0) for p in ok]
            peaks = [p["result"]["stages"][stage].get("peak_rss_mb") for p in ok]
        summary = scaling_summary(xs, ys)
        fit = summary.get("fit") or {}
        rows.append(
            {
                "stage": stage,
                "sizes": [int(x) for x in xs],
                "wall_s": [round(y, 4) for y in ys],
                "s_per_conversation": summary["per_item"],
                "peak_rss_mb": peaks,
                "growth_exponent": summary["growth_exponent"],
                "marginal_ratio": summary["marginal_ratio"],
                "slope_s_per_conversation": fit.get("slope"),
                "intercept_s": fit.get("intercept"),
                "r2": fit.get("r2"),
            }
        )
    return rows


def run_scripted_scale(
    settings: BenchSettings,
    sizes: Sequence[int],
    spec: SyntheticSpec,
    encoder: str,
    timeout_s: float,
) -> dict[str, Any]:
    points = []
    for n in sizes:
        s = SyntheticSpec(
            n,
            spec.sessions,
            spec.turns_per_session,
            spec.questions_per_conversation,
            seed=spec.seed,
        )
        data = write_locomo(s, settings.path("data", f"synthetic-{n}.json"))
        ov = settings.overrides_for(
            [*_dataset(data), f"stages=[{','.join(scripted_stages())}]"],
            cache_off=True,
            cache_dir=settings.out_dir / "cache" / f"scale-{n}",
            scripted=True,
        )
        points.append(
            {
                "conversations": n,
                "turns": n * s.sessions * s.turns_per_session,
                "result": run_worker(settings, f"scale-{n}", ov, encoder, timeout_s),
            }
        )
    return {
        "spec": {
            "sessions": spec.sessions,
            "turns_per_session": spec.turns_per_session,
            "questions_per_conversation": spec.questions_per_conversation,
        },
        "encoder": encoder,
        "points": points,
        "fit": _fit_rows(points, scripted_stages()),
    }


def run_real_slice(
    settings: BenchSettings, sizes: Sequence[int], timeout_s: float
) -> dict[str, Any]:
    """The LLM stages with the real server on 1-2 tiny conversations (LLM cache off)."""
    points = []
    for n in sizes:
        data = write_locomo(
            SyntheticSpec(n, sessions=1, turns_per_session=4, questions_per_conversation=1),
            settings.path("data", f"synthetic-real-{n}.json"),
        )
        ov = settings.overrides_for(
            [*_dataset(data), f"stages=[{','.join(real_stages())}]"],
            cache_off=True,
            cache_dir=settings.out_dir / "cache" / f"real-{n}",
        )
        points.append(
            {
                "conversations": n,
                "turns": 4 * n,
                "result": run_worker(settings, f"scale-real-{n}", ov, "hashing", timeout_s),
            }
        )
    return {
        "spec": {"sessions": 1, "turns_per_session": 4},
        "encoder": "hashing",
        "points": points,
        "fit": _fit_rows(points, real_stages()),
    }


def run_haystack(settings: BenchSettings, spec: SyntheticSpec, timeout_s: float) -> dict[str, Any]:
    """Requests built vs sent by `extract` when conversations share sessions (no cache)."""
    data = write_locomo(spec, settings.path("data", "haystack.json"))
    ov = settings.overrides_for(
        [*_dataset(data), "stages=[load,extract]", "cache.llm=false"],
        cache_dir=settings.out_dir / "cache" / "haystack",
        scripted=True,
    )
    result = run_worker(settings, "haystack", ov, "hashing", timeout_s)
    out: dict[str, Any] = {
        "conversations": spec.conversations,
        "sessions_per_conversation": spec.sessions,
        "pool": spec.shared_pool,
        "unique_sessions": unique_pool_sessions(spec),
        "session_slots": spec.conversations * spec.sessions,
    }
    if "error" in result:
        return {**out, "error": result["error"]}
    req = pl.read_parquet(
        settings.out_dir / "runs" / "haystack" / "tables" / "requests.parquet", glob=False
    )
    req = req.filter(pl.col("stage") == "extract")
    sent = int((~req["cache_hit"]).sum())
    out.update(
        requests=req.height,
        unique_requests=req["messages_hash"].n_unique(),
        sent=sent,
        saved=req.height - sent,
        saved_share=round((req.height - sent) / req.height, 4) if req.height else None,
        dedup_by="in-batch request dedup (llm/dedup.py; cache.llm=false here): the extract "
        "stage builds every window, identical requests of the batch are sent once",
    )
    return out


def run_scale(
    settings: BenchSettings,
    *,
    sizes: Sequence[int],
    real_sizes: Sequence[int],
    haystack: SyntheticSpec,
    encoder: str,
    timeout_s: float,
    spec: SyntheticSpec,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scripted": run_scripted_scale(settings, sizes, spec, encoder, timeout_s)
    }
    if real_sizes and settings.base_url:
        out["real_llm"] = run_real_slice(settings, real_sizes, timeout_s)
    else:
        out["real_llm"] = {"skipped": "no LLM endpoint" if not settings.base_url else "no sizes"}
    out["haystack"] = run_haystack(settings, haystack, timeout_s)
    return out
