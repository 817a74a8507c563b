"""Typed, range-checked configuration, checked before any stage runs.

    python jobs/run.py consolidate.seed_k=abc
    error: config consolidate.seed_k='abc': expected an integer >= 0 (0 = off)   # exit 2

The schema is the typed settings (structmem_gpu/config/settings.py): the nodes every job has are
modelled here (`JobSettings`: root keys, benchmark, method, the llm config, embedder, index),
and each stage's own node by the settings class beside the stage (`Stage.settings`). A job is
checked against `JobSettings` and the settings of every stage its method has (stages run only
when listed, such as the audits, included). A node that none of them reads (the `audit`
block under method=seem, `seem:` keys a debug profile sets for a method that has no SEEM
stage) cannot change the job's results and is not checked; tests/unit/test_config_schema.py
fails when a key of any packaged config has no typed field in any model.

Why not Hydra structured configs: method configs are `@package _global_` and each method adds
its own top-level groups (`extract`, `seem`, `graph_memory` ...), experiments and debug
profiles override across them, and judges embed whole llm configs; Hydra would also report a
type error with a traceback-like block and exit code 1 instead of one line and exit 2.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.config.settings import (
    BOOL,
    COUNT,
    DICT,
    SIZE,
    STR,
    STR_OR_NULL,
    TOKENS,
    Enum,
    Float,
    Int,
    List,
    Settings,
    covered,
    error_line,
    knob,
    leaves,
    problems as model_problems,
    sub,
    to_plain,
    without_unhashed,
)



class HasSettings(Protocol):
    """What validation needs of a stage (structmem_gpu.stage.Stage, a layer above this one)."""

    settings: type[Settings] | None


@dataclass(frozen=True)
class LLMBudgets(Settings):
    """llm.budgets: a profile's reply and context budgets, read by the stage nodes through
    ${llm.budgets.*} interpolations (conf/method/structmem.yaml); absent = the node's default."""

    extract_max_tokens: int | None = knob(TOKENS, None)
    extract_max_items: int | None = knob(Int(ge=1, null=True), None)
    extract_max_item_chars: int | None = knob(SIZE, None)
    synthesis_max_tokens: int | None = knob(TOKENS, None)
    answer_max_tokens: int | None = knob(TOKENS, None)
    reader_entries_k: int | None = knob(Int(ge=0), None)
    reader_syntheses_k: int | None = knob(Int(ge=0), None)
    worked_example: bool | None = knob(BOOL, None)


# Where and how a server is reached or restarted: never part of a fingerprint or the config hash.
_LAUNCH = {"hashed": False}


