"""Stage `judge`: LLM-as-judge labels, lexical metrics and evidence recall for every answer.

    python jobs/run.py stages=[judge,report] judge=second_cpu hydra.run.dir=EXISTING_RUN

Re-judging never re-answers: the stage reads answers.parquet only. For each judge of
`ctx.backends.judges()` (one batch per judge):

- LoCoMo / sample questions: CORRECT / WRONG;
- LongMemEval questions (category ids of data/categories.LONGMEMEVAL_TYPES): yes / no with
  the rule of the question type;
- LoCoMo category 5: LoCoMo's "not mentioned" rule, no LLM call (judge_model "rule:locomo-cat5");
- an empty prediction (the answer request failed): WRONG without a call ("rule:empty-answer").

`judge.protocol` picks the prompts and the label rule (docs/evaluation.md "Judge protocols"):

- `paper` (default): LoCoMo eval/prompts/judge_locomo_paper.py (one user message, label JSON, 1 iff
  exactly `CORRECT`); LongMemEval eval/prompts/judge_longmemeval_paper.py (one user message, bare
  yes/no, max_tokens 10, `'yes' in reply.lower()`);
- `reasoned`: eval/prompts/judge_locomo.py / judge_longmemeval.py (system + user message, a
  reasoning-then-label schema, any case of the label).

Under `paper`, official texts replace our wording when configured (docs/evaluation.md "Official texts",
prompts/official.py): the LoCoMo judge from `prompts.sources.mem0` (else `.lightmem`), the
LongMemEval templates from `prompts.sources.longmemeval`, filled exactly as the official
scripts fill them. `judge.input` picks what the judge sees: `reply` (default) = the reader's
whole reply (answers.reply, as the reference pipelines pass it), `answer` = the extracted
prediction. Lexical metrics and the category-5 rule always score the prediction.

A reply without a readable label gives `label = null` (unjudged): recorded with its raw
reply and never dropped; the report counts it as WRONG in `judge_accuracy` (as the
published pipelines do) and reports `judge_accuracy_judged` and `unjudged` beside it. Rows of other judge names already in
judgments.parquet are kept (one row per (question, judge)) unless their `prediction` no longer
matches answers.parquet (stale: judged an older answer). One row:

    {"question_id": "sample-1:q0", "judge_model": "smollm2|…", "judge_name": "same_as_llm",
     "prompt_version": "judge_locomo_paper/2", "label": True, "reply_raw": "{\\"label\\": …}",
     "f1_locomo": 1.0, "f1_mem0": 1.0, "bleu1": 1.0, "evidence_recall": 0.5,
     "prediction": "Biscuit", "protocol": "paper", "judge_input": "reply"}
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import polars as pl

from structmem_gpu.config.identity import identity
from structmem_gpu.config.job import JobConfig
from structmem_gpu.core import schemas
from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL, LONGMEMEVAL_TYPES
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval.metrics import lexical_scores, says_not_mentioned
from structmem_gpu.eval.recall import recall_by_question
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.structured import strip_fences

from structmem_gpu.llm.types import LLMBackend, LLMRequest, Message, Sampling, request_id
from structmem_gpu.eval.prompts import (
    judge_locomo,
    judge_locomo_paper,
    judge_longmemeval,
    judge_longmemeval_paper,
)
from structmem_gpu.prompts import official
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.stage import LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

RULE_CAT5 = "rule:locomo-cat5"
RULE_EMPTY = "rule:empty-answer"
RULE_CAT5_VERSION = "locomo_cat5_rule/1"
LONGMEMEVAL_IDS = frozenset(LONGMEMEVAL_TYPES.values())
# JSON overhead of {"reasoning": "...", "label": "CORRECT"} in tokens, and chars per token,
# used to bound the reasoning so that a reply capped at judge.max_tokens is still valid JSON.
# SmolLM2 spends ~1.5 characters per token on dates and digits (one token per digit) and pads
# the JSON with spaces, hence the conservative ratio (measured on the CI sample run).
_JSON_OVERHEAD_TOKENS = 24
_CHARS_PER_TOKEN = 1.5
_LABEL_RE = re.compile(r'"label"\s*:\s*"([A-Za-z]+)"')


@dataclass(frozen=True)
class JudgeItem:
    question_id: str
    conv_id: str
    question: str
    gold: str
    category: int
    category_name: str
    is_abstention: bool
    prediction: str  # the extracted answer: lexical metrics, stale-row check, rule verdicts
    judged: str = ""  # what the LLM judge sees (judge.input); "" = the prediction
    # eval.cat5=forced_choice, category 5: the two options the reader was given (cat5_choice.py)
    options: tuple[str, str] | None = None

    @property
    def judge_text(self) -> str:
        return self.judged or self.prediction


@dataclass(frozen=True)
class JudgmentRow:
    question_id: str
    judge_model: str
    judge_name: str
    prompt_version: str
    label: bool | None
    reply_raw: str | None
    f1_locomo: float
    f1_mem0: float | None
    bleu1: float | None
    evidence_recall: float | None
    prediction: str  # the extracted answer (detects stale rows after a re-answer)
    protocol: str  # judge.protocol of the row ("rule" for rule verdicts)
    judge_input: str  # judge.input of the row: reply | answer (what the LLM judge saw)


JUDGMENT_COLUMNS: schemas.Schema = {
    **schemas.JUDGMENTS,
    "prediction": pl.String(),
    "protocol": pl.String(),
    "judge_input": pl.String(),
}


# Official judge texts (prompts.sources.*) by group ("locomo", "longmemeval"), then by use.
OfficialJudges = Mapping[str, Mapping[str, official.OfficialText]]


def judge_protocol(job: JobConfig) -> str:
    """`judge.protocol` (a job without a judge node: the model's default, paper)."""
    return job.settings(JudgeSettings).protocol


def parse_label(data: Any, text: str, positive: str, negative: str) -> bool | None:
    """True / False from a judge reply; None when no valid label can be read (unjudged).

    Uses the schema-validated object when there is one, else a lenient read of the raw text
    (fences stripped, JSON object or a `"label": "…"` fragment), so that a reply cut after its
    label still counts. Matching is case-insensitive; anything else is None, never False.
    """
    label: Any = data.get("label") if isinstance(data, Mapping) else None
    if label is None and text:
        try:
            obj = json.loads(strip_fences(text))
            label = obj.get("label") if isinstance(obj, dict) else None
        except json.JSONDecodeError:
            m = _LABEL_RE.search(text)
            label = m.group(1) if m else None
    if not isinstance(label, str):
        return None
    low = label.strip().lower()
    if low == positive.lower():
        return True
    if low == negative.lower():
        return False
    return None


def judge_items(
    questions: pl.DataFrame, answers: pl.DataFrame, judge_input: str = "answer"
) -> list[JudgeItem]:
    """Selected questions joined with their answers; error if any selected question has none.
    `judge_input` reply: the judge sees answers.reply (the prediction where the reply is null)."""
    preds = dict(answers.select("question_id", "prediction").iter_rows())
    replies: dict[str, str | None] = {}
    if judge_input == "reply":
        if "reply" not in answers.columns:
            raise StructMemError(
                "stage 'judge': judge.input=reply but answers.parquet has no reply column "
                "(written by an older version); rerun stage 'answer' (its replies are cached) "
                "or set judge.input=answer"
            )
        replies = dict(answers.select("question_id", "reply").iter_rows())
    missing = [q for q in questions["question_id"].to_list() if q not in preds]
    if missing:
        raise StructMemError(
            f"stage 'judge': answers.parquet has no answer for {len(missing)} selected questions "
            f"(e.g. {missing[:3]}); rerun stage 'answer' with the same benchmark.categories"
        )
    cols = (
        "question_id",
        "conv_id",
        "question",
        "answer",
        "category",
        "category_name",
        "is_abstention",
    )
    return [
        JudgeItem(qid, conv, q, gold or "", int(cat), name or "", bool(abst), preds[qid] or "",
                  replies.get(qid) or "")
        for qid, conv, q, gold, cat, name, abst in questions.select(cols).iter_rows()
    ]


def with_options(job: JobConfig, questions: pl.DataFrame, items: list[JudgeItem]
                 ) -> list[JudgeItem]:
    """Category-5 items with the options their reader was given (eval.cat5=forced_choice)."""
    from structmem_gpu.eval.cat5_choice import question_options

    opts = question_options(job, questions)
    if not opts:
        return items
    return [replace(it, options=opts[it.question_id]) if it.question_id in opts else it
            for it in items]


def reasoning_chars(max_tokens: int) -> int:
    """maxLength of the reasoning field: 24 chars at 40 tokens (CI), 156 at 128."""
    return max(16, int((max_tokens - _JSON_OVERHEAD_TOKENS) * _CHARS_PER_TOKEN))


def build_request(
    item: JudgeItem,
    judge_name: str,
    samp: Sampling,
    protocol: str = "paper",
    texts: OfficialJudges | None = None,
) -> LLMRequest:
    """One judge request; under protocol paper with official texts (`texts`, from
    prompts.sources.*) the official template filled as the official script fills it."""
    schema_: dict[str, Any] | None
    pred = item.judge_text
    official_ = texts or {}
    if protocol == "paper":
        if item.category in LONGMEMEVAL_IDS:
            if official_.get("longmemeval"):
                tpl = official.longmemeval_template(
                    official_["longmemeval"], item.category_name, item.is_abstention
                )
                # evaluate_qa.py: template.format(question, answer, response), one user message
                msgs = (Message("user", tpl.text.format(item.question, item.gold, pred)),)
                version = tpl.version("judge_longmemeval")
            else:
                msgs = judge_longmemeval_paper.build_messages(
                    item.question, item.gold, pred, item.category_name, item.is_abstention
                )
                version = judge_longmemeval_paper.VERSION
            schema_ = None
            samp = Sampling(
                temperature=samp.temperature,
                max_tokens=min(samp.max_tokens, judge_longmemeval_paper.MAX_TOKENS),
            )
        else:
            locomo = official_.get("locomo")
            if locomo:
                tpl = locomo["judge_locomo"]
                # llm_judge.py: ACCURACY_PROMPT.format(...) as one user message, JSON mode
                text = tpl.text.format(
                    question=item.question, gold_answer=item.gold, generated_answer=pred
                )
                msgs, version = (Message("user", text),), tpl.version("judge_locomo")
            else:
                msgs = judge_locomo_paper.build_messages(item.question, item.gold, pred)
                version = judge_locomo_paper.VERSION
            schema_ = judge_locomo_paper.schema()
    else:
        chars = reasoning_chars(samp.max_tokens)
        if item.category in LONGMEMEVAL_IDS:
            msgs = judge_longmemeval.build_messages(
                item.question, item.gold, pred, item.category_name, item.is_abstention
            )
            version, schema_ = judge_longmemeval.VERSION, judge_longmemeval.schema(chars)
        else:
            msgs = judge_locomo.build_messages(item.question, item.gold, pred)
            version, schema_ = judge_locomo.VERSION, judge_locomo.schema(chars)
    rid = request_id(
        "judge", judge_name, item.question_id, version, [m.as_dict() for m in msgs], asdict(samp)
    )
    return LLMRequest(
        request_id=rid,
        stage="judge",
        messages=msgs,
        prompt_version=version,
        sampling=samp,
        schema=schema_,
        conv_id=item.conv_id,
    )


def read_label(
    item: JudgeItem, protocol: str, data: Any, text: str | None,
    texts: OfficialJudges | None = None,
) -> bool | None:
    """The label of one LLM reply under `protocol` (None = unjudged); with LightMem's judge
    text (`texts`), LightMem's way of reading its JSON."""
    if protocol == "paper":
        if item.category in LONGMEMEVAL_IDS:
            return judge_longmemeval_paper.parse_label(text)
        locomo = (texts or {}).get("locomo")
        lightmem = bool(locomo) and locomo["judge_locomo"].source == "lightmem"
        return judge_locomo_paper.parse_label(text, lightmem)
    pos, neg = _labels_for(item)
    return parse_label(data, text or "", pos, neg)


def _labels_for(item: JudgeItem) -> tuple[str, str]:
    if item.category in LONGMEMEVAL_IDS:
        return judge_longmemeval.POSITIVE, judge_longmemeval.NEGATIVE
    return judge_locomo.POSITIVE, judge_locomo.NEGATIVE


Verdict = tuple[str, str, bool | None, str | None]  # judge_model, prompt_version, label, reply_raw


def rule_verdict(item: JudgeItem, llm_cat5: bool = False) -> Verdict | None:
    """The verdict of an item that needs no LLM call, else None. `llm_cat5`: LoCoMo category 5
    goes to the LLM judge too (eval/protocols.py scores that protocol beside the rule). An item
    with `options` (eval.cat5=forced_choice) is scored by the option its answer names."""
    if item.category == LOCOMO_ADVERSARIAL and item.options is not None:
        from structmem_gpu.eval import cat5_choice as C

        label = C.label(item.prediction, item.options)
        if label is None and item.judged:  # the extracted line named no option: the reply
            label = C.label(item.judged, item.options)
        return C.RULE, C.VERSION, label, None
    if item.category == LOCOMO_ADVERSARIAL and not llm_cat5:
        return RULE_CAT5, RULE_CAT5_VERSION, says_not_mentioned(item.prediction), None
    if not item.prediction.strip():
        # The answer request failed or returned nothing: the method gave no answer -> WRONG.
        return RULE_EMPTY, RULE_EMPTY, False, None
    return None


def judge_with(
    ctx: StageContext,
    name: str,
    backend: LLMBackend,
    items: Sequence[JudgeItem],
    samp: Sampling,
    protocol: str = "paper",
    texts: OfficialJudges | None = None,
    llm_cat5: bool = False,
) -> list[Verdict]:
    """One verdict per item, in item order; the LLM part goes out as one batch."""
    verdicts: list[Verdict | None] = [rule_verdict(it, llm_cat5) for it in items]
    ask = [i for i, v in enumerate(verdicts) if v is None]
    requests = [build_request(items[i], name, samp, protocol, texts) for i in ask]
    results = ctx.generate(requests, backend=backend, desc=f"judge:{name}")
    for i, req, res in zip(ask, requests, results):
        text = res.text if res.error is None else (res.text or None)
        label = read_label(items[i], protocol, res.data, text, texts)
        verdicts[i] = (res.model or backend.model_id, req.prompt_version, label, res.text)
    return [v for v in verdicts if v is not None]


def keep_other_judges(
    old: pl.DataFrame | None, names: Sequence[str], answers: pl.DataFrame
) -> pl.DataFrame:
    """Existing rows of other judge names whose judged prediction is still the current one."""
    if old is None or old.height == 0:
        return schemas.empty(JUDGMENT_COLUMNS)
    others = old.filter(~pl.col("judge_name").is_in(list(names)))
    unchecked = "prediction" not in others.columns  # written before predictions were stored
    for col in ("prediction", "protocol", "judge_input"):  # rows written before these existed
        if col not in others.columns:
            others = others.with_columns(pl.lit(None, pl.String()).alias(col))
    if unchecked or others.height == 0:
        return schemas.conform(others, JUDGMENT_COLUMNS).select(list(JUDGMENT_COLUMNS))
    current = answers.select("question_id", pl.col("prediction").alias("_current"))
    joined = others.join(current, on="question_id", how="left")
    fresh = joined.filter(
        pl.col("_current").is_not_null() & (pl.col("prediction") == pl.col("_current"))
    )
    if fresh.height < others.height:
        log.warning(
            "judge: dropped %d stale rows of other judges (their answers changed)",
            others.height - fresh.height,
        )
    return schemas.conform(fresh.drop("_current"), JUDGMENT_COLUMNS).select(list(JUDGMENT_COLUMNS))


def run_judge(ctx: StageContext) -> dict[str, pl.DataFrame]:
    questions = selected_questions(ctx.job, ctx.read("questions"))
    answers = ctx.read("answers")
    s: JudgeSettings = ctx.settings
    items = with_options(ctx.job, questions, judge_items(questions, answers, s.input))
    recall, unresolved = recall_by_question(
        questions,
        ctx.read_optional("retrievals"),
        ctx.read_optional("entries"),
        ctx.read_optional("syntheses"),
    )
    lexical = {it.question_id: lexical_scores(it.prediction, it.gold, it.category) for it in items}
    samp = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)
    protocol = s.protocol
    texts = official_judges(ctx.job) if protocol == "paper" else None
    rows: list[JudgmentRow] = []
    judges = ctx.backends.judges()
    for name, backend in judges:
        for it, (model, version, label, raw) in zip(
            items, judge_with(ctx, name, backend, items, samp, protocol, texts)
        ):
            lex = lexical[it.question_id]
            rows.append(
                JudgmentRow(
                    it.question_id,
                    model,
                    name,
                    version,
                    label,
                    raw,
                    lex.f1_locomo,
                    lex.f1_mem0,
                    lex.bleu1,
                    recall.get(it.question_id),
                    it.prediction,
                    "rule" if model.startswith("rule:") else protocol,
                    s.input,
                )
            )
    names = [n for n, _ in judges]
    # Read unfingerprinted on purpose: it is this stage's own output (see STAGE below).
    kept = keep_other_judges(ctx.read_optional("judgments"), names, answers)
    new = schemas.frame([asdict(r) for r in rows], JUDGMENT_COLUMNS)
    errata_rows = judge_errata(ctx, questions, items, judges, samp, protocol, texts)
    unjudged = int(new["label"].is_null().sum())
    ctx.notes.update(
        protocol=protocol,
        judge_input=s.input,
        official_texts=official.records(
            {f"{g}/{k}": t for g, group in (texts or {}).items() for k, t in group.items()}
        ),
        judges=names,
        rows=new.height,
        unjudged=unjudged,
        kept_other_judges=kept.height,
        recall_unresolved_items=unresolved,
        errata=None if errata_rows is None else {
            "rows": errata_rows.height,
            "applied": int(errata_rows["applied"].sum())},
    )
    if unjudged:
        log.warning(
            "judge: %d of %d judgments unjudged (reply without a valid label; counted as wrong "
            "in judge_accuracy)",
            unjudged,
            new.height,
        )
    from structmem_gpu.eval.errata import ERRATA_COLUMNS

    return {"judgments": pl.concat([kept, new]),
            "errata_judgments": errata_rows if errata_rows is not None
            else schemas.empty(ERRATA_COLUMNS)}


