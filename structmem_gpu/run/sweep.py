"""Sweep points that fail are named at once and at the end; the sweep goes on.

Each point of a multirun records how it ended in `<sweep dir>/.points/<job num>.json` (the same
dict is the job's return value, which submitit hands back for SLURM sweeps):

    {"job": 2, "overrides": ["retrieve.entries_k=40"], "status": "failed",
     "error": "config retrieve.entries_k=-5: expected an integer >= 0 (0 = off)",
     "exit_code": 2, "run_dir": ".../retrieve.entries_k=40", "report": null}

`SweepSummary` (a Hydra callback, conf/config.yaml `hydra.callbacks`) prints one table of
every point when the multirun ends and writes it to `<sweep dir>/sweep_summary.md` and
`.json`, with its page `<sweep dir>/report/index.html` (eval/html.py); `jobs/run.py` then exits 1 when any point failed. A point stopped by preemption
still exits 75 itself, so a requeue goes on working. With two or more finished points the
summary adds the paired tests of every point against the reference point (the first structmem
point in the comparison's order, else the first; `jobs/report.py compare --reference` picks
another) and build-seed replicates for a sweep over `llm.seed` (analysis/comparison_stats.py;
files paired.csv/.json and seeds.json in the sweep dir), and with `tracking=mlflow` the
callback logs the sweep, on the launching host, as one parent run with a child per point
(analysis/tracking.py).

Points of a SLURM sweep run on many hosts and write `.points/` on a shared file system: each
record is its own file, published by renaming a temporary file whose name carries host, pid and
a random part (two hosts may share a pid), so no lock is needed and a reader sees a whole
record or none; a requeued point replaces its earlier record. The record names the host.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from structmem_gpu.core.artifacts import atomic_write_text
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.config.result_keys import launch_key, split_override

log = logging.getLogger(__name__)

POINTS_DIR = ".points"
STATUSES = ("ok", "failed", "preempted")
_last_failed: int | None = None  # failed points of the multirun that ended in this process


def point_status(*, job: int, overrides: Sequence[str], status: str, run_dir: Path,
                 error: str | None = None, exit_code: int = 0) -> dict[str, Any]:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} not in {STATUSES}")
    report = run_dir / "report" / "report.md"
    return {
        "job": job, "overrides": [str(o) for o in overrides], "status": status,
        "error": error, "exit_code": exit_code, "run_dir": str(run_dir),
        "report": str(report) if status == "ok" and report.is_file() else None,
    }


def record_point(sweep_dir: Path, status: Mapping[str, Any]) -> Path:
    path = Path(sweep_dir) / POINTS_DIR / f"{int(status['job'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    data = (json.dumps({**status, "host": host}, indent=2) + "\n").encode()
    tmp = path.with_name(f".{path.name}.{host}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on NFS/Lustre/GPFS too; the last record of a point wins
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StructMemError(f"{path}: sweep point record not written ({e.strerror or e})") from e
    return path


def read_points(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every recorded point of the sweep, by job number (an unreadable record is a failure)."""
    out = []
    for path in sorted((Path(sweep_dir) / POINTS_DIR).glob("*.json"), key=lambda p: p.stem):
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            out.append({"job": path.stem, "overrides": [], "status": "failed",
                        "error": f"{path}: unreadable point record ({exc})", "run_dir": "",
                        "report": None, "exit_code": 1})
    def order(p: Mapping[str, Any]) -> tuple[bool, int]:
        job = str(p["job"])
        return (not job.isdigit(), int(job) if job.isdigit() else 0)

    return sorted(out, key=order)


def render_summary(points: Sequence[Mapping[str, Any]]) -> str:
    failed = sum(p["status"] != "ok" for p in points)
    lines = [f"# Sweep summary: {len(points)} points, {len(points) - failed} ok, {failed} not ok", "",
             "| # | overrides | status | error or report |", "|---|---|---|---|"]
    for p in points:
        where = p.get("error") if p["status"] != "ok" else (p.get("report") or p.get("run_dir"))
        cell = str(where or "–").replace("|", "\\|")
        shown = [o for o in p["overrides"] if not launch_key(split_override(o)[0])]
        lines.append(f"| {p['job']} | {' '.join(shown) or '(none)'} | {p['status']} | {cell} |")
    return "\n".join(lines) + "\n"