@dataclass(frozen=True)
class LLMSettings(Settings):
    """One llm config (conf/llm/*.yaml): the job's `llm`, `judge.llm`, `judge.*_llm` and each
    judge panel member's `llm`. Keys a backend does not use are absent (None here)."""

    node: ClassVar[str] = "llm"

    backend: str = knob(Enum("llamacpp", "vllm_server", "vllm_offline", "external", "scripted"))
    model: str | None = knob(STR_OR_NULL, None)
    served_name: str | None = knob(STR_OR_NULL, None)
    revision: str | None = knob(STR_OR_NULL, None)
    base_url: str | None = knob(STR_OR_NULL, None, **_LAUNCH)
    api_key_env: str | None = knob(STR_OR_NULL, None)
    api_flavor: str | None = knob(Enum("vllm", "llamacpp", null=True), None)
    max_in_flight: int | None = knob(SIZE, None, **_LAUNCH)
    request_timeout_s: float | None = knob(Float(gt=0), None, **_LAUNCH)
    max_retries: int | None = knob(COUNT, None)
    retry_backoff_s: float | None = knob(Float(ge=0), None)
    startup_timeout_s: float | None = knob(Float(gt=0), None, **_LAUNCH)
    max_restarts: int | None = knob(Int(ge=0, note="0 = never replace a dead server"), None, **_LAUNCH)
    repair_attempts: int | None = knob(COUNT, None)
    seed: int | None = knob(Int(ge=0, null=True), None)
    request_seed: bool | None = knob(BOOL, None)
    progress: bool | None = knob(BOOL, None)
    n_ctx: int | None = knob(Int(ge=256), None)
    tokenizer: str | None = knob(STR_OR_NULL, None)  # chars | HF tokenizer id / folder
    n_threads: int | None = knob(SIZE, None)
    tensor_parallel_size: int | None = knob(SIZE, None)
    data_parallel_size: int | None = knob(SIZE, None)
    max_model_len: int | None = knob(Int(ge=256, null=True), None)
    gpu_memory_utilization: float | None = knob(Float(gt=0, le=1), None)
    max_num_seqs: int | None = knob(Int(ge=1, null=True), None)
    extra_args: tuple[str, ...] | None = knob(List(STR), None)
    extra_body: dict[str, Any] | None = knob(DICT, None)
    chat_template_kwargs: dict[str, Any] | None = knob(DICT, None)
    budgets: LLMBudgets | None = sub(LLMBudgets, null=True, default=None)
    server_python: str | None = knob(STR_OR_NULL, None)
    vllm_entrypoint: str | None = knob(Enum("serve", "module"), None)
    convert_from_gguf: str | None = knob(STR_OR_NULL, None)
    server_env: dict[str, Any] | None = knob(DICT, None)
    engine_kwargs: dict[str, Any] | None = knob(DICT, None)
    # GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's files
    # are not on disk yet (gpu_plan.py); never changes a reply.
    weights_gb: float | None = knob(Float(gt=0, null=True), None, hashed=False)
    # True for profiles whose model only exercises the pipeline (the CPU profile's SmolLM2-135M,
    # the scripted fake): report.md and the closing table then open with a line saying the
    # scores test structure, not memory quality. Set false when such a profile serves a real
    # model (llm.model=...); it changes no reply, so it is not hashed.
    structure_only: bool | None = knob(BOOL, None, hashed=False)


@dataclass(frozen=True)
class BenchmarkSettings(Settings):
    node: ClassVar[str] = "benchmark"

    name: str = knob(Enum("locomo", "longmemeval", "sample"))
    path: str | None = knob(STR_OR_NULL, None)
    conversations: tuple[Any, ...] | None = knob(List(null=True), None)
    max_sessions: int | None = knob(Int(ge=1, null=True), None)
    categories: tuple[int, ...] | None = knob(List(Int(ge=1), null=True), None)


@dataclass(frozen=True)
class MethodImplementations(Settings):
    """method.implementations: stage name -> "module:ATTR" of a Stage, or null to drop a stage
    inherited from another method YAML (structmem_gpu/methods/registry.py)."""

    open_keys: ClassVar[Mapping[str, Any]] = {"*": STR_OR_NULL}


@dataclass(frozen=True)
class MethodSettings(Settings):
    node: ClassVar[str] = "method"

    name: str = knob(STR)
    stages: tuple[str, ...] = knob(List(STR))
    implementations: MethodImplementations = sub(MethodImplementations)


@dataclass(frozen=True)
class EmbedderInstructions(Settings):
    """Instruction per use (embedder.instructions); part of the embedding cache key."""

    entry: str | None = knob(STR_OR_NULL, None)
    query: str | None = knob(STR_OR_NULL, None)
    fact: str | None = knob(STR_OR_NULL, None)
    passage: str | None = knob(STR_OR_NULL, None)


@dataclass(frozen=True)
class EmbedderSettings(Settings):
    node: ClassVar[str] = "embedder"

    model: str | None = knob(STR_OR_NULL)
    device: str = knob(STR)
    fp16: bool = knob(BOOL)
    batch_size: int = knob(SIZE)
    trust_remote_code: bool = knob(BOOL)
    long_texts: str = knob(Enum("chunk", "truncate"))
    instructions: EmbedderInstructions | None = sub(EmbedderInstructions, null=True, default=None)
    max_seq_length: int | None = knob(Int(ge=1, null=True), None)
    # GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's files
    # are not on disk yet (gpu_plan.py); never changes a vector.
    weights_gb: float | None = knob(Float(gt=0, null=True), None, hashed=False)
    # True for profiles whose model only exercises the pipeline (the CPU profile's SmolLM2-135M,
    # the scripted fake): report.md and the closing table then open with a line saying the
    # scores test structure, not memory quality. Set false when such a profile serves a real
    # model (llm.model=...); it changes no reply, so it is not hashed.
    structure_only: bool | None = knob(BOOL, None, hashed=False)


