"""Stage `answer`: one prompt per selected question, all questions in ONE LLM batch.

    python jobs/run.py method=structmem stages=[answer] hydra.run.dir=DIR

What the reader sees is decided by a *context builder*, chosen by `answer.prompt`:

    structmem     retrieved entries by speaker + syntheses (this module)
    full_context  the raw history, newest session first (methods/baselines/full_context.py)
    pkg.mod:func  any importable builder, or a name added with `register_context_builder`

A builder maps `AnswerInputs` (config, selected questions, the optional tables present) to
`{question_id: AnswerPrompt}`. The reply is free text (no schema: small models answer a short
phrase more reliably than they fill JSON); `parse_ok` = the request succeeded and the reply is
non-empty.

`answer.protocol` picks the reader of the memory methods (structmem, flat, graph):

- `paper` (default): the StructMem reference reader (prompts/answer_paper.py): step-by-step
  reasoning ending in `Answer: <short answer>`; the short answer is the prediction and the
  reasoning goes to the `reasoning` column; entries by speaker (first two groups, rank order;
  `answer.entry_layout: rank` = one ranked list), dates with weekday, syntheses as plain
  lines; the "Not mentioned" line only when category 5 / abstention questions are selected.
- `reasoned`: our earlier reader (prompts/answer_structmem.py): a short phrase, no reasoning,
  chronological entries under dates, dated syntheses, always the abstention line.

Other builders (full_context, turn_rag, seem) have one reader each; the protocol is recorded
but does not change them. One answers row, e.g.

    {"question_id": "sample-1:q0", "conv_id": "sample-1", "prediction": "Biscuit",
     "request_id": "answer:3f0c…", "parse_ok": True,
     "reasoning": "Tomas adopted a beagle named Biscuit on 16 March 2024.", "protocol": "paper"}

Every selected question gets a row; a failed request gets `parse_ok=False`, prediction "".
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import polars as pl
from omegaconf import DictConfig, OmegaConf

from structmem_gpu import schemas
from structmem_gpu.errors import ConfigError, MissingTableError
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling, request_id
from structmem_gpu.settings import SIZE, STR, TEMPERATURE, TOKENS, Enum, Settings, knob
from structmem_gpu.stage import LLM_IDENTITY, Stage, StageContext

log = logging.getLogger(__name__)

OPTIONAL_TABLES = ("retrievals", "entries", "syntheses", "turns")
# The llm-config keys that change replies, within one llm config (a judge's, a panel member's).
LLM_IDENTITY_KEYS = tuple(k.removeprefix("llm.") for k in LLM_IDENTITY)
_ANSWER_PREFIX = re.compile(r"^\s*(final\s+)?answer\s*:\s*", re.IGNORECASE)
# answer.protocol values (see the module docstring).
PROTOCOLS = ("paper", "reasoned")
ANSWER_COLUMNS: schemas.Schema = {
    **schemas.ANSWERS,
    "reasoning": pl.String(),  # the reply before its final answer line (paper reader), else null
    "protocol": pl.String(),
}


@dataclass(frozen=True)
class AnswerPrompt:
    messages: tuple[Message, ...]
    prompt_version: str
    # True: the reply is reasoning + a final "Answer:" line (prompts/answer_paper.py).
    reasoned_reply: bool = False


def answer_protocol(cfg: DictConfig) -> str:
    """`answer.protocol` (default paper), validated."""
    value = str(OmegaConf.select(cfg, "answer.protocol", default="paper") or "paper")
    if value not in PROTOCOLS:
        raise ConfigError(f"answer.protocol={value!r}; expected one of {list(PROTOCOLS)}")
    return value


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

    cfg: DictConfig
    questions: pl.DataFrame  # the selected questions, table order
    tables: Mapping[str, pl.DataFrame] = field(default_factory=dict)

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

# Built-in builders, imported on first use ("module:function").
_BUILTIN: dict[str, str] = {
    "structmem": "structmem_gpu.eval.answer:build_structmem_prompts",
    "full_context": "structmem_gpu.methods.baselines.full_context:build_prompts",
    "flat": "structmem_gpu.methods.baselines.flat:build_prompts",
    "graph": "structmem_gpu.methods.baselines.graph_retrieve:build_prompts",
    "turn_rag": "structmem_gpu.methods.baselines.turn_rag:build_prompts",
    "seem": "structmem_gpu.methods.seem.context:build_prompts",
}
_REGISTERED: dict[str, ContextBuilder] = {}


def register_context_builder(name: str, builder: ContextBuilder) -> None:
    """Make `answer.prompt=<name>` use `builder` (methods call this at import time)."""
    _REGISTERED[name] = builder


def context_builder(name: str) -> ContextBuilder:
    """The builder for `answer.prompt`: registered, built-in, or a "module:function" path."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    ref = _BUILTIN.get(name, name)
    module, sep, attr = ref.partition(":")
    if not sep:
        known = sorted(set(_BUILTIN) | set(_REGISTERED))
        raise ConfigError(f"unknown answer.prompt '{name}'; known: {known} (or 'module:function')")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"answer.prompt '{name}': cannot import {ref} ({exc})") from exc
    return fn  # type: ignore[no-any-return]