def last_exit_code() -> int:
    """1 when the multirun that ended in this process had a point that did not finish, else 0."""
    return 1 if _last_failed else 0


class SweepSummary(Callback):
    """Hydra callback: a fresh point record folder per multirun, the table at its end."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        global _last_failed
        _last_failed = None
        from structmem_gpu.analysis import tracking
        from structmem_gpu.core.errors import StructMemError

        try:  # before any point runs: mlflow installed, store allowed
            tracking.check(config)
        except StructMemError as err:
            print(f"error: {err}", flush=True)
            raise SystemExit(2) from err
        points = Path(str(config.hydra.sweep.dir)) / POINTS_DIR
        if points.is_dir():  # an earlier multirun into the same sweep dir
            shutil.rmtree(points)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        global _last_failed
        sweep_dir = Path(str(config.hydra.sweep.dir))
        points = read_points(sweep_dir)
        text = render_summary(points)
        atomic_write_text(sweep_dir / "sweep_summary.md", text)
        atomic_write_text(sweep_dir / "sweep_summary.json", json.dumps(points, indent=2) + "\n")
        _last_failed = sum(p["status"] != "ok" for p in points)
        stats = sweep_stats(sweep_dir, points)
        if stats:
            text += "\n" + stats
            atomic_write_text(sweep_dir / "sweep_summary.md", text)
        page = sweep_page(sweep_dir, points, text)
        print("\n" + text + f"\nsweep summary: {sweep_dir / 'sweep_summary.md'}\npage: {page}",
              flush=True)
        log.info("sweep of %d points ended, %d not ok", len(points), _last_failed)
        from structmem_gpu.analysis import tracking

        target = tracking.safe(tracking.target, config)
        if target is not None:  # on this (the launching) host, from the run directories
            files = [sweep_dir / n for n in ("sweep_summary.md", "sweep_summary.json",
                                             "paired.csv", "paired.json", "seeds.json")]
            tracking.safe(tracking.log_sweep, target, sweep_dir, points, files)


def sweep_page(sweep_dir: Path, points: Sequence[Mapping[str, Any]], text: str) -> Path:
    """<sweep dir>/report/index.html: the summary (and its paired tests), the sweep's figures
    (accuracy against each varied numeric key, with two or more finished points) and links
    to every finished point's own page. A figure that cannot be drawn is one line on the page."""
    from structmem_gpu.eval.html import write_folder_page

    out = Path(sweep_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    done = [(f"#{p['job']} {' '.join(p['overrides'])}", Path(p["run_dir"])) for p in points
            if p["status"] == "ok" and (Path(p["run_dir"]) / "report" / "report.json").is_file()]
    if len(done) >= 2:
        from structmem_gpu.analysis.sweep_plots import write_sweep_plots

        try:
            write_sweep_plots([d for _, d in done], out)
        except StructMemError as err:
            log.warning("sweep figures not drawn: %s", err)
            text += f"\nSweep figures not drawn: {err}\n"
    return write_folder_page(out / "index.html", f"Sweep: {Path(sweep_dir).name}", text,
                             Path(sweep_dir), runs=done)


def sweep_stats(sweep_dir: Path, points: Sequence[Mapping[str, Any]]) -> str:
    """Paired tests (and build-seed replicates) of the finished points, "" with fewer than two;
    a problem reading them is one line in the summary, never a lost summary."""
    done = [Path(p["run_dir"]) for p in points
            if p["status"] == "ok" and (Path(p["run_dir"]) / "report" / "report.json").is_file()]
    if len(done) < 2:
        return ""
    from structmem_gpu.analysis.compare import compare_runs
    from structmem_gpu.analysis.comparison_stats import write_stats
    from structmem_gpu.core.errors import StructMemError

    try:
        text, _ = write_stats(compare_runs(done), sweep_dir)
    except StructMemError as err:
        return f"paired tests not computed: {err}\n"
    return text