@dataclass(frozen=True)
class GpuSettings(Settings):
    """gpu: what the GPU memory plan (structmem_gpu/node/gpu_plan.py) plans against."""

    node: ClassVar[str] = "gpu"

    memory_gb: float | None = knob(Float(gt=0, null=True), None)
    headroom_gb: float = knob(Float(ge=0), 2.0)


@dataclass(frozen=True)
class IndexSettings(Settings):
    node: ClassVar[str] = "index"

    use_gpu: Any = knob(Enum("auto", True, False))
    gpu_max_k: int = knob(SIZE)


@dataclass(frozen=True)
class CacheSettings(Settings):
    llm: bool = knob(BOOL)
    embeddings: bool = knob(BOOL)


@dataclass(frozen=True)
class PreemptSettings(Settings):
    grace_s: float = knob(Float(ge=0))
    exit_code: int = knob(Int(ge=1, le=255))


@dataclass(frozen=True)
class PromptSourcesSettings(Settings):
    """prompts.sources (prompts/official.py): each null, PATH or PATH@COMMIT."""

    lightmem: str | None = knob(STR_OR_NULL, None)
    mem0: str | None = knob(STR_OR_NULL, None)
    longmemeval: str | None = knob(STR_OR_NULL, None)


@dataclass(frozen=True)
class PreflightSettings(Settings):
    """preflight: what the node checks before any stage (structmem_gpu/node/preflight.py)."""

    min_free_gb: float = knob(Float(ge=0))
    hub_timeout_s: float = knob(Float(gt=0))


@dataclass(frozen=True)
class PromptsSettings(Settings):
    reference_dir: str | None = knob(STR_OR_NULL, None)  # older name of sources.lightmem
    sources: PromptSourcesSettings | None = sub(PromptSourcesSettings, null=True, default=None)


@dataclass(frozen=True)
class PathsSettings(Settings):
    """paths (conf/paths/default.yaml): where runs, caches and data live. Never changes a result."""

    open_keys: ClassVar[Mapping[str, Any]] = {"*": STR}

    root_dir: str | None = knob(STR_OR_NULL, None)
    output_dir: str | None = knob(STR_OR_NULL, None)  # run directories live under it
    cache_dir: str | None = knob(STR_OR_NULL, None)  # LLM response and embedding caches
    data_dir: str | None = knob(STR_OR_NULL, None)  # downloaded benchmark files
    # The folder of the pinned official checkouts (lightmem.git, mem0.git, longmemeval.git;
    # prompts/pinned.py): STRUCTMEM_OFFICIAL_DIR, else <data_dir>/official. Where they are
    # never changes a result (their commits and text hashes are fingerprinted).
    official_dir: str | None = knob(STR_OR_NULL, None)


@dataclass(frozen=True)
class TrackingSettings(Settings):
    """`tracking:` (conf/tracking/*.yaml; analysis/tracking.py): where finished runs are logged
    after they ended. Never changes a result (hashed=False in JobSettings)."""

    node: ClassVar[str] = "tracking"

    backend: str = knob(Enum("none", "mlflow"), "none")  # none = nothing leaves the run directory
    # null = a local file store file:<paths.output_dir>/mlruns; a path = a file store there; a
    # URI = that store (http://HOST:5000). Never mlflow's default SQLite file, which a shared
    # filesystem's locks can corrupt; a sqlite: URI on a network filesystem is refused.
    uri: str | None = knob(STR_OR_NULL, None)
    experiment: str | None = knob(STR_OR_NULL, None)  # null = structmem-<benchmark>
    artifacts: bool = knob(BOOL, True)  # upload report/ (md, json, figures): bytes vs browsing


