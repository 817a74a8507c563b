"""StructMem's Table 1 as a table: each finished run beside the paper's row for its method.

    python jobs/run.py -m experiment=structmem_table1            # StructMem + every system
    python jobs/report.py table1 outputs/table1 outputs/multirun/locomo/<date>
    # -> outputs/table1/table1.md, .csv, .json and index.html

One row per Table 1 row of the paper (eval/published/structmem.json: the rows whose id starts
with `structmem-table1`), in the paper's order, plus a row per run whose method has none:

- the paper's numbers: overall and the four categories (judge accuracy, %), and its build
  cost (input and output tokens, LLM calls, wall seconds; "–" where the paper prints none);
- ours, from the run directory the row's method ran in: the same scores (overall with its
  intervals resampling questions and resampling conversations) and the build cost from the
  same accounting as every report (manifest.json's per-stage `build_cost`, summed over the
  stages whose part is `build`: memory building only, never answer, judge or audits; for a
  baseline system that is `system_build`, every request its own code sent through the
  recording front, structmem_gpu/systems/front.py);
- the paired test of the run against the StructMem run (the reference: McNemar's exact p and
  the paired difference with its interval, analysis/paired.py), on the same questions;
- whether the run IS the paper's configuration (`matched`: the report's `published` list names
  the row, eval/published.py), or why not (a harness run, a setting that differs).

A run is put beside the row whose `match` block it agrees with most, among the rows of its
method (method=full_context has two: FullContext, newest first, and the flat reading of OpenAI);
rows no run reached are listed with the paper's numbers and "not run", an excluded row with its
reason. Wall time is shown for both but is not comparable: the paper's is a hosted API's latency
and rate limits, ours a local server's throughput at this run's concurrency (docs/evaluation.md
"StructMem Table 1 and Table 4 rows").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.analysis.compare import load_json
from structmem_gpu.core.artifacts import MANIFEST, atomic_write_text
from structmem_gpu.core.errors import InputError

log = logging.getLogger(__name__)

ROW_PREFIX = "structmem-table1"
REFERENCE = "structmem"  # the method every other run is paired against
# Our category ids (data/categories.py) in Table 1's column order: multi, open, single, temp.
CATEGORIES = (("multi-hop", "1"), ("open-domain", "3"), ("single-hop", "4"), ("temporal", "2"))
COST = ("prompt_tokens", "completion_tokens", "calls", "wall_s")
# The paper prints its token sum rounded on its own (MemoryOS: 1.889 + 0.939 printed as 2.868):
# its column is shown as printed (`total_tokens`), ours as the sum of the two.


def table1_rows() -> list[Any]:
    """The paper's Table 1 rows, in the order structmem.json lists them."""
    from structmem_gpu.eval.published import load_published

    return [r for r in load_published() if r.id == ROW_PREFIX or r.id.startswith(ROW_PREFIX + "-")]


def build_cost(manifest: Mapping[str, Any], run_dir: Path) -> dict[str, float]:
    """Sum of the memory-building stages' build_cost (Stage.part `build`, as the run's method
    declared it; no audit, unlike compare's): input/output tokens, calls (cache hits included:
    the method's cost, not this rerun's) and wall seconds as measured."""
    from structmem_gpu.analysis.compare import stage_costs
    from structmem_gpu.core.stage_parts import BUILD

    return {k: float(v) for k, v in stage_costs(manifest, run_dir, (BUILD,), COST).items()}


def _agreement(get: Callable[[str], Any] | None, row: Any) -> tuple[int, list[str]]:
    """(how many of the row's match keys the run's saved config (`get`: a key lookup,
    eval/published.saved_facts; None = not saved) agrees with, the differing keys as
    `key=ours (paper: theirs)`)."""
    from structmem_gpu.eval.published import meets

    if get is None:
        return 0, ["configuration not saved (no .hydra/config.yaml)"]
    agree, differ = 0, []
    for key, want in (row.match or {}).items():
        have = get(key)
        if meets(key, have, want):
            agree += 1
        else:
            differ.append(f"{key}={have} (paper: {want})")
    return agree, differ


def _saved(run_dir: Path) -> Callable[[str], Any] | None:
    """The run's saved config as a match-key lookup, None when it has none."""
    from structmem_gpu.eval.published import saved_facts

    path = run_dir / ".hydra" / "config.yaml"
    return saved_facts(path) if path.is_file() else None


