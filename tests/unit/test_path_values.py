"""Every path knob takes `~/x`, `$HOME/x` and relative paths alike: the shell expands an
unquoted `$HOME`, Hydra cannot parse an unquoted `~` (quoted it reaches the job as typed), and
jobs/run.py expands whatever still begins like a shell path (structmem_gpu/config/path_values.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf

from structmem_gpu.config.path_values import expand_paths, expand_value
from tests.fixtures.pipeline import CONF_DIR

KNOBS = ["benchmark.path", "paths.cache_dir", "prompts.sources.lightmem", "llm.model",
         "embedder.model"]


def _compose(overrides: list[str], hydra_cfg: bool = False):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=hydra_cfg)


@pytest.mark.e2e  # e2e: composes every path knob
def test_tilde_and_home_reach_the_same_path_in_every_path_knob(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for knob in KNOBS:
        want = str(tmp_path / "src" / "x@8fc9a91")
        tilde = _compose([f'{knob}="~/src/x@8fc9a91"'])  # quoted: how `~` passes Hydra
        home = _compose([f"{knob}='$HOME/src/x@8fc9a91'"])  # quoted: the shell left it alone
        shell = _compose([f"{knob}={os.path.expandvars('$HOME')}/src/x@8fc9a91"])  # unquoted
        assert expand_paths(tilde) == [knob] and expand_paths(home) == [knob]
        assert expand_paths(shell) == []
        got = {OmegaConf.select(c, knob) for c in (tilde, home, shell)}
        assert got == {want}, knob
    with pytest.raises(HydraException):  # why the docs write $HOME: Hydra refuses a bare ~
        _compose(["prompts.sources.lightmem=~/src/LightMem"])


def test_relative_paths_stay_relative_to_the_launch_directory() -> None:
    cfg = _compose(["benchmark.path=data/locomo10.json"], hydra_cfg=True)
    assert cfg.hydra.job.chdir is False  # jobs run where they were launched
    assert expand_paths(cfg) == [] and cfg.benchmark.path == "data/locomo10.json"


def test_only_values_that_begin_like_a_shell_path_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    assert expand_value("~") == "/home/me" and expand_value("${HOME}/a") == "/home/me/a"
    for text in ("Answer with $5 or less.", "~ about 5 days", "Qwen/Qwen2.5-7B-Instruct",
                 "cost: $HOME", "a ~/b", "$ 5"):
        assert expand_value(text) == text
    assert expand_value("$NOT_SET_ANYWHERE_29/x") == "$NOT_SET_ANYWHERE_29/x"  # as a shell leaves it
