"""Compare finished runs side by side: one row per run, scores and build cost.

    python jobs/report.py compare outputs/compare outputs/multirun/sample/2026-05-01_12-00-00
    # or, from code / jobs/report.py:
    df = compare_runs(discover_runs(Path("outputs/multirun/sample/2026-05-01_12-00-00")))
    write_comparison(df, Path("outputs/compare"))   # comparison.md, .csv, .json

Reads each run's report/report.json (scores; docs/design.md "Run directory contract"), manifest.json (per-stage build_cost, including
LLM batches) and .hydra/overrides.yaml + config.yaml (what the run was launched with). Rows are
labelled by the overrides that vary across the compared runs (e.g. `retrieve.entries_k` of a
sweep, a column of its own in every output) plus the answer and judge models, and sorted
numerically by them. BUILD cost sums every stage that builds memory, i.e. all
stages except `load, retrieve, answer, judge, report`. Calls count every request the method
makes, cache hits included: the cost of the method, not of this particular rerun (wall
seconds, in contrast, are as measured and shrink when the cache answers). One row:

    {"method": "graph_memory", "benchmark": "sample", "n": 2, "acc_overall": 0.5,
     "acc_single_hop": 1.0, ..., "f1_locomo": 0.31, "evidence_recall": 0.5,
     "build_calls": 19, "build_prompt_tokens": 9120, "build_completion_tokens": 1310,
     "build_wall_s": 95.2, "build_batches": 11, "build_calls_vs_ref": 2.4, ...}
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import MANIFEST, atomic_write_text
from structmem_gpu.core.errors import InputError
from structmem_gpu.config.result_keys import changes_result, split_override

log = logging.getLogger(__name__)

REPORT = Path("report") / "report.json"
COST_KEYS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "wall_s", "batches")
METRICS = ("f1_locomo", "f1_mem0", "bleu1", "evidence_recall")


def load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(path, "missing; is this a finished run directory (stages up to report)?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise InputError(path, "expected a JSON object")
    return data


def discover_runs(*roots: Path) -> list[Path]:
    """Run directories (those with report/report.json) at or below `roots`, sorted by path."""
    found: set[Path] = set()
    for root in roots:
        if (root / REPORT).is_file():
            found.add(root)
        found |= {
            p.parent.parent
            for p in root.rglob("report.json")
            if p.parent.name == "report" and (p.parent.parent / MANIFEST).is_file()
        }
    return sorted(found)


def slug(name: str) -> str:
    """Column-safe category name ("single-hop" -> "single_hop")."""
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def stage_costs(manifest: Mapping[str, Any], run_dir: Path, parts: Iterable[str],
                keys: Sequence[str]) -> dict[str, float]:
    """Sum of the manifest's build_cost `keys` over the stages whose part (Stage.kind as the
    run's method declared it, stage_lookup.RunStages) is one of `parts`."""
    from structmem_gpu.stage_lookup import RunStages

    lookup, wanted = RunStages(run_dir, manifest), set(parts)
    out: dict[str, float] = dict.fromkeys(keys, 0)
    for name, entry in (manifest.get("stages") or {}).items():
        if lookup.part(name) not in wanted:
            continue
        cost = entry.get("build_cost") or {}
        for k in keys:
            out[k] += cost.get(k) or 0
    return out


def build_cost(manifest: Mapping[str, Any], run_dir: Path) -> dict[str, float]:
    """Sum of the build stages' manifest build_cost (memory building and audits: Stage.kind
    as the run's method declared it, stage_lookup.RunStages), plus the answer stage's
    calls/tokens."""
    from structmem_gpu.core.stage_parts import AUDIT, BUILD

    out = {f"build_{k}": v for k, v in stage_costs(manifest, run_dir, (BUILD, AUDIT), COST_KEYS).items()}
    out["build_wall_s"] = round(float(out["build_wall_s"]), 3)
    answer = ((manifest.get("stages") or {}).get("answer") or {}).get("build_cost") or {}
    out["answer_calls"] = answer.get("calls") or 0
    out["answer_prompt_tokens"] = answer.get("prompt_tokens") or 0
    return out


def _protocols(report: Mapping[str, Any]) -> str:
    """"reader/judge" protocols of a report ("reasoned/reasoned" before protocols existed:
    older runs used what is now the `reasoned` variant)."""
    p = report.get("protocols") or {}
    return f"{p.get('answer', 'reasoned')}/{p.get('judge', 'reasoned')}"


def run_overrides(run_dir: Path) -> dict[str, str]:
    """The result-changing overrides a run was launched with (.hydra/overrides.yaml), key ->
    value ({} for a run without that record, e.g. one run in-process)."""
    from structmem_gpu.eval.published import saved_yaml

    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    items = saved_yaml(path)
    if not isinstance(items, list):
        raise InputError(path, "expected a list of overrides")
    pairs = [split_override(item) for item in items]
    return {key: value or "" for key, value in pairs if changes_result(key)}


