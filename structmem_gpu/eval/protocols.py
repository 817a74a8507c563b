"""One finished run scored under every published protocol of its benchmark.

    python jobs/report.py protocols RUN [--override prompts.sources.mem0=~/src/mem0.git@b3ede5b ...]

The run's existing answers (answers.parquet) are re-scored, never re-answered, under each
protocol the literature uses for its benchmark, and written to `report/protocols.md` and
`report/protocols.json`: per protocol the score over the same predictions, its bootstrap 95%
CI (report.bootstrap_*), n, per category, and the spread (max - min) across protocols.

- LoCoMo (and the LoCoMo-format sample): the judge text (mem0's `ACCURACY_PROMPT` and
  LightMem's copy of it, each with its own label parse, when `prompts.sources.mem0` /
  `.lightmem` are set; our paraphrase always) x the judge input (the whole reply / the
  extracted answer) x, only when the run answered category 5, category 5 by LoCoMo's rule or
  by the judge (gold "Not mentioned in the conversation", the option LoCoMo's own QA prompt
  offers for adversarial questions); plus LoCoMo's official F1, mem0's F1 and BLEU-1.
- LongMemEval: the official per-type judge of evaluate_qa.py (`prompts.sources.longmemeval`)
  and our paraphrase, each on the whole reply and on the extracted answer only.

Every judge call goes through the judge stage's own code (eval/judge.py: `judge_items`,
`judge_with`, the same request builder and label rules) on the run's first judge (or
`--judge NAME`) and through the response cache, so a second call sends no request; each
row records how many of its replies were sent (not cached). Nothing of the run is changed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import INPUTS, JudgeSettings
from structmem_gpu.core.artifacts import RunDir, atomic_write_text
from structmem_gpu.data.categories import CATEGORY_NAMES, LOCOMO_ADVERSARIAL
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval import judge as J
from structmem_gpu.eval.bootstrap import bootstrap_ci
from structmem_gpu.eval.metrics import lexical_scores
from structmem_gpu.eval.report import ReportSettings
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.types import Sampling
from structmem_gpu.prompts import official
from structmem_gpu.eval.prompts.answer_structmem import NOT_MENTIONED
from structmem_gpu.stage import Backends, StageContext, judge_key, judge_members

log = logging.getLogger(__name__)

# Gold answer the judge gets for a category-5 question under "category 5 by judge": LoCoMo's
# own QA prompt offers "(a) Not mentioned in the conversation" for adversarial questions; the
# file's adversarial_answer is the distractor, which a judge must not reward.
CAT5_JUDGE_GOLD = NOT_MENTIONED

# Who numbers categories how (protocols.md "Category numbering"): a per-category figure of one
# harness is comparable with another's only through these.
CATEGORY_NUMBERING: dict[str, str] = {
    "LoCoMo (snap-research task_eval)": "the file's ids: 1 multi-hop, 2 temporal, 3 open-domain, "
    "4 single-hop, 5 adversarial (our ids, data/categories.py)",
    "mem0 evaluation/ (evals.py, llm_judge.py)": "the file's ids as strings; skips '5'; the "
    "names a maintainer gives in mem0 #2609 contradict the file's counts: compare ids, not names",
    "LightMem experiments/locomo/search_locomo.py": "the file's ids (ints), --allow-categories; "
    "skips 5",
    "LongMemEval src/evaluation/evaluate_qa.py": "question_type strings; abstention = '_abs' in "
    "the question id (counted inside its type); ours: type ids 101-106",
}


@dataclass(frozen=True)
class Protocol:
    id: str
    kind: str  # judge | lexical
    used_by: str  # the harness / paper that scores this way
    judge_text: str | None = None  # mem0 | lightmem | longmemeval (official) | ours
    judge_input: str | None = None  # reply | answer (config/judge.py INPUTS)
    cat5: str | None = None  # rule | judge; None: the run answered no category-5 question
    metric: str | None = None  # f1_locomo | f1_mem0 | bleu1 (lexical rows)


def is_longmemeval(questions: pl.DataFrame) -> bool:
    return bool(questions["category"].is_in(list(J.LONGMEMEVAL_IDS)).any())


_USED_BY = {
    "mem0": "mem0 evaluation/metrics/llm_judge.py (b3ede5b)",
    "lightmem": "LightMem experiments/locomo/llm_judge.py (StructMem's numbers)",
    "longmemeval": "LongMemEval evaluate_qa.py",
    "ours": "this project's paraphrase (judge.protocol=paper without official texts)",
}


def protocols_for(
    longmemeval: bool, texts: Sequence[str], inputs: Sequence[str], has_cat5: bool
) -> list[Protocol]:
    """The protocol rows of a run: `texts` = judge texts available (official names + "ours"),
    `inputs` = judge inputs the run's answers allow."""
    out: list[Protocol] = []
    cat5s: tuple[str | None, ...] = ("rule", "judge") if has_cat5 and not longmemeval else (None,)
    for text in texts:
        for inp in inputs:
            for c5 in cat5s:
                pid = f"judge:{text}/{inp}" + (f"/cat5-{c5}" if c5 else "")
                out.append(Protocol(pid, "judge", _USED_BY[text], text, inp, c5))
    if not longmemeval:
        out += [
            Protocol("f1_locomo", "lexical", "LoCoMo task_eval/evaluation.py",
                     metric="f1_locomo"),
            Protocol("f1_mem0", "lexical", "mem0 / A-Mem evaluation/metrics/utils.py",
                     metric="f1_mem0"),
            Protocol("bleu1", "lexical", "mem0 / A-Mem evaluation/metrics/utils.py",
                     metric="bleu1"),
        ]
    return out