def llm_identity(llm_cfg: Any) -> dict[str, Any] | None:
    """The reply-relevant part of an llm config (None = reuse the answer model)."""
    if llm_cfg is None:
        return None
    if OmegaConf.is_config(llm_cfg):
        llm_cfg = OmegaConf.to_container(llm_cfg, resolve=True)
    return {k: llm_cfg.get(k) for k in LLM_IDENTITY_KEYS}


def clean_prediction(text: str) -> str:
    """The reply as the prediction: stripped, without a leading "Answer:" label."""
    return _ANSWER_PREFIX.sub("", text or "", count=1).strip()


@dataclass(frozen=True)
class AnswerSettings(Settings):
    """`answer:` of the method config (conf/method/*.yaml)."""

    node: ClassVar[str] = "answer"

    prompt: str = knob(STR)  # a context builder's name, or module:function
    max_tokens: int = knob(TOKENS)
    temperature: float = knob(TEMPERATURE)
    protocol: str = knob(Enum(*PROTOCOLS), "paper")
    # Reader context budget (characters / 4): full_context and SEEM's builders.
    context_tokens: int | None = knob(SIZE, None)
    # paper reader: entries grouped by speaker (the reference) or one ranked list.
    entry_layout: str = knob(Enum("speakers", "rank"), "speakers")
    speaker_groups: int = knob(SIZE, 2)  # speaker groups shown (entry_layout=speakers)


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
    from structmem_gpu.prompts.answer_paper import split_reply

    rows = []
    for (qid, conv), res in zip(questions.select("question_id", "conv_id").iter_rows(), results):
        reasoning: str | None = None
        if res.error is not None:
            pred = ""
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
            }
        )
    return schemas.frame(rows, ANSWER_COLUMNS)


def run_answer(ctx: StageContext) -> dict[str, pl.DataFrame]:
    questions = selected_questions(ctx.cfg, ctx.read("questions"))
    tables = {n: t for n in OPTIONAL_TABLES if (t := ctx.read_optional(n)) is not None}
    s: AnswerSettings = ctx.settings
    prompt, protocol = s.prompt, s.protocol
    prompts = context_builder(prompt)(AnswerInputs(ctx.cfg, questions, tables))
    requests = make_requests(questions, prompts, sampling(s))
    results = ctx.generate(requests, desc="answer")
    answers = answer_rows(questions, results, prompts, protocol)
    failed = int((~answers["parse_ok"]).sum())
    from structmem_gpu.prompts.answer_paper import has_final_line

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


# ---- the StructMem context builder --------------------------------------------------------
def build_structmem_prompts(inputs: AnswerInputs) -> dict[str, AnswerPrompt]:
    """Entries grouped by speaker and syntheses per question, in the configured protocol."""
    retrievals = inputs.require("retrievals", "structmem")
    entries = inputs.require("entries", "structmem")
    syntheses = inputs.table("syntheses")
    qids = set(inputs.questions["question_id"].to_list())
    retrievals = retrievals.filter(pl.col("question_id").is_in(list(qids)))
    if answer_protocol(inputs.cfg) == "paper":
        texts = synthesis_texts(retrievals, syntheses)
        return paper_prompts(inputs, retrievals, entries, lambda q: [texts.get(q, [])], None)
    from structmem_gpu.prompts import answer_structmem as P

    lines = entry_lines(retrievals, entries, P.MemoryLine)
    synths = _synthesis_lines(retrievals, syntheses, P.SynthesisLine)
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        msgs = P.build_messages(question, lines.get(qid, []), synths.get(qid, []), now)
        out[qid] = AnswerPrompt(msgs, P.VERSION)
    return out


