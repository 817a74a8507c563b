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

import functools
import itertools
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import check_config
from structmem_gpu.eval.published import comparison_lines, load_published, match_note
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.run.pipeline import config_hash, run_stages
from structmem_gpu.systems.registry import system_spec
from tests.fixtures.data import tiny_longmemeval
from tests.fixtures.pipeline import (CONF_DIR, experiment_method, load_job, missing_system, options,
                                     systems_mark_if)

METHODS = options("method")
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
PROFILE = ["debug=scripted", "embedder=minilm"]


def _compose(overrides: list[str], hydra_cfg: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_cfg)


@functools.lru_cache(maxsize=None)
def _experiment_cfg(experiment: str) -> DictConfig:
    return _compose([f"experiment={experiment}"], hydra_cfg=True)


def sweep_points(experiment: str) -> list[list[str]]:
    """The overrides of each job `-m experiment=NAME` launches (one empty point: no sweep)."""
    cfg = _experiment_cfg(experiment)
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    parser = OverridesParser.create()
    axes = []
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        axes.append([f"{key}={v}" for v in override.sweep_string_iterator()])
    return [list(p) for p in itertools.product(*axes)]


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


def point_method(experiment: str, point: list[str]) -> str:
    """The method a sweep point runs: its own `method=` override, else the experiment's."""
    chosen = [o.split("=", 1)[1] for o in point if o.startswith("method=")]
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


