"""GPU memory plan: per stage, what the job keeps resident on each GPU, checked before any
server starts (docs/performance.md "GPU memory plan").

    p = plan(job, stages)          # stages: the job's Stage objects, in order
    print(p.format())              # one block per stage: residents per GPU against the device
    p.refusal                      # None, or one line: stage, sum, device size, the fixing knob

Residents follow the pipeline's release schedule (a backend stays open only while a
remaining stage uses it, Stage.uses): a launched backend that says it sits on a GPU
(llm/backends/ Backend.gpu_kind: `vllm_server` without `base_url`, `vllm_offline`) reserves
`gpu_memory_utilization` x device memory on each of its tensor x data parallel GPUs, and its
weights (per tensor-parallel rank) plus `gpu.headroom_gb` must fit inside that share; the encoder (embedder.device auto/cuda) holds its
weights in its dtype (fp16 on CUDA when embedder.fp16, else float32); FAISS-GPU (index.use_gpu)
holds its scratch memory from the first retrieve stage to the end of the process. Per GPU,
shares + encoder + FAISS + headroom must fit the device. Where a backend opened earlier and
needed later does not fit beside a stage's own backends, the plan releases it before that stage
(`evict_before`) and the pipeline opens it again when a later stage asks for it.

Device memory: `gpu.memory_gb` when set (plan for a GPU node from a login node), else the first
CUDA device torch sees; neither = the size is unknown and nothing is refused. Weight sizes come
from the model's own files when they are on disk (a local folder, or the HF cache: never a
download): `model.safetensors.index.json` metadata.total_size, else the *.safetensors (or
*.bin) sizes, with config.json's dtype; else from the preset's `weights_gb`.

`plan` is pure and cheap (file sizes, one torch device query), so the preflight and the
pipeline may both call it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.config.settings import open_values
from structmem_gpu.llm.backends import backend
from structmem_gpu.node.model_refs import cached_snapshot
from structmem_gpu.stage import Stage, backend_keys, judge_key, judge_members

log = logging.getLogger(__name__)

GB = 1e9
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1}
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
# FAISS StandardGpuResources' default temporary memory on a large GPU (1.5 GiB; faiss
# GpuResources.cpp): one shared instance per process (index/faiss_index.py).
FAISS_SCRATCH_GB = 1.5 * 2**30 / GB
MAX_UTILIZATION = 0.95  # what the plan proposes at most for one server (vLLM's own default is 0.9)


@dataclass(frozen=True)
class Weights:
    gb: float | None  # on the GPU, in the dtype it runs in; None = unknown
    source: str  # "files <path>" | "preset weights_gb" | why unknown


@dataclass(frozen=True)
class Resident:
    """One backend on the GPU(s): a server's share or the encoder's / FAISS' own memory."""

    key: str  # Backends key: llm | judge-<name> | encoder | faiss
    what: str  # e.g. "vLLM server Qwen/Qwen2.5-7B-Instruct"
    gpus: tuple[int, ...]
    weights: Weights  # per GPU (a tensor-parallel rank holds 1/tp of them)
    utilization: float | None = None  # servers: their gpu_memory_utilization
    knob: str = ""  # the config node that sizes it (llm, judge.llm, judge.qwen_llm, embedder)
    tp: int = 1  # servers: tensor_parallel_size (weights are per rank)

    def reserved_gb(self, device_gb: float | None) -> float | None:
        """What it holds on each of its GPUs: a server its share, others their weights."""
        if self.utilization is not None:
            return None if device_gb is None else self.utilization * device_gb
        return self.weights.gb


@dataclass(frozen=True)
class StagePlan:
    stage: str
    residents: tuple[Resident, ...]
    evict: tuple[str, ...] = ()  # backends released before the stage (their room is needed)


