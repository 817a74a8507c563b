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
from typing import Any, ClassVar, Protocol

from structmem_gpu.core import preempt
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.config.settings import (
    BOOL,
    COUNT,
    DICT,
    RATE,
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


# Roles (config/settings.py): "model" = the llm identity (stage fingerprints, stage.LLM_IDENTITY),
# "run" = where and how a server is reached or restarted (never hashed: result_keys.SERVING_KEYS).
_MODEL = {"role": "model"}
_RUN = {"role": "run"}


class LLMSettings(Settings):
    """One llm config (conf/llm/*.yaml): the job's `llm`, `judge.llm`, `judge.*_llm` and each
    judge panel member's `llm`. The defaults are what a profile that leaves a key out gets (the
    factory, the client and the preflight read this model, never a dict of their own)."""

    node: ClassVar[str] = "llm"
    # Fingerprints (the judge's embedded llm configs) hash what a profile states, absent = None,
    # as before the defaults moved here from llm/factory.py.
    fingerprint_unset_as_none: ClassVar[bool] = True

    backend: str = knob(Enum("llamacpp", "vllm_server", "vllm_offline", "external", "scripted"),
                        "llamacpp", **_MODEL, description="what launches/serves the model")
    model: str | None = knob(STR_OR_NULL, None, **_MODEL,
                             description="GGUF path, HF id or folder; null = the backend's packaged default")
    served_name: str | None = knob(STR_OR_NULL, "smollm2", **_MODEL,
                                   description="name sent as `model`; null = the model argument (vLLM's own default)")
    revision: str | None = knob(STR_OR_NULL, None, **_MODEL,
                                description="weights version; part of the cache key")
    # The sampling seed sent with every request (and the server's seed).
    seed: int | None = knob(Int(ge=0, null=True), 0, **_MODEL, description="sampling seed")
    base_url: str | None = knob(STR_OR_NULL, None, **_RUN,
                                description="attach to a running server instead of launching one")
    api_key_env: str | None = knob(STR_OR_NULL, None, description="env var holding an API key")
    api_flavor: str | None = knob(Enum("vllm", "llamacpp", null=True), None, **_MODEL,
                                  description="external only: vllm (json_schema, default) | llamacpp")
    max_in_flight: int | None = knob(SIZE, 2, **_RUN, description="concurrent requests")
    request_timeout_s: float | None = knob(Float(gt=0), 600.0, **_RUN, description="per attempt")
    max_retries: int | None = knob(COUNT, 4, description="retries on transport errors")
    retry_backoff_s: float | None = knob(Float(ge=0), 1.0, description="first backoff, doubling")
    startup_timeout_s: float | None = knob(Float(gt=0), 180.0, **_RUN,
                                           description="launch -> server answering")
    max_restarts: int | None = knob(Int(ge=0, note="0 = never replace a dead server"), 3, **_RUN,
                                    description="launched servers: replacements after a crash, per job")
    repair_attempts: int | None = knob(COUNT, 1, description="re-asks per invalid/truncated JSON reply")
    # Send each request's sampling seed (reproducible sampled replies whatever the batching);
    # false only where an engine cannot take one (conf/llm/vllm_cpu.yaml). False enters the
    # response-cache key (HTTPBackend.cache_params): unseeded replies are other replies.
    request_seed: bool | None = knob(BOOL, True, description="send each request's sampling seed")
    progress: bool | None = knob(BOOL, True, description="tqdm bar on stderr")
    n_ctx: int | None = knob(Int(ge=256), 8192, description="llama.cpp context window")
    # What counts this model's tokens (extract.window_tokenizer's default, the context guard):
    # chars = characters / 4, or an HF tokenizer id / local folder (None = the model's own
    # when it is local, else chars).
    tokenizer: str | None = knob(STR_OR_NULL, None, description="chars | HF tokenizer id / folder")
    n_threads: int | None = knob(SIZE, 2, description="llama.cpp decoding threads")
    tensor_parallel_size: int | None = knob(SIZE, 1)
    data_parallel_size: int | None = knob(SIZE, 1)
    max_model_len: int | None = knob(Int(ge=256, null=True), None)
    gpu_memory_utilization: float | None = knob(Float(gt=0, le=1), 0.9)
    max_num_seqs: int | None = knob(Int(ge=1, null=True), None)
    extra_args: tuple[str, ...] | None = knob(List(STR), (), description="extra server CLI flags")
    extra_body: dict[str, Any] | None = knob(DICT, None, **_MODEL,
                                             description="extra request-body fields; part of the cache key")
    chat_template_kwargs: dict[str, Any] | None = knob(DICT, None, **_MODEL)
    # Reply budgets of the profile, read by the stage nodes through ${llm.budgets.*}
    # interpolations; the backend itself ignores them.
    budgets: LLMBudgets | None = sub(LLMBudgets, null=True, default=None)
    # vLLM backends on another environment / CPU (conf/llm/vllm_cpu.yaml):
    server_python: str | None = knob(STR_OR_NULL, None,
                                     description="interpreter that runs the launched server; null = this one")
    vllm_entrypoint: str | None = knob(Enum("serve", "module"), "serve",
                                       description="serve = `vllm serve`; module = python -m ...api_server")
    convert_from_gguf: str | None = knob(STR_OR_NULL, None,
                                         description="GGUF to convert into `model` on first use; packaged = SmolLM2")
    server_env: dict[str, Any] | None = knob(DICT, None, description="extra environment of the launched server")
    engine_kwargs: dict[str, Any] | None = knob(DICT, None, description="vllm_offline only: extra vllm.LLM(...) arguments")
    # GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's files
    # are not on disk yet (gpu_plan.py); never changes a reply.
    weights_gb: float | None = knob(Float(gt=0, null=True), None, **_RUN)
    # True for profiles whose model only exercises the pipeline (the CPU profile's SmolLM2-135M,
    # the scripted fake): report.md and the closing table then open with a line saying the
    # scores test structure, not memory quality. Set false when such a profile serves a real
    # model (llm.model=...); it changes no reply, so it is not hashed.
    structure_only: bool | None = knob(BOOL, False, **_RUN)


class BenchmarkSettings(Settings):
    node: ClassVar[str] = "benchmark"

    name: str = knob(Enum("locomo", "longmemeval", "sample"))
    path: str | None = knob(STR_OR_NULL, None)
    conversations: tuple[Any, ...] | None = knob(List(null=True), None)
    max_sessions: int | None = knob(Int(ge=1, null=True), None)
    categories: tuple[int, ...] | None = knob(List(Int(ge=1), null=True), None)


class MethodImplementations(Settings):
    """method.implementations: stage name -> "module:ATTR" of a Stage, or null to drop a stage
    inherited from another method YAML (structmem_gpu/methods/registry.py)."""

    open_keys: ClassVar[Mapping[str, Any]] = {"*": STR_OR_NULL}


class MethodSettings(Settings):
    node: ClassVar[str] = "method"

    name: str = knob(STR)
    stages: tuple[str, ...] = knob(List(STR))
    implementations: MethodImplementations = sub(MethodImplementations)


class EmbedderInstructions(Settings):
    """Instruction per use (embedder.instructions); part of the embedding cache key. entry =
    memory texts (entries, syntheses, StructMem's consolidation seed query, SEEM facts/passages
    as documents); query = questions; fact / passage = SEEM queries against facts / passages
    (HippoRAG 2's query-to-fact / query-to-passage). The uses are these fields (embed/encoder.py)."""

    closed: ClassVar[bool] = True

    entry: str | None = knob(STR_OR_NULL, None)
    query: str | None = knob(STR_OR_NULL, None)
    fact: str | None = knob(STR_OR_NULL, None)
    passage: str | None = knob(STR_OR_NULL, None)


class EmbedderSettings(Settings):
    """embedder (conf/embedder/*.yaml). role "model" = the encoder identity behind every vector
    (stage.EMBEDDER_IDENTITY); the open_encoder reads this model, nothing re-defaults it."""

    node: ClassVar[str] = "embedder"

    model: str | None = knob(STR_OR_NULL, None, **_MODEL,
                             description="sentence-transformers model: hub id, folder, or null = packaged MiniLM")
    max_seq_length: int | None = knob(Int(ge=1, null=True), None, **_MODEL,
                                      description="truncate inputs to this many tokens; null = the model's own")
    instructions: EmbedderInstructions | None = sub(EmbedderInstructions, null=True, default=None, **_MODEL)
    # Models with their own modelling code (NV-Embed-v2) need it; it runs code from the model
    # repository, so it is off unless the embedder config says so.
    trust_remote_code: bool = knob(BOOL, False, **_MODEL)
    # chunk = embed a text over the limit in chunks and mean-pool; truncate = let the model
    # read its start only, as the reference code's MiniLM does (counted in the notes).
    long_texts: str = knob(Enum("chunk", "truncate"), "chunk", **_MODEL)
    device: str = knob(STR, "auto", description="auto | cpu | cuda[:N]")
    # fp16 halves memory and roughly doubles throughput on GPU (CPU always runs float32).
    fp16: bool = knob(BOOL, True, description="half precision on CUDA")
    batch_size: int = knob(SIZE, 64)
    # GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's files
    # are not on disk yet (gpu_plan.py); never changes a vector.
    weights_gb: float | None = knob(Float(gt=0, null=True), None, **_RUN)
    # True for profiles whose model only exercises the pipeline (the CPU profile's SmolLM2-135M,
    # the scripted fake): report.md and the closing table then open with a line saying the
    # scores test structure, not memory quality. Set false when such a profile serves a real
    # model (llm.model=...); it changes no reply, so it is not hashed.
    structure_only: bool | None = knob(BOOL, None, **_RUN)


class GpuSettings(Settings):
    """gpu: what the GPU memory plan (structmem_gpu/node/gpu_plan.py) plans against."""

    node: ClassVar[str] = "gpu"
    yaml_home: ClassVar[str | None] = "config.yaml"

    memory_gb: float | None = knob(Float(gt=0, null=True), None, description=(
        "GB of memory per GPU to plan against; null = the first CUDA device torch sees (no "
        "device and null = the size is unknown and nothing is refused). Set it on a login node "
        "or a CPU machine to plan for the GPU node, e.g. gpu.memory_gb=141 (H200) or 80 "
        "(A100/H100 80GB)."))
    headroom_gb: float = knob(Float(ge=0), 2.0, description=(
        "GB kept free on each GPU beside the planned residents: CUDA contexts, the encoder's "
        "activations, a server's minimum KV cache inside its share."))


class IndexSettings(Settings):
    node: ClassVar[str] = "index"

    use_gpu: Any = knob(Enum("auto", True, False))
    gpu_max_k: int = knob(SIZE)


class CacheSettings(Settings):
    """cache: the caches shared across runs (under paths.cache_dir)."""

    node: ClassVar[str] = "cache"
    yaml_home: ClassVar[str | None] = "config.yaml"

    llm: bool = knob(BOOL, True, description=(
        "LLM responses keyed by model, sampling, prompt version and messages"))
    embeddings: bool = knob(BOOL, True, description="embeddings keyed by encoder model and text hash")


class PreemptSettings(Settings):
    """preempt (conf/config.yaml; core/preempt.py): how a job stops on SIGTERM / SIGUSR2."""

    node: ClassVar[str] = "preempt"
    yaml_home: ClassVar[str | None] = "config.yaml"

    grace_s: float = knob(Float(ge=0), 20.0, description=(
        "Seconds in-flight requests get to finish after the signal; keep it under the "
        "scheduler's kill wait (SLURM KillWait, 30 s by default) so the job exits before SIGKILL."))
    exit_code: int = knob(Int(ge=1, le=255), preempt.DEFAULT_EXIT_CODE, description=(
        'Exit code of a preempted job (75 = EX_TEMPFAIL, "try again"); a requeue wrapper or '
        "slurm.conf RequeueExit can requeue on it. Under submitit its own handler requeues first."))


class PromptSourcesSettings(Settings):
    """prompts.sources (prompts/official.py): each null, PATH or PATH@COMMIT."""

    lightmem: str | None = knob(STR_OR_NULL, None)
    mem0: str | None = knob(STR_OR_NULL, None)
    longmemeval: str | None = knob(STR_OR_NULL, None)


class PreflightSettings(Settings):
    """preflight: what the node checks before any stage (structmem_gpu/node/preflight.py)."""

    node: ClassVar[str] = "preflight"
    yaml_home: ClassVar[str | None] = "config.yaml"

    min_free_gb: float = knob(Float(ge=0), 2.0, description=(
        "Free disk (GB) required under the run directory and under paths.cache_dir; a job "
        "writes tables, logs and LLM/embedding caches there (about 1 GB per LoCoMo run with a "
        "GPU model)."))
    hub_timeout_s: float = knob(Float(gt=0), 3.0, description=(
        "Seconds for the one probe of the Hugging Face hub that asks whether a model missing "
        "from the local cache could be downloaded (skipped with HF_HUB_OFFLINE=1); the job "
        "never waits on huggingface_hub's retries."))


class PromptsSettings(Settings):
    reference_dir: str | None = knob(STR_OR_NULL, None)  # older name of sources.lightmem
    sources: PromptSourcesSettings | None = sub(PromptSourcesSettings, null=True, default=None)


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


class ReportSettings(Settings):
    """`report:` of conf/config.yaml (eval/report.py; defaults apply to older configs without
    the block)."""

    node: ClassVar[str] = "report"
    yaml_home: ClassVar[str | None] = "config.yaml"

    bootstrap_resamples: int = knob(COUNT, 1000, description=(
        "Bootstrap resamples for judge_accuracy_ci95; more = a stabler interval (1,000 over "
        "1,540 questions takes milliseconds)."))
    bootstrap_seed: int = knob(Int(ge=0), 0, description=(
        "Bootstrap seed: the same judgments give the same interval on every machine."))
    max_parse_failure_rate: float = knob(RATE, 0.5, description=(
        "The report stage fails (after writing its files) when any LLM stage's parse-failure "
        "rate exceeds this, so a broken prompt never reads as a low score. 0.5 lets a weak CPU "
        "model (SmolLM2 with capped replies) through and still catches a prompt that fails "
        "outright. For GPU runs with real models, 0.05-0.1 is stricter."))
    # report/*.png only: no table changes with it (result_keys.NO_TABLE_KEYS).
    plots: bool = knob(BOOL, True, tables=False, description=(
        "Write report/*.png (accuracy by category beside matching published values, build cost "
        "per stage, cumulative build tokens over turns, evidence recall@k; eval/plots.py). About "
        "1-2 s a run; false skips matplotlib (e.g. thousands of sweep jobs)."))


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
    # Caches change no table, only what is kept beside them (result_keys.NO_TABLE_KEYS).
    cache: CacheSettings | None = sub(CacheSettings, null=True, default=None, tables=False)
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
    report: ReportSettings | None = sub(ReportSettings, null=True, default=None)
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