def judge_errata(
    ctx: StageContext, questions: pl.DataFrame, items: Sequence[JudgeItem],
    judges: Sequence[tuple[str, LLMBackend]], samp: Sampling, protocol: str,
    texts: OfficialJudges | None,
) -> pl.DataFrame | None:
    """eval.errata (eval/errata.py): each joined entry among the selected questions, per judge;
    a score-changing entry's answer judged again against the corrected gold. None when off or
    the benchmark is not LoCoMo-format."""
    from structmem_gpu.eval import errata as E
    from structmem_gpu.eval.locomo_audit import describe

    src = E.configured(ctx.job)
    if src is None or bool(questions["category"].is_in(list(LONGMEMEVAL_IDS)).any()):
        return None
    joined = E.join(src, E.load(src), E.all_questions(ctx.job, ctx.read("questions")))
    ctx.notes["errata_source"] = describe(src)
    ctx.notes["errata_outside_run"] = joined.outside
    selected = {it.question_id: it for it in items if it.question_id in joined.by_question}
    fixed_q = E.corrected_questions(questions, joined)
    recall, _ = recall_by_question(
        fixed_q.filter(pl.col("question_id").is_in(list(selected))),
        ctx.read_optional("retrievals"), ctx.read_optional("entries"),
        ctx.read_optional("syntheses"))
    applied = [q for q, e in joined.by_question.items() if q in selected and e.kind == E.SCORE]
    asked = [E.with_gold(selected[q], joined.by_question[q]) for q in applied]
    rows = []
    for name, backend in judges:
        verdicts = dict(zip(applied, judge_with(ctx, name, backend, asked, samp, protocol, texts)))
        for qid in selected:
            e = joined.by_question[qid]
            model, version, label, raw = verdicts.get(qid, (None, None, None, None))
            rows.append({
                "question_id": qid, "judge_name": name, "audit_id": e.audit_id,
                "error_type": e.error_type, "kind": e.kind, "applied": qid in verdicts,
                "official_gold": e.official_gold, "corrected_gold": e.correct_answer,
                "corrected_label": label, "judge_model": model, "prompt_version": version,
                "reply_raw": raw,
                "evidence_recall_corrected": recall.get(qid) if e.kind != E.AMBIGUOUS else None,
            })
    return schemas.frame(rows, E.ERRATA_COLUMNS)