@dataclass
class GpuPlan:
    device_gb: float | None
    device_source: str  # gpu.memory_gb | "torch: <device name>" | why unknown
    headroom_gb: float
    stages: list[StagePlan] = field(default_factory=list)
    refusal: str | None = None
    notes: list[str] = field(default_factory=list)  # attached servers, CPU backends ...

    def evict_before(self, stage: str) -> set[str]:
        return {k for s in self.stages if s.stage == stage for k in s.evict}

    def format(self) -> str:
        dev = "unknown (no CUDA device seen; set gpu.memory_gb to plan for a GPU node)" \
            if self.device_gb is None else f"{self.device_gb:.1f} GB per GPU ({self.device_source})"
        lines = [f"GPU memory plan: device {dev}; headroom {self.headroom_gb:.1f} GB per GPU"]
        for sp in self.stages:
            head = f"  {sp.stage:<20}"
            if sp.evict:
                head += f"(releases {', '.join(sp.evict)} first) "
            if not sp.residents:
                lines.append(head + "nothing on a GPU")
                continue
            for gpu in sorted({g for r in sp.residents for g in r.gpus}):
                on = [r for r in sp.residents if gpu in r.gpus]
                parts = [_describe(r, self.device_gb) for r in on]
                total = _gpu_total(on, self.device_gb, self.headroom_gb)
                tail = "" if total is None or self.device_gb is None else \
                    f" + {self.headroom_gb:.1f} headroom = {total:.1f} of {self.device_gb:.1f} GB"
                lines.append(f"{head}GPU {gpu}: {' + '.join(parts)}{tail}")
                head = " " * len(head)
        lines += [f"  note: {n}" for n in self.notes]
        if self.refusal:
            lines.append(f"  REFUSED: {self.refusal}")
        return "\n".join(lines)


def _describe(r: Resident, device_gb: float | None) -> str:
    w = "?" if r.weights.gb is None else f"{r.weights.gb:.1f}"
    if r.utilization is not None:
        share = "?" if device_gb is None else f"{r.utilization * device_gb:.1f}"
        return (f"{r.key} ({r.what}) {share} GB = share {r.utilization:.2f} "
                f"[weights {w} GB by {r.weights.source}, rest KV cache]")
    return f"{r.key} ({r.what}) {w} GB [{r.weights.source}]"


def _gpu_total(on: Sequence[Resident], device_gb: float | None, headroom_gb: float) -> float | None:
    sizes = [r.reserved_gb(device_gb) for r in on]
    return None if any(s is None for s in sizes) else sum(sizes) + headroom_gb  # type: ignore[misc]


# ---- sizes ---------------------------------------------------------------------------------


# Device files a CUDA (or ROCm) driver creates: NVIDIA's, WSL 2's GPU bridge, AMD's KFD.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


def device_memory(job: JobConfig) -> tuple[float | None, str]:
    """(GB per GPU, where it came from): gpu.memory_gb, else torch's first CUDA device."""
    gpu = job.root.gpu
    stated = gpu.memory_gb if gpu is not None else None
    if stated is not None:
        return float(stated), "gpu.memory_gb"
    if not any(Path(p).exists() for p in GPU_DEVICE_FILES):
        # No GPU driver on this machine: the same answer as torch's, without its ~3 s import
        # in a job (load-only, dry runs) that otherwise never imports torch.
        return None, "no CUDA device"
    try:
        import torch  # the encoder imports it anyway; only its device query is used here
    except ImportError:
        return None, "torch not installed"
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    props = torch.cuda.get_device_properties(0)
    return props.total_memory / GB, f"torch: {props.name}"


def _local_folder(model: str, revision: str | None) -> Path | None:
    """The model's folder on disk: the path itself, or its HF-cache snapshot (no download)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.is_absolute() or model.count("/") != 1:
        return None
    try:
        return cached_snapshot(model, revision)  # the preflight's lookup (honours HF_HOME now)
    except ImportError:
        return None


def _stored_bytes_per_param(folder: Path) -> int | None:
    try:
        conf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = conf.get("torch_dtype") or conf.get("dtype")
    return _DTYPE_BYTES.get(str(dtype)) if dtype else None


def _files_size(folder: Path) -> int | None:
    """Bytes of the weights as stored: the safetensors index's total, else the weight files."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            total = json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"]
            return int(total)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    for suffix in _WEIGHT_SUFFIXES:
        files = [p for p in folder.glob(f"*{suffix}") if p.is_file()]
        if files:
            return sum(p.stat().st_size for p in files)
    return None


