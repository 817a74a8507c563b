"""Log finished runs to an experiment tracker (MLflow), from their run directories only.

    python jobs/run.py tracking=mlflow                        # one job -> one MLflow run
    python jobs/run.py -m tracking=mlflow retrieve.entries_k=10,20,40   # parent + 3 children
    MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file:$PWD/outputs/mlruns

Off by default (`tracking: none`); `tracking=mlflow` needs the optional extra
(`pip install -e '.[tracking]'`: mlflow-skinny, the client; `pip install mlflow` adds
`mlflow ui`). What a run logs, read from its run directory after it ended:
its typed configuration (.hydra/config.yaml, every leaf a dotted parameter), its scores
(report.json: judge accuracy with its 95% CI overall and per category, unjudged, F1, BLEU-1,
evidence recall; LongMemEval's task-averaged and abstention accuracy), build cost and timings
(manifest.json: calls, tokens, batches, wall seconds per stage) as metrics, and report/ (report.md,
report.json, the figures) as artifacts. A sweep becomes one parent run (the sweep summary and
the comparison with paired tests as artifacts) with one child run per point, logged by the
sweep-summary callback at the end of the multirun on the launching host (structmem_gpu/run/sweep.py):
the points, possibly SLURM array tasks, write nothing to the tracking store.

The store is set explicitly, never mlflow's default (a SQLite file since mlflow 3.7, which a
shared filesystem's locks can corrupt): `tracking.uri` null = a local file store
`file:<paths.output_dir>/mlruns`; a path = a file store there; a URI (http://HOST:5000,
databricks, file:...) = that store. A `sqlite:` URI whose file lies on a network filesystem
(NFS, Lustre, GPFS, CIFS, ...) is refused with one line. mlflow 3.x keeps the file store in
maintenance mode and refuses it unless MLFLOW_ALLOW_FILE_STORE=true, which the tracker sets for
a file: store (and `mlflow ui` on it needs too).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.config.schema import TrackingSettings
from structmem_gpu.core.errors import ConfigError, InputError, StructMemError
from structmem_gpu.eval.html import PAGE

log = logging.getLogger(__name__)

EXTRA = "tracking"  # the pyproject extra that installs mlflow
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"  # mlflow's opt-in to its file store
NETWORK_FS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "fuse.sshfs",
              "beegfs", "glusterfs", "fuse.glusterfs", "panfs", "afs")
_PARAM_KEY = re.compile(r"[^0-9A-Za-z_\-. /]")  # what mlflow accepts in a key
MAX_PARAM_CHARS = 6000  # mlflow's limit on a parameter value
BATCH = 100  # mlflow's limit on parameters per log_batch call


# ---- settings and store -----------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where a job's runs go: its settings, the store URI and the experiment name."""

    settings: TrackingSettings
    uri: str
    experiment: str


def _pick(cfg: Mapping[str, Any], key: str, default: Any) -> Any:
    """The value at dotted `key`, reading only that path: at a multirun's start the launcher's
    config cannot be resolved as a whole (hydra.runtime is unset), so it is never checked into a
    JobConfig here; the mapping (Hydra's config included) is walked key by key."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node or node[part] is None:
            return default
        node = node[part]
    return node


def target(cfg: Mapping[str, Any]) -> Target | None:
    """The job's tracking target, None when tracking is off (`tracking: none` or no node).
    `cfg`: the launcher's Hydra config or a plain mapping (see _pick)."""
    node = _pick(cfg, "tracking", None)
    plain = None if node is None else {str(k): node[k] for k in node}  # a flat node
    st = TrackingSettings.from_cfg({"tracking": plain})
    if st.backend == "none":
        return None
    out = str(_pick(cfg, "paths.output_dir", "outputs"))
    bench = _pick(cfg, "benchmark.name", "runs")
    return Target(st, store_uri(st, out), st.experiment or f"structmem-{bench}")


def _mount_type(path: Path) -> str | None:
    """Filesystem type of the mount holding `path` (/proc/mounts; None where unreadable)."""
    try:
        lines = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    best, kind = "", None
    target = str(path.resolve())
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, parts[2]
    return kind


