"""GPU memory plan (structmem_gpu/node/gpu_plan.py) with fake device sizes (gpu.memory_gb): what
each stage keeps resident under the release schedule, and the exact one-line refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.node import gpu_plan
from structmem_gpu.node.gpu_plan import job_stages, plan
from structmem_gpu.stage import Stage
from tests.fixtures.pipeline import compose_cfg


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No model of the presets in the HF cache: sizes come from the presets' weights_gb."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))


def job_plan(*overrides: str) -> gpu_plan.GpuPlan:
    job = JobConfig.from_cfg(compose_cfg(list(overrides)))
    return plan(job, job_stages(job))


def residents(p: gpu_plan.GpuPlan, stage: str) -> list[str]:
    return sorted(r.key for s in p.stages if s.stage == stage for r in s.residents)


@pytest.mark.parametrize("memory", [141, 80])
def test_7b_answer_then_32b_judge_fit_one_gpu(memory: int) -> None:
    """The answer server is released after the answer stage, so the 32B judge gets the GPU."""
    p = job_plan("llm=vllm_qwen2_5_7b", "judge=qwen2_5_32b", f"gpu.memory_gb={memory}")
    assert p.refusal is None
    assert residents(p, "answer") == ["llm"]
    assert residents(p, "judge") == ["judge-qwen2_5_32b"]
    assert residents(p, "consolidate") == ["encoder", "llm"]
    text = p.format()
    assert f"device {memory:.1f} GB per GPU (gpu.memory_gb)" in text
    assert "weights 65.5 GB by preset weights_gb" in text


def test_32b_judge_refused_on_24_gb() -> None:
    p = job_plan("llm=vllm_qwen2_5_7b", "judge=qwen2_5_32b", "gpu.memory_gb=24")
    assert p.refusal == (
        "gpu plan: stage judge: judge-qwen2_5_32b (vLLM server Qwen/Qwen2.5-32B-Instruct) "
        "weights 65.5 GB + 2.0 GB headroom do not fit its share 0.90 x 24.0 GB = 21.6 GB of the "
        "24.0 GB GPU (gpu.memory_gb); no share of one GPU holds it: set "
        "judge.llm.tensor_parallel_size=4 (4 GPUs) or use a smaller model"
    )


def test_co_resident_panel_adds_up_and_names_each_members_knob() -> None:
    """panel_example keeps the answer model as a member: both servers share the judge stage."""
    p141 = job_plan("llm=vllm_qwen2_5_7b", "judge=panel_example", "gpu.memory_gb=141")
    assert residents(p141, "judge") == ["judge-qwen2_5_32b", "llm"]
    assert p141.refusal == (
        "gpu plan: stage judge does not fit GPU 0: judge-qwen2_5_32b 126.9 GB + llm 126.9 GB + "
        "2.0 GB headroom = 255.8 GB > the 141.0 GB GPU (gpu.memory_gb); set "
        "judge.qwen_llm.gpu_memory_utilization=0.78 llm.gpu_memory_utilization=0.20"
    )
    fixed = job_plan("llm=vllm_qwen2_5_7b", "judge=panel_example", "gpu.memory_gb=141",
                     "judge.qwen_llm.gpu_memory_utilization=0.78", "llm.gpu_memory_utilization=0.20")
    assert fixed.refusal is None
    p80 = job_plan("llm=vllm_qwen2_5_7b", "judge=panel_example", "gpu.memory_gb=80")
    assert p80.refusal == (
        "gpu plan: stage judge does not fit GPU 0: judge-qwen2_5_32b 72.0 GB + llm 72.0 GB + "
        "2.0 GB headroom = 146.0 GB > the 80.0 GB GPU (gpu.memory_gb); the servers "
        "(judge.qwen_llm, llm) do not fit one GPU together: more GPUs (tensor_parallel_size) or "
        "smaller models"
    )


def test_seem_qwen3_8b_beside_nv_embed_v2_on_141_gb() -> None:
    """SEEM's fusion stage holds the server and NV-Embed-v2 (15.7 GB) together: 0.9 leaves 14.1."""
    p = job_plan("experiment=seem_locomo", "llm=vllm_qwen3_8b", "gpu.memory_gb=141")
    assert residents(p, "fusion") == ["encoder", "llm"]
    assert p.refusal == (
        "gpu plan: stage fusion does not fit GPU 0: encoder 15.7 GB + llm 126.9 GB + 2.0 GB "
        "headroom = 144.6 GB > the 141.0 GB GPU (gpu.memory_gb); set "
        "llm.gpu_memory_utilization=0.87 or embedder.device=cpu"
    )
    assert job_plan("experiment=seem_locomo", "llm=vllm_qwen3_8b", "gpu.memory_gb=141",
                    "llm.gpu_memory_utilization=0.87").refusal is None
    on_cpu = job_plan("experiment=seem_locomo", "llm=vllm_qwen3_8b", "gpu.memory_gb=141",
                      "embedder.device=cpu")
    assert on_cpu.refusal is None and residents(on_cpu, "fusion") == ["llm"]