def weights(model: str | None, weights_gb: float | None = None, *, revision: str | None = None,
            runtime_bytes: int | None = None) -> Weights:
    """A model's weight size: its own files when local, else the preset's weights_gb (stated
    at 16 bits a parameter). `runtime_bytes` (encoder: 2 in fp16, 4 in float32) rescales the
    stored size to the dtype it runs in; None = as stored (vLLM loads the checkpoint's dtype)."""
    folder = _local_folder(str(model), revision) if model else None
    if folder is not None:
        size = _files_size(folder)
        if size:
            stored = _stored_bytes_per_param(folder)
            scale = runtime_bytes / stored if runtime_bytes and stored else 1.0
            return Weights(size * scale / GB, "local files")
    stated = weights_gb
    if stated is not None:
        return Weights(float(stated) * (runtime_bytes or 2) / 2, "preset weights_gb")
    return Weights(None, "no local files and no weights_gb")


# ---- what each backend key puts on the GPUs -----------------------------------------------


def judge_llms(job: JobConfig) -> list[tuple[str, LLMSettings | None, str]]:
    """(judge name, its llm settings or None = the answer model, the node path whose knobs
    size it) for every configured judge: stage.judge_members (what Backends opens, in its
    order) with the node path added."""
    members = judge_members(job)
    if not members or not job.settings(JudgeSettings).panel:
        return [(name, llm, "judge.llm") for name, llm in members]
    shared_nodes = open_values(job.settings(JudgeSettings))  # judge.*_llm
    out = []
    for i, (name, llm) in enumerate(members):
        # A member that interpolates a judge.*_llm node (judge.qwen_llm: ${judge.qwen_llm})
        # is sized by that node's knobs: the resolved config holds an equal copy of it.
        shared = [k for k, v in shared_nodes.items() if k.endswith("_llm") and llm is not None and v == llm]
        out.append((name, llm, f"judge.{shared[0]}" if shared else f"judge.panel.{i}.llm"))
    return out


def _llm_node(job: JobConfig, key: str) -> tuple[LLMSettings | None, str]:
    """(llm settings, the node path whose knobs size it) of a Backends key."""
    if key == "llm" or job.root.debug_profile == "scripted":  # scripted: every role is llm
        scripted = LLMSettings(backend="scripted")
        return (job.root.llm if key == "llm" else scripted), "llm"
    for name, llm_cfg, knob in judge_llms(job):
        if judge_key(name, llm_cfg) == key:
            return llm_cfg, knob
    return None, key


def resident(job: JobConfig, key: str, device_gb: float | None) -> Resident | str | None:
    """The key's GPU resident; a note (str) when it is ours but not on our GPU; None = nothing."""
    if key == "encoder":
        emb = job.root.embedder
        device = emb.device or "auto"
        on_gpu = device.startswith("cuda") or (device == "auto" and device_gb is not None)
        if not on_gpu:
            return None
        gpu = int(device.split(":")[1]) if ":" in device else 0
        nbytes = 2 if emb.fp16 else 4
        return Resident("encoder", emb.model or "packaged MiniLM", (gpu,),
                        weights(encoder_model(emb.model), emb.weights_gb, runtime_bytes=nbytes),
                        knob="embedder")
    node, knob = _llm_node(job, key)
    spec = None if node is None else backend(node.backend)
    if node is None or spec is None or spec.gpu_kind is None:  # its backend holds no GPU memory
        return None
    if node.base_url and spec.http:
        return f"{key}: attached server {node.base_url} (not ours: not planned, never stopped)"
    tp, dp = node.tensor_parallel_size, node.data_parallel_size
    w = weights(node.model, node.weights_gb, revision=node.revision)
    per_rank = Weights(None if w.gb is None else w.gb / tp, w.source)
    return Resident(key, f"{spec.gpu_kind} {node.model}", tuple(range(tp * dp)), per_rank,
                    node.gpu_memory_utilization, knob, tp)


