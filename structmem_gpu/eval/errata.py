"""LoCoMo scored against corrected golds, beside the official ones (`eval.errata=CHECKOUT`).

    python jobs/run.py benchmark=locomo benchmark.path=FILE eval.errata=~/src/locomo-audit

dial481/locomo-audit's errors.json (read at run time, never copied: CC BY-NC 4.0) lists 156
gold-answer problems of LoCoMo's categories 1-4. By `error_type`:

- score-changing (HALLUCINATION, TEMPORAL_ERROR, ATTRIBUTION_ERROR, INCOMPLETE): the gold is
  wrong; the corrected score judges the run's answer again against `correct_answer` (same judge,
  protocol, judge input and request builder as the judge stage) and uses that label;
- AMBIGUOUS: reported (listed, counted in the ceiling), never applied;
- WRONG_CITATION (citation-only): the gold stands; only evidence recall's corrected column
  uses `correct_evidence` (so do the applied score-changing entries).

The official score (judgments.parquet, report.json `overall`) is never touched: a run with
errata and one without have the same official column. Entries are joined to our questions by
question text within their conversation (the audit's conversation index -> sample_id through
its own data/locomo10.json), and every entry of a conversation the run holds must find exactly
one question, else the stage stops naming the entry. The judge stage writes one
`errata_judgments` row per (joined entry among the selected questions, judge); the report adds
`errata` (official and corrected judge accuracy per judge and category, the official golds'
ceiling, the affected questions) to report.json and report.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import EvalSettings
from structmem_gpu.core.errors import ConfigError, InputError
from structmem_gpu.core.hashing import stable_hash
from structmem_gpu.eval import locomo_audit as LA
from structmem_gpu.prompts import sources as S

KEY = "eval.errata"
SCORE, AMBIGUOUS, CITATION = "score", "ambiguous", "citation"
# error_type -> what it changes (module docstring).
KINDS: Mapping[str, str] = {
    "HALLUCINATION": SCORE, "TEMPORAL_ERROR": SCORE, "ATTRIBUTION_ERROR": SCORE,
    "INCOMPLETE": SCORE, "AMBIGUOUS": AMBIGUOUS, "WRONG_CITATION": CITATION,
}

ERRATA_COLUMNS = {
    "question_id": pl.String(),
    "judge_name": pl.String(),
    "audit_id": pl.String(),
    "error_type": pl.String(),
    "kind": pl.String(),  # score | ambiguous | citation
    "applied": pl.Boolean(),  # the corrected score uses corrected_label
    "official_gold": pl.String(),
    "corrected_gold": pl.String(),
    "corrected_label": pl.Boolean(),  # null: not applied, or unjudged
    "judge_model": pl.String(),
    "prompt_version": pl.String(),
    "reply_raw": pl.String(),
    "evidence_recall_corrected": pl.Float64(),  # null: no corrected evidence or no retrievals
}


@dataclass(frozen=True)
class Erratum:
    audit_id: str
    conversation: int
    question: str
    official_gold: str
    error_type: str
    kind: str
    correct_answer: str
    correct_evidence: tuple[str, ...]


def configured(job: JobConfig) -> S.Source | None:
    spec = job.settings(EvalSettings).errata
    return None if spec is None else LA.source(KEY, spec, job)


def fingerprint(job: JobConfig) -> Any:
    """The checkout's commit and a hash of errors.json (None when eval.errata is off)."""
    src = configured(job)
    if src is None:
        return None
    return {"commit": S.resolved_commit(src), "errors": stable_hash(S.read_file(src, LA.ERRORS))}