def official_judges(job: JobConfig) -> dict[str, dict[str, official.OfficialText]]:
    """The official judge texts of prompts.sources.* (protocol paper): "locomo" (mem0's, else
    LightMem's) and "longmemeval" (by question type), each only when configured."""
    out: dict[str, dict[str, official.OfficialText]] = {}
    locomo = official.locomo_judge(
        official.source_spec(job, "lightmem"), official.source_spec(job, "mem0")
    )
    if locomo is not None:
        out["locomo"] = {"judge_locomo": locomo}
    lme = official.source_spec(job, "longmemeval")
    if lme is not None:
        out["longmemeval"] = official.longmemeval_judges(lme)
    return out


def _fingerprint(job: JobConfig) -> Any:
    """The official judge texts; with eval.errata (or eval.cat5 not its default) those too.
    Unchanged when both are off, so that no finished judge stage reruns."""
    from structmem_gpu.eval.cat5_choice import fingerprint as cat5_fingerprint
    from structmem_gpu.eval.errata import fingerprint as errata_fingerprint

    texts = judge_texts_fingerprint(job)
    extra = {k: v for k, v in (("errata", errata_fingerprint(job)),
                               ("cat5", cat5_fingerprint(job))) if v is not None}
    return {"texts": texts, **extra} if extra else texts


