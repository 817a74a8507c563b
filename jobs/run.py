"""Run a method's stages on a benchmark: the main job.

    python jobs/run.py                                         # sample, StructMem, CPU profile
    python jobs/run.py benchmark=locomo benchmark.path=FILE stages=[load] hydra.run.dir=DIR
    python jobs/run.py -m consolidate.seed_k=0,5,10,15,20      # Hydra multirun sweep

Before any stage, the preflight (structmem_gpu/node/preflight.py) checks that the node has every
model, engine, CUDA device and the disk space the job needs (docs/replication.md "Replicate on a GPU node");
`dry_run=true` only reports what it finds. Expected errors (bad input files, bad config, a
preflight problem, missing tables) end the job with exit code 2 and one line naming the file
and record, without a traceback. In a multirun a failing point prints
the same line and the sweep goes on; the sweep ends with a table of every point
(structmem_gpu/run/sweep.py) and exits 1 when any point failed. A preempted job exits 75.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/run.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.core.errors import StructMemError  # noqa: E402

log = logging.getLogger("structmem_gpu.run")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    from structmem_gpu.config.schema import PreemptSettings
    from structmem_gpu.core import preempt
    from structmem_gpu.run import sweep
    from structmem_gpu.config.path_values import expand_paths

    from structmem_gpu.config.job import JobConfig

    expand_paths(cfg)  # `~/x`, `$HOME/x` in any path knob, as a shell expands them
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN

    def point(status: str, error: str | None = None, code: int = 0) -> dict:
        record = sweep.point_status(job=int(hydra_cfg.job.get("num") or 0),
                                    overrides=list(hydra_cfg.overrides.task), status=status,
                                    run_dir=run_dir, error=error, exit_code=code)
        if in_sweep:
            sweep.record_point(Path(str(hydra_cfg.sweep.dir)), record)
        return record

    try:  # the job's configuration as typed objects, once: everything below reads these
        job = JobConfig.from_cfg(cfg)
    except StructMemError as err:
        log.error("%s", err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return _end(point("failed", str(err), 2), in_sweep)
    # conf/config.yaml's preempt node; its model's defaults are the one home of grace and exit
    # code (config/schema.py PreemptSettings), also when a config has no preempt node
    stop = job.root.preempt or PreemptSettings()
    guard = preempt.PreemptionGuard(grace_s=stop.grace_s, exit_code=stop.exit_code)

    from structmem_gpu.analysis import tracking

    try:
        # tracking=mlflow: a single job logs itself at its end; a sweep's points never do (the
        # sweep summary logs them on the launching host). Checked before any stage.
        track = None if in_sweep else tracking.check(cfg)
        ran = run_job(cfg, run_dir, guard, overrides=list(hydra_cfg.overrides.task), job=job)
    except preempt.Preempted as err:
        # Servers are stopped by now (run_stages' scope closed); let submitit requeue, if it
        # installed the handler we replaced, else exit with the code a requeue wrapper expects.
        log.warning("%s", err)
        print(f"preempted: {err}", file=sys.stderr)
        point("preempted", str(err), guard.exit_code)
        guard.chain()
        sys.exit(guard.exit_code)
    except StructMemError as err:
        log.error("%s", err)
        print(f"error: {err}", file=sys.stderr, flush=True)
        # a question group's child passes its own code on (75 = preempted: requeue)
        return _end(point("failed", str(err), getattr(err, "exit_code", 2)), in_sweep)
    except Exception as err:  # a bug: its traceback goes to the console and run.log
        log.exception("job failed with an unexpected %s", type(err).__name__)
        line = f"{type(err).__name__}: {err} (unexpected: traceback in {run_dir / 'run.log'})"
        print(f"error: {line}", file=sys.stderr, flush=True)
        return _end(point("failed", line, 1), in_sweep)
    if ran:
        _print_closing(run_dir, table="report" in ran)
        if track is not None and "report" in ran:
            tracking.safe(tracking.log_job, track, run_dir)
    return _end(point("ok"), in_sweep)


def _end(record: dict, in_sweep: bool) -> dict:
    """A sweep point returns its record (the sweep goes on); a single job exits with its code."""
    if not in_sweep and record["exit_code"]:
        sys.exit(record["exit_code"])
    return record


def run_job(cfg: DictConfig, run_dir: Path, guard: object, overrides: list[str] | None = None,
            job: object | None = None) -> list[str]:
    """Check the config and the node (preflight), then run the stages (or print the dry-run
    estimate). The names of the stages the job went through (none for a dry run). `job`: the
    JobConfig of `cfg` when the caller built it already. Below this entry point everything
    reads the JobConfig; `cfg` goes on only to what records or opens from the Hydra config
    itself (the config check, the changed-keys log, .hydra/, the backends, the dry run)."""
    from structmem_gpu.config.job import JobConfig

    from structmem_gpu.core import preempt
    from structmem_gpu.node import preflight
    from structmem_gpu.config.schema import check_config
    from structmem_gpu.methods.registry import stage_registry
    from structmem_gpu.run.pipeline import job_stage_names

    job = JobConfig.from_cfg(job if job is not None else cfg)
    registry = stage_registry(job)
    # Types and ranges of every knob the job's stages (and every job) read, before anything runs.
    check_config(cfg, registry.values())
    dry_run = job.root.dry_run
    with guard:  # type: ignore[attr-defined]
        # Models, engines, CUDA, disk: seconds, before any stage; a dry run only reports them.
        with preempt.interruptible("preflight"):
            stages = [registry[name] for name in job_stage_names(job) if name in registry]
            preflight.enforce(preflight.check(job, stages, run_dir, overrides or []),
                              dry_run=dry_run)
        if dry_run:  # estimate requests and tokens per stage; no server, no files
            from structmem_gpu.node.dry_run import print_dry_run

            print_dry_run(job)  # estimate, then the GPU memory plan; one that cannot fit: exit 2
            return []
        from structmem_gpu.run.pipeline import run_stages, stages_to_run
        from structmem_gpu.config.run_changes import log_changes
        from structmem_gpu.core.runlock import hold_run_dir

        # The lock first, then Hydra's record of the job: a second job on this directory must
        # not overwrite .hydra/ of the one running (hydra.output_subdir is null for that reason).
        with hold_run_dir(run_dir):
            if job.root.question_groups is not None:  # per group, children (run/groups.py)
                from structmem_gpu.run.groups import run_grouped

                save_job_config(cfg, run_dir)
                run_grouped(job, run_dir, overrides or [])
                return job_stage_names(job)
            # before .hydra/ is replaced: what changed against the directory's last job
            log_changes(run_dir, cfg, lambda: stages_to_run(job, run_dir, registry))
            save_job_config(cfg, run_dir)
            run_stages(cfg, run_dir, registry)
    return job_stage_names(job)


def _print_closing(run_dir: Path, table: bool) -> None:
    """The headline table (and matching published rows) of the report this job wrote, then
    the paths."""
    from structmem_gpu.eval.report_md import closing_table

    report = run_dir / "report" / "report.md"
    table = closing_table(run_dir / "report" / "report.json") if table else None
    if table:
        print("\n" + table)
    print(f"run directory: {run_dir}")
    if report.exists():
        print(f"report: {report}")
    page = report.with_name("index.html")  # eval/html.py: tables and figures on one page
    if page.exists():
        print(f"page: {page}")


def save_job_config(cfg: DictConfig, run_dir: Path) -> None:
    """What Hydra writes to <run_dir>/.hydra/ (config, hydra config, overrides), written once
    this job holds the run directory."""
    from omegaconf import OmegaConf

    from structmem_gpu.core.artifacts import atomic_write_text

    hydra_cfg = HydraConfig.get()
    out = run_dir / ".hydra"
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg))
    atomic_write_text(out / "hydra.yaml", OmegaConf.to_yaml({"hydra": hydra_cfg}))
    atomic_write_text(out / "overrides.yaml", OmegaConf.to_yaml(list(hydra_cfg.overrides.task)))


if __name__ == "__main__":
    main()
    from structmem_gpu.run.sweep import last_exit_code

    sys.exit(last_exit_code())  # 1 after a multirun with a failed point, else 0
