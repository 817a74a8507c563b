"""Which models a job's config names, and whether each is on this machine.

    refs = named_models(job, stages)        # answer LLM, judges, encoder, window tokenizer
    for ref in refs:
        print(ref.key, ref.name, locate(ref).status)   # local | cached | missing | ...

Read by the preflight (structmem_gpu/node/preflight.py) and by `python jobs/data.py models`, so
the job checks exactly what the download fetched. A stage's `uses` (roles "llm", "judges",
"encoder"; absent = all of them) decides which models a job names. Attached servers
(`llm.base_url`), external endpoints and the scripted LLM name no model of ours; with
`debug=scripted` every judge is the scripted LLM too (stage.Backends).

Presence is decided from files only: a local folder or file, or a complete snapshot in the
Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub); nothing
here touches the network (`hub_probe` in preflight.py does, once, with a short timeout).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import LLMSettings

# The HF cache lookups live a layer below (the LLM factory keys its cache with the snapshot).
from structmem_gpu.core.hf_cache import hub_cache_dir, is_path as _is_path, resolved_snapshot

ROLES = ("llm", "judges", "encoder")
# Files a tokenizer-only download fetches (`extract.window_tokenizer`): no weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                   "spiece.model", "sentencepiece.bpe.model", "config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# A job's overrides that `jobs/data.py models` leaves out: Hydra's own node (it does not
# compose outside a job) and switches that name no model.
NOT_FOR_MODELS = ("hydra.", "dry_run=", "force=")


@dataclass(frozen=True)
class NamedLLM:
    """One llm config a job would open: `key` is its config path (llm, judge.llm, ...)."""

    role: str  # "answer LLM", "judge qwen2_5_32b"
    key: str
    cfg: LLMSettings

    @property
    def launched(self) -> bool:
        """True when the job starts this model itself (not attached, external or scripted):
        its backend says so (llm/backends/, Backend.launched)."""
        from structmem_gpu.llm.backends import backend

        return backend(self.cfg.backend).launched(self.cfg)


@dataclass(frozen=True)
class ModelRef:
    """A model the job loads: a hub id or a local path, and what of it is needed."""

    role: str  # "answer LLM", "judge qwen2_5_32b", "encoder", "window tokenizer"
    key: str  # the config key naming it, e.g. judge.panel[1].llm.model
    name: str  # hub id, local folder or file
    revision: str | None = None
    tokenizer_only: bool = False  # only tokenizer files are needed (window packing)
    gguf: bool = False  # a llama.cpp GGUF file: must be a local file
    convert_from_gguf: str | None = None  # vllm_cpu: the folder is made from a GGUF on first use
    weights_gb: float | None = None  # size the preset states (llm/embedder `weights_gb`)


@dataclass(frozen=True)
class Location:
    """Where a model is: status local (folder/file) | cached (HF cache) | missing (hub id not
    in the cache) | missing_path (a path that does not exist: nothing to download)."""

    status: str
    path: Path | None = None
    detail: str = ""

    @property
    def present(self) -> bool:
        return self.status in ("local", "cached")


def job_roles(stages: Iterable[Any]) -> set[str]:
    """Roles the job's stages use (`Stage.uses`; a stage without it may use every role)."""
    out: set[str] = set()
    for stage in stages:
        uses = getattr(stage, "uses", None)
        out |= set(ROLES) if uses is None else set(uses)
    return out


def named_llms(job: JobConfig, stages: Sequence[Any]) -> list[NamedLLM]:
    """The llm configs the job opens, as Backends would: the answer model, then each judge
    (a panel member or judge with `llm: null` is the answer model; debug=scripted: every judge
    is the scripted answer model). Each NamedLLM.cfg is its typed llm settings, as the factory
    opens them."""
    roles = job_roles(stages)
    answer = NamedLLM("answer LLM", "llm", job.root.llm)
    out: list[NamedLLM] = []
    needs_answer = "llm" in roles
    if "judges" in roles and job.has("judge"):
        judge = job.settings(JudgeSettings)
        scripted = job.root.debug_profile == "scripted"
        for i, (name, llm) in enumerate(judge.members()):
            if llm is None or scripted:
                needs_answer = True
                continue
            key = f"judge.panel[{i}].llm" if judge.panel else "judge.llm"
            out.append(NamedLLM(f"judge {name}", key, llm))
    return ([answer] if needs_answer else []) + out


def _llm_model(llm: NamedLLM) -> ModelRef | None:
    """The weights a launched backend loads, as it states them (Backend.weights)."""
    from structmem_gpu.llm.backends import backend

    if not llm.launched:
        return None
    w = backend(llm.cfg.backend).weights(llm.cfg)
    if w is None:
        return None  # the factory refuses it with its own line (llm.model must name ...)
    return ModelRef(llm.role, f"{llm.key}.model", w.name, revision=w.revision, gguf=w.gguf,
                    convert_from_gguf=w.convert_from_gguf, weights_gb=llm.cfg.weights_gb)


def _encoder_model(job: JobConfig) -> ModelRef:
    emb = job.root.embedder
    name = emb.model
    if name is None:  # the packaged MiniLM (embed/encoder.py resolves it the same way)
        from structmem_gpu.embed.encoder import resolve_model

        name = resolve_model(None)[0]
    return ModelRef("encoder", "embedder.model", str(name), weights_gb=emb.weights_gb)