def store_uri(st: TrackingSettings, output_dir: str | Path) -> str:
    """The tracking URI a job logs to (see the module doc); ConfigError for a SQLite file on a
    network filesystem."""
    uri = st.uri
    if not uri:
        return (Path(output_dir) / "mlruns").resolve().as_uri()
    if "://" not in uri and not uri.startswith(("file:", "sqlite:", "databricks")):
        return Path(uri).resolve().as_uri()  # a plain path: a file store there
    if uri.startswith("sqlite:"):
        path = Path(uri.split(":///", 1)[-1] if ":///" in uri else uri.removeprefix("sqlite:"))
        kind = _mount_type(path.parent if path.parent.exists() else Path.cwd())
        if kind in NETWORK_FS:
            raise ConfigError(
                f"config tracking.uri={uri}: a SQLite file on a {kind} filesystem (its locks do "
                f"not hold across hosts); use a file store (tracking.uri=null or a path) or a "
                f"tracking server URI")
    return uri


def require_mlflow() -> None:
    """ConfigError naming the extra when mlflow is not installed (checked before any stage)."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            f"config tracking=mlflow: mlflow is not installed; pip install -e '.[{EXTRA}]' "
            f"(or pip install 'mlflow-skinny>=3.7')")


def check(cfg: Mapping[str, Any]) -> Target | None:
    """Before anything runs: the target (None = off), with mlflow installed and the store
    allowed; ConfigError (one line, exit 2) otherwise."""
    t = target(cfg)
    if t is not None:
        require_mlflow()
    return t


# ---- what a run directory holds ---------------------------------------------------------------
def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def config_params(run_dir: Path) -> dict[str, str]:
    """Every leaf of the run's .hydra/config.yaml, interpolations resolved where they resolve,
    as dotted parameter -> text (lists as JSON)."""
    from structmem_gpu.eval.published import saved_value, saved_yaml

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    raw = saved_yaml(path)
    out: dict[str, str] = {}
    for key, value in _leaves(raw):
        if isinstance(value, str) and "${" in value:
            try:
                value = saved_value(path, key)
            except Exception:  # noqa: BLE001 - a resolver of the launching job: keep the text
                log.debug("%s: %s kept unresolved", path, key)
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[_PARAM_KEY.sub("_", key)[:250]] = text[:MAX_PARAM_CHARS]
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _put(out: dict[str, float], key: str, value: Any) -> None:
    if isinstance(value, bool):
        value = float(value)
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        out[key] = float(value)


def _group(out: dict[str, float], prefix: str, g: Mapping[str, Any]) -> None:
    _put(out, f"{prefix}/judge_accuracy", g.get("judge_accuracy"))
    ci = g.get("judge_accuracy_ci95") or [None, None]
    _put(out, f"{prefix}/judge_accuracy_ci_low", ci[0])
    _put(out, f"{prefix}/judge_accuracy_ci_high", ci[1])
    for k in ("judge_accuracy_judged", "n", "unjudged", "f1_locomo", "f1_mem0", "bleu1",
              "evidence_recall"):
        _put(out, f"{prefix}/{k}", g.get(k))


def run_metrics(run_dir: Path) -> dict[str, float]:
    """Scores with CIs (report.json), build cost and per-stage timings (manifest.json)."""
    from structmem_gpu.analysis.compare import build_cost, slug

    run_dir = Path(run_dir)
    report = _read_json(run_dir / "report" / "report.json")
    manifest = _read_json(run_dir / "manifest.json")
    out: dict[str, float] = {}
    if report.get("overall"):
        _group(out, "overall", report["overall"])
    for cid, g in (report.get("by_category") or {}).items():
        _group(out, f"category/{slug(str(g.get('name') or cid))}", g)
    if report.get("overall_without_adversarial"):
        _group(out, "overall_without_adversarial", report["overall_without_adversarial"])
    for k, v in (report.get("longmemeval") or {}).items():
        _put(out, f"longmemeval/{k}", v)
    for k, v in build_cost(manifest, run_dir).items():
        _put(out, f"cost/{k}", v)
    for stage, entry in (manifest.get("stages") or {}).items():
        for k, v in (entry.get("build_cost") or {}).items():
            if k.endswith("wall_s"):
                _put(out, f"time/{stage}/{k}", v)
    return out


def run_tags(run_dir: Path) -> dict[str, str]:
    report = _read_json(Path(run_dir) / "report" / "report.json")
    manifest = _read_json(Path(run_dir) / "manifest.json")
    tags = {"run_dir": str(Path(run_dir).resolve()),
            "method": report.get("method") or manifest.get("method"),
            "benchmark": report.get("benchmark") or manifest.get("benchmark"),
            "config_hash": manifest.get("config_hash"), "git_commit": manifest.get("git_commit"),
            "judge": report.get("judge")}
    return {k: str(v) for k, v in tags.items() if v is not None}


# ---- mlflow -----------------------------------------------------------------------------------
class Tracker:
    """One MLflow client on one store and experiment (no global mlflow state is touched)."""

    def __init__(self, uri: str, experiment: str) -> None:
        require_mlflow()
        if uri.startswith("file:"):
            # mlflow >= 3.x keeps its file store in maintenance mode and refuses it without
            # this opt-in; the file store is our default on purpose (module doc).
            os.environ.setdefault(ALLOW_FILE_STORE, "true")
        from mlflow.tracking import MlflowClient  # heavy import, only here

        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(experiment))

    def _batch(self, run_id: str, params: Mapping[str, str], metrics: Mapping[str, float],
               tags: Mapping[str, str]) -> None:
        import time

        from mlflow.entities import Metric, Param, RunTag

        ts = int(time.time() * 1000)
        p = [Param(k, v) for k, v in params.items()]
        m = [Metric(k, v, ts, 0) for k, v in metrics.items()]
        t = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(p), len(m), len(t), 1), BATCH):
            self.client.log_batch(run_id, metrics=m[i:i + BATCH], params=p[i:i + BATCH],
                                  tags=t[i:i + BATCH])

    def log_run_dir(self, run_dir: Path, *, name: str, parent: str | None = None,
                    status: str = "FINISHED", artifacts: bool = True,
                    extra_tags: Mapping[str, str] | None = None) -> str:
        """One MLflow run from a run directory; its id."""
        tags = {**run_tags(run_dir), **(extra_tags or {})}
        first = {"mlflow.parentRunId": parent} if parent else {}  # a child from its creation
        run = self.client.create_run(self.experiment_id, run_name=name, tags=first)
        rid = run.info.run_id
        # A point that did not finish logs its tags only: what its directory holds (an earlier
        # job's report, a config written before the failure) is not this point's result.
        ok = status == "FINISHED"
        self._batch(rid, config_params(run_dir) if ok else {}, run_metrics(run_dir) if ok else {},
                    tags)
        report = Path(run_dir) / "report"
        if ok and artifacts and report.is_dir():
            self.client.log_artifacts(rid, str(report), "report")
        self.client.set_terminated(rid, status)
        return rid


def log_job(t: Target, run_dir: Path) -> str:
    """A single job's run (jobs/run.py, after the job ended); its MLflow run id."""
    tracker = Tracker(t.uri, t.experiment)
    rid = tracker.log_run_dir(run_dir, name=Path(run_dir).name, artifacts=t.settings.artifacts)
    print(f"tracking: MLflow run {rid} in {t.uri} (experiment {t.experiment})", flush=True)
    _link_page(Path(run_dir) / "report" / PAGE, tracker, rid)
    return rid