def official_texts(job: "JobConfig", longmemeval: bool) -> dict[str, J.OfficialJudges]:
    """Judge texts by name: each configured official one (read from prompts.sources.*) and
    "ours" (empty: the judge stage's paraphrase)."""
    out: dict[str, J.OfficialJudges] = {}
    if longmemeval:
        spec = official.source_spec(job, "longmemeval")
        if spec is not None:
            out["longmemeval"] = {"longmemeval": official.longmemeval_judges(spec)}
    else:
        mem0 = official.source_spec(job, "mem0")
        lightmem = official.source_spec(job, "lightmem")
        if mem0 is not None:
            t = official.locomo_judge(None, mem0)
            assert t is not None
            out["mem0"] = {"locomo": {"judge_locomo": t}}
        if lightmem is not None:
            t = official.locomo_judge(lightmem, None)
            assert t is not None
            out["lightmem"] = {"locomo": {"judge_locomo": t}}
    out["ours"] = {}
    return out


@dataclass
class Scored:
    protocol: Protocol
    values: list[float]  # per question, in question order (unjudged = 0, as judge_accuracy)
    unjudged: int = 0
    requests: int = 0
    sent: int = 0  # replies not served from the response cache
    # of those, replies that did not parse: the cache keeps only parsed replies, so these
    # are asked again on the next call (the project's rule for unparseable model output)
    sent_unparsed: int = 0


def _cat5_for_judge(item: J.JudgeItem) -> J.JudgeItem:
    if item.category != LOCOMO_ADVERSARIAL:
        return item
    return dataclasses.replace(item, gold=CAT5_JUDGE_GOLD)