def answer_model(run_dir: Path) -> str | None:
    """The answer LLM's name as the run's .hydra/config.yaml gives it (served name, model or
    backend), None when unrecorded."""
    from structmem_gpu.eval.published import saved_yaml

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    llm = saved_yaml(path).get("llm") or {}
    for key in ("served_name", "model", "backend"):
        value = llm.get(key) if isinstance(llm, dict) else None
        if isinstance(value, str) and value and "${" not in value:
            return value.rsplit("/", 1)[-1] if key == "model" else value
    return None


def _model_names(identities: Sequence[str]) -> str | None:
    """"served|weights|revision" identities -> their first non-empty parts, comma-joined."""
    names = [next((p for p in str(i).split("|") if p), str(i)).rsplit("/", 1)[-1] for i in identities]
    return ", ".join(names) or None


def _published_overall(report: Mapping[str, Any]) -> tuple[str | None, float | None, str | None]:
    """(id, overall judge accuracy as a fraction, note) of the first published row that
    matched; the note is set when the run matched it only as a configuration the row is shown
    beside (report.json `published_notes`)."""
    from structmem_gpu.eval.published import load_published

    ids = list(report.get("published") or [])
    notes = report.get("published_notes") or {}
    rows = {r.id: r for r in load_published()}
    for rid in ids:
        row = rows.get(rid)
        if row is not None and "judge_accuracy" in row.overall:
            note = notes.get(rid)
            if 5 in row.categories:  # SEEM's J: all 1,986 LoCoMo questions, category 5 included
                note = "; ".join(x for x in (note, "includes category 5") if x)
            return rid, row.overall["judge_accuracy"] / 100, note
    return (ids[0] if ids else None), None, (notes.get(ids[0]) if ids else None)


def _audit_cell(report: Mapping[str, Any], judge: str | None) -> str:
    from structmem_gpu.eval.judge_audit import short_line

    return short_line((report.get("judge_audit") or {}).get(judge or ""))


def run_row(run_dir: Path) -> dict[str, Any]:
    """One comparison row from a run directory's report.json and manifest.json."""
    report, manifest = load_json(run_dir / REPORT), load_json(run_dir / MANIFEST)
    overall = report.get("overall") or {}
    ci = overall.get("judge_accuracy_ci95") or [None, None]
    judge = report.get("judge")
    published_id, published_acc, published_note = _published_overall(report)
    row: dict[str, Any] = {
        "method": report.get("method") or manifest.get("method"),
        "benchmark": report.get("benchmark") or manifest.get("benchmark"),
        "run_dir": str(run_dir),
        "config_hash": manifest.get("config_hash"),
        "answer_model": answer_model(run_dir),
        "judge": judge,
        "judge_models": _model_names((report.get("judge_models") or {}).get(judge or "", [])),
        # The judge's own error rates (eval/judge_audit.py), or "not audited".
        "judge_audit_rates": _audit_cell(report, judge),
        "published_id": published_id,
        "published_acc": published_acc,
        "published_note": published_note,
        "_overrides": run_overrides(run_dir),
        "protocols": _protocols(report),
        "n": overall.get("n"),
        "unjudged": report.get("unjudged"),
        "acc_overall": overall.get("judge_accuracy"),
        "acc_overall_ci_low": ci[0],
        "acc_overall_ci_high": ci[1],
        # Every interval names its resampling unit: the CI above resamples questions; this one
        # whole conversations (null in a report from before it existed).
        "ci_unit": "questions",
        "ci_conv_low": (overall.get("judge_accuracy_ci95_conversations") or [None, None])[0],
        "ci_conv_high": (overall.get("judge_accuracy_ci95_conversations") or [None, None])[1],
    }
    cats = report.get("by_category") or {}
    for cid in sorted(cats, key=lambda c: (not c.isdigit(), int(c) if c.isdigit() else 0, c)):
        row[f"acc_{slug(cats[cid].get('name') or cid)}"] = cats[cid].get("judge_accuracy")
    row.update({m: overall.get(m) for m in METRICS})
    row.update(build_cost(manifest, run_dir))
    return row


