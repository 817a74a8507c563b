"""`python jobs/gpu_check.py` (`make gpu-check`): what a GPU node runs first, in minutes.

Parts, each printing one line, or one `skipped (why)` line when its package or device is
absent (a GPU machine without vLLM or faiss-gpu still runs the encoder and plan parts):
- encoder: CUDA embeddings/s of the configured encoder (fp16), after a warm-up batch;
- plan: the GPU memory plan's encoder weights beside torch.cuda.max_memory_allocated after
  loading and after encoding (the plan's headroom must cover the difference);
- faiss: FAISS-GPU flat-index build vectors/s and queries/s, with the top-1 agreement
  against the CPU index on the same vectors;
- vllm: a vLLM server with a small model (`--model`, default Qwen/Qwen2.5-0.5B-Instruct;
  from the HF cache or a folder) through the sample's load + extract stages (debug=ci), its
  requests and wall time, and nvidia-smi's peak memory beside the plan's share.
Exit code 1 when a part that ran failed, else 0.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SMALL_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass
class Outcome:
    part: str
    status: str  # ok | skipped | failed
    line: str

    def __str__(self) -> str:
        return f"{self.part:<8} {self.status:<8} {self.line}"


def compose(overrides: Sequence[str]) -> Any:
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def cuda_missing() -> str | None:
    """Why there is no usable CUDA device for torch here, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def check_encoder(overrides: Sequence[str], texts: int) -> tuple[Outcome, Outcome]:
    """The encoder part and the plan part (both from one CUDA encoder load)."""
    why = cuda_missing() or (None if importlib.util.find_spec("sentence_transformers")
                             else "sentence-transformers is not installed")
    if why:
        return (Outcome("encoder", "skipped", why),
                Outcome("plan", "skipped", f"needs the encoder on CUDA ({why})"))
    import torch

    from structmem_gpu.bench.components import synthetic_texts
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.embed.encoder import open_encoder
    from structmem_gpu.node.gpu_plan import weights

    emb = JobConfig.from_cfg(compose(overrides)).root.embedder.model_copy(update={"device": "cuda"})
    from structmem_gpu.node.gpu_plan import encoder_model

    predicted = weights(encoder_model(emb.model), emb.weights_gb, runtime_bytes=2 if emb.fp16 else 4)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    enc = open_encoder(emb, cache_dir=None)
    loaded = (torch.cuda.max_memory_allocated() - base) / 1e9
    batch = synthetic_texts(texts)
    enc.encode([f"warm-up {i}" for i in range(64)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    mat = enc.encode(batch)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 1e9
    enc_line = (f"{enc.model_id}: {len(batch) / wall:,.0f} embeddings/s on "
                f"{torch.cuda.get_device_name(0)} ({len(batch)} texts, dim {mat.shape[1]}, "
                f"batch {enc.batch_size}, {wall:.1f} s)")
    pred = "?" if predicted.gb is None else f"{predicted.gb:.2f}"
    plan_line = (f"encoder weights predicted {pred} GB ({predicted.source}); measured "
                 f"{loaded:.2f} GB after load, {peak:.2f} GB peak while encoding "
                 "(torch.cuda.max_memory_allocated)")
    ok = predicted.gb is None or loaded <= predicted.gb * 1.25 + 0.2
    return (Outcome("encoder", "ok", enc_line),
            Outcome("plan", "ok" if ok else "failed",
                    plan_line + ("" if ok else "; the plan under-predicts the weights")))


def faiss_missing() -> str | None:
    if importlib.util.find_spec("faiss") is None:
        return "faiss is not installed"
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        return "this faiss has no GPU support (faiss-cpu; the gpu extra installs faiss-gpu)"
    if faiss.get_num_gpus() < 1:
        return "faiss-gpu sees no GPU"
    return None


def check_faiss(vectors: int = 200_000, dim: int = 768, queries: int = 2_000, k: int = 10) -> Outcome:
    why = faiss_missing()
    if why:
        return Outcome("faiss", "skipped", why)
    from structmem_gpu.index.faiss_index import VectorIndex

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((vectors, dim)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    xq = xb[rng.choice(vectors, queries, replace=False)] + 0.01 * rng.standard_normal(
        (queries, dim)).astype(np.float32)
    ids = [str(i) for i in range(vectors)]
    t0 = time.perf_counter()
    gpu = VectorIndex(ids, xb, use_gpu=True)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    hits = gpu.search(xq, k)
    search = time.perf_counter() - t0
    cpu = VectorIndex(ids, xb, use_gpu=False).search(xq[:200], 1)
    agree = np.mean([h[0][0] == c[0][0] for h, c in zip(hits[:200], cpu)])
    line = (f"{vectors:,} x {dim} flat IP: build {vectors / build:,.0f} vectors/s, "
            f"{queries / search:,.0f} queries/s at k={k}; top-1 agrees with CPU on {agree:.0%}")
    return Outcome("faiss", "ok" if agree >= 0.99 else "failed", line)


def vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None and shutil.which("vllm") is None:
        return "vllm is not installed (make setup-gpu installs the gpu extra)"
    return cuda_missing()


class MemoryPoller:
    """Peak nvidia-smi memory.used of GPU 0 (MB) while a child process runs."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", "0"], capture_output=True, text=True, check=False)
            if out.returncode == 0 and out.stdout.strip():
                self.peak_mb = max(self.peak_mb, float(out.stdout.split()[0]))
            self._stop.wait(0.5)

    def __enter__(self) -> "MemoryPoller":
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def check_vllm(model: str, overrides: Sequence[str], timeout_s: float = 240) -> Outcome:
    why = vllm_missing()
    if why:
        return Outcome("vllm", "skipped", why)
    import json

    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.node.gpu_plan import device_memory

    util = 0.3  # a small model: leaves the GPU to anything else the node runs
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    args = [sys.executable, str(ROOT / "jobs" / "run.py"), "llm=vllm_server", f"llm.model={model}",
            "llm.served_name=gpu-check", f"llm.gpu_memory_utilization={util}", "llm.max_model_len=4096",
            "llm.startup_timeout_s=180", "debug=ci", "benchmark=sample", "stages=[load,extract]",
            f"hydra.run.dir={run_dir}", f"paths.cache_dir={run_dir / 'cache'}", *overrides]
    t0 = time.perf_counter()
    with MemoryPoller() as mem:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Outcome("vllm", "failed", f"extract on {model} exited {done.returncode}: {tail}")
    stage = json.loads((run_dir / "manifest.json").read_text())["stages"]["extract"]
    cost = stage["build_cost"]
    device_gb, _ = device_memory(JobConfig.from_cfg(compose(overrides)))
    share = "?" if device_gb is None else f"{util * device_gb:.1f}"
    line = (f"{model}: sample extract {cost['calls']} requests in {cost['wall_s']:.1f} s "
            f"(job {wall:.0f} s with server start); nvidia-smi peak {mem.peak_mb / 1000:.1f} GB, "
            f"plan share {util:.2f} x device = {share} GB")
    return Outcome("vllm", "ok", line)


def run_checks(*, model: str = SMALL_MODEL, texts: int = 20_000, overrides: Sequence[str] = (),
               out: Callable[[str], None] = print) -> int:
    """Run every part, printing one line each; 1 when a part that ran failed."""
    outcomes: list[Outcome] = []
    parts: list[Callable[[], Any]] = [
        lambda: check_encoder(overrides, texts), check_faiss, lambda: check_vllm(model, overrides)]
    for part in parts:
        try:
            got = part()
        except Exception as e:  # a part's failure is its line; the next part still runs
            name = ("encoder", "faiss", "vllm")[parts.index(part)]
            got = Outcome(name, "failed", f"{type(e).__name__}: {e}")
        for o in got if isinstance(got, tuple) else (got,):
            outcomes.append(o)
            out(str(o))
    failed = [o.part for o in outcomes if o.status == "failed"]
    ran = [o.part for o in outcomes if o.status == "ok"]
    out(f"gpu check: {len(ran)} ok, {len(failed)} failed, "
        f"{len(outcomes) - len(ran) - len(failed)} skipped")
    return 1 if failed else 0
