"""A finished run's predictions in the files the official scorers read.

    python jobs/report.py export RUN --format longmemeval|mem0|lightmem [--out DIR]

- `longmemeval`: `longmemeval_hypotheses.jsonl`, the hypothesis file of LongMemEval's
  `src/evaluation/evaluate_qa.py` (one {"question_id", "hypothesis"} per line; the hypothesis
  is what our judge saw, judge.input), the same text the report stage writes.
- `mem0`: `mem0_results.json`, the input of mem0's `evaluation/evals.py` and
  `metrics/llm_judge.py` (mem0ai/mem0 b3ede5b): {conversation: [{"question", "answer",
  "response", "category", "evidence", "adversarial_answer", "question_id"}]}. `response` is
  the extracted prediction, the text our F1 and BLEU-1 score, so mem0's `calculate_metrics`
  / `calculate_bleu_scores` give our f1_mem0 / bleu1 per answer (tests/unit/test_export.py
  checks this with mem0's own functions). evals.py skips category 5 itself.
- `lightmem`: what LightMem's `experiments/locomo/search_locomo.py` writes: one
  `sample_<conv_id>.json` per conversation ({"sample_id", "results": [{"question",
  "prediction", "reference", "category", "metrics": {"judge_correct", "judge_response"}}],
  "token_stats"}) and `summary.json` (its `aggregate_metrics`: judge accuracy overall and per
  category, mean / population std / count). LightMem scores judge accuracy only; the label
  is the run's headline judge's (unjudged = 0, as its script scores a failed judgment);
  `prediction` is the reader's whole reply, as search_locomo.py stores it. Category 5 is left
  out, as search_locomo.py skips it.

A run of the wrong benchmark for the format, or without the tables a format needs, is refused
with one line before anything is written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.core.artifacts import RunDir, atomic_write_text
from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL, LONGMEMEVAL_TYPES
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.eval.report import hypotheses_jsonl

FORMATS = ("longmemeval", "mem0", "lightmem")
_LME_IDS = frozenset(LONGMEMEVAL_TYPES.values())


def _answered(run: RunDir) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(questions that have an answer, in table order; answers)."""
    answers = run.read_table("answers", needed_by="export")
    questions = run.read_table("questions", needed_by="export")
    questions = questions.filter(pl.col("question_id").is_in(answers["question_id"].to_list()))
    if questions.height == 0:
        raise StructMemError(f"{run.table_path('answers')}: no answered question to export")
    return questions, answers


def headline_judge(run: RunDir, judgments: pl.DataFrame) -> str:
    """report.json's headline judge, else the first judge name of judgments.parquet."""
    rep = run.report_dir / "report.json"
    if rep.is_file():
        name = json.loads(rep.read_text(encoding="utf-8")).get("judge")
        if name:
            return str(name)
    names = judgments["judge_name"].drop_nulls().unique(maintain_order=True).to_list()
    if not names:
        raise StructMemError(f"{run.table_path('judgments')}: no judge rows")
    return str(names[0])


def _judge_input(run: RunDir) -> str:
    """What the run's judge read (the judge stage's notes; older runs judged the answer)."""
    notes = (run.stage_entry("judge") or {}).get("notes") or {}
    return str(notes.get("judge_input") or "answer")


def _labels(run: RunDir) -> dict[str, bool | None]:
    judgments = run.read_table("judgments", needed_by="export")
    name = headline_judge(run, judgments)
    rows = judgments.filter(pl.col("judge_name") == name).select("question_id", "label")
    return dict(rows.iter_rows())


def _check_benchmark(questions: pl.DataFrame, fmt: str, run: RunDir) -> None:
    lme = bool(questions["category"].is_in(list(_LME_IDS)).any())
    if lme != (fmt == "longmemeval"):
        want = "a LongMemEval" if fmt == "longmemeval" else "a LoCoMo-format"
        raise StructMemError(f"{run.table_path('questions')}: export --format {fmt} needs {want} "
                             f"run, this one is {'LongMemEval' if lme else 'LoCoMo-format'}")