@dataclass(frozen=True, kw_only=True)
class JobSettings(Settings):
    """The nodes of every job's config that no stage owns (conf/config.yaml and its groups).
    hashed=False: where a run lives and how it is launched never changes what it computes."""

    stages: tuple[str, ...] | None = knob(List(STR, null=True), None, hashed=False)
    force: bool = knob(BOOL, False, hashed=False)
    dry_run: bool = knob(BOOL, False, hashed=False)
    # Shards of one job share the config hash; the load stage depends on them (its tables differ).
    shard_index: int = knob(Int(ge=0), 0, hashed=False)
    num_shards: int = knob(SIZE, 1, hashed=False)
    debug_profile: str | None = knob(Enum("ci", "scripted", null=True), None)
    prompts: PromptsSettings | None = sub(PromptsSettings, null=True, default=None)
    cache: CacheSettings | None = sub(CacheSettings, null=True, default=None)
    preempt: PreemptSettings | None = sub(PreemptSettings, null=True, default=None, hashed=False)
    preflight: PreflightSettings | None = sub(PreflightSettings, null=True, default=None,
                                              hashed=False)
    paths: PathsSettings | None = sub(PathsSettings, null=True, default=None, hashed=False)
    run_dir: str | None = knob(STR_OR_NULL, None, hashed=False)
    benchmark: BenchmarkSettings = sub(BenchmarkSettings)
    method: MethodSettings = sub(MethodSettings)
    llm: LLMSettings = sub(LLMSettings)
    embedder: EmbedderSettings = sub(EmbedderSettings)
    index: IndexSettings = sub(IndexSettings)
    gpu: GpuSettings | None = sub(GpuSettings, null=True, default=None, hashed=False)
    tracking: TrackingSettings | None = sub(TrackingSettings, null=True, default=None,
                                            hashed=False)

    def check(self) -> list[str]:
        if not 0 <= self.shard_index < self.num_shards:
            return [f"shard_index={self.shard_index!r}: expected 0 <= shard_index < num_shards "
                    f"({self.num_shards})"]
        return []


SKIPPED_TOP_KEYS = ("hydra",)  # Hydra's own node: its launcher/sweeper, never a knob of ours


def _models(stages: Iterable[HasSettings]) -> list[type[Settings]]:
    out: list[type[Settings]] = [JobSettings]
    for stage in stages:
        if stage.settings is not None and stage.settings not in out:
            out.append(stage.settings)
    return out


def _node(data: Mapping[str, Any], model: type[Settings]) -> Any:
    node: Any = data
    for part in model.node.split(".") if model.node else ():
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def problems(data: Mapping[str, Any], stages: Iterable[HasSettings] = ()) -> list[str]:
    """Every violation as one line `key=value: expected ...` (empty when the config is fine):
    the job's nodes, then each stage's node (a key read by two stages is reported once)."""
    data = {k: v for k, v in data.items() if k not in SKIPPED_TOP_KEYS}
    found: list[str] = []
    for model in _models(stages):
        node = _node(data, model)
        if node is None and model.node:
            node = {}  # an absent node: each required field is named as missing
        for line in model_problems(model, node, model.node, data):
            if line not in found:
                found.append(line)
    return found


def uncovered(data: Mapping[str, Any], stages: Iterable[HasSettings]) -> list[str]:
    """Leaves of `data` that no typed field of these stages' settings (or JobSettings) declares."""
    data = {k: v for k, v in data.items() if k not in SKIPPED_TOP_KEYS}
    seen: set[str] = set()
    for model in _models(stages):
        seen |= covered(model, _node(data, model), model.node, data)
    return [k for k in leaves(data) if k not in seen]


def check_config(cfg: Any, stages: Iterable[HasSettings] = ()) -> None:
    """Raise ConfigError naming the first bad key (and how many more) before any stage runs."""
    found = problems(to_plain(cfg), list(stages))
    if found:
        raise ConfigError(error_line(found))


def hashed_view(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` without JobSettings' hashed=False fields and Hydra's node (the config hash)."""
    out = without_unhashed(JobSettings, copy.deepcopy(dict(data)))
    return {k: v for k, v in out.items() if k not in SKIPPED_TOP_KEYS}