def load(src: S.Source) -> list[Erratum]:
    out = []
    for rec in LA.errata(src):
        qid = str(rec.get("question_id"))
        kind = KINDS.get(str(rec.get("error_type")))
        if kind is None:
            raise ConfigError(f"{src.where()}: {LA.ERRORS}: entry {qid} has error_type "
                              f"{rec.get('error_type')!r}; known: {sorted(KINDS)}")
        conv, _ = LA.split_id(src, LA.ERRORS, qid)
        out.append(Erratum(qid, conv, str(rec["question"]), str(rec["golden_answer"]),
                           str(rec["error_type"]), kind, str(rec.get("correct_answer") or ""),
                           tuple(str(e) for e in rec.get("correct_evidence") or ())))
    return out


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().casefold()


@dataclass(frozen=True)
class Joined:
    by_question: dict[str, Erratum]  # our question_id -> its entry
    outside: int  # entries of conversations this run does not hold


def join(src: S.Source, errata: Sequence[Erratum], questions: pl.DataFrame) -> Joined:
    """Each entry to our question of the same text in its conversation (exactly one).
    `questions`: every question of the conversations, as the benchmark file holds them
    (`all_questions`: a run cut to its first sessions holds fewer)."""
    samples = LA.sample_ids(src)
    texts: dict[str, dict[str, list[str]]] = {}
    for qid, conv, q in questions.select("question_id", "conv_id", "question").iter_rows():
        texts.setdefault(conv, {}).setdefault(_norm(q), []).append(qid)
    by_question: dict[str, Erratum] = {}
    outside = 0
    for e in errata:
        if e.conversation >= len(samples):
            raise InputError(f"{src.where()}: {LA.ERRORS}", f"conversation {e.conversation} is "
                             f"not in {LA.CONVERSATIONS} ({len(samples)})", e.audit_id)
        conv = samples[e.conversation]
        if conv not in texts:
            outside += 1
            continue
        found = texts[conv].get(_norm(e.question), [])
        if len(found) != 1:
            raise InputError(f"{src.where()}: {LA.ERRORS}", f"{e.question!r} matches "
                             f"{len(found)} questions of conversation {conv}, expected exactly "
                             "one", e.audit_id)
        by_question[found[0]] = e
    return Joined(by_question, outside)


def all_questions(job: JobConfig, questions: pl.DataFrame) -> pl.DataFrame:
    """Every question of the run's conversations in the benchmark file (no session cut), with
    the ids the loader gives them: what the join must find each entry in."""
    from structmem_gpu.data.locomo import load_locomo

    convs = list(dict.fromkeys(questions["conv_id"].to_list()))
    _, full = load_locomo(str(job.root.benchmark.path), conversations=convs)
    return full


def corrected_questions(questions: pl.DataFrame, joined: Joined) -> pl.DataFrame:
    """The questions with corrected evidence where an applied or citation-only entry gives one
    (what evidence recall's corrected column is computed from)."""
    fix = {q: list(e.correct_evidence) for q, e in joined.by_question.items()
           if e.kind != AMBIGUOUS and e.correct_evidence}
    if not fix:
        return questions
    return questions.with_columns(
        pl.struct("question_id", "evidence").map_elements(
            lambda r: fix.get(r["question_id"], r["evidence"]), return_dtype=pl.List(pl.String())
        ).alias("evidence"))


def with_gold(item: Any, e: Erratum) -> Any:
    """A judge item (eval/judge.JudgeItem) asked against the corrected gold."""
    return dataclasses.replace(item, gold=e.correct_answer)


# ---- the report's section ---------------------------------------------------------------------
def _acc(labels: Sequence[bool | None]) -> float | None:
    return sum(bool(x) for x in labels) / len(labels) if labels else None