def mem0_results(questions: pl.DataFrame, answers: pl.DataFrame) -> dict[str, list[dict]]:
    preds = dict(answers.select("question_id", "prediction").iter_rows())
    out: dict[str, list[dict[str, Any]]] = {}
    cols = ("conv_id", "question_id", "question", "answer", "category", "evidence",
            "adversarial_answer")
    for conv, qid, q, gold, cat, evidence, adv in questions.select(cols).iter_rows():
        out.setdefault(str(conv), []).append({
            "question": q, "answer": gold or "", "response": preds.get(qid) or "",
            "category": int(cat), "evidence": list(evidence or []), "adversarial_answer": adv,
            "question_id": qid,
        })
    return out


def _stats(vals: list[float]) -> dict[str, Any]:
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals)), "count": len(vals)}


def lightmem_results(questions: pl.DataFrame, answers: pl.DataFrame,
                     labels: Mapping[str, bool | None], judge: str) -> dict[str, Any]:
    """{file name: content}: sample_<conv>.json per conversation and summary.json."""
    column = "reply" if "reply" in answers.columns else "prediction"
    replies = dict(answers.select("question_id", pl.col(column).fill_null(
        pl.col("prediction"))).iter_rows())
    scored = questions.filter(pl.col("category") != LOCOMO_ADVERSARIAL)
    missing = [q for q in scored["question_id"].to_list() if q not in labels]
    if missing:
        raise StructMemError(f"judgments.parquet: judge {judge!r} has no row for {len(missing)} "
                             f"answered questions (e.g. {missing[:3]}); run stages=[judge]")
    samples: dict[str, list[dict[str, Any]]] = {}
    per_cat: dict[int, list[float]] = {}
    total: list[float] = []
    cols = ("conv_id", "question_id", "question", "answer", "category")
    for conv, qid, q, gold, cat in scored.select(cols).iter_rows():
        ok = bool(labels[qid])
        samples.setdefault(str(conv), []).append({
            "question": q, "prediction": replies.get(qid) or "", "reference": gold or "",
            "category": int(cat), "question_id": qid,
            "metrics": {"judge_correct": int(ok),
                        "judge_response": "" if labels[qid] is None else
                        ("CORRECT" if ok else "WRONG")},
        })
        per_cat.setdefault(int(cat), []).append(float(ok))
        total.append(float(ok))
    files: dict[str, Any] = {
        f"sample_{conv}.json": {"sample_id": conv, "results": rows, "token_stats": {}}
        for conv, rows in samples.items()
    }
    aggregate: dict[str, Any] = {"overall": {}}
    if total:
        aggregate["overall"]["judge_correct"] = _stats(total)
    for cat in sorted(per_cat):
        aggregate[f"category_{cat}"] = {"judge_correct": _stats(per_cat[cat])}
    files["summary.json"] = {
        "judge_model": judge, "total_questions": len(total), "total_samples": len(samples),
        "category_distribution": {str(c): len(v) for c, v in sorted(per_cat.items())},
        "aggregate_metrics": aggregate,
    }
    return files


def export_run(run_dir: Path, fmt: str, out: Path | None = None) -> list[Path]:
    """Write the `fmt` files (default RUN/report/export/FMT/); returns their paths."""
    if fmt not in FORMATS:
        raise StructMemError(f"export: unknown format {fmt!r}; expected one of {list(FORMATS)}")
    run = RunDir(run_dir)
    questions, answers = _answered(run)
    _check_benchmark(questions, fmt, run)
    files: dict[str, str] = {}
    if fmt == "longmemeval":
        files["longmemeval_hypotheses.jsonl"] = hypotheses_jsonl(questions, answers,
                                                                 _judge_input(run))
    elif fmt == "mem0":
        files["mem0_results.json"] = json.dumps(mem0_results(questions, answers), indent=2,
                                                ensure_ascii=False)
    else:
        judgments = run.read_table("judgments", needed_by="export")
        judge = headline_judge(run, judgments)
        content = lightmem_results(questions, answers, _labels(run), judge)
        files = {k: json.dumps(v, indent=2, ensure_ascii=False) for k, v in content.items()}
    out_dir = out or run.report_dir / "export" / fmt
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():  # everything was built before the first write
        atomic_write_text(out_dir / name, text)
        paths.append(out_dir / name)
    return paths