def _assign(runs: Sequence[tuple[Path, dict[str, Any]]], rows: Sequence[Any]
            ) -> tuple[dict[str, tuple[Path, dict[str, Any], list[str]]],
                       list[tuple[Path, dict[str, Any], str]]]:
    """row id -> (run dir, report, differing keys) for the run put beside each row; the runs
    beside no row, each with why. A run the report matched to a row goes there; else to the
    row of its method it agrees with most; a row keeps the first run assigned to it."""
    placed: dict[str, tuple[Path, dict[str, Any], list[str]]] = {}
    unplaced = []
    for run_dir, report in runs:
        ids = set(report.get("published") or [])
        exact = [r for r in rows if r.id in ids]
        if exact:
            target, differ = exact[0], []
        else:
            mine = [r for r in rows if r.match and r.match.get("method") == report.get("method")]
            get = _saved(run_dir)  # read once for every candidate row
            scored = [(_agreement(get, r), r) for r in mine]
            if not scored:
                unplaced.append((run_dir, report, "no Table 1 row for this method"))
                continue
            (_, differ), target = max(scored, key=lambda s: s[0][0])
        if target.id in placed:
            why = f"another run stands beside {target.label}: {placed[target.id][0]}"
            unplaced.append((run_dir, report, why))
            continue
        placed[target.id] = (run_dir, report, differ)
    return placed, unplaced


def _why_unmatched(run_dir: Path, report: Mapping[str, Any], differ: Sequence[str]) -> str:
    # The report's own reason (report.json `published_excluded`: eval/published.harness_run).
    why = report.get("published_excluded")
    parts = [f"harness run: {why}"] if why else []
    if differ:
        parts.append("differs: " + "; ".join(differ[:3]) + (" ..." if len(differ) > 3 else ""))
    return ", ".join(parts) or "category scope or judge protocol differs"


def _ours(run_dir: Path, report: Mapping[str, Any]) -> dict[str, Any]:
    manifest = load_json(run_dir / MANIFEST)
    overall = report.get("overall") or {}
    cats = report.get("by_category") or {}
    ci = overall.get("judge_accuracy_ci95") or [None, None]
    conv = overall.get("judge_accuracy_ci95_conversations") or [None, None]
    out: dict[str, Any] = {
        "run_dir": str(run_dir), "method": report.get("method"), "n": overall.get("n"),
        "ours_overall": _pct(overall.get("judge_accuracy")),
        "ours_ci_low": _pct(ci[0]), "ours_ci_high": _pct(ci[1]),
        "ours_ci_conv_low": _pct(conv[0]), "ours_ci_conv_high": _pct(conv[1]),
    }
    for name, cid in CATEGORIES:
        out[f"ours_{name}"] = _pct((cats.get(cid) or {}).get("judge_accuracy"))
    out.update({f"ours_{k}": v for k, v in build_cost(manifest, run_dir).items()})
    return out


def _pct(x: Any) -> float | None:
    return None if x is None else round(100 * float(x), 2)


def _paper(row: Any) -> dict[str, Any]:
    cost = row.extra.get("build_cost") or {}
    out: dict[str, Any] = {"row": row.id, "label": row.label,
                           "paper_overall": row.overall.get("judge_accuracy")}
    for name, cid in CATEGORIES:
        out[f"paper_{name}"] = (row.by_category.get("judge_accuracy") or {}).get(cid)
    for k in (*COST, "total_tokens"):
        out[f"paper_{k}"] = cost.get(k)
    return out


def table1(run_dirs: Sequence[Path]) -> pl.DataFrame:
    """The table: one row per Table 1 row (and per run beside none), paper and ours."""
    runs = [(Path(d), load_json(Path(d) / "report" / "report.json")) for d in run_dirs]
    if not runs:
        raise InputError("table1", "no run directories given (none found under the folders named?)")
    rows = table1_rows()
    placed, unplaced = _assign(runs, rows)
    ref = next((d for d, rep in runs if rep.get("method") == REFERENCE), None)
    paired = _paired(ref, [d for d, _ in runs]) if ref is not None else {}
    out = []
    for row in rows:
        rec = _paper(row)
        if row.id in placed:
            run_dir, report, differ = placed[row.id]
            rec.update(_ours(run_dir, report))
            matched = row.id in set(report.get("published") or [])
            note = (report.get("published_notes") or {}).get(row.id)
            rec["matched"] = matched
            rec["status"] = (("matched" + (f" ({note})" if note else "")) if matched
                             else "not the paper's configuration: " + _why_unmatched(run_dir, report, differ))
            rec.update(paired.get(str(run_dir), {}))
        else:
            rec["matched"] = False
            rec["status"] = (f"excluded: {row.excluded}" if row.excluded
                             else "not run: no run of this row among the directories given")
        out.append(rec)
    for run_dir, report, why in unplaced:
        rec = {"row": None, "label": str(report.get("method")), **_ours(run_dir, report),
               "matched": False, "status": why}
        rec.update(paired.get(str(run_dir), {}))
        out.append(rec)
    return pl.DataFrame(out, infer_schema_length=None)


def _paired(ref: Path, run_dirs: Sequence[Path]) -> dict[str, dict[str, Any]]:
    """run dir -> its headline judge's overall paired test against the reference run."""
    from structmem_gpu.analysis.paired import paired_comparison

    rows, refused = paired_comparison(ref, run_dirs)
    for line in refused:
        log.warning("table1: %s", line)
    out: dict[str, dict[str, Any]] = {str(ref): {"vs_structmem": "reference"}}
    for r in rows:
        if r["group"] == "overall" and r["headline"]:
            out[r["run_dir"]] = {
                "vs_structmem": "paired",
                "diff_pp": _pct(r["diff"]), "diff_ci_low": _pct(r["ci_low"]),
                "diff_ci_high": _pct(r["ci_high"]), "diff_ci_conv_low": _pct(r["ci_low_conv"]),
                "diff_ci_conv_high": _pct(r["ci_high_conv"]), "mcnemar_p": r["mcnemar_p"],
            }
    return out


