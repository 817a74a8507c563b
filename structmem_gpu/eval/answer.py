"""Stage `answer`: one prompt per selected question, all questions in ONE LLM batch.

    python jobs/run.py method=structmem stages=[answer] hydra.run.dir=DIR

What the reader sees is decided by a *context builder*, chosen by `answer.prompt`: an import
path "module:function" (each method's YAML names its own, e.g. conf/method/structmem.yaml:
`structmem_gpu.methods.structmem.context:build_prompts`), or a name added with
`register_context_builder`.

A builder maps `AnswerInputs` (config, selected questions, the optional tables present) to
`{question_id: AnswerPrompt}`. The reply is free text (no schema: small models answer a short
phrase more reliably than they fill JSON); `parse_ok` = the request succeeded and the reply is
non-empty.

`answer.protocol` picks the reader of the memory methods (structmem, flat, graph):

- `paper` (default): the StructMem reference reader (eval/prompts/answer_paper.py): step-by-step
  reasoning ending in `Answer: <short answer>`; the short answer is the prediction and the
  reasoning goes to the `reasoning` column; entries by speaker (first two groups, rank order;
  `answer.entry_layout: rank` = one ranked list), dates with weekday, syntheses as plain
  lines; the "Not mentioned" line only when category 5 / abstention questions are selected.
- `reasoned`: our earlier reader (eval/prompts/answer_structmem.py): a short phrase, no reasoning,
  chronological entries under dates, dated syntheses, always the abstention line.

Other builders (full_context, turn_rag, seem) have one reader each; the protocol is recorded
but does not change them. One answers row, e.g.

    {"question_id": "sample-1:q0", "conv_id": "sample-1", "prediction": "Biscuit",
     "request_id": "answer:3f0c…", "parse_ok": True,
     "reasoning": "Tomas adopted a beagle named Biscuit on 16 March 2024.", "protocol": "paper",
     "reply": "Tomas adopted a beagle named Biscuit on 16 March 2024.\nAnswer: Biscuit"}

Every selected question gets a row; a failed request gets `parse_ok=False`, prediction "".
The `reply` column keeps the reader's whole reply: `judge.input: reply` (the default) judges it,
as the reference pipelines do; `answer` judges the prediction. With an official reader text
(`prompts.sources.lightmem`, eval/prompts/answer_official.py) the prediction is the whole reply.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core import schemas
from structmem_gpu.core.errors import ConfigError, MissingTableError
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling, request_id
from structmem_gpu.config.settings import (
    COUNT,
    External,
    SIZE,
    Settings,
    TEMPERATURE,
    TOKENS,
    YamlExpr,
)
from structmem_gpu.stage import LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

OPTIONAL_TABLES = ("retrievals", "entries", "syntheses", "turns", "entry_updates", "system_hits",
                   "system_readers")
# The llm-config keys that change replies, within one llm config (a judge's, a panel member's).
_ANSWER_PREFIX = re.compile(r"^\s*(final\s+)?answer\s*:\s*", re.IGNORECASE)
# answer.protocol values (see the module docstring).
PROTOCOLS = ("paper", "reasoned")
ANSWER_COLUMNS: schemas.Schema = {
    **schemas.ANSWERS,
    "reasoning": pl.String(),  # the reply before its final answer line (paper reader), else null
    "protocol": pl.String(),
    "reply": pl.String(),  # the reader's whole reply, as sent back (null: the request failed)
}


@dataclass(frozen=True)
class AnswerPrompt:
    messages: tuple[Message, ...]
    prompt_version: str
    # True: the reply is reasoning + a final "Answer:" line (eval/prompts/answer_paper.py).
    reasoned_reply: bool = False
    # True: the reply as a whole is the prediction, as the reference uses it (an official
    # reader text without a final-line instruction, eval/prompts/answer_official.py).
    raw_reply: bool = False


def answer_protocol(job: JobConfig) -> str:
    """`answer.protocol` (a job without an answer node: the model's default, paper)."""
    return job.settings(AnswerSettings).protocol


def wants_abstention(questions: pl.DataFrame) -> bool:
    """Whether the paper reader gets its abstention line: the selection holds LoCoMo
    category 5 or LongMemEval abstention questions (all other questions are answerable)."""
    from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL

    if questions.height == 0:
        return False
    cats = set(questions["category"].to_list())
    abst = "is_abstention" in questions.columns and bool(questions["is_abstention"].any())
    return LOCOMO_ADVERSARIAL in cats or abst


@dataclass(frozen=True)
class AnswerInputs:
    """What a context builder may use. `tables` holds only the optional tables that exist."""

    job: JobConfig  # the job's typed configuration (config/job.py)
    questions: pl.DataFrame  # the selected questions, table order
    tables: Mapping[str, pl.DataFrame] = field(default_factory=dict)
    # Whether the job's whole selection holds abstention questions (the load stage's note
    # `abstention_line`, taken before sharding or question grouping); None (a run loaded
    # before the note existed, a dry run) = decide from `questions`.
    abstention_line: bool | None = None

    def abstain(self) -> bool:
        """The paper reader's abstention line: one choice per job (wants_abstention)."""
        if self.abstention_line is not None:
            return self.abstention_line
        return wants_abstention(self.questions)

    def table(self, name: str) -> pl.DataFrame | None:
        return self.tables.get(name)

    def require(self, name: str, prompt: str) -> pl.DataFrame:
        if name not in self.tables:
            raise MissingTableError(
                f"answer.prompt={prompt} needs table '{name}', which no finished stage of this "
                f"run directory wrote; run the stage that writes it first (or pick another "
                f"answer.prompt)"
            )
        return self.tables[name]


ContextBuilder = Callable[[AnswerInputs], Mapping[str, AnswerPrompt]]

_REGISTERED: dict[str, ContextBuilder] = {}


def register_context_builder(name: str, builder: ContextBuilder) -> None:
    """Make `answer.prompt=<name>` use `builder` (an extension calls this at import time)."""
    _REGISTERED[name] = builder


def forced_choice_questions(job: JobConfig, questions: pl.DataFrame) -> pl.DataFrame:
    """The questions as the reader sees them: under eval.cat5=forced_choice each category-5
    question carries its two options (eval/cat5_choice.py); otherwise unchanged."""
    from structmem_gpu.eval import cat5_choice as C

    opts = C.question_options(job, questions)
    if not opts:
        return questions
    texts = [C.ask(q, opts[qid]) if qid in opts else q
             for qid, q in questions.select("question_id", "question").iter_rows()]
    return questions.with_columns(pl.Series("question", texts, dtype=pl.String()))


def builder_fingerprint(job: JobConfig) -> Any:
    """Extra fingerprint material of the configured builder: a "module:function" builder may
    define `<function>_fingerprint(job)` beside it (e.g. the commit and hash of an official
    reader text it reads from a checkout); None when it does not. With eval.cat5 away from
    its default, that too (so the default leaves every fingerprint as it was)."""
    from structmem_gpu.eval.cat5_choice import fingerprint

    fp, cat5 = _builder_fingerprint(job), fingerprint(job)
    return fp if cat5 is None else {"builder": fp, "cat5": cat5}


def _builder_fingerprint(job: JobConfig) -> Any:
    name = job.settings(AnswerSettings).prompt if job.has("answer") else ""
    module, sep, attr = name.partition(":")
    if not sep or name in _REGISTERED:
        return None
    context_builder(name)  # a clear error for an unimportable builder
    fp = getattr(importlib.import_module(module), f"{attr}_fingerprint", None)
    return fp(job) if fp is not None else None


def context_builder(name: str) -> ContextBuilder:
    """The builder for `answer.prompt`: a registered name, or a "module:function" path."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ConfigError(
            f"unknown answer.prompt '{name}': expected 'module:function' or a name registered "
            f"with register_context_builder (registered: {sorted(_REGISTERED)})"
        )
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"answer.prompt '{name}': cannot import it ({exc})") from exc
    return fn  # type: ignore[no-any-return]


def clean_prediction(text: str) -> str:
    """The reply as the prediction: stripped, without a leading "Answer:" label."""
    return _ANSWER_PREFIX.sub("", text or "", count=1).strip()


class AnswerSettings(Settings):
    """`answer:` of the method config: generated into conf/method/_answer.yaml from these
    fields, which every method lists in its defaults; a method states only what differs (its
    reader's `prompt`, a short-answer reader's budget)."""

    node: ClassVar[str] = "answer"
    yaml_home: ClassVar[str | None] = "method/_answer.yaml"

    prompt: str = Field("structmem_gpu.methods.structmem.context:build_prompts", description=(
        'The reader\'s context builder ("module:function"; structmem_gpu/eval/answer.py): what '
        "each question's prompt holds. Every method names its own."))
    protocol: Literal[PROTOCOLS] = Field("paper", description=(
        "Reader protocol: paper = the StructMem reference reader (step-by-step reasoning, then "
        '"Answer: <short answer>"; the published numbers came from it); reasoned = our earlier '
        "short-phrase reader (no reasoning, chronological entries, always an abstention line). "
        "Different protocols give different scores: compare runs of the same protocol only."))
    max_tokens: Annotated[TOKENS, YamlExpr("${llm_or:budgets.answer_max_tokens,512}")] = Field(512, description=(
        "Reply budget. The paper reader reasons before answering, so it needs room: >= 512 on "
        "GPU (the reference sets no limit); a reply cut here has no final answer line and its "
        "whole text becomes the prediction. The CPU profile's llm.budgets caps it for a 135M "
        "model; debug=ci caps it further (structure only)."))
    entry_layout: Literal["speakers", "rank"] = Field("speakers", description=(
        "paper reader only: speakers = entries grouped by speaker, the first `speaker_groups` "
        "groups in order of first appearance in the ranking, rank order inside (the reference); "
        "rank = one list in rank order, each line naming its speaker (all entries kept)."))
    speaker_groups: SIZE = Field(2, description=(
        "Speaker groups shown (reference: 2, both conversation partners; more keeps entries "
        "about a third speaker at the cost of prompt length). entry_layout=speakers only."))
    temperature: TEMPERATURE = Field(0.0, description="Reader sampling temperature (0 = greedy).")
    context_tokens: Annotated[int, Field(ge=1)] | None = Field(None, description=(
        "Reader context budget (characters / 4) of the builders that take one: full_context "
        "(null = the whole history, never cut; a request over the model's context is refused "
        "by the context guard) and SEEM (which needs a number). StructMem's reader has none."))
    # StructMem Table 1's two no-memory rows (Appendix A.4): FullContext = newest_first, OpenAI
    # (as A.4 describes it) = flat.
    history_order: Literal["newest_first", "flat"] = Field("newest_first", description=(
        "full_context's history: newest_first = sessions newest first, each under its dated "
        "header (A.4's FullContext); flat = every turn in the conversation's order as flat text, "
        "no session headers or dates (A.4's description of Table 1's OpenAI row). Other "
        "readers ignore it."))


class ReaderSizes(Settings):
    """The memory the StructMem reader template shows, for the dry run's stand-in prompts:
    keys of the stages that build and retrieve it (their own models, a layer above, validate
    them). A node the method does not have leaves its memory out (0 / off / no cap)."""

    entries_k: Annotated[COUNT, External("retrieve.entries_k")] = 0
    syntheses_k: Annotated[COUNT, External("retrieve.syntheses_k")] = 0
    consolidate: Annotated[bool, External("consolidate.enabled")] = False
    max_item_chars: Annotated[Annotated[int, Field(ge=1)] | None, External("extract.max_item_chars")] = None
    synthesis_max_tokens: Annotated[COUNT, External("consolidate.max_tokens")] = 0


def sampling(s: AnswerSettings) -> Sampling:
    return Sampling(temperature=s.temperature, max_tokens=s.max_tokens)


def make_requests(
    questions: pl.DataFrame, prompts: Mapping[str, AnswerPrompt], samp: Sampling
) -> list[LLMRequest]:
    missing = [q for q in questions["question_id"].to_list() if q not in prompts]
    if missing:
        raise RuntimeError(
            f"context builder produced no prompt for {len(missing)} questions, e.g. {missing[:3]}"
        )
    out = []
    for qid, conv in questions.select("question_id", "conv_id").iter_rows():
        p = prompts[qid]
        digest = [m.as_dict() for m in p.messages]
        out.append(
            LLMRequest(
                request_id=request_id("answer", qid, p.prompt_version, digest, asdict(samp)),
                stage="answer",
                messages=p.messages,
                prompt_version=p.prompt_version,
                sampling=samp,
                schema=None,
                conv_id=conv,
            )
        )
    return out


def answer_rows(
    questions: pl.DataFrame,
    results: list[LLMResult],
    prompts: Mapping[str, AnswerPrompt] | None = None,
    protocol: str = "paper",
) -> pl.DataFrame:
    from structmem_gpu.eval.prompts.answer_paper import split_reply

    rows = []
    for (qid, conv), res in zip(questions.select("question_id", "conv_id").iter_rows(), results):
        reasoning: str | None = None
        if res.error is not None:
            pred = ""
        elif prompts is not None and prompts[qid].raw_reply:
            pred = res.text if (res.text or "").strip() else ""
        elif prompts is not None and prompts[qid].reasoned_reply:
            pred, reasoning = split_reply(res.text)
            pred = clean_prediction(pred)
        else:
            pred = clean_prediction(res.text)
        rows.append(
            {
                "question_id": qid,
                "conv_id": conv,
                "prediction": pred,
                "request_id": res.request_id,
                "parse_ok": bool(res.parse_ok and pred),
                "reasoning": reasoning,
                "protocol": protocol,
                "reply": None if res.error is not None else (res.text or ""),
            }
        )
    return schemas.frame(rows, ANSWER_COLUMNS)


class _LazyTables(Mapping[str, pl.DataFrame]):
    """The optional tables that exist, each read on first use: LongMemEval's compact turns
    expand to millions of rows (turns_store.py), which only a builder that asks pays for."""

    def __init__(self, ctx: StageContext, names: Sequence[str]) -> None:
        self._ctx = ctx
        self._names = [n for n in names if ctx.run.has_table(n)]
        self._read: dict[str, pl.DataFrame] = {}

    def __getitem__(self, name: str) -> pl.DataFrame:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._read:
            self._read[name] = self._ctx.run.read_table(name)
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def run_answer(ctx: StageContext) -> dict[str, pl.DataFrame]:
    questions = selected_questions(ctx.job, ctx.read("questions"))
    tables = _LazyTables(ctx, OPTIONAL_TABLES)
    s: AnswerSettings = ctx.settings
    prompt, protocol = s.prompt, s.protocol
    asked = forced_choice_questions(ctx.job, questions)  # eval.cat5=forced_choice
    loaded = (ctx.run.stage_entry("load") or {}).get("notes", {})
    prompts = context_builder(prompt)(AnswerInputs(ctx.job, asked, tables,
                                                   loaded.get("abstention_line")))
    requests = make_requests(questions, prompts, sampling(s))
    results = ctx.generate(requests, desc="answer")
    answers = answer_rows(questions, results, prompts, protocol)
    failed = int((~answers["parse_ok"]).sum())
    from structmem_gpu.eval.prompts.answer_paper import has_final_line

    no_final = sum(
        1
        for q, res in zip(questions["question_id"].to_list(), results)
        if prompts[q].reasoned_reply and res.error is None and not has_final_line(res.text)
    )
    ctx.notes.update(
        questions=answers.height,
        failed=failed,
        prompt=prompt,
        protocol=protocol,
        without_final_answer_line=no_final,
    )
    if failed:
        log.warning(
            "answer: %d of %d questions got no usable reply (parse_ok=False)",
            failed,
            answers.height,
        )
    return {"answers": answers}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

ANSWER_COMPLETION = 16  # a short phrase (answer.protocol=reasoned)
# answer.protocol=paper: a few reasoning steps with the date arithmetic, then the answer line
ANSWER_PAPER_COMPLETION = 200
SYNTHESIS_TOKENS = 450  # a synthesis is as long as its reply: at most a 350-word narrative
# The reader the prompts are rendered with (other readers are estimated with its template).
STRUCTMEM_READER = "structmem_gpu.methods.structmem.context:build_prompts"


def reader_prompts(inp: EstimateInputs, s: AnswerSettings) -> list[Any] | None:
    """The reader's own prompts (`answer.prompt`) on the loaded turns and the stand-in tables
    earlier hooks left (EstimateInputs.stand_ins: entries, syntheses, retrievals); None when
    it needs a table no hook stands in for (a job that lists answer without its retrieve)."""
    builder = context_builder(s.prompt)
    try:
        prompts = builder(AnswerInputs(inp.job, inp.selected, {"turns": inp.turns, **inp.stand_ins},
                                       inp.abstention_line))
    except MissingTableError:
        return None
    return [prompts[q].messages for q in inp.selected["question_id"].to_list()]


def estimate_answer(inp: EstimateInputs) -> StageEstimate:
    """Exact count: one request per selected question. Prompts: the reader's own (exact for
    full_context, which reads only the turns; on the stand-in memories the earlier stages'
    hooks leave for structmem, flat, turn_rag, SEEM and graph memory), else, for a reader
    whose tables no hook stands in for, the StructMem reader's template (answer.protocol's)
    filled with stand-ins of the configured sizes (entries_k entries cut to
    extract.max_item_chars, syntheses_k syntheses)."""
    from datetime import datetime

    from structmem_gpu.eval.prompts import answer_structmem as P

    s = inp.job.settings(AnswerSettings)
    qs, turns, job = inp.selected, inp.turns, inp.job
    own = reader_prompts(inp, s)
    if own is not None:
        paper = s.protocol == "paper"
        comp = min(s.max_tokens, ANSWER_PAPER_COMPLETION if paper else ANSWER_COMPLETION)
        return StageEstimate("answer", len(own), sum(inp.counter.messages(m) for m in own),
                             len(own) * comp,
                             "1 per selected question (the reader's own prompts"
                             + (" on stand-in memories)" if inp.stand_ins else ")"),
                             sum(inp.over(m, s.max_tokens) for m in own) if inp.checked else None)
    # Sizes of the memory the method retrieves (other stages' nodes, typed by ReaderSizes).
    sizes = job.settings(ReaderSizes)
    k = sizes.entries_k
    sk = sizes.syntheses_k if sizes.consolidate else 0
    cap = sizes.max_item_chars
    texts = [(x or "")[: int(cap)] if cap else (x or "") for x in turns["text"].to_list()]
    t = datetime(2023, 5, 8)
    entries = ([P.MemoryLine(turns["speaker"][i % turns.height], t, texts[i % len(texts)]) for i in range(k)]
               if texts else [])
    synth_tokens = min(sizes.synthesis_max_tokens, SYNTHESIS_TOKENS)
    synth = [P.SynthesisLine(t, t, "word " * int(synth_tokens * 0.75))] * sk
    paper = s.protocol == "paper"
    if paper:
        from structmem_gpu.eval.prompts import answer_paper as A

        block = [A.render_entries([A.PaperEntry(e.speaker, e.time, e.text) for e in entries]),
                 A.render_summaries([x.text for x in synth])]
        prompts = [A.build_messages(q, block) for q in qs["question"].to_list()]
    else:
        prompts = [P.build_messages(q, entries, synth) for q in qs["question"].to_list()]
    prompt = sum(inp.counter.messages(m) for m in prompts)
    over = sum(inp.over(m, s.max_tokens) for m in prompts)
    note = "" if s.prompt == STRUCTMEM_READER else " (StructMem template as a stand-in for answer.prompt)"
    comp = min(s.max_tokens, ANSWER_PAPER_COMPLETION if paper else ANSWER_COMPLETION)
    return StageEstimate("answer", qs.height, prompt, qs.height * comp,
                         f"1 per selected question; {k} entries + {sk} syntheses{note}",
                         over if inp.checked else None)


STAGE = Stage(
    name="answer",
    run=run_answer,
    reads=("questions",),
    writes=("answers",),
    optional_reads=OPTIONAL_TABLES,
    settings=AnswerSettings,
    depends=("benchmark.name", "benchmark.categories", *LLM_IDENTITY),
    extra_fingerprint=builder_fingerprint,
    # 2: answer.protocol (paper reader by default) and the reasoning/protocol columns.
    # 3: the reply column (judge.input=reply judges it).
    version="3",
    uses=("llm",),
    estimate=estimate_answer,
)
