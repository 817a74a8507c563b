"""Build-seed replicates (llm.seed reaches every request; the sweep summary and `compare` give
mean ± sd across builds and name the seeds) and tracking=mlflow (a sweep is one parent MLflow
run with a child per point, read back with mlflow's own client). One scripted 3-point sweep
serves both: `-m llm.seed=0,1,2 tracking=mlflow`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.analysis.seeds import seed_groups, seeds_needed
from structmem_gpu.analysis.tracking import store_uri
from structmem_gpu.config.schema import TrackingSettings
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.seeded import SeededBackend
from structmem_gpu.llm.types import LLMRequest, Message, Sampling

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["debug=scripted", "benchmark.max_sessions=3"]
SCHEMA = {"type": "object", "required": ["facts"], "properties": {"facts": {
    "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "string"}}}}


def _req(temperature: float) -> LLMRequest:
    return LLMRequest(request_id="r1", stage="extract", prompt_version="t/1",
                      messages=(Message("user", "Caroline went to a support group on Monday "
                                        "and painted a sunrise over the lake afterwards"),),
                      sampling=Sampling(temperature=temperature, top_p=0.1), schema=SCHEMA)


def test_llm_seed_reaches_every_request_and_its_cache_key(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "cache")
    try:
        seen: dict[int, str] = {}
        for seed in (0, 1, 2):
            inner = CachedBackend(ScriptedLLM(), cache)
            llm = inner if seed == 0 else SeededBackend(inner, seed)  # as open_llm wraps it
            [res] = llm.generate([_req(0.1)])
            assert not res.cache_hit  # one seed's cached reply never answers another's
            seen[seed] = res.text
        # A sampled request under another seed is another sample; seed 0 keeps the old reply.
        assert len(set(seen.values())) == 3
        [again] = SeededBackend(CachedBackend(ScriptedLLM(), cache), 2).generate([_req(0.1)])
        assert again.cache_hit and again.text == seen[2]
        # Greedy requests do not depend on the seed.
        greedy = {SeededBackend(ScriptedLLM(), s).generate([_req(0.0)])[0].text for s in (1, 2)}
        assert len(greedy) == 1
    finally:
        cache.close()


@pytest.mark.parametrize(("sd", "diff", "k"), [
    (0.5, 1.0, 2),    # 2 * (1.96 * 0.5 / 1)^2 = 1.92 -> at least 2
    (1.0, 0.5, 31),   # 2 * (3.92)^2 = 30.7
    (1.0, 1.0, 8),    # 2 * 1.96^2 = 7.68
    (0.2, 0.06, 86),  # 2 * (1.96 * 0.2 / 0.06)^2 = 85.4
])
def test_seeds_needed_hand_computed(sd: float, diff: float, k: int) -> None:
    assert seeds_needed(sd, diff) == k


def test_seed_groups_mean_sd_per_configuration() -> None:
    df = pl.DataFrame({
        "consolidate.seed_k": [0, 0, 0, 5], "llm.seed": [0, 1, 2, 0],
        "method": ["structmem"] * 4, "benchmark": ["sample"] * 4, "run_dir": list("abcd"),
        "answer_model": ["m"] * 4, "judge": ["j"] * 4, "n": [10] * 4,
        "acc_overall": [0.5, 0.6, 0.7, 0.4], "acc_overall_ci_low": [0.2, 0.3, 0.4, 0.1],
        "acc_overall_ci_high": [0.8, 0.9, 1.0, 0.7], "acc_temporal": [0.1, 0.2, 0.3, 0.0],
    })
    [g] = seed_groups(df)  # seed_k=5 has one seed: no spread to report
    assert g["seeds"] == [0, 1, 2] and g["k"] == 3
    assert g["acc_overall_mean"] == pytest.approx(0.6)
    assert g["acc_overall_sd"] == pytest.approx(0.1)  # sample sd of .5 .6 .7
    assert g["by_category"]["temporal"]["sd"] == pytest.approx(0.1)
    assert [b["ci95"] for b in g["builds"]] == [[0.2, 0.8], [0.3, 0.9], [0.4, 1.0]]
    assert g["seeds_needed"] == {"0.5": seeds_needed(10, 0.5), "1": 769, "2": 193}


def test_a_sqlite_store_on_a_network_filesystem_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import structmem_gpu.analysis.tracking as tracking

    assert store_uri(TrackingSettings(backend="mlflow"), tmp_path).startswith("file:")
    assert store_uri(TrackingSettings(backend="mlflow"), tmp_path) == \
        (tmp_path / "mlruns").resolve().as_uri()
    assert store_uri(TrackingSettings(backend="mlflow", uri="http://h:5000"), tmp_path) == \
        "http://h:5000"
    monkeypatch.setattr(tracking, "_mount_type", lambda path: "nfs4")
    with pytest.raises(ConfigError, match="SQLite file on a nfs4 filesystem"):
        store_uri(TrackingSettings(backend="mlflow", uri=f"sqlite:///{tmp_path}/m.db"), tmp_path)


# ---- one scripted 3-point sweep over llm.seed, tracked in MLflow --------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    tmp = tmp_path_factory.mktemp("seeds")
    sweep_dir, store = tmp / "sweep", tmp / "mlruns"
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), "-m", *SMALL, "llm.seed=0,1,2",
           "tracking=mlflow", f"tracking.uri={store}", "tracking.experiment=seeds-test",
           f"hydra.sweep.dir={sweep_dir}", f"paths.output_dir={tmp / 'out'}",
           f"paths.cache_dir={tmp / 'cache'}", "report.plots=false"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return sweep_dir, store, proc.stdout


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_a_three_seed_build_reports_mean_sd_and_names_the_seeds(
    sweep: tuple[Path, Path, str], tmp_path: Path
) -> None:
    sweep_dir, _, printed = sweep
    points = json.loads((sweep_dir / "sweep_summary.json").read_text())
    runs = [Path(p["run_dir"]) for p in points]
    assert len(runs) == 3 and all(p["status"] == "ok" for p in points)
    # The seed reaches the build: the three extractions differ.
    entries = [pl.read_parquet(r / "tables" / "entries.parquet")["text"].to_list() for r in runs]
    assert entries[0] != entries[1] and entries[1] != entries[2]
    accs = [json.loads((r / "report" / "report.json").read_text())["overall"]["judge_accuracy"]
            for r in runs]
    [group] = json.loads((sweep_dir / "seeds.json").read_text())
    assert group["seeds"] == [0, 1, 2]
    assert group["acc_overall_mean"] == pytest.approx(statistics.fmean(accs))
    assert group["acc_overall_sd"] == pytest.approx(statistics.stdev(accs))
    mean_sd = f"{100 * statistics.fmean(accs):.1f} ± {100 * statistics.stdev(accs):.1f}"
    assert "## Build-seed replicates" in printed and mean_sd in printed
    assert "| 0, 1, 2 |" in printed and "seed 2: " in printed
    # `compare` on the sweep dir gives the same section.
    from jobs.report import main as report_main

    assert report_main(["compare", str(tmp_path / "cmp"), str(sweep_dir)]) == 0
    text = (tmp_path / "cmp" / "comparison.md").read_text()
    assert mean_sd in text and "| 0, 1, 2 |" in text and "## Paired against the reference" in text


@pytest.mark.e2e  # e2e: a tracked sweep of whole scripted runs
def test_the_sweep_is_one_mlflow_parent_run_with_a_child_per_point(
    sweep: tuple[Path, Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3.x's file-store opt-in

    sweep_dir, store, printed = sweep
    assert "tracking: MLflow sweep run" in printed
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    exp = client.get_experiment_by_name("seeds-test")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert parent.data.params["sweep_dir"] == str(sweep_dir.resolve())
    assert parent.data.metrics["points_ok"] == 3
    by_seed = {c.data.params["llm.seed"]: c for c in children}
    assert sorted(by_seed) == ["0", "1", "2"]
    for c in children:
        run_dir = Path(c.data.tags["run_dir"])
        report = json.loads((run_dir / "report" / "report.json").read_text())
        assert c.info.status == "FINISHED"
        assert c.data.params["method.name"] == "structmem"
        assert c.data.params["benchmark.max_sessions"] == "3"
        assert c.data.metrics["overall/judge_accuracy"] == pytest.approx(
            report["overall"]["judge_accuracy"])
        lo, hi = report["overall"]["judge_accuracy_ci95"]
        assert c.data.metrics["overall/judge_accuracy_ci_low"] == pytest.approx(lo)
        assert c.data.metrics["overall/judge_accuracy_ci_high"] == pytest.approx(hi)
        assert c.data.metrics["cost/build_calls"] > 0
        assert "time/extract/wall_s" in c.data.metrics
        artifacts = {a.path for a in client.list_artifacts(c.info.run_id, "report")}
        assert "report/report.json" in artifacts and "report/report.md" in artifacts
        # The point's own page names its MLflow run (eval/html.link_tracking).
        assert f"MLflow run <code>{c.info.run_id}</code>" in (
            run_dir / "report" / "index.html").read_text()
    assert f"MLflow run <code>{parent.info.run_id}</code>" in (
        sweep_dir / "report" / "index.html").read_text()
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "sweep_summary.md", "paired.json", "seeds.json"}


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
def test_a_single_job_with_tracking_logs_one_run(
    sweep: tuple[Path, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    cache = sweep[0].parent / "cache"  # the sweep's seed-0 replies: no new LLM work
    store = tmp_path / "store"
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *SMALL, "tracking=mlflow",
           f"tracking.uri={store}", f"paths.output_dir={tmp_path / 'out'}",
           f"paths.cache_dir={cache}", "report.plots=false"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    exp = client.get_experiment_by_name("structmem-sample")  # the default experiment name
    [run] = client.search_runs([exp.experiment_id])
    assert "mlflow.parentRunId" not in run.data.tags and run.info.status == "FINISHED"
    report = json.loads((Path(run.data.tags["run_dir"]) / "report" / "report.json").read_text())
    assert run.data.params["llm.seed"] == "0" and run.data.params["tracking.backend"] == "mlflow"
    assert run.data.metrics["overall/judge_accuracy"] == pytest.approx(
        report["overall"]["judge_accuracy"])


@pytest.mark.e2e  # e2e: reads the tracked sweep's subprocess runs
def test_report_track_logs_a_finished_sweep_after_the_fact(
    sweep: tuple[Path, Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from jobs.report import main as report_main

    store = tmp_path / "later"
    assert report_main(["track", str(sweep[0]), "--uri", str(store)]) == 0
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name("structmem-sample").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 4 and sorted(r.data.params["llm.seed"] for r in children) == ["0", "1", "2"]


def test_tracking_config_errors_are_one_line_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    import structmem_gpu.analysis.tracking as tracking

    with pytest.raises(ConfigError, match=r"tracking.backend='wandb'"):
        TrackingSettings.from_cfg({"tracking": {"backend": "wandb"}})
    assert tracking.check({"tracking": {"backend": "none"}}) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[tracking\]'"):
        tracking.check({"tracking": {"backend": "mlflow"}, "paths": {"output_dir": "o"}})