def paper_prompts(
    inputs: AnswerInputs,
    retrievals: pl.DataFrame,
    entries: pl.DataFrame,
    extra: Callable[[str], list[Any]],
    memory_note: str | None,
) -> dict[str, AnswerPrompt]:
    """Reader `paper` prompts: the entry block (answer.entry_layout) plus `extra(qid)` — a
    list of already-rendered blocks, or lists of synthesis texts — per question."""
    from structmem_gpu.prompts import answer_paper as A

    layout = str(OmegaConf.select(inputs.cfg, "answer.entry_layout", default="speakers"))
    groups = int(OmegaConf.select(inputs.cfg, "answer.speaker_groups", default=A.MAX_GROUPS))
    if layout not in A.LAYOUTS:
        raise ConfigError(f"answer.entry_layout={layout!r}; expected one of {list(A.LAYOUTS)}")
    if groups < 1:
        raise ConfigError(f"answer.speaker_groups={groups} must be >= 1")
    ranked = ranked_entries(retrievals, entries, A.PaperEntry)
    abstain = wants_abstention(inputs.questions)
    out: dict[str, AnswerPrompt] = {}
    for qid, question, now in inputs.questions.select(
        "question_id", "question", "question_time"
    ).iter_rows():
        blocks = [A.render_entries(ranked.get(qid, []), layout, groups)]
        for b in extra(qid):
            blocks.append(A.render_summaries(b) if isinstance(b, list) else str(b))
        msgs = A.build_messages(question, blocks, now, abstain, memory_note)
        out[qid] = AnswerPrompt(msgs, A.VERSION, reasoned_reply=True)
    return out


def _retrieved(
    retrievals: pl.DataFrame, circuit: str, table: pl.DataFrame, id_col: str, cols: list[str]
) -> tuple[pl.DataFrame, int]:
    """(the retrievals of one circuit joined to their rows' `cols`, the number retrieved)."""
    hits = retrievals.filter(pl.col("circuit") == circuit)
    joined = hits.join(
        table.select(id_col, *cols), left_on="item_id", right_on=id_col, how="inner"
    )
    return joined, hits.height


def _per_question(joined: pl.DataFrame, cols: list[str], make: Callable[..., Any]
                  ) -> dict[str, list[Any]]:
    """Rows grouped by question, in the frame's order: make(*row[cols]) each."""
    out: dict[str, list[Any]] = {}
    for qid, *values in joined.select("question_id", *cols).iter_rows():
        out.setdefault(qid, []).append(make(*values))
    return out


def _entry(make: Callable[..., Any]) -> Callable[..., Any]:
    return lambda speaker, t, text: make(speaker=speaker, time=t, text=text)


ENTRY_COLS = ["speaker", "event_time", "text"]


def ranked_entries(
    retrievals: pl.DataFrame, entries: pl.DataFrame, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    """Retrieved entries per question in RANK order (the reference reader's order)."""
    joined, _ = _retrieved(retrievals, "entries", entries, "entry_id", ENTRY_COLS)
    joined = joined.sort(["question_id", "rank"], nulls_last=True)
    return _per_question(joined, ENTRY_COLS, _entry(make))


def synthesis_texts(
    retrievals: pl.DataFrame, syntheses: pl.DataFrame | None
) -> dict[str, list[str]]:
    """Retrieved synthesis texts per question, in rank order, without time ranges."""
    if syntheses is None:
        return {}
    joined, _ = _retrieved(retrievals, "syntheses", syntheses, "synth_id", ["text"])
    joined = joined.sort(["question_id", "rank"], nulls_last=True)
    return _per_question(joined, ["text"], lambda text: text)


def entry_lines(
    retrievals: pl.DataFrame, entries: pl.DataFrame, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    # Chronological order (not rank order): the reader resolves relative dates and "most
    # recent wins" more easily when memories read as a timeline.
    joined, n_hits = _retrieved(retrievals, "entries", entries, "entry_id",
                                [*ENTRY_COLS, "session_index", "turn_index"])
    if joined.height < n_hits:
        log.warning(
            "answer: %d retrieved entry ids are not in entries.parquet", n_hits - joined.height
        )
    joined = joined.sort(
        ["question_id", "event_time", "session_index", "turn_index", "rank"], nulls_last=True
    )
    # Identical (speaker, date, text) lines say nothing new: the two perspectives sometimes
    # word a statement the same way; show it once.
    joined = joined.unique(
        subset=["question_id", *ENTRY_COLS], keep="first", maintain_order=True
    )
    return _per_question(joined, ENTRY_COLS, _entry(make))


def _synthesis_lines(
    retrievals: pl.DataFrame, syntheses: pl.DataFrame | None, make: Callable[..., Any]
) -> dict[str, list[Any]]:
    if syntheses is None:
        return {}
    cols = ["window_start", "window_end", "text"]
    joined, _ = _retrieved(retrievals, "syntheses", syntheses, "synth_id", cols)
    joined = joined.sort(["question_id", "window_start", "rank"], nulls_last=True)
    return _per_question(joined, cols, lambda a, b, text: make(start=a, end=b, text=text))


STAGE = Stage(
    name="answer",
    run=run_answer,
    reads=("questions",),
    writes=("answers",),
    optional_reads=OPTIONAL_TABLES,
    settings=AnswerSettings,
    depends=("benchmark.name", "benchmark.categories", *LLM_IDENTITY),
    # 2: answer.protocol (paper reader by default) and the reasoning/protocol columns.
    version="2",
)