# ---- output ----------------------------------------------------------------------------------
def _f(x: Any, digits: int = 2) -> str:
    return "–" if x is None else f"{float(x):.{digits}f}"


def _n(x: Any) -> str:
    return "–" if x is None else f"{round(float(x)):,}"


def _mtok(x: Any) -> str:
    return "–" if x is None else f"{float(x) / 1e6:.3f}"


def _both(r: Mapping[str, Any], key: str, fmt: Any = _f) -> str:
    return f"{fmt(r.get('ours_' + key))} / {fmt(r.get('paper_' + key))}"


def render_markdown(df: pl.DataFrame) -> str:
    lines = [
        "# StructMem Table 1: ours / the paper's",
        "",
        ("Each cell is `ours / paper`. Scores: judge accuracy in %, LoCoMo categories 1-4; ours "
        "with its 95% intervals resampling questions and resampling whole conversations "
        "(LoCoMo's 10 conversations make the second cover less than 95%, "
        "docs/evaluation.md \"Intervals\"). Build cost: memory-building stages only, input and "
        "output tokens in millions, LLM calls (cache hits included), wall seconds (not "
        "comparable: the paper's is a hosted API's latency, ours a local server's throughput; "
        "docs/evaluation.md \"StructMem Table 1 and Table 4 rows\"). "
        "vs StructMem: the paired difference in points against the StructMem run on the same "
        "questions, its 95% interval (questions) and McNemar's exact p. Status says whether "
        "the run is the configuration that produced the paper's number."),
        "",
    ]
    head = ["row", "overall", "95% CI (questions)", "by conversation",
            *(name for name, _ in CATEGORIES), "vs StructMem (pp, CI, p)", "status"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in df.iter_rows(named=True):
        ci = (f"[{_f(r.get('ours_ci_low'))}, {_f(r.get('ours_ci_high'))}]"
              if r.get("ours_ci_low") is not None else "–")
        conv = (f"[{_f(r.get('ours_ci_conv_low'))}, {_f(r.get('ours_ci_conv_high'))}]"
                if r.get("ours_ci_conv_low") is not None else "–")
        vs = r.get("vs_structmem")
        if vs == "paired":
            vs = (f"{r['diff_pp']:+.2f} [{_f(r['diff_ci_low'])}, {_f(r['diff_ci_high'])}], "
                  f"p={r['mcnemar_p']:.3g}")
        lines.append("| " + " | ".join([
            str(r.get("label")), _both(r, "overall"), ci, conv,
            *(_both(r, name) for name, _ in CATEGORIES), vs or "–",
            str(r.get("status") or "").replace("|", "\\|"),
        ]) + " |")
    cost = ["row", "build input (M tok)", "build output (M tok)", "build sum (M tok)",
            "LLM calls", "wall s"]
    lines += ["", "## Build cost (ours / paper)", "",
              "| " + " | ".join(cost) + " |", "|" + "---|" * len(cost)]
    for r in df.iter_rows(named=True):
        ours = (None if r.get("ours_prompt_tokens") is None
                else float(r["ours_prompt_tokens"]) + float(r.get("ours_completion_tokens") or 0))
        lines.append("| " + " | ".join([
            str(r.get("label")), _both(r, "prompt_tokens", _mtok),
            _both(r, "completion_tokens", _mtok),
            f"{_mtok(ours)} / {_mtok(r.get('paper_total_tokens'))}",
            _both(r, "calls", _n), _both(r, "wall_s", _n),
        ]) + " |")
    return "\n".join(lines) + "\n"


def write_table1(df: pl.DataFrame, out_dir: Path) -> dict[str, Path]:
    """table1.md, table1.csv and table1.json (records) under `out_dir`."""
    out_dir = Path(out_dir)
    paths = {s: out_dir / f"table1.{s}" for s in ("md", "csv", "json")}
    atomic_write_text(paths["md"], render_markdown(df))
    atomic_write_text(paths["csv"], df.write_csv())
    atomic_write_text(paths["json"], json.dumps(df.to_dicts(), indent=2, default=str) + "\n")
    return paths


def write_table1_page(out_dir: Path, run_dirs: Sequence[Path]) -> Path:
    """OUT/index.html: table1.md, with links to the tables and to every run's own page."""
    from structmem_gpu.eval.html import write_folder_page

    out_dir = Path(out_dir)
    text = (out_dir / "table1.md").read_text(encoding="utf-8")
    return write_folder_page(out_dir / "index.html", "StructMem Table 1", text, out_dir,
                             runs=[(Path(d).name, Path(d)) for d in run_dirs])