def judge_texts_fingerprint(job: JobConfig) -> str | None:
    """The commit and hash of every official judge text the stage uses (protocol paper)."""
    if judge_protocol(job) != "paper":
        return None
    texts = official_judges(job)
    return official.fingerprint({f"{g}/{k}": t for g, m in texts.items() for k, t in m.items()})


def judge_identity(job: JobConfig) -> dict[str, Any]:
    """The judge's identity (config/identity.py: names, models, reply knobs and sampling, no
    connection settings) and the answer model's, which is the judge where a member's llm is
    null. `panel` lists every judge: the panel, else the one judge as a panel of one."""
    ident = identity(job.settings(JudgeSettings))
    ident["panel"] = ident.get("panel") or [{"name": ident["name"], "llm": ident["llm"]}]
    return {**ident, "answer_llm": identity(job.root.llm)}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

JUDGE_COMPLETION = 40  # one sentence of reasoning + label (judge.protocol=reasoned)
JUDGE_PAPER_COMPLETION = 8  # {"label": "CORRECT"} (judge.protocol=paper)
ANSWER_REPLY_TOKENS = 200  # the paper reader's reply the judge reads (judge.input=reply)


def judge_count(inp: EstimateInputs) -> int:
    """Judges of the panel (one without a panel): each gets every judged request."""
    s = inp.job.settings(JudgeSettings)
    return len(s.panel) if s.panel else 1


