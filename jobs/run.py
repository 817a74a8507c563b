"""Run a method's stages on a benchmark: the main job.

    python jobs/run.py                                         # sample, StructMem, CPU profile
    python jobs/run.py benchmark=locomo benchmark.path=FILE stages=[load] hydra.run.dir=DIR
    python jobs/run.py -m consolidate.seed_k=0,5,10,15,20      # Hydra multirun sweep

Expected errors (bad input files, bad config, missing tables) end the job with exit code 2 and
one line naming the file and record, without a traceback.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/run.py` from a clean clone without install
    sys.path.insert(0, str(ROOT))

from structmem_gpu.errors import StructMemError  # noqa: E402

log = logging.getLogger("structmem_gpu.run")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from structmem_gpu import preempt
    from structmem_gpu.config_schema import check_config

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    guard = preempt.PreemptionGuard(
        grace_s=float(cfg.get("preempt", {}).get("grace_s", 30)),
        exit_code=int(cfg.get("preempt", {}).get("exit_code", preempt.DEFAULT_EXIT_CODE)),
    )
    try:
        check_config(cfg)  # types and ranges of every knob, before anything runs
        if cfg.get("dry_run"):  # estimate requests and tokens per stage; no server, no files
            from structmem_gpu.bench.dry_run import estimate, format_estimate

            print(format_estimate(estimate(cfg)))
            return
        from structmem_gpu.methods.registry import stage_registry
        from structmem_gpu.pipeline import run_stages
        from structmem_gpu.runlock import hold_run_dir

        # The lock first, then Hydra's record of the job: a second job on this directory must
        # not overwrite .hydra/ of the one running (hydra.output_subdir is null for that reason).
        with hold_run_dir(run_dir), guard:
            save_job_config(cfg, run_dir)
            run_stages(cfg, run_dir, stage_registry(cfg))
    except preempt.Preempted as err:
        # Servers are stopped by now (run_stages' scope closed); let submitit requeue, if it
        # installed the handler we replaced, else exit with the code a requeue wrapper expects.
        log.warning("%s", err)
        print(f"preempted: {err}", file=sys.stderr)
        guard.chain()
        sys.exit(guard.exit_code)
    except StructMemError as err:
        log.error("%s", err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    report = run_dir / "report" / "report.md"
    print(f"run directory: {run_dir}")
    if report.exists():
        print(f"report: {report}")


def save_job_config(cfg: DictConfig, run_dir: Path) -> None:
    """What Hydra writes to <run_dir>/.hydra/ (config, hydra config, overrides), written once
    this job holds the run directory."""
    from omegaconf import OmegaConf

    from structmem_gpu.artifacts import atomic_write_text

    hydra_cfg = HydraConfig.get()
    out = run_dir / ".hydra"
    atomic_write_text(out / "config.yaml", OmegaConf.to_yaml(cfg))
    atomic_write_text(out / "hydra.yaml", OmegaConf.to_yaml({"hydra": hydra_cfg}))
    atomic_write_text(out / "overrides.yaml", OmegaConf.to_yaml(list(hydra_cfg.overrides.task)))


if __name__ == "__main__":
    main()
