"""One scale measurement in a fresh process (clean peak-memory baseline); run by `scale.py`.

    python -m structmem_gpu.bench.scale_worker --conf-dir conf --run-dir RUN --out RESULT.json \\
        --encoder hashing -- benchmark=locomo benchmark.path=syn-100.json llm=scripted ...

Runs the configured stages once (run_stages, forced) with every stage wrapped to record the
process's peak RSS while it ran: the kernel's high-water mark (VmHWM) is reset before each
stage through /proc/self/clear_refs, so each stage gets its own peak; where that is not
possible the figure is the process peak so far (resource.getrusage maxrss; `per_stage_peak`
false). Writes {"stages": {name: {wall_s, calls, ..., peak_rss_mb, rss_start_mb}}, "counts",
"maxrss_mb", "wall_s"} to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import resource
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import RunDir

log = logging.getLogger(__name__)


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False when not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        return None
    return None


def peak_rss_mb() -> float:
    hwm = _status_mb("VmHWM")
    return (
        hwm
        if hwm is not None
        else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    )


def current_rss_mb() -> float | None:
    return _status_mb("VmRSS")


def instrumented(registry: Mapping[str, Any], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The registry with each stage's run function wrapped to record its peak memory
    (fingerprints do not depend on the function, so runs are unchanged)."""

    def wrap(stage: Any) -> Any:
        inner: Callable[[Any], Any] = stage.run

        def run(ctx: Any) -> Any:
            per_stage = reset_peak_rss()
            start = current_rss_mb()
            try:
                return inner(ctx)
            finally:
                records[stage.name] = {
                    "rss_start_mb": start,
                    "peak_rss_mb": peak_rss_mb(),
                    "per_stage_peak": per_stage,
                }

        return dataclasses.replace(stage, run=run)

    return {name: wrap(registry[name]) for name in registry}


def _counts(run_dir: Path) -> dict[str, int]:
    out = {}
    for table in ("turns", "entries", "syntheses", "requests", "questions"):
        path = run_dir / "tables" / f"{table}.parquet"
        if path.exists():
            out[table] = pl.scan_parquet(path, glob=False).select(pl.len()).collect().item()
    run = RunDir(run_dir)
    if "turns" not in out and run.has_table("turns"):  # the compact layout (turns_store.py)
        out["turns"] = run.output_info(["turns"])["turns"]["rows"]
    return out


def measure(conf_dir: Path, run_dir: Path, overrides: list[str], encoder: str) -> dict[str, Any]:
    import contextlib

    from structmem_gpu.bench.harness import compose, hashing_encoder, manifest_stages, run_pipeline
    from structmem_gpu.methods.registry import stage_registry

    cfg = compose(conf_dir, overrides)
    records: dict[str, dict[str, Any]] = {}
    registry = instrumented(stage_registry(cfg), records)
    ctx = hashing_encoder() if encoder == "hashing" else contextlib.nullcontext()
    with ctx:
        wall = run_pipeline(cfg, run_dir, registry)
    stages = {}
    for name, cost in manifest_stages(run_dir).items():
        keep = {
            k: cost.get(k)
            for k in (
                "wall_s",
                "llm_wall_s",
                "encoder_wall_s",
                "index_wall_s",
                "calls",
                "cache_hits",
                "overhead_share",
            )
        }
        stages[name] = {**keep, **records.get(name, {})}
    return {
        "stages": stages,
        "counts": _counts(run_dir),
        "wall_s": round(wall, 3),
        "maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "encoder": encoder,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conf-dir", type=Path, required=True)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--encoder", choices=("hashing", "configured"), default="hashing")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    t0 = time.perf_counter()
    result = measure(args.conf_dir, args.run_dir, list(args.overrides), args.encoder)
    result["process_s"] = round(time.perf_counter() - t0, 3)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
