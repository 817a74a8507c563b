"""Launcher presets (conf/hydra/launcher/*.yaml) compose into the expected submitit/sbatch
parameters. No cluster: the executor is built exactly as hydra-submitit-launcher 1.2.0's
`BaseSubmititLauncher.launch` builds it, and the sbatch script of a 16-task array is rendered
with submitit's own `_make_sbatch_string`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from tests.fixtures.pipeline import CONF_DIR

submitit = pytest.importorskip("submitit")
pytest.importorskip("hydra_plugins.hydra_submitit_launcher")


def hydra_cfg(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def executor_for(launcher: dict[str, Any], folder: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The launcher's executor set-up (submitit_launcher.py, launch()), minus submission."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 2))  # "srun exists"
    params = {k: v for k, v in launcher.items() if k != "_target_"}
    executor = submitit.AutoExecutor(
        cluster="slurm", folder=folder, slurm_max_num_timeout=params.pop("max_num_timeout")
    )
    params.pop("submitit_folder")
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    return executor


def test_slurm_preset_composes(tmp_path: Path) -> None:
    cfg = hydra_cfg(
        ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", f"hydra.sweep.dir={tmp_path}"]
    )
    node = cfg.hydra.launcher
    assert node._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (node.partition, node.gpus_per_node, node.timeout_min) == ("gpu", 1, 240)
    assert node.max_num_timeout > 0  # timeouts/preemption requeue; the rerun resumes
    assert node.array_parallelism == 16
    assert "source .venv/bin/activate" in node.setup
    assert node.submitit_folder == f"{tmp_path}/.submitit/%j"


def test_slurm_preset_renders_a_16_task_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from submitit.slurm.slurm import _make_sbatch_string

    cfg = hydra_cfg(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.account=proj42",
            "hydra.launcher.array_parallelism=8",
            "+hydra.launcher.additional_parameters.mail-type=END",
            f"hydra.sweep.dir={tmp_path}",
            "num_shards=16",
        ]
    )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(launcher, dict)
    ex = executor_for(launcher, tmp_path / ".submitit" / "%j", monkeypatch)
    params = ex._executor.parameters
    assert params["time"] == 240 and params["gpus_per_node"] == 1 and params["mem"] == "64GB"
    script = _make_sbatch_string(
        command="python -u -m submitit.core._submit X", folder=ex.folder, map_count=16, **params
    )
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj42",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --time=240",
        "#SBATCH --array=0-15%8",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --mail-type=END",
        "#SBATCH --nodes=1",
        "source .venv/bin/activate",
    ):
        assert line in script, f"{line!r} not in sbatch script:\n{script}"
    assert ex._executor.max_num_timeout == 3


def test_gres_only_clusters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = hydra_cfg(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.gres=gpu:a100:1",
            "hydra.launcher.gpus_per_node=null",
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(launcher, dict)
    params = executor_for(launcher, tmp_path, monkeypatch)._executor.parameters
    assert params["gres"] == "gpu:a100:1" and "gpus_per_node" not in params


def test_local_preset_composes(tmp_path: Path) -> None:
    cfg = hydra_cfg(["hydra/launcher=local", f"hydra.sweep.dir={tmp_path}"])
    node = cfg.hydra.launcher
    assert node._target_.endswith("submitit_launcher.LocalLauncher")
    assert node.timeout_min == 240 and node.gpus_per_node is None


@pytest.mark.parametrize(
    "name",
    [
        "structmem_locomo",
        "structmem_locomo_reference_code",
        "seed_k_sweep",
        "entries_k_sweep",
        "window_sweep",
        "judge_robustness",
        "seem_locomo",
        "seem_longmemeval",
        "fidelity",
    ],
)
def test_experiments_compose(name: str) -> None:
    cfg = hydra_cfg([f"experiment={name}"])
    header = (CONF_DIR / "experiment" / f"{name}.yaml").read_text().splitlines()
    assert header[0] == "# @package _global_"
    assert any("python jobs/run.py" in line for line in header[:25]), "header must give the command"
    assert cfg.method.name in ("structmem", "seem")


def test_sweep_experiments_sweep_what_the_paper_sweeps() -> None:
    seed = hydra_cfg(["experiment=seed_k_sweep"]).hydra.sweeper.params
    assert seed["consolidate.seed_k"] == "0,5,10,15,20"
    assert "retrieve.entries_k" in hydra_cfg(["experiment=entries_k_sweep"]).hydra.sweeper.params
    assert (
        "consolidate.window_seconds" in hydra_cfg(["experiment=window_sweep"]).hydra.sweeper.params
    )
    fid = hydra_cfg(["experiment=fidelity"]).hydra.sweeper.params
    assert fid["consolidate.prompt_variant"] == "constrained,unconstrained"
    panel = hydra_cfg(["experiment=judge_robustness"]).judge.panel
    assert len(panel) >= 2