def score_protocols(job: JobConfig, run_dir: Path, judge: str | None = None
                    ) -> tuple[pl.DataFrame, list[Scored], dict[str, Any]]:
    """(the scored questions, one Scored per protocol, context for the report) of the run's
    configuration (jobs/report.py reads it)."""
    run = RunDir(run_dir)
    answers = run.read_table("answers", needed_by="protocols")
    questions = selected_questions(job, run.read_table("questions", needed_by="protocols"))
    questions = questions.filter(pl.col("question_id").is_in(answers["question_id"].to_list()))
    if questions.height == 0:
        raise StructMemError(f"{run.table_path('answers')}: no answer to a selected question")
    lme = is_longmemeval(questions)
    has_cat5 = bool((questions["category"] == LOCOMO_ADVERSARIAL).any())
    inputs = [i for i in INPUTS if i != "reply" or "reply" in answers.columns]
    texts = official_texts(job, lme)
    protocols = protocols_for(lme, list(texts), inputs, has_cat5)

    members = judge_members(job)
    if not members:
        raise StructMemError("protocols: the config has no judge")
    names = [n for n, _ in members]
    if judge is not None and judge not in names:
        raise StructMemError(f"protocols: --judge {judge!r} is not a judge of the run ({names})")
    name, llm_cfg = next(m for m in members if m[0] == (judge or names[0]))
    s = job.settings(JudgeSettings)
    samp = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)

    items_by_input = {inp: J.judge_items(questions, answers, inp) for inp in inputs}
    out: list[Scored] = []
    with Backends(job, run) as backends:
        ctx = StageContext(job, run, J.STAGE, backends)
        backend = None
        for p in protocols:
            if p.kind == "lexical":
                items = items_by_input[inputs[-1]]
                vals = [getattr(lexical_scores(it.prediction, it.gold, it.category), p.metric)
                        or 0.0 for it in items]
                out.append(Scored(p, [float(v) for v in vals]))
                continue
            if backend is None:
                backend = backends.llm(judge_key(name, llm_cfg), llm_cfg)
            assert p.judge_input is not None and p.judge_text is not None
            items = items_by_input[p.judge_input]
            llm_cat5 = p.cat5 == "judge"
            if llm_cat5:
                items = [_cat5_for_judge(it) for it in items]
            before = len(ctx.request_frames)
            verdicts = J.judge_with(ctx, name, backend, items, samp, "paper",
                                    texts[p.judge_text], llm_cat5)
            frames = ctx.request_frames[before:]
            reqs = pl.concat(frames) if frames else None
            labels = [v[2] for v in verdicts]
            fresh = None if reqs is None else reqs.filter(~pl.col("cache_hit").fill_null(False))
            out.append(Scored(
                p, [1.0 if lab else 0.0 for lab in labels],
                unjudged=sum(lab is None for lab in labels),
                requests=0 if reqs is None else reqs.height,
                sent=0 if fresh is None else fresh.height,
                sent_unparsed=0 if fresh is None
                else int((~fresh["parse_ok"].fill_null(False)).sum()),
            ))
    context = {
        "run": str(run_dir),
        "benchmark": "longmemeval" if lme else "locomo",
        "judge_name": name,
        "judge_model": getattr(backend, "model_id", None),
        "judge_sampling": dataclasses.asdict(samp),
        "official_texts": {k: official.records({f"{g}/{u}": t for g, grp in v.items()
                                                for u, t in grp.items()})
                           for k, v in texts.items() if v},
        "category_5": "answered" if has_cat5 else "not answered (no cat-5 protocols)",
        "cat5_judge_gold": CAT5_JUDGE_GOLD if has_cat5 and not lme else None,
    }
    return questions, out, context


