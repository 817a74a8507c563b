"""Stage `report`: report/report.json + report/report.md (+ LongMemEval hypotheses export).

    python jobs/run.py stages=[report] hydra.run.dir=DIR

Reads questions, answers, judgments (requests and the manifest for rates and cost) and writes
no tables. report.json (docs/design.md "Run directory contract"; scores in [0, 1]):

    {"overall": {"name": "overall", "n": 12, "judge_accuracy": 0.5,
                 "judge_accuracy_ci95": [0.25, 0.75], "f1_locomo": 0.41, "f1_mem0": 0.38,
                 "bleu1": 0.30, "evidence_recall": 0.66},
     "by_category": {"4": {...}}, "unjudged": 1, "judge": "same_as_llm", "by_judge": {...},
     "category_names": {"1": "multi-hop", ...}, "judge_models": {"same_as_llm": ["smollm2|…"]},
     "parse_failure_rate": {"extract": 0.02, "answer": 0.0}, "truncation_rate": {...},
     "build_cost": {"extract": {"calls": 40, "cache_hits": 0, "prompt_tokens": …, "wall_s": …}}, …}

n = scored questions; `judge_accuracy` counts an unjudged reply (label null) as wrong, as the
published pipelines do, `judge_accuracy_judged` averages the judged ones only, and `unjudged`
counts the difference, per category and overall. F1/BLEU-1 average every answer of the group,
evidence recall the questions with resolvable evidence. `protocols` names the answer and
judge protocols the run used; `published` lists only rows whose every fixed setting matches
(eval/published.py), and `published_notes` the note of each row the run matched only as a
configuration the row is shown beside (e.g. "paper text configuration, number from the
code's"), which every view of the row prints beside its label. When any LLM stage's parse-failure rate exceeds
`report.max_parse_failure_rate`, the files are written first and then StructMemError is
raised, so a broken prompt is never reported as a low score.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import atomic_write_text
from structmem_gpu.data.categories import (
    CATEGORY_NAMES,
    LOCOMO_ADVERSARIAL,
    LOCOMO_CATEGORIES,
    LONGMEMEVAL_TYPES,
)
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval.bootstrap import bootstrap_ci, cluster_bootstrap_ci, min_detectable_difference
from structmem_gpu.eval.answer import answer_protocol
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.eval.judge import judge_identity, judge_protocol
from structmem_gpu.eval.published import (
    config_fact,
    harness_run,
    load_published,
    match_notes,
    matching_rows,
    run_categories,
    shown_label,
)
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.config.schema import ReportSettings  # the root node report: (config/schema.py)
from structmem_gpu.core.stage_parts import REPORT
from structmem_gpu.stage import Stage, StageContext

log = logging.getLogger(__name__)

LONGMEMEVAL_IDS = frozenset(LONGMEMEVAL_TYPES.values())
COST_KEYS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "wall_s")


# ---- scores ---------------------------------------------------------------------------------
def _mean(s: pl.Series) -> float | None:
    s = s.drop_nulls()
    return float(s.mean()) if s.len() else None  # type: ignore[arg-type]


def group_summary(rows: pl.DataFrame, name: str, st: ReportSettings) -> dict[str, Any]:
    """The contract block of one group (one judge's rows of a category, or of all categories).

    An unjudged row (label null: the judge's reply had no readable label) counts as WRONG in
    `judge_accuracy` and its CI, as in the published pipelines (docs/evaluation.md "Judge
    protocols");
    `judge_accuracy_judged` leaves it out, and `unjudged` counts it. n = every scored row.
    """
    scored = rows["label"].fill_null(False).cast(pl.Float64)
    judged = rows["label"].drop_nulls().cast(pl.Float64)
    ci = bootstrap_ci(scored.to_list(), resamples=st.bootstrap_resamples, seed=st.bootstrap_seed)
    convs = rows["conv_id"].to_list() if "conv_id" in rows.columns else None
    conv_ci = None if convs is None else cluster_bootstrap_ci(
        scored.to_list(), convs, resamples=st.bootstrap_resamples, seed=st.bootstrap_seed)
    acc = float(scored.mean()) if scored.len() else None  # type: ignore[arg-type]
    return {
        "name": name,
        "n": scored.len(),
        "judge_accuracy": acc,
        "judge_accuracy_ci95": list(ci) if ci else None,
        # Every interval names what it resamples (docs/evaluation.md "Intervals"): questions as
        # if independent, and whole conversations (LoCoMo's 10; a LongMemEval question is its
        # own haystack, so there the two coincide).
        "judge_accuracy_ci95_unit": "questions",
        "judge_accuracy_ci95_conversations": list(conv_ci) if conv_ci else None,
        "conversations": None if convs is None else len(set(convs)),
        # The smallest paired difference detectable at this n (alpha 0.05, power 0.8) against a
        # run of the same accuracy whose errors are independent of this one's (discordant
        # share 2p(1-p)); a sweep's observed differences are checked against their own pairs.
        "mde_paired": None if acc is None else min_detectable_difference(scored.len(), 2 * acc * (1 - acc)),
        "judge_accuracy_judged": (
            float(judged.mean()) if judged.len() else None  # type: ignore[arg-type]
        ),
        "unjudged": int(rows["label"].is_null().sum()),
        "f1_locomo": _mean(rows["f1_locomo"]),
        "f1_mem0": _mean(rows["f1_mem0"]),
        "bleu1": _mean(rows["bleu1"]),
        "evidence_recall": _mean(rows["evidence_recall"]),
    }


def longmemeval_summary(rows: pl.DataFrame) -> dict[str, Any]:
    """Overall (micro), task-averaged (unweighted over types) and abstention accuracy (§3.5).

    An unjudged reply counts as "no", as in evaluate_qa.py's substring rule.
    """
    scored = rows.with_columns(pl.col("label").fill_null(False).cast(pl.Float64).alias("_s"))
    per_type = scored.group_by("category").agg(pl.col("_s").mean().alias("acc"))
    abst = scored.filter(pl.col("is_abstention"))
    return {
        "overall_accuracy": _mean(scored["_s"]),
        "overall_n": scored.height,
        "task_averaged_accuracy": _mean(per_type["acc"]),
        "task_averaged_types": per_type.height,
        "abstention_accuracy": _mean(abst["_s"]),
        "abstention_n": abst.height,
        "unjudged": int(rows["label"].is_null().sum()),
    }


def judge_summary(
    rows: pl.DataFrame, names: Mapping[int, str], st: ReportSettings
) -> dict[str, Any]:
    """overall / by_category / unjudged (+ LongMemEval and non-adversarial totals) of one judge."""
    by_cat = {
        str(c): group_summary(rows.filter(pl.col("category") == c), names.get(c, str(c)), st)
        for c in sorted(rows["category"].unique().to_list())
    }
    out: dict[str, Any] = {
        "overall": group_summary(rows, "overall", st),
        "by_category": by_cat,
        "unjudged": int(rows["label"].is_null().sum()),
        "judge_models": sorted(rows["judge_model"].unique().drop_nulls().to_list()),
    }
    cats = set(rows["category"].to_list())
    if LOCOMO_ADVERSARIAL in cats and len(cats) > 1:
        # The Mem0-style headline leaves category 5 out; SEEM-style totals keep it
        # (docs/methods.md "SEEM: scoring scope").
        out["overall_without_adversarial"] = group_summary(
            rows.filter(pl.col("category") != LOCOMO_ADVERSARIAL), "overall without adversarial", st
        )
    if cats & LONGMEMEVAL_IDS:
        out["longmemeval"] = longmemeval_summary(rows)
    return out


def headline_judge(job: JobConfig, present: Sequence[str]) -> str | None:
    """The first configured judge (panel order) that has rows, else the first judge present."""
    j = job.settings(JudgeSettings) if job.has("judge") else None
    configured = [m.name for m in j.panel] if j and j.panel else [j.name if j else ""]
    for name in configured:
        if name in present:
            return name
    return present[0] if present else None


# ---- LLM stage quality and cost --------------------------------------------------------------
def stage_rates(
    requests: pl.DataFrame | None, answers: pl.DataFrame, judgments: pl.DataFrame | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-stage parse-failure and truncation rates, from requests.parquet, except:

    - answer: answers.parquet (failed request or empty reply; free text always "parses");
    - judge: the share of LLM-judged rows without a readable label (what the scores lose; the
      lenient label reader recovers some schema failures), for all judges together and, with
      several judges, per judge as "judge:<name>" (requests.parquet keeps only the last run's).
    """
    parse: dict[str, float] = {}
    trunc: dict[str, float] = {}
    if requests is not None and requests.height:
        agg = requests.group_by("stage", maintain_order=True).agg(
            (~pl.col("parse_ok").fill_null(False)).cast(pl.Float64).mean().alias("p"),
            (pl.col("finish_reason") == "length")
            .fill_null(False)
            .cast(pl.Float64)
            .mean()
            .alias("t"),
        )
        for stage, p, t in agg.iter_rows():
            parse[stage], trunc[stage] = float(p), float(t)
    if answers.height:
        parse["answer"] = _mean((~answers["parse_ok"].fill_null(False)).cast(pl.Float64)) or 0.0
    if judgments is not None:
        parse.update(judge_failure_rates(judgments))
    return parse, trunc


def over_context_counts(requests: pl.DataFrame | None) -> dict[str, int]:
    """Requests per stage that were not sent because they exceed the model's context
    (llm/context_guard.py); stages without any are left out."""
    from structmem_gpu.llm.context_guard import OVER_CONTEXT

    if requests is None or not requests.height:
        return {}
    over = requests.filter(pl.col("finish_reason") == OVER_CONTEXT)
    per_stage = over.group_by("stage", maintain_order=True).len()
    return {str(s): int(n) for s, n in per_stage.iter_rows()}


def judge_failure_rates(judgments: pl.DataFrame) -> dict[str, float]:
    asked = judgments.filter(~pl.col("judge_model").str.starts_with("rule:"))
    if asked.height == 0:
        return {}
    unjudged = pl.col("label").is_null().cast(pl.Float64).mean()
    out = {"judge": float(asked.select(unjudged).item())}
    per = asked.group_by("judge_name", maintain_order=True).agg(unjudged.alias("u"))
    if per.height > 1:
        out.update({f"judge:{name}": float(u) for name, u in per.iter_rows()})
    return out


def build_costs(
    manifest: Mapping[str, Any], requests: pl.DataFrame | None, order: Sequence[str]
) -> dict[str, Any]:
    """build_cost[stage] from the manifest; stages only in requests.parquet get token sums."""
    stages = manifest.get("stages", {})
    names = [s for s in order if s in stages] + sorted(s for s in stages if s not in order)
    out: dict[str, Any] = {}
    for name in names:
        cost = stages[name].get("build_cost") or {}
        out[name] = {k: cost.get(k, 0 if k != "wall_s" else None) for k in COST_KEYS}
    if requests is not None:
        for (stage,), df in requests.group_by(["stage"], maintain_order=True):
            if stage not in out:
                out[stage] = {
                    "calls": df.height,
                    "cache_hits": int(df["cache_hit"].fill_null(False).sum()),
                    "prompt_tokens": int(df["prompt_tokens"].fill_null(0).sum()),
                    "completion_tokens": int(df["completion_tokens"].fill_null(0).sum()),
                    "wall_s": None,
                }
    out["total"] = {k: sum((v.get(k) or 0) for v in out.values()) for k in COST_KEYS}
    return out


# ---- assembly --------------------------------------------------------------------------------
def scored_rows(questions: pl.DataFrame, judgments: pl.DataFrame) -> pl.DataFrame:
    q = questions.select("question_id", "conv_id", "category", "category_name", "is_abstention")
    return judgments.join(q, on="question_id", how="inner")


def split_forced_choice(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the rows every overall counts, the eval.cat5=forced_choice category-5 rows, which are
    reported on their own and in no overall: eval/cat5_choice.py)."""
    from structmem_gpu.eval.cat5_choice import RULE

    choice = pl.col("judge_model") == RULE
    return rows.filter(~choice), rows.filter(choice)


def category_names(questions: pl.DataFrame) -> dict[str, str]:
    """The benchmark family's full id -> name mapping, plus any name the questions carry."""
    cats = set(questions["category"].to_list())
    family = dict(LONGMEMEVAL_TYPES) if cats & LONGMEMEVAL_IDS else {}
    base = {v: k for k, v in family.items()} if family else dict(LOCOMO_CATEGORIES)
    for c, n in questions.select("category", "category_name").unique().iter_rows():
        base[int(c)] = n or CATEGORY_NAMES.get(int(c), str(c))
    return {str(k): v for k, v in sorted(base.items())}


def build_report(
    job: JobConfig,
    questions: pl.DataFrame,
    answers: pl.DataFrame,
    judgments: pl.DataFrame,
    requests: pl.DataFrame | None,
    manifest: Mapping[str, Any],
    st: ReportSettings,
) -> dict[str, Any]:
    names = {int(k): v for k, v in category_names(questions).items()}
    rows, choice = split_forced_choice(scored_rows(questions, judgments))
    judges = list(dict.fromkeys(rows["judge_name"].to_list() + choice["judge_name"].to_list()))
    by_judge = {j: judge_summary(rows.filter(pl.col("judge_name") == j), names, st) for j in judges}
    head = headline_judge(job, judges)
    empty = judge_summary(rows.clear(), names, st)
    main = by_judge[head] if head else empty
    parse, trunc = stage_rates(requests, answers, rows)
    order = list(job.root.method.stages)
    report: dict[str, Any] = {
        "benchmark": str(config_fact(job, "benchmark")),
        "method": str(config_fact(job, "method")),
        "config_hash": manifest.get("config_hash"),
        "categories": sorted(int(c) for c in questions["category"].unique().to_list()),
        "questions": questions.height,
        "judge": head,
        "overall": main["overall"],
        "by_category": main["by_category"],
        "unjudged": main["unjudged"],
        "by_judge": by_judge,
        "judge_models": {j: s["judge_models"] for j, s in by_judge.items()},
        "category_names": {str(k): v for k, v in sorted(names.items())},
        "parse_failure_rate": parse,
        "truncation_rate": trunc,
        "over_context": over_context_counts(requests),
        "build_cost": build_costs(manifest, requests, order),
        "evidence_recall_excluded": int(
            rows.filter(pl.col("judge_name") == head)["evidence_recall"].is_null().sum()
        )
        if head
        else 0,
        "protocols": run_protocols(job, manifest),
        "category_scope": list(run_categories(job)),
        "published": [r.id for r in matching_rows(job)],
        "published_notes": match_notes(job),
        "published_excluded": harness_run(job),
        # llm.structure_only: the profile's model tests the pipeline's structure only
        # (CPU and scripted profiles); report.md and the closing table open by saying so.
        "structure_only": bool(job.root.llm.structure_only),
        "weights": list(manifest.get("weights") or []),  # per role: repository, revision, snapshot
        "settings": {
            "bootstrap_resamples": st.bootstrap_resamples,
            "bootstrap_seed": st.bootstrap_seed,
            "ci_level": 0.95,
            "max_parse_failure_rate": st.max_parse_failure_rate,
        },
    }
    for key in ("overall_without_adversarial", "longmemeval"):
        if key in main:
            report[key] = main[key]
    has_cat5 = LOCOMO_ADVERSARIAL in set(questions["category"].to_list())
    report["category_5_rule"] = (None if not has_cat5 else
                                 "forced_choice" if choice.height else "rule")
    if choice.height:
        report["category_5_forced_choice"] = {
            j: group_summary(choice.filter(pl.col("judge_name") == j), "adversarial (forced "
                             "choice)", st) for j in dict.fromkeys(choice["judge_name"].to_list())}
    from structmem_gpu.eval.judge_audit import compact, run_audits

    # The judge's own error rates where an audit of its identity is stored (eval/judge_audit.py).
    audits = run_audits(job) if job.has("judge") else {}
    report["judge_audit"] = {j: compact(audits.get(j)) for j in judges}
    return report


def errata_section(job: JobConfig, questions: pl.DataFrame, judgments: pl.DataFrame,
                   errata: pl.DataFrame | None, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """report.json `errata` (eval/errata.py) when the judge stage scored corrected golds."""
    if errata is None or errata.height == 0:
        return None
    from structmem_gpu.eval.errata import summary

    names = {int(k): v for k, v in category_names(questions).items()}
    notes = ((manifest.get("stages") or {}).get("judge") or {}).get("notes") or {}
    rows, _ = split_forced_choice(scored_rows(questions, judgments))  # the overall's rows
    return summary(rows, errata, names, notes.get("errata_source"))


def run_protocols(job: JobConfig, manifest: Mapping[str, Any]) -> dict[str, str]:
    """{"answer": ..., "judge": ..., "judge_input": reply | answer, "texts": official: ... |
    ours, and "qa_store" where the offline update ran}: what each stage recorded in the
    manifest, else the config (a judge entry without judge_input judged the answer)."""
    stages = manifest.get("stages") or {}
    out = {}
    for stage, default in (("answer", answer_protocol(job)), ("judge", judge_protocol(job))):
        notes = (stages.get(stage) or {}).get("notes") or {}
        out[stage] = str(notes.get("protocol") or default)
    judge_notes = (stages.get("judge") or {}).get("notes")
    configured = job.settings(JudgeSettings).input  # no judge node: the model's default, reply
    out["judge_input"] = str(judge_notes.get("judge_input") or "answer") if judge_notes \
        else configured
    from structmem_gpu.prompts.official import texts_protocol

    out["texts"] = texts_protocol(job)  # official checkouts (commits) or our own wording
    update = (stages.get("update") or {}).get("notes")
    if update is not None:  # the offline update ran: which store QA read (update.read)
        # The update stage records its own settings in its notes (its settings class lives in
        # methods/, a layer above eval); `read` is among them, so a change reruns it.
        read = str(update.get("read"))
        keeps = read == "pre" or bool(update.get("post_syntheses"))
        out["qa_store"] = (f"{read}-update ({'with' if keeps else 'without'} syntheses; "
                           f"update {'on' if update.get('enabled') else 'off'})")
    # The reference's pre-processing, named only when its stages ran (docs/methods.md "Compression and
    # topic segmentation").
    comp = (stages.get("compress") or {}).get("notes")
    if comp:
        out["compression"] = (f"LLMLingua-2 {comp.get('model')} at rate {comp.get('rate')}: "
                              f"{comp.get('tokens_in')} -> {comp.get('tokens_out')} o200k tokens")
    seg = (stages.get("segment") or {}).get("notes")
    if seg:
        out["segmentation"] = (f"topic segmentation: {seg.get('segments')} segments in "
                               f"{seg.get('batches')} extraction batches "
                               f"({seg.get('cross_session_batches')} spanning sessions, "
                               f"{seg.get('lost_turns')} turns lost at the last cut)")
    return out


def hypotheses_jsonl(
    questions: pl.DataFrame, answers: pl.DataFrame, judge_input: str = "answer"
) -> str:
    """LongMemEval's evaluate_qa.py input: one {"question_id", "hypothesis"} per line; the
    hypothesis is what our judge saw (judge.input: the whole reply, or the prediction)."""
    column = "reply" if judge_input == "reply" and "reply" in answers.columns else "prediction"
    preds = dict(answers.select("question_id", column).iter_rows())
    lines = [
        json.dumps({"question_id": q, "hypothesis": preds.get(q) or ""}, ensure_ascii=False)
        for q in questions["question_id"].to_list()
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def check_parse_failures(rates: Mapping[str, float], limit: float) -> None:
    bad = {s: r for s, r in rates.items() if r > limit}
    if bad:
        worst = max(bad, key=lambda s: bad[s])
        listed = ", ".join(f"'{s}' {r:.1%}" for s, r in bad.items())
        raise StructMemError(
            f"stage '{worst}' parse failure rate {bad[worst]:.1%} exceeds "
            f"report.max_parse_failure_rate={limit:.0%} (stages over the limit: {listed}); the "
            f"report files were written, but the scores would reflect broken output, not memory "
            f"quality: check that stage's prompt/max_tokens"
        )


# What the rates and costs read of requests.parquet: never the replies (a LongMemEval-M run
# has a million rows; their texts would be most of the report's memory).
REQUEST_COLUMNS = ("request_id", "stage", "conv_id", "parse_ok", "finish_reason", "cache_hit",
                   "prompt_tokens", "completion_tokens")


def run_report(ctx: StageContext) -> dict[str, pl.DataFrame]:
    from structmem_gpu.eval.report_md import render_markdown

    job, st = ctx.job, ctx.settings
    questions = selected_questions(job, ctx.read("questions"))
    answers, judgments = ctx.read("answers"), ctx.read("judgments")
    requests = ctx.read_optional("requests", REQUEST_COLUMNS)
    from structmem_gpu.eval.audit import audit_markdown, audit_summary

    manifest = ctx.run.load_manifest()
    report = build_report(job, questions, answers, judgments, requests, manifest, st)
    errata = errata_section(job, questions, judgments, ctx.read_optional("errata_judgments"),
                            manifest)
    if errata is not None:  # eval.errata: corrected golds beside the official ones
        report["errata"] = errata
    system = system_summary(ctx.read_optional("system_units"),
                            ctx.read_optional("system_search_units"), manifest)
    if system:  # a baseline system run from its own code (structmem_gpu/systems/)
        report["system"] = system
    audit = audit_summary(ctx.run.root, resamples=st.bootstrap_resamples, seed=st.bootstrap_seed)
    if audit:  # fidelity audits ran (stages audit_*): their rates go into both reports
        report["audit"] = audit
    out = ctx.run.report_dir
    atomic_write_text(out / "report.json", json.dumps(report, indent=2, sort_keys=False) + "\n")
    published = matching_rows(job)
    markdown = render_markdown(report, published)
    if errata is not None:
        from structmem_gpu.eval.errata import markdown as errata_markdown

        markdown += "\n" + "\n".join(errata_markdown(errata, report["judge"]))
    markdown += ("\n" + audit_markdown(audit)) if audit else ""
    atomic_write_text(out / "report.md", markdown)
    if "longmemeval" in report:
        atomic_write_text(
            out / "longmemeval_hypotheses.jsonl",
            hypotheses_jsonl(questions, answers, report["protocols"]["judge_input"]),
        )
    figures = []
    if st.plots:  # report/*.png (eval/plots.py)
        from structmem_gpu.eval.plots import write_run_plots

        figures = write_run_plots(ctx.run.root, job)
    from structmem_gpu.eval.html import write_run_page  # report/index.html, after the figures

    notes = report.get("published_notes")
    write_run_page(ctx.run.root, report, markdown,
                   [{"label": shown_label(r, notes), "source": f"{r.source}; judge {r.judge_model}",
                     "overall": r.overall} for r in published], figures)
    ctx.notes.update(
        judge=report["judge"],
        n=report["overall"]["n"],
        unjudged=report["unjudged"],
        protocols=report["protocols"],
    )
    log.info("report: %s", out / "report.md")
    check_parse_failures(report["parse_failure_rate"], st.max_parse_failure_rate)
    return {}


def system_summary(build: pl.DataFrame | None, search: pl.DataFrame | None,
                   manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a baseline system kept, lost and failed on, per conversation (system_units)."""
    if build is None:
        return None
    notes = ((manifest.get("stages") or {}).get("system_build") or {}).get("notes") or {}
    where: dict[str, int] = {}
    for drops in [*build["drops"].to_list(),
                  *(search["drops"].to_list() if search is not None else [])]:
        for d in json.loads(drops or "[]"):
            key = f"{d.get('where')}: {d.get('why')}"
            where[key] = where.get(key, 0) + 1
    failed = [{"conv_id": c, "phase": p, "error": e}
              for frame in (build, search) if frame is not None
              for c, p, e in frame.filter(pl.col("status") == "error")
              .select("conv_id", "phase", "error").iter_rows()]
    return {
        "system": notes.get("system"), "version": notes.get("version"),
        "conversations": build.height,
        "memories": int(build["memories"].sum() or 0),
        "dropped": int(build["dropped"].sum() or 0),
        "dropped_by_conversation": {c: int(n) for c, n in build.select("conv_id", "dropped").iter_rows()},
        # what a search lost (Mem0^g: relations of a question whose entity reply was unusable)
        "search_dropped": int(search["dropped"].sum() or 0) if search is not None else 0,
        "drops": where,
        "failed": failed,
    }


def _report_fingerprint(job: JobConfig) -> Any:
    keys = sorted({k for r in load_published() if r.match for k in r.match})  # beside: a subset
    keys += ["llm.backend", "debug_profile", "answer.protocol"]
    out = {"published": {k: config_fact(job, k) for k in keys}, "judge": judge_identity(job)}
    from structmem_gpu.eval.judge_audit import run_audits

    # A judge audit stored since the last report shows in the next one (only when one exists,
    # so the fingerprint of a run without audits is what it was).
    audits = {n: (a["key"], a["slice"]["name"]) for n, a in run_audits(job).items() if a}
    if audits:
        out["judge_audit"] = audits
    return out


STAGE = Stage(
    name="report",
    run=run_report,
    reads=("questions", "answers", "judgments"),
    writes=(),
    optional_reads=("requests", "retrievals", "audit_extraction", "audit_consolidation",
                    "errata_judgments", "system_units", "system_search_units"),
    settings=ReportSettings,
    depends=("benchmark.name", "benchmark.categories", "method.name", "method.stages"),
    extra_fingerprint=_report_fingerprint,
    # 2: unjudged counted as wrong; judge_accuracy_judged / unjudged per group; protocols.
    # 3: protocols.judge_input; LongMemEval hypotheses follow it.
    # 4: protocols.texts (official checkouts or ours) and protocols.qa_store (offline update).
    version="4",
    uses=(),
    part=REPORT,  # reads the questions but answers none: neither a build nor a question cost
)