def _frame(rows: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    # Category columns after the overall score, in first-seen order; all other columns fixed.
    acc = [c for c in cols if c.startswith("acc_") and not c.startswith("acc_overall")]
    head = [
        "method",
        "benchmark",
        "run_dir",
        "config_hash",
        "answer_model",
        "judge",
        "judge_models",
        "judge_audit_rates",
        "protocols",
        "protocols_differ",
        "n",
        "unjudged",
        "acc_overall",
        "acc_overall_ci_low",
        "acc_overall_ci_high",
        "ci_unit",
        "ci_conv_low",
        "ci_conv_high",
    ]
    order = head + acc + [c for c in cols if c not in head and c not in acc]
    return pl.DataFrame(
        [{c: r.get(c) for c in order} for r in rows],
        schema_overrides={
            c: pl.Float64
            for c in order
            if c.startswith("acc_") or c in METRICS or c in ("build_wall_s", "ci_conv_low", "ci_conv_high")
        },
        infer_schema_length=None,
    )


def _number(value: Any) -> Any:
    """An override's value as a number where it reads as one ("40" -> 40, "0.5" -> 0.5)."""
    if isinstance(value, str):
        for cast in (int, float):
            try:
                return cast(value)
            except ValueError:
                pass
    return value


def varied_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Override keys whose value differs between the rows (a key one run lacks counts)."""
    keys = sorted({k for r in rows for k in r["_overrides"]})
    return [k for k in keys if len({r["_overrides"].get(k) for r in rows}) > 1]


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (2, "")
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def compare_runs(run_dirs: Iterable[Path], reference: str | None = "structmem") -> pl.DataFrame:
    """One row per run, with a column per override key that varies across them (named by
    the dotted key, values as numbers where they read as numbers), sorted by those keys;
    in the given order when none varies. `build_calls_vs_ref` = build calls / the build
    calls of the `reference` method's run on the same benchmark (null when there is none)."""
    rows = [run_row(Path(d)) for d in run_dirs]
    if not rows:
        raise InputError(
            "compare_runs", "no run directories given (none found under the folders named?)"
        )
    varied = varied_keys(rows)
    for r in rows:
        overrides = r.pop("_overrides")
        for k in varied:
            r[k] = _number(overrides.get(k))
    if varied:
        rows.sort(key=lambda r: tuple(_sort_key(r[k]) for k in varied))
    mixed = [k for k in varied if len({type(r[k]) for r in rows if r[k] is not None}) > 1]
    for r in rows:  # a column polars can type: text where numbers and words mix
        for k in mixed:
            r[k] = None if r[k] is None else str(r[k])
    # A row whose reader/judge protocols differ from the most common pair is marked: its
    # scores are not comparable with the others' (docs/evaluation.md "Evaluation protocols").
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["protocols"]] = counts.get(r["protocols"], 0) + 1
    common = max(counts, key=lambda k: (counts[k], k == "paper/paper"))
    for r in rows:
        r["protocols_differ"] = r["protocols"] != common
    df = _frame(rows)
    labels = [k for k in varied if k not in ("method", "benchmark")]  # those have their columns
    df = df.select([*labels, *[c for c in df.columns if c not in labels]])
    ref = (
        df.filter(pl.col("method") == reference)
        .group_by("benchmark")
        .agg(pl.col("build_calls").first().alias("_ref"))
        if reference
        else None
    )
    if ref is None or ref.height == 0:
        return df.with_columns(pl.lit(None, pl.Float64).alias("build_calls_vs_ref"))
    df = df.join(ref, on="benchmark", how="left", maintain_order="left")
    ratio = pl.when(pl.col("_ref") > 0).then(pl.col("build_calls") / pl.col("_ref")).otherwise(None)
    return df.with_columns(ratio.round(2).alias("build_calls_vs_ref")).drop("_ref")


# ---- output ----------------------------------------------------------------------------------
def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}"


def _num(x: Any) -> str:
    if x is None:
        return "–"
    return f"{x:,.1f}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x):,}"


def label_columns(df: pl.DataFrame) -> list[str]:
    """The varied override keys of a compare_runs frame (its columns before `method`)."""
    return df.columns[: df.columns.index("method")]


def short_labels(keys: Sequence[str]) -> list[str]:
    """`retrieve.entries_k` -> `entries_k` where the last part names one key only."""
    tails = [k.rsplit(".", 1)[-1] for k in keys]
    return [t if tails.count(t) == 1 else k for k, t in zip(keys, tails, strict=True)]


def _cell(x: Any) -> str:
    return "–" if x is None else str(x).replace("|", "\\|")


def _published_cell(r: Mapping[str, Any]) -> str:
    if r.get("published_acc") is None:
        return "–"
    note = r.get("published_note")
    return _pct(r["published_acc"]) + (f" ({note})" if note else "")


def _models(r: Mapping[str, Any]) -> str:
    judge = _cell(r.get("judge"))
    return judge + (f" ({r['judge_models']})" if r.get("judge_models") else "")