def summarise(questions: pl.DataFrame, scored: Sequence[Scored], st: ReportSettings
              ) -> dict[str, Any]:
    """protocols.json: per protocol its score, CI, n and per category; the spread per kind."""
    cats = questions["category"].to_list()
    rows: list[dict[str, Any]] = []
    for sc in scored:
        ci = bootstrap_ci(sc.values, resamples=st.bootstrap_resamples, seed=st.bootstrap_seed)
        by_cat: dict[str, Any] = {}
        for c in sorted(set(cats)):
            v = [x for x, k in zip(sc.values, cats) if k == c]
            by_cat[str(c)] = {"name": CATEGORY_NAMES.get(c, str(c)), "n": len(v),
                              "score": sum(v) / len(v)}
        rows.append({
            **dataclasses.asdict(sc.protocol),
            "n": len(sc.values),
            "score": sum(sc.values) / len(sc.values) if sc.values else None,
            "ci95": list(ci) if ci else None,
            "unjudged": sc.unjudged if sc.protocol.kind == "judge" else None,
            "requests": sc.requests,
            "sent": sc.sent,
            "sent_unparsed": sc.sent_unparsed,
            "by_category": by_cat,
        })
    spread: dict[str, Any] = {}
    for kind in ("judge", "lexical"):
        group = [r for r in rows if r["kind"] == kind and r["score"] is not None]
        if group:
            lo = min(group, key=lambda r: r["score"])
            hi = max(group, key=lambda r: r["score"])
            spread[kind] = {"spread": hi["score"] - lo["score"], "min": lo["id"], "max": hi["id"]}
    return {"protocols": rows, "spread": spread,
            "requests_sent": sum(r["sent"] for r in rows),
            "requests_sent_unparsed": sum(r["sent_unparsed"] for r in rows),
            "bootstrap_resamples": st.bootstrap_resamples, "bootstrap_seed": st.bootstrap_seed,
            "category_numbering": CATEGORY_NUMBERING}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(summary: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    rows = summary["protocols"]
    lines = [
        f"# One run under every published protocol ({context['benchmark']})",
        "",
        (f"Run `{context['run']}`; judge `{context['judge_name']}` "
         f"({context.get('judge_model')}). The same predictions scored under each protocol; "
         f"95% CI: percentile bootstrap over questions ({summary['bootstrap_resamples']} "
         f"resamples, seed {summary['bootstrap_seed']}). Unjudged replies count as wrong."),
        "",
        "| protocol | used by | n | score (%) | 95% CI | unjudged | sent |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        ci = "–" if not r["ci95"] else f"[{_pct(r['ci95'][0])}, {_pct(r['ci95'][1])}]"
        unj = "–" if r["unjudged"] is None else str(r["unjudged"])
        lines.append(f"| `{r['id']}` | {r['used_by']} | {r['n']} | {_pct(r['score'])} | {ci} "
                     f"| {unj} | {r['sent']} |")
    cats = sorted({c for r in rows for c in r["by_category"]}, key=int)
    if cats:
        lines += ["", "By category (score %, n):", "",
                  "| protocol | " + " | ".join(
                      f"{c} {rows[0]['by_category'].get(c, {}).get('name', '')}" for c in cats)
                  + " |",
                  "|---|" + "---:|" * len(cats)]
        for r in rows:
            cells = [f"{_pct(r['by_category'][c]['score'])} ({r['by_category'][c]['n']})"
                     if c in r["by_category"] else "–" for c in cats]
            lines.append(f"| `{r['id']}` | " + " | ".join(cells) + " |")
    lines += ["", "Spread (max - min over the same predictions):", ""]
    for kind, sp in summary["spread"].items():
        lines.append(f"- {kind}: {_pct(sp['spread'])} points (`{sp['min']}` .. `{sp['max']}`)")
    cat5 = f"- Category 5: {context['category_5']}."
    if context.get("cat5_judge_gold"):
        cat5 += (f" Under `cat5-judge` the judge compares with \"{context['cat5_judge_gold']}\"; "
                 "under `cat5-rule` LoCoMo's rule (the answer says \"not mentioned\" / \"no "
                 "information available\") decides, no call.")
    lines += ["", "## Notes", "",
              ("- `judge:TEXT/INPUT[/cat5-RULE]`: TEXT = the judge wording (mem0 / lightmem / "
               "longmemeval: the official text read from prompts.sources.*, each with its own "
               "label parse; ours = our paraphrase), INPUT = what the judge reads (reply = the "
               "reader's whole reply, answer = the extracted answer)."),
              cat5,
              ("- Lexical rows score the extracted answer over the run's categories (category 5 "
               "by LoCoMo's rule); mem0's and LightMem's scripts skip category 5."),
              (f"- Requests: {summary['requests_sent']} sent (of which "
               f"{summary['requests_sent_unparsed']} replies did not parse, and are asked again "
               "next time), the rest from the response cache."),
              "", "### Category numbering", ""]
    lines += [f"- {who}: {how}" for who, how in summary["category_numbering"].items()]
    return "\n".join(lines) + "\n"


def write_protocols(job: JobConfig, run_dir: Path, out: Path | None = None,
                    judge: str | None = None) -> dict[str, Any]:
    """Score, then write protocols.md / .json (default RUN/report/); returns the summary."""
    questions, scored, context = score_protocols(job, run_dir, judge)
    summary = summarise(questions, scored, job.settings(ReportSettings))
    summary["context"] = context
    out_dir = out or RunDir(run_dir).report_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "protocols.json", json.dumps(summary, indent=2, default=str))
    atomic_write_text(out_dir / "protocols.md", markdown(summary, context))
    summary["paths"] = {"md": str(out_dir / "protocols.md"),
                        "json": str(out_dir / "protocols.json")}
    return summary