def _link_page(page_path: Path, tracker: Tracker, run_id: str) -> None:
    """The run's (or sweep's) HTML page names its MLflow run (eval/html.link_tracking)."""
    from structmem_gpu.eval.html import link_tracking

    if link_tracking(page_path, tracker.uri, tracker.experiment_id, run_id):
        log.info("%s links MLflow run %s", page_path, run_id)


def log_sweep(t: Target, sweep_dir: Path, points: Sequence[Mapping[str, Any]],
              artifacts: Sequence[Path] = ()) -> str:
    """A multirun: one parent run (sweep summary and comparison files as artifacts, counts of
    points) and one child per point, read from the point records (sweep.py) and their run
    directories; a failed point's child is FAILED with its error line as a tag."""
    tracker = Tracker(t.uri, t.experiment)
    client = tracker.client
    name = Path(sweep_dir).name
    failed = sum(p.get("status") != "ok" for p in points)
    parent = client.create_run(tracker.experiment_id, run_name=name).info.run_id
    tracker._batch(parent, {"sweep_dir": str(Path(sweep_dir).resolve()),
                            "points": str(len(points))},
                   {"points_ok": len(points) - failed, "points_failed": failed},
                   {"sweep": "parent"})
    for p in points:
        shown = " ".join(p.get("overrides") or []) or f"job {p.get('job')}"
        status = "FINISHED" if p.get("status") == "ok" else "FAILED"
        extra = {"sweep_job": str(p.get("job")), "point_status": str(p.get("status")),
                 "overrides": shown[:5000]}
        if p.get("error"):
            extra["error"] = str(p["error"])[:5000]
        run_dir = Path(str(p.get("run_dir") or sweep_dir))
        child = tracker.log_run_dir(run_dir, name=shown[:250], parent=parent, status=status,
                                    artifacts=t.settings.artifacts and status == "FINISHED",
                                    extra_tags=extra)
        if status == "FINISHED":
            _link_page(run_dir / "report" / PAGE, tracker, child)
    if t.settings.artifacts:
        for path in artifacts:
            if Path(path).is_file():
                client.log_artifact(parent, str(path))
    client.set_terminated(parent, "FAILED" if failed else "FINISHED")
    _link_page(Path(sweep_dir) / "report" / PAGE, tracker, parent)
    print(f"tracking: MLflow sweep run {parent} with {len(points)} child runs in {t.uri} "
          f"(experiment {t.experiment})", flush=True)
    return parent


