"""Bench part `lme-load`: LongMemEval-M-shaped load time and peak memory, in a subprocess.

    python jobs/bench.py lme-load                              # 100 questions x 500 sessions
    python jobs/bench.py lme-load --lme-questions 100,500      # and 500 x 500 (1.4 GB file)
    python jobs/bench.py lme-load --lme-dates per_haystack,fixed   # both date shapes

For each size, writes (or reuses) a file of longmemeval_synthetic.py's shape under
`outputs/bench/data/`, then runs the load stage's work in a fresh Python process: stream the
file into the compact turns layout (turns_store.py) and write its tables, as
`methods/load.py` does. The child reports its wall times and `ru_maxrss` (peak resident set
of that process alone: the parent's memory and the file writer's never count). A fresh
process per size, so one size's peak cannot hide another's. Each file is also counted
(bench/lme_count.py: occurrences, distinct ids, contents, dated sessions). `dates`: the
generator's date shape, per_haystack (LongMemEval's recipe, the default) or fixed.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval

__all__ = ["measure", "run_lme_load"]


def data_file(data_dir: Path, spec: HaystackFileSpec) -> Path:
    """The spec's file, written once and reused (same spec, byte-identical file)."""
    name = (f"lme_m_shaped_q{spec.questions}_s{spec.sessions}_pool{spec.pool}"
            f"_t{spec.turns_per_session}_seed{spec.seed}_{spec.dates}.json")
    path = data_dir / name
    if not path.exists():
        write_longmemeval(spec, path)
    return path


def measure(path: Path, out_dir: Path, timeout_s: float = 1800) -> dict[str, Any]:
    """Load `path` in a child process (compact layout + table write); its numbers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "structmem_gpu.bench.lme_load", str(path), str(out_dir)]
    # cwd = this checkout's root: `-m` puts it first on sys.path, so the child imports this
    # package even where another checkout is installed in the venv.
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False,
                          cwd=root)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"load child exited {proc.returncode}: {' | '.join(tail)}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_lme_load(data_dir: Path, out_dir: Path, sizes: Sequence[tuple[int, int, int]],
                 turns_per_session: int = 10, dates: Sequence[str] = ("per_haystack",)
                 ) -> dict[str, Any]:
    """`sizes`: (questions, sessions per haystack, pool) per point, for each date shape."""
    from structmem_gpu.bench.lme_count import count_file

    rows = []
    for shape in dates:
        for q, s, pool in sizes:
            spec = HaystackFileSpec(q, s, pool, turns_per_session, dates=shape)
            t0 = time.perf_counter()
            path = data_file(data_dir, spec)
            write_s = time.perf_counter() - t0
            res = measure(path, out_dir / f"q{q}_s{s}_{shape}")
            counts = {k: v for k, v in count_file(path).items()
                      if k in ("occurrences", "distinct_ids", "distinct_contents",
                               "distinct_dated")}
            rows.append({"questions": q, "sessions": s, "pool": pool, "dates": shape,
                         "turns_per_session": turns_per_session,
                         "file_mb": round(path.stat().st_size / 1e6, 1),
                         "file_write_s": round(write_s, 1), **counts, **res})
    return {"points": rows}


def _child(path: Path, out_dir: Path) -> dict[str, Any]:
    from structmem_gpu.core.artifacts import RunDir
    from structmem_gpu.data.longmemeval import load_longmemeval_compact

    t0 = time.perf_counter()
    compact, questions = load_longmemeval_compact(path)
    load_s = time.perf_counter() - t0
    rss_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run = RunDir(out_dir)
    t1 = time.perf_counter()
    run.write_table("turns", compact)
    run.write_table("questions", questions)
    write_s = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "load_s": round(load_s, 2),
        "write_tables_s": round(write_s, 2),
        "peak_rss_load_mb": round(rss_load / 1024, 1),
        "peak_rss_mb": round(peak / 1024, 1),
        "questions_loaded": questions.height,
        "turn_rows_plain": compact.turn_count,  # what turns.parquet would hold
        "turn_rows_stored": compact.sessions.height,  # distinct sessions' turns
        "distinct_sessions": compact.sessions["session_key"].n_unique(),
        "tables_mb": round(sum(run.table_path(n).stat().st_size
                               for n in ("turn_sessions", "turn_haystacks", "questions")) / 1e6, 1),
    }


def _n(x: Any) -> str:
    return "–" if x is None else f"{x:,}"


def render(part: dict[str, Any]) -> list[str]:
    lines = ["LongMemEval-M-shaped files (bench/longmemeval_synthetic.py), loaded by the load "
             "stage's code in a fresh process (compact turns layout, tables written); peak RSS "
             "= the child's ru_maxrss.", "",
             "| questions x sessions (pool) | dates | file MB | load s | write s | peak RSS MB | "
             "turn rows (plain) | turn rows stored | occurrences | distinct contents | "
             "distinct (turns + date) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in part.get("points", []):
        lines.append(f"| {r['questions']} x {r['sessions']} ({r['pool']}) | "
                     f"{r.get('dates', 'fixed')} | {r['file_mb']} | "
                     f"{r['load_s']} | {r['write_tables_s']} | {r['peak_rss_mb']} | "
                     f"{r['turn_rows_plain']:,} | {r['turn_rows_stored']:,} | "
                     f"{_n(r.get('occurrences'))} | {_n(r.get('distinct_contents'))} | "
                     f"{_n(r.get('distinct_dated'))} |")
    return lines


if __name__ == "__main__":
    print(json.dumps(_child(Path(sys.argv[1]), Path(sys.argv[2]))))
