"""Bench part `lme-groups`: a scripted StructMem build through the judge on LongMemEval-M-shaped
files, question-grouped (run/groups.py), and its peak memory per size.

    python jobs/bench.py lme-groups                                   # 50, 100, 200 questions
    python jobs/bench.py lme-groups --lme-questions 50,100,200 --lme-group 25

For each size: the file of lme_load.py's shape (500 sessions per haystack from a pool of
20,000, 10 turns, dates drawn per haystack as LongMemEval's recipe draws them), then one job
`debug=scripted method=structmem benchmark=longmemeval question_groups=G` run by a fresh
worker process (this module's `__main__`): it counts the questions, runs each group in a
child `bench/scale_worker.py` (the structure-only hashing encoder, every stage's own peak
RSS from VmHWM), merges and renders the report. The job's peak = the largest of the
children's stage peaks and the worker's own (count, merge, report). Reported per size: wall
time, stage seconds summed over groups, requests, disk per question, and a 500-question
projection (per-question rates x 500; the peak is per group, so it does not grow).
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_lme_groups"]

ROOT = Path(__file__).resolve().parents[2]


def _dir_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def run_lme_groups(data_dir: Path, out_dir: Path, questions: Sequence[int], group: int,
                   timeout_s: float = 7200) -> dict[str, Any]:
    from structmem_gpu.bench.lme_load import data_file
    from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec

    rows = []
    for q in questions:
        path = data_file(data_dir, HaystackFileSpec(q, 500, 20_000, 10))
        run_dir = out_dir / f"q{q}_g{group}"
        out = out_dir / f"q{q}_g{group}.json"
        cmd = [sys.executable, "-m", "structmem_gpu.bench.lme_groups", str(path), str(run_dir),
               str(group), str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"lme-groups worker exited {proc.returncode}: {' | '.join(tail)}")
        res = json.loads(out.read_text())
        res.update(questions=q, group=group, wall_s=round(time.perf_counter() - t0, 1),
                   disk_mb_per_question=round(_dir_mb(run_dir) / q, 2))
        rows.append(res)
    return {"points": rows, "group": group}


def _worker(path: Path, run_dir: Path, group: int) -> dict[str, Any]:
    """One grouped job; runs in its own process (the parent reads its peak cleanly)."""
    from structmem_gpu.bench.harness import compose
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.core.artifacts import RunDir
    from structmem_gpu.run.groups import run_grouped
    from structmem_gpu.run.pipeline import job_stage_names

    overrides = ["debug=scripted", "method=structmem", "benchmark=longmemeval",
                 f"benchmark.path={path}", f"paths.cache_dir={run_dir}.cache",
                 f"question_groups={group}"]
    job = JobConfig.from_cfg(compose(ROOT / "conf", overrides))
    children: list[dict[str, Any]] = []

    def launch(index: int, groups: int, gdir: Path, child: list[str]) -> int:
        out = gdir.parent / f"{gdir.name}.json"
        gdir.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "structmem_gpu.bench.scale_worker", "--conf-dir",
               str(ROOT / "conf"), "--run-dir", str(gdir), "--out", str(out), "--encoder",
               "hashing", "--", *child]
        code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
        if code == 0:
            children.append(json.loads(out.read_text()))
        return code

    t0 = time.perf_counter()
    dirs = run_grouped(job, run_dir, overrides, launch=launch)
    wall = time.perf_counter() - t0
    stages: dict[str, dict[str, float]] = {}
    for child in children:
        for name, st in child["stages"].items():
            acc = stages.setdefault(name, {"wall_s": 0.0, "calls": 0, "peak_rss_mb": 0.0})
            acc["wall_s"] = round(acc["wall_s"] + float(st.get("wall_s") or 0), 2)
            acc["calls"] += int(st.get("calls") or 0)
            acc["peak_rss_mb"] = max(acc["peak_rss_mb"], float(st.get("peak_rss_mb") or 0))
    worker_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    merged = RunDir(run_dir).load_manifest()
    report = json.loads((RunDir(run_dir).report_dir / "report.json").read_text())
    return {
        "stage_order": list(job_stage_names(job)),
        "groups": len(dirs),
        "job_s": round(wall, 1),
        "stages": stages,
        "child_peak_rss_mb": round(max(s["peak_rss_mb"] for s in stages.values()), 1),
        "worker_peak_rss_mb": round(worker_peak, 1),
        "requests": sum(s["calls"] for s in stages.values()),
        "entries": merged["stages"]["extract"]["outputs"]["entries"]["rows"],
        "judged": report["overall"]["n"],
    }


def render(part: dict[str, Any]) -> list[str]:
    pts = part.get("points") or []
    stages = pts[0].get("stage_order", sorted(pts[0]["stages"])) if pts else []
    lines = [f"Scripted StructMem through the judge, question_groups={part.get('group')} "
             "(run/groups.py), LongMemEval-M-shaped files with dates drawn per haystack; "
             "hashing encoder; peak = max(children's stage peaks, the worker's own).", "",
             "| questions | groups | wall s | " + " | ".join(f"{s} s" for s in stages)
             + " | requests | entries | peak RSS MB (children / merge+report) | disk MB per "
             "question |", "|" + "---|" * (len(stages) + 7)]
    for p in pts:
        st = p["stages"]
        lines.append(
            f"| {p['questions']} | {p['groups']} | {p['wall_s']} | "
            + " | ".join(str(st.get(s, {}).get("wall_s", "–")) for s in stages)
            + f" | {p['requests']:,} | {p['entries']:,} | {p['child_peak_rss_mb']:,} / "
            f"{p['worker_peak_rss_mb']:,} | {p['disk_mb_per_question']} |")
    if pts:
        last = max(pts, key=lambda p: p["questions"])
        per_q = last["wall_s"] / last["questions"]
        peaks = [max(p["child_peak_rss_mb"], p["worker_peak_rss_mb"]) for p in pts]
        lines += ["", f"Peaks {', '.join(f'{x:,.0f}' for x in peaks)} MB: largest / smallest = "
                  f"{max(peaks) / min(peaks):.2f}. 500-question projection from the "
                  f"{last['questions']}-question point: {per_q * 500 / 60:.0f} min wall, "
                  f"{math.ceil(last['requests'] / last['questions'] * 500):,} requests, "
                  f"{last['disk_mb_per_question'] * 500 / 1e3:.1f} GB on disk."]
    return lines


if __name__ == "__main__":
    _path, _run, _group, _out = sys.argv[1:5]
    Path(_out).write_text(json.dumps(_worker(Path(_path), Path(_run), int(_group))))