def track_dirs(dirs: Sequence[Path], *, uri: str | None = None, experiment: str | None = None,
               output_dir: str | Path = "outputs") -> list[str]:
    """Log finished sweeps and runs after the fact (`python jobs/report.py track DIR...`): a
    directory with sweep_summary.json is a sweep (parent + children), any other stands for the
    run directories at or below it. The ids of the MLflow runs created."""
    from structmem_gpu.analysis.compare import discover_runs

    st = TrackingSettings(backend="mlflow", uri=uri, experiment=experiment)
    ids = []
    for d in map(Path, dirs):
        summary = d / "sweep_summary.json"
        runs = [] if summary.is_file() else discover_runs(d)
        first = runs[0] if runs else None
        bench = _read_json(first / "report" / "report.json").get("benchmark") if first else None
        if bench is None and summary.is_file():
            points = json.loads(summary.read_text(encoding="utf-8"))
            done = [Path(p["run_dir"]) for p in points if p.get("status") == "ok"]
            bench = _read_json(done[0] / "report" / "report.json").get("benchmark") if done \
                else None
        t = Target(st, store_uri(st, output_dir), experiment or f"structmem-{bench or 'runs'}")
        require_mlflow()
        if summary.is_file():
            points = json.loads(summary.read_text(encoding="utf-8"))
            files = [d / n for n in ("sweep_summary.md", "sweep_summary.json", "paired.csv",
                                     "paired.json", "seeds.json")]
            ids.append(log_sweep(t, d, points, files))
        elif not runs:
            raise InputError(d, "no sweep_summary.json and no finished run directory below it")
        else:
            ids.extend(log_job(t, r) for r in runs)
    return ids


def safe(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a logging call after the results are on disk: a tracking failure is one error line
    (the run directories stay complete; `python jobs/report.py track DIR` logs them later),
    never a lost result."""
    try:
        return fn(*args, **kwargs)
    except StructMemError as err:
        log.error("tracking: %s", err)
        print(f"error: tracking: {err}", flush=True)
    except Exception as err:  # noqa: BLE001 - the store is outside this job: name it, go on
        log.error("tracking failed (%s: %s); results are on disk", type(err).__name__, err)
        print(f"error: tracking failed ({type(err).__name__}: {err}); the run directories are "
              f"complete: log them later with python jobs/report.py track DIR", flush=True)
    return None