# A command that runs a baseline system from its own code is marked `systems`: it runs in the
# systems tier (make systems-test) with the systems' environments, outside CI's make test.
COMMANDS = [pytest.param(label, overrides, id=label, marks=systems_mark_if(method))
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
    cfg = _compose([f"method={method}", *PROFILE])
    assert cfg.method.name == method, "method.name must be the file name (run dir, error lines)"
    registry = stage_registry(cfg)
    for name in registry:  # every stage it can run, the ones only `stages=[...]` lists too
        got = registry[name].name
        assert got == name, f"{method}: '{name}' maps to stage {got!r}"
    assert set(cfg.method.stages) <= set(registry)


@pytest.mark.parametrize(("label", "overrides"), COMMANDS)
def test_command_runs_to_a_report(label: str, overrides: list[str], shared: dict[str, Any],
                                  request: pytest.FixtureRequest) -> None:
    base = _compose([*overrides, *PROFILE])
    # LLMLingua-2 stages: the tests' small stand-in model (tests/fixtures/lingua.py), offline
    lingua = ([f"compress.model={request.getfixturevalue('tiny_lingua_model')}", "segment.layers=[0,1]"]
              if {"compress", "segment"} & set(base.method.stages) else [])
    # a baseline system that runs LLMLingua-2 itself (an `llmlingua_model` option, LightMem's
    # code): the 12-layer stand-in (its segmenter reads layers 8-11), on the CPU
    system = OmegaConf.select(base, "system.name") if "system_build" in base.method.stages else None
    if system and "llmlingua_model" in system_spec(system).options:
        model = request.getfixturevalue("tiny_lingua_model_12")
        lingua = [*lingua, f"system.options={{llmlingua_model:'{model}',device:cpu}}"]
    cfg = _compose([*overrides, *PROFILE, *benchmark_overrides(base, shared["data"]), *lingua,
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
    cfg = _compose(["method=flat", *PROFILE,
                    "method.implementations.extract=structmem_gpu.methods.nope:STAGE"])
    with pytest.raises(ConfigError) as err:
        run_stages(cfg, tmp_path / "run", stage_registry(cfg))
    msg = str(err.value)
    assert "\n" not in msg and "conf/method/flat.yaml" in msg and "stage 'extract'" in msg
    assert not (tmp_path / "run" / "tables").exists()  # nothing ran
    cfg = _compose(["method=flat", *PROFILE, "method.stages=[load,extract,summarise]"])
    names = r"conf/method/flat.yaml: method.stages names \['summarise'\]"
    with pytest.raises(ConfigError, match=names):
        stage_registry(cfg)


# ---- the commands README.md, docs/ and the experiment headers show ---------------------------

ROOT = CONF_DIR.parent
RUN = "python jobs/run.py"
# Placeholders of the shown commands and what a user would put there.
PLACEHOLDERS = {"FILE": "data/locomo10.json", "DIR": "outputs/some_run", "RUN": "outputs/some_run",
                "NODE": "node01"}


def _shown_in() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((CONF_DIR / "experiment").glob("*.yaml"))]


def shown_commands() -> list[tuple[str, str]]:
    """(file:line, command text) of every `python jobs/run.py` command shown: a code line (or
    a YAML comment line) from RUN to its end, backslash continuations joined; inline code up to
    its closing backtick, across a line break. A second command on a line: `file:line+1`."""
    out = []
    for path in _shown_in():
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.suffix == ".yaml":  # the header: comment lines only
            lines = [ln.lstrip()[1:] if ln.lstrip().startswith("#") else "" for ln in lines]
        for n, line in enumerate(lines):
            start = line.find(RUN)
            while start >= 0:
                text, k = line[start:], n
                if start and line[start - 1] == "`":  # inline code: up to the closing backtick
                    while "`" not in text and k + 1 < len(lines):
                        k += 1
                        text += " " + lines[k].strip()
                    text = text.split("`")[0]
                else:
                    while text.rstrip().endswith("\\") and k + 1 < len(lines):
                        k += 1
                        text = text.rstrip()[:-1] + " " + lines[k].strip()
                where = f"{path.relative_to(ROOT)}:{n + 1}"
                out.append((where + ("" if start == line.find(RUN) else "+1"), text))
                start = line.find(RUN, start + len(RUN))
    return out


def command_overrides(text: str) -> tuple[bool, list[str]]:
    """(multirun, overrides) of a shown command, as a user's shell would pass them."""
    words = shlex.split(text, comments=True)[len(RUN.split()):]
    multirun = "-m" in words
    out = []
    for word in words:
        if word == "-m" or word == "..." or word.endswith("=..."):
            continue
        word = os.path.expandvars(word)  # $HOME/..., as the shell expands it
        for name, value in PLACEHOLDERS.items():
            word = re.sub(rf"\b{name}\b", value, word)
        out.append(word)
    return multirun, out


SHOWN = shown_commands()


def _compose_checked(point: list[str], shards: dict[tuple[str, ...], DictConfig | str]
                     ) -> DictConfig | str:
    """The point's config, checked as jobs/run.py checks it, or the one-line error. Shards of
    one job differ only in the root int `shard_index`: composed once, each index then set on
    a copy and checked (Hydra composes nothing else differently for a value override)."""
    shard = next((o for o in point if o.startswith("shard_index=")), None)
    rest = tuple(o for o in point if o != shard)
    try:
        if rest not in shards:
            shards[rest] = _compose(list(rest))
        base = shards[rest]
        if isinstance(base, str):
            return base
        cfg = base.copy()
        if shard is not None:
            cfg.shard_index = int(shard.split("=", 1)[1])
        check_config(cfg, stage_registry(cfg).values())
        return cfg
    except Exception as err:  # Hydra's and ours: recorded, asserted by the test
        shards.setdefault(rest, f"{type(err).__name__}: {err}".splitlines()[0])
        return f"{type(err).__name__}: {err}".splitlines()[0]


@pytest.fixture(scope="module")
def shown_points() -> dict[str, list[tuple[list[str], DictConfig | str]]]:
    """where -> (overrides, config or the error it composes with) of every point the
    command launches (one for a single run)."""
    points = load_job("data").sweep_points  # as `python jobs/data.py models -m` expands them
    out: dict[str, list[tuple[list[str], DictConfig | str]]] = {}
    composed: dict[tuple[str, ...], DictConfig | str] = {}
    bases: dict[tuple[str, ...], DictConfig | str] = {}
    for where, text in SHOWN:
        multirun, overrides = command_overrides(text)
        try:
            todo = points(overrides) if multirun else [overrides]
        except Exception as err:  # the sweep itself does not parse: recorded, asserted below
            out[where] = [(overrides, f"{type(err).__name__}: {err}")]
            continue
        out[where] = []
        for point in todo:
            key = tuple(point)
            if key not in composed:
                composed[key] = _compose_checked(list(point), bases)
            out[where].append((list(point), composed[key]))
    return out


def test_shown_commands_are_found() -> None:
    wheres = [w for w, _ in SHOWN]
    assert len(SHOWN) >= 50 and any(w.startswith("docs/") for w in wheres)
    assert any(w.startswith("conf/experiment/") for w in wheres)
    texts = [t for _, t in SHOWN]
    assert any("range(0,16)" in t for t in texts)  # continuation line joined
    assert any(t.endswith("hydra.run.dir=RUN") for t in texts)  # inline code across a line break


def test_every_shown_command_composes(shown_points: dict[str, list[tuple[list[str], Any]]]) -> None:
    failed = [f"{where}: {' '.join(o)}: {cfg}" for where, pts in shown_points.items()
              for o, cfg in pts if isinstance(cfg, str)]
    assert not failed, "\n".join(failed)
    sharded = [pts for pts in shown_points.values() if any("shard_index=15" in o for o, _ in pts)]
    assert sharded and all(len(p) >= 16 for p in sharded)  # range() expanded


def test_every_published_row_with_a_configuration_is_reached(
    shown_points: dict[str, list[tuple[list[str], Any]]]
) -> None:
    rows = [r for r in load_published() if r.match]
    reached: dict[str, list[str]] = {}
    for where, pts in shown_points.items():
        for overrides, cfg in pts:
            if isinstance(cfg, str):
                continue
            for row in rows:
                if match_note(cfg, row) is not None:
                    reached.setdefault(row.id, []).append(f"{where}: {' '.join(overrides)}")
                    assert row.id in "\n".join(comparison_lines(cfg))  # the dry run lists it
    missing = [r.id for r in rows if r.id not in reached]
    assert not missing, f"published rows no shown command reaches: {missing}"


def test_the_table_2_experiments_run_on_locomo_and_match_their_rows() -> None:
    ids = {r.id: r for r in load_published()}
    want = {"flat": "structmem-table2-flat", "graph_memory": "structmem-table2-graph",
            "structmem_no_cross_event": "structmem-table2-no-cross-event"}
    for experiment in ("paradigms", "baselines"):
        for point in sweep_points(experiment):
            cfg = _compose([f"experiment={experiment}", *point, "llm=vllm_qwen2_5_7b"])
            assert cfg.benchmark.name == "locomo", (experiment, point)
            method = point[0].split("=", 1)[1]
            if method in want:
                assert match_note(cfg, ids[want[method]]) is not None, (experiment, method)


def test_seem_no_eef_reaches_its_row_and_the_second_reading_does_not() -> None:
    from structmem_gpu.methods.seem.settings import Ablation

    row = next(r for r in load_published() if r.id == "seem-table3-no-eef")
    base = ["experiment=seem_ablations"]
    no_eef = _compose([*base, "method=seem_no_eef"])
    assert match_note(no_eef, row) is not None
    assert match_note(_compose([*base, "method=seem_no_eef_rpe"]), row) is None
    # the switches the row names are what the run does: no frames in the context, no RPE
    assert not Ablation.from_cfg(no_eef).expands


def test_the_official_locomo_file_under_benchmark_sample_is_one_line(tmp_path: Path) -> None:
    from structmem_gpu.data.locomo import LOCOMO_SHA256
    from structmem_gpu.core.hashing import file_sha256

    path = os.environ.get("STRUCTMEM_LOCOMO_PATH")
    if not path or not Path(path).is_file() or file_sha256(path) != LOCOMO_SHA256:
        pytest.skip("STRUCTMEM_LOCOMO_PATH: the official LoCoMo file is needed")
    cfg = _compose(["benchmark=sample", f"benchmark.path={path}", *PROFILE])
    with pytest.raises(ConfigError, match=r"official LoCoMo file .* pass benchmark=locomo") as err:
        run_stages(cfg, tmp_path / "run", stage_registry(cfg))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "tables").exists()  # nothing written
