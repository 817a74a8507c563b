"""Every advertised command runs: each conf/method/*.yaml and each point of each
conf/experiment/*.yaml sweep, on the bundled sample with the scripted LLM and the bundled
encoder (`debug=scripted embedder=minilm`, offline), end to end to report/report.json.

    python -m pytest tests/unit/test_every_command.py -q

The files are globbed, so a new method or experiment is covered without editing this test; a
method YAML whose stages do not import fails here. Sweep points are the cartesian product of
the experiment's `hydra.sweeper.params` (what `python jobs/run.py -m experiment=NAME` runs).
Experiments on LoCoMo run on the sample instead (same format, a few turns); LongMemEval ones on
the tests' tiny LongMemEval file. Points whose configs are identical (e.g. `method=structmem`
and the structmem point of experiment=baselines) run once. One cache directory serves the whole
module, and the encoder is loaded once, so embeddings are computed once.

The commands shown: every `python jobs/run.py` command of README.md, docs/*.md and the
conf/experiment/*.yaml headers (`shown_commands`: continuation lines joined, comments dropped,
FILE / DIR / RUN / NODE placeholders substituted, `$HOME` expanded as the shell would, a `...`
left out) is composed at every point it launches (`-m` sweeps, the experiment's and the
command line's, `range()` included, expanded as `python jobs/data.py models -m` expands them)
and checked like a job; and every published row with a configuration must be matched by at
least one of those points (eval/published.match_note), so each paper row is reachable from a
command a user can copy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import check_config
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import config_hash, run_stages
from structmem_gpu.systems.registry import system_spec
from tests.fixtures.data import tiny_longmemeval
from tests.fixtures.pipeline import (
    CONF_DIR,
    compose_with_hydra,
    experiment_method,
    missing_system,
    options,
    sweep_points,
    systems_mark_if,
)

METHODS = options("method")
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
PROFILE = ["debug=scripted", "embedder=minilm"]


def benchmark_overrides(cfg: DictConfig, data_dir: Path) -> list[str]:
    """The sample in place of LoCoMo; the tiny LongMemEval file in place of the real one."""
    if str(cfg.benchmark.name) == "longmemeval":
        path = data_dir / "tiny_longmemeval.json"
        if not path.exists():
            path.write_text(json.dumps(tiny_longmemeval()))
        return [f"benchmark.path={path}"]
    return ["benchmark=sample"]


def missing_official(cfg: DictConfig) -> str | None:
    """The first official checkout the config names that this machine lacks (None: all here).
    CI sets STRUCTMEM_OFFICIAL_DIR (paths.official_dir) to the shared mirrors, so none is
    skipped there; a machine without them skips those commands with this line."""
    from structmem_gpu.prompts.official import SOURCE_NAMES, source_spec

    job = JobConfig.from_cfg(cfg)
    for name in SOURCE_NAMES:
        spec = source_spec(job, name)
        if spec is not None and not Path(spec.rpartition("@")[0] or spec).exists():
            return f"prompts.sources.{name}={spec}"
    return None


def option_method(override: str) -> str | None:
    """The method a config-group option of a sweep point selects (`+table1=amem`: its YAML's
    `override /method`, or the method of the experiment it includes), None when it selects none."""
    group, _, option = override.lstrip("+").partition("=")
    path = CONF_DIR / group / f"{option}.yaml"
    if group in ("method", "experiment") or not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            return experiment_method(entry.rsplit("/", 1)[1])
        if hasattr(entry, "get") and entry.get("override /method"):
            return str(entry.get("override /method"))
    return None


def point_method(experiment: str, point: list[str]) -> str:
    """The method a sweep point runs: its own `method=` override, or the method a group option
    of it selects (experiment=structmem_table1's `+table1=NAME`), else the experiment's."""
    chosen = [o.split("=", 1)[1] for o in point if o.startswith("method=")]
    chosen += [m for o in point if (m := option_method(o))]
    return chosen[-1] if chosen else experiment_method(experiment)


def commands() -> Iterator[tuple[str, list[str], str]]:
    """(label, overrides, method): the methods with their figures, then every sweep point
    (figures off: test_plots covers them, and they would take most of a scripted run's time)."""
    for method in METHODS:
        yield f"method={method}", [f"method={method}"], method
    for experiment in EXPERIMENTS:
        for point in sweep_points(experiment):
            label = " ".join([f"experiment={experiment}", *point])
            yield label, [f"experiment={experiment}", *point, "report.plots=false"], point_method(experiment, point)


# The full runs are the e2e tier's (tests/tiers.py; the gate composes every shown command
# instead: test_every_shown_command_composes); a command that runs a baseline system from its
# own code is the systems tier's, with the systems' environments.
COMMANDS = [pytest.param(label, overrides, id=label, marks=systems_mark_if(method, otherwise=(pytest.mark.e2e,)))
            for label, overrides, method in commands()]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One cache directory and one loaded encoder per model for the whole module."""
    from structmem_gpu.embed import encoder as encoder_module

    real_open = encoder_module.open_encoder
    loaded: dict[str, Any] = {}

    def open_once(cfg: Any, *, cache_dir: Path | None) -> Any:
        key = json.dumps([dict(cfg), str(cache_dir)], sort_keys=True, default=str)
        if key not in loaded:
            loaded[key] = real_open(cfg, cache_dir=cache_dir)
        return loaded[key]

    import torch

    threads = torch.get_num_threads()
    # One thread: SEEM's fusion encodes a few frames per wavefront step, and on a busy machine
    # torch's threads fight over the cores (a small encode is ~4x faster on one thread).
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    mp.setattr(encoder_module, "open_encoder", open_once)
    yield {"cache": tmp_path_factory.mktemp("cache"), "data": tmp_path_factory.mktemp("data"),
           "runs": tmp_path_factory.mktemp("runs"), "done": {}}
    mp.undo()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("method", METHODS)
def test_method_yaml_names_its_file_and_resolvable_stages(method: str) -> None:
    cfg = compose_with_hydra([f"method={method}", *PROFILE])
    assert cfg.method.name == method, "method.name must be the file name (run dir, error lines)"
    registry = stage_registry(cfg)
    for name in registry:  # every stage it can run, the ones only `stages=[...]` lists too
        got = registry[name].name
        assert got == name, f"{method}: '{name}' maps to stage {got!r}"
    assert set(cfg.method.stages) <= set(registry)


@pytest.mark.parametrize(("label", "overrides"), COMMANDS)
def test_command_runs_to_a_report(label: str, overrides: list[str], shared: dict[str, Any],
                                  request: pytest.FixtureRequest) -> None:
    base = compose_with_hydra([*overrides, *PROFILE])
    # LLMLingua-2 stages: the tests' small stand-in model (tests/fixtures/lingua.py), offline
    lingua = ([f"compress.model={request.getfixturevalue('tiny_lingua_model')}", "segment.layers=[0,1]"]
              if {"compress", "segment"} & set(base.method.stages) else [])
    # a baseline system that runs LLMLingua-2 itself (an `llmlingua_model` option, LightMem's
    # code): the 12-layer stand-in (its segmenter reads layers 8-11), on the CPU
    system = OmegaConf.select(base, "system.name") if "system_build" in base.method.stages else None
    if system and "llmlingua_model" in system_spec(system).options:
        model = request.getfixturevalue("tiny_lingua_model_12")
        lingua = [*lingua, f"system.options={{llmlingua_model:'{model}',device:cpu}}"]
    cfg = compose_with_hydra([*overrides, *PROFILE, *benchmark_overrides(base, shared["data"]), *lingua,
                    f"paths.cache_dir={shared['cache']}"])
    check_config(cfg)  # what jobs/run.py checks before any stage runs
    if missing := missing_official(cfg):  # replication experiments read the official texts
        pytest.skip(f"{missing}: STRUCTMEM_OFFICIAL_DIR is unset or holds no checkouts "
                    "(python jobs/data.py official)")
    if missing := missing_system(JobConfig.from_cfg(cfg)):
        pytest.skip(missing)
    key = config_hash(cfg)
    if key in shared["done"]:  # the same job as an earlier command: it ran there
        run_dir = shared["done"][key]
    else:
        run_dir = shared["runs"] / f"run{len(shared['done'])}"
        run_stages(cfg, run_dir, stage_registry(cfg))
        shared["done"][key] = run_dir
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["method"] == str(cfg.method.name), label
    # the scripted profile is structure-only: report.md opens by saying so
    from structmem_gpu.eval.report_md import STRUCTURE_ONLY_LINE

    assert report["structure_only"] is True
    assert (run_dir / "report" / "report.md").read_text().startswith(STRUCTURE_ONLY_LINE)
    # no LLM weights (the compression model is the tests' local LLMLingua-2 stand-in)
    assert {w["role"] for w in report["weights"]} <= {"encoder", "window tokenizer", "compression model"}


def test_every_experiment_has_a_point_and_the_ablation_sweep_all_six() -> None:
    points = {e: sweep_points(e) for e in EXPERIMENTS}
    assert all(points.values())
    assert [p[0] for p in points["seem_ablations"]][-1] == "method=seem_no_eef_rpe"
    assert len(points["seem_ablations"]) == 6


def test_a_stage_that_cannot_be_imported_is_one_config_error(tmp_path: Path) -> None:
    cfg = compose_with_hydra(["method=flat", *PROFILE,
                    "method.implementations.extract=structmem_gpu.methods.nope:STAGE"])
    with pytest.raises(ConfigError) as err:
        run_stages(cfg, tmp_path / "run", stage_registry(cfg))
    msg = str(err.value)
    assert "\n" not in msg and "conf/method/flat.yaml" in msg and "stage 'extract'" in msg
    assert not (tmp_path / "run" / "tables").exists()  # nothing ran
    cfg = compose_with_hydra(["method=flat", *PROFILE, "method.stages=[load,extract,summarise]"])
    names = r"conf/method/flat.yaml: method.stages names \['summarise'\]"
    with pytest.raises(ConfigError, match=names):
        stage_registry(cfg)


def test_the_official_locomo_file_under_benchmark_sample_is_one_line(tmp_path: Path) -> None:
    from structmem_gpu.core.hashing import file_sha256
    from structmem_gpu.data.locomo import LOCOMO_SHA256

    path = os.environ.get("STRUCTMEM_LOCOMO_PATH")
    if not path or not Path(path).is_file() or file_sha256(path) != LOCOMO_SHA256:
        pytest.skip("STRUCTMEM_LOCOMO_PATH: the official LoCoMo file is needed")
    cfg = compose_with_hydra(["benchmark=sample", f"benchmark.path={path}", *PROFILE])
    with pytest.raises(ConfigError, match=r"official LoCoMo file .* pass benchmark=locomo") as err:
        run_stages(cfg, tmp_path / "run", stage_registry(cfg))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "tables").exists()  # nothing written