def encoder_model(model: str | None) -> str | None:
    """The encoder's model: null = the packaged MiniLM, found as the encoder finds it (None
    when the package is absent: sized from weights_gb, if stated)."""
    if model is not None:
        return model
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.embed.encoder import resolve_model

    try:
        return resolve_model(None)[0]
    except ConfigError:
        return None


# LLMLingua-2 (compress.model, bert-base-multilingual-cased: 178M parameters, loaded in its
# stored float32) for the stages that load it (Stage.loads); weights_gb is stated at 16 bits a
# parameter.
COMPRESSION_WEIGHTS_GB = 0.36


def compression_resident(job: JobConfig, device_gb: float | None) -> Resident | None:
    """The compression model on GPU 0 while a compress/segment stage runs (compress.device
    cuda, or auto with a GPU); None otherwise."""
    if not job.has("compress"):
        return None
    from structmem_gpu.methods.structmem.compress import CompressSettings

    c = job.settings(CompressSettings)
    model, device = c.model, c.device
    if not (device == "cuda" or (device == "auto" and device_gb is not None)):
        return None
    w = weights(model, COMPRESSION_WEIGHTS_GB, runtime_bytes=4)
    return Resident("compression", f"LLMLingua-2 {model}", (0,), w, knob="compress")


def _faiss_on_gpu(job: JobConfig, device_gb: float | None) -> bool:
    use = job.root.index.use_gpu
    if use is True:
        return True
    if use != "auto" or device_gb is None:
        return False
    names = {d.metadata["Name"].lower() for d in metadata.distributions() if d.metadata["Name"]}
    return any(n.startswith("faiss-gpu") or n.startswith("faiss_gpu") for n in names)


# ---- the check -------------------------------------------------------------------------------


def _fit_problem(stage: str, on: Sequence[Resident], device_gb: float, headroom: float,
                 source: str) -> str | None:
    """One refusal line for residents `on` (one stage) when they do not fit, else None."""
    dev = f"the {device_gb:.1f} GB GPU ({source})"
    for r in on:  # each server's weights inside its own share
        if r.utilization is None or r.weights.gb is None:
            continue
        need = r.weights.gb + headroom
        if need <= r.utilization * device_gb:
            continue
        head = (f"gpu plan: stage {stage}: {r.key} ({r.what}) weights {r.weights.gb:.1f} GB + "
                f"{headroom:.1f} GB headroom do not fit its share {r.utilization:.2f} x "
                f"{device_gb:.1f} GB = {r.utilization * device_gb:.1f} GB of {dev}")
        if need <= MAX_UTILIZATION * device_gb:
            return head + f"; set {r.knob}.gpu_memory_utilization={_ceil2(need / device_gb)}"
        total, tp = r.weights.gb * r.tp, r.tp * 2
        while total / tp + headroom > r.utilization * device_gb and tp < 64:
            tp *= 2
        return (head + f"; no share of one GPU holds it: set {r.knob}.tensor_parallel_size={tp} "
                f"({tp} GPUs) or use a smaller model")
    for gpu in sorted({g for r in on for g in r.gpus}):
        here = [r for r in on if gpu in r.gpus]
        total = _gpu_total(here, device_gb, headroom)
        if total is None or total <= device_gb:
            continue
        parts = " + ".join(f"{r.key} {r.reserved_gb(device_gb):.1f} GB" for r in here)
        parts += f" + {headroom:.1f} GB headroom"
        head = (f"gpu plan: stage {stage} does not fit GPU {gpu}: {parts} = {total:.1f} GB > "
                f"{dev}")
        return head + "; " + _fix(here, device_gb, headroom)
    return None