def _loading(stages: Sequence[Any], what: str) -> bool:
    """Whether a stage of the job declares that it loads `what` (Stage.loads)."""
    return any(what in getattr(s, "loads", ()) for s in stages)


def window_tokenizer(job: JobConfig, stages: Sequence[Any]) -> ModelRef | None:
    """`extract.window_tokenizer` when a stage of the job packs windows by it (Stage.loads:
    extract, audit_extraction) and it names a tokenizer (a value other than `chars`); None
    when the job has no extract node or the knob is null."""
    if not _loading(stages, "window_tokenizer") or not job.has("extract"):
        return None
    from structmem_gpu.methods.structmem.extract import ExtractSettings

    value = job.settings(ExtractSettings).window_tokenizer
    if value is None or value == "chars":
        return None
    llm = job.root.llm
    same_as_llm = value == str(llm.model)
    return ModelRef("window tokenizer", "extract.window_tokenizer", value,
                    revision=llm.revision if same_as_llm else None, tokenizer_only=True)


def compression_model(job: JobConfig, stages: Sequence[Any]) -> ModelRef | None:
    """`compress.model` (LLMLingua-2) when a stage of the job loads it (Stage.loads: compress,
    and segment, which shares it)."""
    if not _loading(stages, "compression_model") or not job.has("compress"):
        return None
    from structmem_gpu.methods.structmem.compress import CompressSettings

    return ModelRef("compression model", "compress.model", job.settings(CompressSettings).model)


def named_models(job: JobConfig, stages: Sequence[Any]) -> list[ModelRef]:
    """Every model the job loads, each once (the same model in two roles keeps its first)."""
    refs = [ref for llm in named_llms(job, stages) if (ref := _llm_model(llm)) is not None]
    if "encoder" in job_roles(stages):
        refs.append(_encoder_model(job))
    tok = window_tokenizer(job, stages)
    if tok is not None:
        refs.append(tok)
    comp = compression_model(job, stages)
    if comp is not None:
        refs.append(comp)
    seen: dict[tuple[str, str | None], ModelRef] = {}
    for ref in refs:
        key = (ref.name, ref.revision)
        if key in seen and ref.tokenizer_only:
            continue  # the weights' download has the tokenizer files too
        if key in seen and seen[key].tokenizer_only:
            del seen[key]  # the full download replaces the tokenizer-only one
        seen.setdefault(key, ref)
    return list(seen.values())


# ---- the local Hugging Face cache ---------------------------------------------------------


def hub_offline() -> bool:
    """HF_HUB_OFFLINE set to a true value: nothing may reach the hub."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def weights_record(refs: Sequence[ModelRef]) -> list[dict[str, Any]]:
    """The manifest's `weights`: per model role the repository (hub id or path), the revision
    asked for and the snapshot resolved in the local cache (None: a local folder or file, or
    not cached on this host)."""
    return [{"role": r.role, "key": r.key, "repository": r.name, "revision": r.revision,
             "snapshot": resolved_snapshot(r.name, r.revision)} for r in refs]


def cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of `repo` at `revision` (None = main), if any."""
    from huggingface_hub import try_to_load_from_cache

    for marker in ("config.json", "modules.json", "tokenizer_config.json", "tokenizer.json",
                   "model.safetensors.index.json"):
        hit = try_to_load_from_cache(repo, marker, cache_dir=hub_cache_dir(), revision=revision)
        if isinstance(hit, str):
            return Path(hit).parent
    return None


def _weights_complete(folder: Path) -> str:
    """'' when `folder` holds complete weights, else what is missing."""
    for index in folder.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError) as exc:
            return f"unreadable {index.name} ({exc})"
        absent = sorted(s for s in shards if not (folder / s).is_file())
        if absent:
            return f"{len(absent)} of {len(shards)} weight shards missing (e.g. {absent[0]})"
        return ""
    if any(p.suffix in _WEIGHT_SUFFIXES and p.is_file() for p in folder.rglob("*")):
        return ""
    return "no weight files"


def _tokenizer_complete(folder: Path) -> str:
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
    return "" if any((folder / n).is_file() for n in names) else "no tokenizer files"


def locate(ref: ModelRef) -> Location:
    """Where `ref` is on this machine, from files only."""
    path = Path(ref.name).expanduser()
    if ref.gguf:
        ok = path.is_file()
        return Location("local" if ok else "missing_path", path, "" if ok else "no such file")
    if path.is_dir():
        missing = _tokenizer_complete(path) if ref.tokenizer_only else _weights_complete(path)
        return Location("missing_path", path, missing) if missing else Location("local", path)
    if _is_path(ref.name):
        return Location("missing_path", path, "no such folder")
    snap = cached_snapshot(ref.name, ref.revision)
    if snap is None:
        return Location("missing", None, f"not in the Hugging Face cache {hub_cache_dir()}")
    missing = _tokenizer_complete(snap) if ref.tokenizer_only else _weights_complete(snap)
    if missing:
        return Location("missing", snap, f"incomplete in the Hugging Face cache ({missing})")
    return Location("cached", snap)