def estimate_judge(inp: EstimateInputs) -> StageEstimate:
    """An upper bound, exact unless an answer comes back empty (judged WRONG by rule, no
    request): one request per selected question but category 5 (scored by rule) per judge of
    the panel; prompts of the real LoCoMo judge template with a stand-in answer."""
    from structmem_gpu.eval.answer import AnswerSettings

    s = inp.job.settings(JudgeSettings)
    a = inp.job.settings(AnswerSettings)
    qs = inp.selected.filter(pl.col("category") != LOCOMO_ADVERSARIAL)
    judges = judge_count(inp)
    paper = s.protocol == "paper"
    build = judge_locomo_paper.build_messages if paper else judge_locomo.build_messages
    # judge.input=reply after the paper reader: the judge reads the reader's whole reply.
    whole = s.input == "reply" and a.protocol == "paper"
    reply_tokens = min(a.max_tokens, ANSWER_REPLY_TOKENS)
    stand_in = "word " * int(reply_tokens * 0.75) if whole else "a short generated answer"
    prompts = [build(q, ans or "", stand_in) for q, ans in qs.select("question", "answer").iter_rows()]
    prompt = sum(inp.counter.messages(m) for m in prompts)
    over = judges * sum(inp.over(m, s.max_tokens, judge=True) for m in prompts)
    comp = min(s.max_tokens, JUDGE_PAPER_COMPLETION if paper else JUDGE_COMPLETION)
    return StageEstimate(
        "judge", qs.height * judges, prompt * judges, qs.height * judges * comp,
        f"upper bound: 1 per selected question (category 5 by rule; an empty answer too) x "
        f"{judges} judge(s)",
        over if inp.checked else None, bound=True,
    )


# judgments is deliberately NOT an optional_read: it is this stage's own output, so hashing it
# would change the fingerprint after every run and the stage would never be skipped.
STAGE = Stage(
    name="judge",
    run=run_judge,
    reads=("questions", "answers"),
    # errata_judgments: empty unless eval.errata is set (eval/errata.py).
    writes=("judgments", "errata_judgments"),
    optional_reads=("retrievals", "entries", "syntheses"),
    settings=JudgeSettings,
    depends=("benchmark.name", "benchmark.categories", *LLM_IDENTITY),
    extra_fingerprint=_fingerprint,
    # 2: judge.protocol (paper judges by default), protocol column, cat-5 lexical rule.
    # 3: judge.input (the reply by default) and the judge_input column.
    version="3",
    uses=("judges",),
    estimate=estimate_judge,
)