def test_a_backend_carried_across_a_stage_is_released_when_it_does_not_fit() -> None:
    """The encoder is used before and after a judge stage; beside the 32B judge's share it
    does not fit 80 GB, so the plan releases it first (the pipeline reopens it later)."""
    cfg = JobConfig.from_cfg(compose_cfg(["judge=qwen2_5_32b", "embedder=nv_embed_v2", "gpu.memory_gb=80"]))
    noop = lambda ctx: {}  # noqa: E731
    stages = [Stage("a", noop, uses=("encoder",)), Stage("b", noop, uses=("judges",)),
              Stage("c", noop, uses=("encoder",))]
    p = plan(cfg, stages)
    assert p.refusal is None
    assert p.evict_before("b") == {"encoder"} and residents(p, "b") == ["judge-qwen2_5_32b"]
    assert residents(p, "c") == ["encoder"]  # the judge server left after b
    roomy = plan(JobConfig.from_cfg(compose_cfg(["judge=qwen2_5_32b", "embedder=nv_embed_v2", "gpu.memory_gb=141",
                                                 "judge.llm.gpu_memory_utilization=0.8"])), stages)
    assert roomy.evict_before("b") == set()
    assert residents(roomy, "b") == ["encoder", "judge-qwen2_5_32b"]


def test_judge_on_the_answer_model_keeps_one_server() -> None:
    p = job_plan("llm=vllm_qwen2_5_7b", "judge=same_as_llm", "gpu.memory_gb=24")
    assert p.refusal is None and residents(p, "judge") == ["llm"]


def test_attached_server_is_not_planned() -> None:
    p = job_plan("llm=vllm_qwen2_5_7b", "llm.base_url=http://10.0.0.5:8000/v1", "gpu.memory_gb=24",
                 "embedder.device=cpu")
    assert p.refusal is None and residents(p, "answer") == []
    assert any("attached server http://10.0.0.5:8000/v1" in n for n in p.notes)


@pytest.mark.skipif(bool(os.environ.get("CUDA_VISIBLE_DEVICES")), reason="a GPU may be visible")
def test_unknown_device_plans_without_refusing() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: its size is known")
    p = job_plan("llm=vllm_qwen2_5_7b", "judge=qwen2_5_32b")
    assert p.device_gb is None and p.refusal is None
    assert "device unknown" in p.format()
    assert residents(p, "judge") == ["judge-qwen2_5_32b"]  # the encoder (auto) is not placed


def test_device_query_asks_torch_only_where_a_gpu_driver_is(tmp_path: Path, monkeypatch) -> None:
    job = JobConfig.from_cfg(compose_cfg([]))
    torch_asked: list[bool] = []

    class FakeCuda:
        @staticmethod
        def is_available() -> bool:
            torch_asked.append(True)
            return False

    import torch

    monkeypatch.setattr(torch, "cuda", FakeCuda)
    monkeypatch.setattr(gpu_plan, "GPU_DEVICE_FILES", (str(tmp_path / "nvidiactl"),))
    assert gpu_plan.device_memory(job) == (None, "no CUDA device") and not torch_asked
    (tmp_path / "nvidiactl").touch()  # a driver's device file: torch decides
    assert gpu_plan.device_memory(job) == (None, "no CUDA device") and torch_asked


def test_weights_from_the_models_own_files(tmp_path: Path) -> None:
    """A local folder's safetensors index (total_size, stored dtype from config.json) wins over
    the preset; the encoder is rescaled to fp16; without an index the files' sizes count."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 40_000_000_000}, "weight_map": {}}))
    assert gpu_plan.weights(str(model), 1.0).gb == pytest.approx(40.0)
    enc = gpu_plan.weights(str(model), runtime_bytes=2)
    assert enc.gb == pytest.approx(20.0) and enc.source == "local files"
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        with open(shards / f"model-0000{i}.safetensors", "wb") as f:
            f.truncate(3_000_000_000)  # sparse: sizes without the bytes
    assert gpu_plan.weights(str(shards)).gb == pytest.approx(6.0)
    assert gpu_plan.weights("org/absent", 7.5).source == "preset weights_gb"
    assert gpu_plan.weights("org/absent").gb is None


@pytest.mark.e2e  # e2e: job subprocesses
def test_dry_run_prints_the_plan_and_exits_2_on_refusal(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    base = [sys.executable, str(root / "jobs" / "run.py"), "dry_run=true", "llm=vllm_qwen2_5_7b",
            "judge=qwen2_5_32b", f"paths.output_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'r'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    bad = subprocess.run([*base, "gpu.memory_gb=24"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert bad.returncode == 2, bad.stderr[-2000:]
    assert "GPU memory plan: device 24.0 GB" in bad.stdout
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "stage judge" in errors[0] and "65.5 GB" in errors[0]
    assert "24.0 GB GPU" in errors[0] and "Traceback" not in bad.stderr
    ok = subprocess.run([*base, "gpu.memory_gb=141"], capture_output=True, text=True, env=env,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "judge-qwen2_5_32b (vLLM server Qwen/Qwen2.5-32B-Instruct) 126.9 GB" in ok.stdout
    assert not (tmp_path / "r" / "manifest.json").exists()


def test_faiss_scratch_only_from_a_stage_that_searches_faiss() -> None:
    """Stage.loads names the FAISS index: StructMem's retrieve holds the scratch from its
    stage on; SEEM's retrieve (PPR, no FAISS) holds none, though it is named "retrieve"."""
    structmem = job_plan("gpu.memory_gb=80", "index.use_gpu=true")
    assert "faiss" in residents(structmem, "retrieve") and "faiss" not in residents(structmem, "embed")
    seem = job_plan("method=seem", "gpu.memory_gb=80", "index.use_gpu=true")
    assert not any("faiss" in residents(seem, s.stage) for s in seem.stages)