def _fix(here: Sequence[Resident], device_gb: float, headroom: float) -> str:
    servers = [r for r in here if r.utilization is not None]
    fixed = sum(r.weights.gb or 0.0 for r in here if r.utilization is None)
    encoder = any(r.key == "encoder" for r in here)
    alt = " or embedder.device=cpu" if encoder else ""
    free = device_gb - fixed - headroom
    needs = [(r.weights.gb or 0.0) + headroom for r in servers]
    if servers and sum(needs) <= free:
        spare = free - sum(needs)
        utils = [math.floor((n + spare * n / sum(needs)) / device_gb * 100) / 100 for n in needs]
        if all(u * device_gb >= n for u, n in zip(utils, needs)):
            knobs = " ".join(f"{r.knob}.gpu_memory_utilization={u:.2f}"
                             for r, u in zip(servers, utils))
            return f"set {knobs}{alt}"
    if encoder:
        return "set embedder.device=cpu (the servers leave no room for the encoder)"
    names = ", ".join(r.knob for r in servers)
    return (f"the servers ({names}) do not fit one GPU together: more GPUs "
            "(tensor_parallel_size) or smaller models")


def _ceil2(x: float) -> str:
    return f"{math.ceil(x * 100) / 100:.2f}"


def plan(job: JobConfig, stages: Sequence[Stage]) -> GpuPlan:
    """The plan for the job's `stages` (in order), following the pipeline's release schedule."""
    device_gb, source = device_memory(job)
    gpu = job.root.gpu
    headroom = 2.0 if gpu is None else float(gpu.headroom_gb)  # GpuSettings' default: 2.0
    out = GpuPlan(device_gb, source, headroom)
    keys = [backend_keys(job, s.uses) for s in stages]
    cache: dict[str, Resident | str | None] = {}

    def res(key: str) -> Resident | None:
        if key not in cache:
            cache[key] = resident(job, key, device_gb)
            if isinstance(cache[key], str):
                out.notes.append(str(cache[key]))
        found = cache[key]
        return found if isinstance(found, Resident) else None

    faiss = _faiss_on_gpu(job, device_gb)
    # from the first stage that searches a FAISS index (Stage.loads; SEEM's retrieve does not)
    faiss_from = next((i for i, s in enumerate(stages) if "faiss" in s.loads), None)
    open_now: set[str] = set()
    for i, stage in enumerate(stages):
        need = keys[i]
        carried = open_now - need
        scratch = Resident("faiss", "FAISS-GPU scratch", (0,), Weights(FAISS_SCRATCH_GB, "faiss default"))
        extra = [scratch] if faiss and faiss_from is not None and i >= faiss_from else []
        if "compression_model" in stage.loads and (comp := compression_resident(job, device_gb)):
            extra.append(comp)  # loaded and dropped by the stage itself
        own = [r for k in sorted(need) if (r := res(k))] + extra
        kept = [r for k in sorted(carried) if (r := res(k))]
        evict: tuple[str, ...] = ()
        problem = None
        if device_gb is not None:
            problem = _fit_problem(stage.name, own, device_gb, headroom, source)
            together = _fit_problem(stage.name, own + kept, device_gb, headroom, source)
            if problem is None and kept and together:
                evict, kept = tuple(r.key for r in kept), []
        if problem and out.refusal is None:
            out.refusal = problem
        out.stages.append(StagePlan(stage.name, tuple(own + kept), evict))
        later = set().union(*keys[i + 1:]) if i + 1 < len(keys) else set()
        open_now = (need | carried) - set(evict)
        open_now &= later
    return out


def check(job: JobConfig, stages: Sequence[Stage]) -> str | None:
    """The refusal line of the job's plan, or None when it fits (or the device is unknown)."""
    return plan(job, stages).refusal


def job_stages(job: JobConfig) -> list[Stage]:
    """The job's Stage objects in order (stages=[...] or the method's list)."""
    from structmem_gpu.methods.registry import stage_registry

    registry = stage_registry(job)
    return [registry[n] for n in job.stage_names if n in registry]