def _mean_known(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None (evidence recall excludes those)."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summary(rows: pl.DataFrame, errata: pl.DataFrame, names: Mapping[int, str],
            source: Mapping[str, Any] | None) -> dict[str, Any]:
    """report.json `errata`: per judge the official and corrected accuracy overall and per
    category, the official golds' ceiling per category, and the affected questions.
    `rows`: the scored judgments joined with the questions (report.scored_rows)."""
    out: dict[str, Any] = {"source": source, "by_judge": {}}
    for (judge,), jr in rows.group_by(["judge_name"], maintain_order=True):
        er = errata.filter(pl.col("judge_name") == judge)
        fixes = {q: lab for q, lab, ap in er.select("question_id", "corrected_label",
                                                     "applied").iter_rows() if ap}
        kinds = dict(er.select("question_id", "kind").iter_rows())
        groups: dict[str, Any] = {}
        for key, g in [("overall", jr)] + [(str(c), jr.filter(pl.col("category") == c))
                                           for c in sorted(jr["category"].unique().to_list())]:
            official = g["label"].to_list()
            qids = g["question_id"].to_list()
            corrected = [fixes.get(q, lab) for q, lab in zip(qids, official)]
            wrong_gold = sum(kinds.get(q) in (SCORE, AMBIGUOUS) for q in qids)
            groups[key] = {
                "name": "overall" if key == "overall" else names.get(int(key), key),
                "n": len(qids),
                "official": _acc(official),
                "corrected": _acc(corrected),
                "score_changing": sum(kinds.get(q) == SCORE for q in qids),
                "ambiguous": sum(kinds.get(q) == AMBIGUOUS for q in qids),
                "citation_only": sum(kinds.get(q) == CITATION for q in qids),
                # The best any system can score against the official golds: every question
                # whose gold the audit finds wrong (ambiguous included) is lost.
                "official_ceiling": (len(qids) - wrong_gold) / len(qids) if qids else None,
            }
        official_recall = dict(jr.select("question_id", "evidence_recall").iter_rows())
        fixed_recall = {q: r for q, r, k in er.select(
            "question_id", "evidence_recall_corrected", "kind").iter_rows() if k != AMBIGUOUS}
        labels = dict(jr.select("question_id", "label").iter_rows())
        out["by_judge"][judge] = {
            "groups": groups,
            "evidence_recall": {
                "official": _mean_known(official_recall.values()),
                "corrected": _mean_known(fixed_recall.get(q, r)
                                         for q, r in official_recall.items())},
            "affected": [
                {"question_id": q, "audit_id": a, "error_type": t, "applied": ap,
                 "official_label": labels.get(q), "corrected_label": lab}
                for q, a, t, ap, lab in er.select("question_id", "audit_id", "error_type",
                                                  "applied", "corrected_label").iter_rows()],
        }
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(section: Mapping[str, Any], judge: str | None) -> list[str]:
    """report.md's section for the headline judge."""
    data = (section.get("by_judge") or {}).get(judge or "")
    if not data:
        return []
    src = section.get("source") or {}
    lines = [
        "## Corrected golds (dial481/locomo-audit errata)", "",
        (f"Checkout `{src.get('spec')}` (commit {str(src.get('commit') or 'work tree')[:7]}). "
         "`official` = against LoCoMo's golds (the published-comparable number, as above); "
         "`corrected` = the score-changing entries re-judged against the audit's correct answer. "
         "Ambiguous entries are reported, not applied; citation-only entries change only evidence "
         "recall. `ceiling` = the best score possible against the official golds."), "",
        "| group | n | official (%) | corrected (%) | score-changing | ambiguous | "
        "citation-only | ceiling (%) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in data["groups"].values():
        lines.append(f"| {g['name']} | {g['n']} | {_pct(g['official'])} | {_pct(g['corrected'])} "
                     f"| {g['score_changing']} | {g['ambiguous']} | {g['citation_only']} | "
                     f"{_pct(g['official_ceiling'])} |")
    rec = data["evidence_recall"]
    lines += ["", f"Evidence recall: official {_pct(rec['official'])}, corrected "
                  f"{_pct(rec['corrected'])}.", ""]
    if data["affected"]:
        how = {SCORE: "", AMBIGUOUS: ", reported only", CITATION: ", evidence only"}
        lines += ["Affected questions: " + ", ".join(
            f"`{a['question_id']}` ({a['error_type']}{how[KINDS[a['error_type']]]})"
            for a in data["affected"]), ""]
    return lines
