"""The points of a Hydra sweep without running it: `jobs/run.py -m <overrides>` expanded as
Hydra's basic sweeper expands it (`python jobs/data.py models -m` fetches every point's
models). Here because it reads Hydra's composed config (OmegaConf), which only config/ does."""

from __future__ import annotations

from collections.abc import Sequence

from structmem_gpu.config.yaml_defaults import CONF_DIR


def sweep_points(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of every point of `jobs/run.py -m <overrides>`: the experiment's
    `hydra.sweeper.params` first, then the command line's (Hydra's basic sweeper order)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3",
                               job_name="data_models"):
        base = compose("config", overrides=[o for o in fixed if not o.startswith("hydra.")],
                       return_hydra_config=True)
    from omegaconf import OmegaConf

    params = OmegaConf.select(base, "hydra.sweeper.params", default=None) or {}
    lines = [f"{k}={v}" for k, v in params.items()] + list(overrides)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(lines), None)
    return [point for batch in batches for point in batch]