def render_markdown(df: pl.DataFrame, reference: str | None = "structmem") -> str:
    acc = [c for c in df.columns if c.startswith("acc_") and not c.startswith("acc_overall")]
    metrics = [c for c in METRICS if c in df.columns]
    labels = label_columns(df)
    note = (
        "Scores in percent (judge accuracy per category, unjudged counted as wrong; n = scored "
        "questions; overall with its 95% bootstrap CI resampling questions, and, where the "
        "report has it, the interval resampling whole conversations: LoCoMo's 10 make it "
        "cover less than 95%, docs/evaluation.md \"Intervals\"). Rows are labelled by the overrides "
        "that vary across the compared runs. Protocols = reader/judge protocol; a row marked "
        "(differs) used other protocols than the rest and is not comparable with them. "
        "Published = the overall judge accuracy of the first published row matching the run's "
        "configuration, with the row's note when the run is not the configuration that "
        "produced the number (e.g. paper text configuration, number from the code's). Judge "
        "audit = the judge's false accepts (FA) on locomo-audit's wrong answer sets v1 / v2 and "
        "false rejects (FR) of gold answers and their paraphrases, on the slice named "
        "(docs/evaluation.md \"Judge audit\"). Build cost sums every memory-building stage; calls include cache hits "
        "(the method's cost), wall seconds are as measured."
    )
    lines = ["# Method comparison", "", note, ""]
    head = [
        *short_labels(labels),
        "method",
        "benchmark",
        "answer model",
        "judge",
        "judge audit",
        "protocols",
        "n",
        "overall (95% CI, questions)",
        "by conversation",
        *(c.removeprefix("acc_") for c in acc),
        *metrics,
        "published",
    ]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in df.iter_rows(named=True):
        proto = str(r.get("protocols") or "–")
        ci = (f" [{_pct(r['acc_overall_ci_low'])}, {_pct(r['acc_overall_ci_high'])}]"
              if r.get("acc_overall_ci_low") is not None else "")
        cells = [
            *(_cell(r[k]) for k in labels),
            str(r["method"]),
            str(r["benchmark"]),
            _cell(r.get("answer_model")),
            _models(r),
            _cell(r.get("judge_audit_rates") or "not audited"),
            f"**{proto} (differs)**" if r.get("protocols_differ") else proto,
            _num(r["n"]),
            _pct(r["acc_overall"]) + ci,
            (f"[{_pct(r['ci_conv_low'])}, {_pct(r['ci_conv_high'])}]"
             if r.get("ci_conv_low") is not None else "–"),
            *(_pct(r[c]) for c in acc),
            *(_pct(r[c]) for c in metrics),
            _published_cell(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ratio = f"calls vs {reference}" if reference else "calls vs ref"
    cost = [
        *short_labels(labels),
        "method",
        "build calls",
        ratio,
        "LLM batches",
        "prompt tokens",
        "completion tokens",
        "wall s",
        "answer prompt tokens",
    ]
    lines += ["", "## Build cost", "", "| " + " | ".join(cost) + " |", "|" + "---|" * len(cost)]
    for r in df.iter_rows(named=True):
        x = r.get("build_calls_vs_ref")
        cells = [
            *(_cell(r[k]) for k in labels),
            str(r["method"]),
            _num(r["build_calls"]),
            "–" if x is None else f"×{x:.2f}",
            _num(r["build_batches"]),
            _num(r["build_prompt_tokens"]),
            _num(r["build_completion_tokens"]),
            _num(r["build_wall_s"]),
            _num(r["answer_prompt_tokens"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(
    df: pl.DataFrame, out_dir: Path, reference: str | None = "structmem"
) -> dict[str, Path]:
    """comparison.md, comparison.csv and comparison.json (records) under `out_dir`."""
    out_dir = Path(out_dir)
    paths = {
        "md": out_dir / "comparison.md",
        "csv": out_dir / "comparison.csv",
        "json": out_dir / "comparison.json",
    }
    atomic_write_text(paths["md"], render_markdown(df, reference))
    atomic_write_text(paths["csv"], df.write_csv())
    atomic_write_text(paths["json"], json.dumps(df.to_dicts(), indent=2, default=str) + "\n")
    log.info("comparison of %d runs: %s", df.height, paths["md"])
    return paths


def write_comparison_page(out_dir: Path, run_dirs: Sequence[Path]) -> Path:
    """OUT/index.html: comparison.md as it stands (with the paired tests once written), the
    figures in OUT and links to the tables and to every run's own report page."""
    from structmem_gpu.eval.html import write_folder_page

    out_dir = Path(out_dir)
    text = (out_dir / "comparison.md").read_text(encoding="utf-8")
    return write_folder_page(out_dir / "index.html", "Comparison", text, out_dir,
                             runs=[(Path(d).name, Path(d)) for d in run_dirs])
