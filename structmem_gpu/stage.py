"""Stage contract: a stage is a function from tables to tables with injected backends.

    def run_extract(ctx: StageContext) -> dict[str, pl.DataFrame]:
        turns = ctx.read("turns")
        results = ctx.generate(requests)            # one batch, request log kept by ctx
        return {"entries": entries_frame}

    STAGE = Stage(name="extract", run=run_extract, reads=("turns",), writes=("entries",),
                  settings=ExtractSettings, depends=LLM_IDENTITY)

`settings` is the stage's typed settings class (structmem_gpu/config/settings.py), built from its
config node (`settings.node`) and read by the stage as `ctx.settings`; `depends` names the
dotted keys outside that node whose values change its output (the model that writes its rows,
the benchmark's category selection ...). The pipeline (pipeline.py) decides whether to run a
stage (fingerprint of its settings, its dependencies and the hashes of the `reads` tables),
writes the returned tables atomically, replaces the stage's rows in requests.parquet and
writes the manifest entry last.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import polars as pl

from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.core.stage_parts import BUILD, PARTS, QUESTION

if TYPE_CHECKING:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.embed.encoder import Encoder
    from structmem_gpu.config.settings import Settings
    from structmem_gpu.llm.types import LLMBackend, LLMRequest, LLMResult, Message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[["StageContext"], Mapping[str, pl.DataFrame]]
    reads: tuple[str, ...] = ()  # tables of this run directory the stage needs (fingerprinted)
    writes: tuple[str, ...] = ()  # tables it returns (all of them, every time)
    # Its typed settings (a Settings dataclass; None = the stage has no knobs of its own).
    settings: "type[Settings] | None" = None
    # Dotted keys outside its settings' node that it depends on (fingerprinted, validated by
    # the models that own them: config.schema.JobSettings).
    depends: tuple[str, ...] = ()
    version: str = "1"  # bump when the stage's code changes its output for the same inputs
    optional_reads: tuple[str, ...] = ()  # read when present (fingerprinted when present)
    # Extra fingerprint material computed from the job (e.g. the sha256 of an input file).
    extra_fingerprint: "Callable[[JobConfig], Any] | None" = None
    # The backends it opens (ROLES): the pipeline keeps a server or the encoder only while a
    # remaining stage of the job uses it, and the GPU plan (gpu_plan.py) adds up per stage
    # what these roles keep resident. None = undeclared, read as every role (every packaged
    # stage declares it; Backends refuses a role a stage did not declare). Not fingerprinted.
    uses: tuple[str, ...] | None = None
    # What the stage will send, without a server (the dry run, node/dry_run.py): requests and
    # prompt/completion tokens built by the stage's own request builders on the loaded turns
    # and questions. Exact where its requests do not depend on earlier replies; an upper
    # bound (StageEstimate.bound) where they do. None = nothing to say beyond `uses`: a stage
    # without "llm" / "judges" sends 0 requests, one with them is "not estimated".
    estimate: "Callable[[EstimateInputs], StageEstimate] | None" = None
    # What the stage loads itself besides the backends of `uses` (LOADS): the GPU memory plan
    # (node/gpu_plan.py) counts the compression model and FAISS-GPU scratch where they are.
    loads: tuple[str, ...] = ()
    # What the stage's work is for (core/stage_parts.py PARTS; the manifest records it):
    # "input" loads the benchmark, "build" builds the
    # memory (cost per turn, compared with a paper's build cost), "question" retrieves,
    # answers or judges per question (cost per question), "audit" checks fidelity, "report"
    # summarises the run.
    # None = "question" when the stage reads the questions table, else "build". The cost
    # tables (analysis/compare.py, eval/curves.py, bench/cost.py) group stages by it.
    part: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.uses or ()) - set(ROLES))
        if unknown:
            raise ValueError(f"stage {self.name!r}: unknown uses {unknown}; roles are {ROLES}")
        other = sorted(set(self.loads) - set(LOADS))
        if other:
            raise ValueError(f"stage {self.name!r}: unknown loads {other}; known: {LOADS}")
        if self.part is not None and self.part not in PARTS:
            raise ValueError(f"stage {self.name!r}: unknown part {self.part!r}; parts are {PARTS}")

    @property
    def sends_llm_requests(self) -> bool:
        """Whether the stage may send LLM requests (`uses` names "llm" or "judges"; an
        undeclared `uses` may)."""
        return self.uses is None or bool({"llm", "judges"} & set(self.uses))

    @property
    def kind(self) -> str:
        """Its part (PARTS), the stated one or the one its reads imply."""
        if self.part is not None:
            return self.part
        return QUESTION if "questions" in self.reads else BUILD

    @property
    def per_question(self) -> bool:
        """Whether the stage's work is per question of the benchmark (answer, judge, the
        retrieve stages) rather than per turn (a memory's build): bench/cost.py scales the
        one by questions, the other by turns."""
        return self.kind == QUESTION

    def describe(self, inputs: "EstimateInputs") -> "StageEstimate":
        """The stage's dry-run row: its estimate hook, else 0 requests for a stage without
        an LLM role, else "not estimated"."""
        if self.estimate is not None:
            return self.estimate(inputs)
        if not self.sends_llm_requests:
            return StageEstimate(self.name, 0, 0, 0, "no LLM", 0)
        return StageEstimate(self.name, None, None, None, "LLM stage: not estimated")


@dataclass(frozen=True)
class StageEstimate:
    """One stage's dry-run row. `bound`: requests (and tokens) are an upper bound, because
    what the stage sends depends on earlier replies (a fusion judged "same", a dedup shortlist
    built from extracted names); otherwise the count is what the stage will send."""

    stage: str
    requests: int | None  # None = not estimated
    prompt_tokens: int | None
    completion_tokens: int | None
    basis: str
    # requests the context guard would not send (llm/context_guard.py); None = not estimated
    over_context: int | None = None
    window_plan: str | None = None  # extract: digest of the windows (the job's manifest shows it)
    bound: bool = False
    # build stages (a memory's construction, compared with the paper's build cost)
    build: bool = False


class MessageCounter(Protocol):
    """Counts the prompt tokens of one chat request (llm/prompt_counter.TokenCounter)."""

    name: str

    def messages(self, messages: "Sequence[Message]") -> int: ...


class OverContext(Protocol):
    """The context guard's rule without a server (node/dry_run.ContextCheck)."""

    def over(self, messages: "Sequence[Message]", max_tokens: int) -> bool: ...


@dataclass(frozen=True)
class EstimateInputs:
    """What a stage's estimate hook reads: the job's typed configuration, the benchmark as the
    load stage produces it (shard applied), the selected questions, and the counters."""

    job: "JobConfig"
    turns: pl.DataFrame
    questions: pl.DataFrame  # every question of the loaded conversations
    selected: pl.DataFrame  # the questions the job answers (benchmark.categories)
    counter: MessageCounter
    check: OverContext | None = None  # the answer/build model's context guard (None: unchecked)
    judge_check: OverContext | None = None  # the judge's (None: the answer model's)
    # Stand-ins of the tables earlier stages write (entries, syntheses, retrievals...), shaped
    # as the stage writes them with content from the turns: a hook leaves its own for the
    # hooks after it, so a reader can render its real prompts (eval/answer.estimate_answer).
    stand_ins: dict[str, pl.DataFrame] = field(default_factory=dict)
    # The answer prompt's abstention line over the job's whole selection (a sharded job's
    # load note, methods/load.py abstention_line); None = decided from `selected`.
    abstention_line: bool | None = None

    def over(self, messages: "Sequence[Message]", max_tokens: int, *, judge: bool = False) -> int:
        """1 when the context guard would not send this request, else 0."""
        check = (self.judge_check or self.check) if judge else self.check
        return int(check is not None and check.over(messages, max_tokens))

    @property
    def checked(self) -> bool:
        return self.check is not None


# compression_model = LLMLingua-2 (compress.model), loaded and dropped by the stage;
# faiss = a FAISS index searched in the stage (GPU scratch with index.use_gpu);
# window_tokenizer = extract.window_tokenizer's tokenizer files (no weights, no GPU), which
# the stage packs its windows by: the preflight (node/model_refs.py) checks it is local.
LOADS = ("compression_model", "faiss", "window_tokenizer")

# llm = the answer/build model; judges = every judge of `judge` (panel members included; one
# with `llm: null` is the answer model's backend); encoder = the sentence encoder.
ROLES = ("llm", "judges", "encoder")


# The model that wrote a stage's rows and the encoder behind its vectors, as `depends` keys:
# the fingerprint holds each node's identity (config/identity.py: every field of role model,
# reply or result; a different model, seed, reply knob or budget recomputes the stage), never
# its connection or speed settings (role "run").
LLM_IDENTITY = ("llm",)
EMBEDDER_IDENTITY = ("embedder",)


def judge_members(job: "JobConfig") -> list[tuple[str, LLMSettings | None]]:
    """(judge name, its llm settings or None = the answer model) for every configured judge
    (none when the job has no judge node)."""
    if not job.has("judge"):
        return []
    return job.settings(JudgeSettings).members()


def judge_key(name: str, llm_cfg: LLMSettings | None) -> str:
    """The backend key a judge runs on: the answer model's ("llm") or its own server's."""
    return "llm" if llm_cfg is None else f"judge-{name}"


def backend_keys(job: "JobConfig", uses: Sequence[str] | None) -> set[str]:
    """The backends (`Backends` keys: "llm", "judge-<name>", "encoder") that roles `uses`
    open (None = every role)."""
    out: set[str] = set()
    for role in ROLES if uses is None else uses:
        if role == "judges":
            out |= {judge_key(name, llm_cfg) for name, llm_cfg in judge_members(job)}
        else:
            out.add(role)
    return out


class Backends:
    """Lazily opened LLM servers/clients and the encoder. Each one closes on `release` (the
    pipeline releases what no remaining stage uses) or at the end of the job; a released one
    opens again when a later stage asks for it."""

    def __init__(self, job: "JobConfig", run: RunDir) -> None:
        self.job = job
        self.run = run
        self._stacks: dict[str, contextlib.ExitStack] = {}
        self._llms: dict[str, LLMBackend] = {}
        self._encoder: Encoder | None = None
        # The running stage's `uses` (set by the pipeline; None = any role): opening a role
        # it did not declare is a bug in the stage's declaration, which the release schedule
        # and the GPU plan rely on.
        self.stage_uses: tuple[str, ...] | None = None
        self.stage_name = ""
        self._judging = False

    def _require(self, role: str) -> None:
        if self.stage_uses is not None and role not in self.stage_uses:
            raise RuntimeError(
                f"stage '{self.stage_name}' opened the {role} backend but declares "
                f"uses={self.stage_uses}; add {role!r} to its Stage(uses=...)"
            )

    def __enter__(self) -> "Backends":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release(self.open_keys())

    def open_keys(self) -> set[str]:
        """Keys of the backends open now ("llm", "judge-<name>", "encoder")."""
        return set(self._llms) | ({"encoder"} if self._encoder is not None else set())

    def release(self, keys: set[str] | Sequence[str]) -> None:
        """Close these backends now: a launched server is stopped (an attached one only loses
        our client), the encoder's model is dropped and its CUDA memory returned."""
        with contextlib.ExitStack() as closing:  # every one is closed even if one fails
            for key in sorted(set(keys) & self.open_keys()):
                if key == "encoder":
                    closing.callback(self._drop_encoder)
                    continue
                log.info("releasing backend %s", key)
                del self._llms[key]
                closing.push(self._stacks.pop(key))

    def _drop_encoder(self) -> None:
        import gc
        import sys

        log.info("releasing the encoder %s", getattr(self._encoder, "model_id", ""))
        self._encoder = None
        gc.collect()  # the model's tensors go with their last reference
        torch = sys.modules.get("torch")  # loaded by the encoder; never imported here
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the freed blocks back to the device for a server

    def _cache_dir(self, kind: str) -> Path | None:
        """<paths.cache_dir>/<kind>, or None when `cache.<kind>` (llm | embeddings) is off."""
        root = self.job.root
        if root.cache is not None and not getattr(root.cache, kind):
            return None
        return Path(str(root.paths.cache_dir if root.paths is not None else None)) / kind

    def llm(self, role: str = "llm", llm_cfg: LLMSettings | None = None) -> "LLMBackend":
        """The backend for `role` ("llm" = the answer/build model; judges use their own names)."""
        self._require("llm" if role == "llm" and not self._judging else "judges")
        if role not in self._llms:
            from structmem_gpu.llm.factory import open_llm

            # debug=scripted: every llm of the config (judges, panel members) is the job's
            # scripted one, so a harness run of any experiment starts no server; the judgments
            # record the scripted model that replied.
            if llm_cfg is None or self.job.root.debug_profile == "scripted":
                llm_cfg = self.job.root.llm
            cm = open_llm(llm_cfg, log_dir=self.run.logs_dir, cache_dir=self._cache_dir("llm"), name=role)
            stack = contextlib.ExitStack()
            self._llms[role] = stack.enter_context(cm)
            self._stacks[role] = stack
        return self._llms[role]

    def judges(self) -> list[tuple[str, "LLMBackend"]]:
        """(judge_name, backend) for every configured judge; `llm: null` reuses the answer model."""
        return [(name, self.judge(name, llm_cfg)) for name, llm_cfg in judge_members(self.job)]

    def judge(self, name: str, llm_cfg: LLMSettings | None) -> "LLMBackend":
        """The backend of one judge (`llm_cfg` None: the answer model's)."""
        self._judging = True  # a judge on the answer model is the "judges" role here
        try:
            return self.llm(judge_key(name, llm_cfg), llm_cfg)
        finally:
            self._judging = False

    def encoder(self) -> "Encoder":
        self._require("encoder")
        if self._encoder is None:
            from structmem_gpu.embed.encoder import open_encoder

            self._encoder = open_encoder(self.job.root.embedder,
                                         cache_dir=self._cache_dir("embeddings"))
        return self._encoder


@dataclass
class StageContext:
    """What a stage function sees: the job's typed configuration (structmem_gpu/config/job.py),
    the run directory, backends, and its own accounting."""

    job: "JobConfig"
    run: RunDir
    stage: Stage
    backends: Backends
    request_frames: list[pl.DataFrame] = field(default_factory=list)
    batches: int = 0  # LLM batches sent (a wavefront stage sends several)
    llm_wall_s: float = 0.0  # wall time spent inside backend.generate
    encoder_wall_s: float = 0.0  # wall time inside the encoder, model load included
    index_wall_s: float = 0.0  # wall time inside vector-index build + search (retrieve stages)
    notes: dict[str, Any] = field(default_factory=dict)  # stage-specific counters for the manifest
    # Where requests got no reply at all (transport failure, dead server, not sent while
    # stopping); non-empty = the stage is incomplete (pipeline.py), never "done". Which requests
    # they were is in request_frames (column `unanswered`).
    unanswered_endpoints: set[str] = field(default_factory=set)

    @functools.cached_property
    def settings(self) -> Any:
        """The stage's typed settings for this job (built once, from the checked config)."""
        cls = self.stage.settings
        return None if cls is None else self.job.settings(cls)

    def read(self, name: str) -> pl.DataFrame:
        return self.run.read_table(name, needed_by=self.stage.name)

    def read_optional(self, name: str, columns: Sequence[str] | None = None) -> pl.DataFrame | None:
        """The table (only `columns`, when given), or None when no stage wrote it."""
        return self.run.read_table(name, columns=columns) if self.run.has_table(name) else None

    def llm(self, role: str = "llm") -> "LLMBackend":
        return self.backends.llm(role)

    def encoder(self) -> "Encoder":
        """The run's encoder; the first call loads the model, which is encoder time too."""
        t0 = time.perf_counter()
        enc = self.backends.encoder()
        self.encoder_wall_s += time.perf_counter() - t0
        return enc

    def generate(self, requests: "Iterable[LLMRequest]", *, backend: "LLMBackend | None" = None,
                 desc: str | None = None, total: int | None = None) -> list["LLMResult"]:
        """Send one batch; log every request (cached or not) for requests.parquet. An iterator
        (a generator planning the requests) is drawn from while the first requests are already
        at the server, when the backend streams (llm/types.py); `total` is its length, for the
        progress bar. Results are in the requests' order."""
        from structmem_gpu.llm.request_log import to_frame
        from structmem_gpu.llm.types import noted, streams

        if not isinstance(requests, Sequence):  # a stream: empty only if it yields nothing
            source = iter(requests)
            first = next(source, None)
            requests = () if first is None else itertools.chain((first,), source)
        if isinstance(requests, Sequence) and not requests:
            return []  # before self.llm(): an empty batch launches no server
        be = backend or self.llm()
        extra: dict[str, Any] = {}
        if isinstance(requests, Sequence):
            sent: Sequence[LLMRequest] = requests
        elif streams(be):
            drawn: list[LLMRequest] = []
            requests, sent, extra = noted(requests, drawn), drawn, {"total": total}
        else:
            requests = sent = list(requests)
        t0 = time.perf_counter()
        results = be.generate(requests, desc=desc or self.stage.name, **extra)
        self.llm_wall_s += time.perf_counter() - t0
        self.batches += 1
        if len(results) != len(sent):
            raise RuntimeError(f"backend returned {len(results)} results for {len(sent)} requests")
        self.request_frames.append(to_frame(sent, results))
        from structmem_gpu.llm.context_guard import OVER_CONTEXT

        over = sum(r.finish_reason == OVER_CONTEXT for r in results)
        if over:  # not sent (llm/context_guard.py): counted in the manifest, never dropped
            self.notes["over_context"] = self.notes.get("over_context", 0) + over
        if any(r.unanswered for r in results):
            self.unanswered_endpoints.add(endpoint_of(be))
        return results

    def encode(self, texts: Sequence[str], use: str = "entry") -> Any:
        """Encode with the configured encoder, timing it for the overhead accounting; `use`
        picks the instruction (embedder.instructions: entry | query | fact | passage)."""
        from structmem_gpu.embed.encoder import instruction

        enc = self.encoder()
        prompt = instruction(self.job.root.embedder, use)
        t0 = time.perf_counter()
        out = enc.encode(list(texts), prompt=prompt) if prompt else enc.encode(list(texts))
        self.encoder_wall_s += time.perf_counter() - t0
        return out


def http_backend_of(backend: Any) -> Any:
    """The HTTP client under a (wrapped) backend, or None when it has none (offline, scripted):
    the innermost layer with a `base_url` — a SupervisedBackend (a server the job launched)
    shows its client's URL but not the client's served name, key and flavour."""
    be, found = backend, None
    for _ in range(8):  # CachedBackend/DedupBackend -> SeededBackend -> SupervisedBackend -> HTTPBackend
        if isinstance(getattr(be, "base_url", None), str):
            found = be
        be = getattr(be, "inner", None)
        if be is None:
            break
    return found


def endpoint_of(backend: Any) -> str:
    """The URL behind a (wrapped) backend, or its repr when it has none (offline, scripted)."""
    http = http_backend_of(backend)
    return http.base_url if http is not None else repr(backend)
