"""The differential's files (analysis/differential.py computes it):

    <out>/differential.md                 the per-stage table, request settings, first diffs,
                                          memory sizes, mean overlap@k per circuit pair
    <out>/differential.parquet            one row per stage
    <out>/differential_questions.parquet  one row per (question, official circuit, port circuit)
    <out>/differential_memory.parquet     one row per conversation

Everything is rendered before the first file is written, and each file is replaced
atomically (core/artifacts.py), so a failure leaves the previous files as they were.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import polars as pl

from structmem_gpu.analysis.differential import Differential, StageDiff
from structmem_gpu.analysis.deviations import Explanation, explain
from structmem_gpu.analysis.differential_memory import overlap_means
from structmem_gpu.core.artifacts import atomic_write_parquet, atomic_write_text

MD, STAGES, QUESTIONS, MEMORY = ("differential.md", "differential.parquet",
                                 "differential_questions.parquet", "differential_memory.parquet")


IDENTICAL = ("identical = byte-equal messages (the JSON of [{role, content}] in order); model, "
             "sampling parameters, output format and tools are listed apart (request settings). "
             "share = identical / max(official, port).")
OVERLAP = ("overlap@k = |A ∩ B| / max(|A|, |B|), A and B the texts each run ranked below k for "
           "the same question; per question: {}")


def default_out(official: Path, port: Path) -> Path:
    return Path(port) / "differential" / Path(official).resolve().name


def _params(c: Counter[str]) -> str:
    return "; ".join(f"{p} (×{n})" for p, n in c.most_common())


def _named(explained: Counter[str]) -> str:
    """"deviation (differences); ..." of one stage's explained differences ("" = none)."""
    return "; ".join(f"{k} ({n})" for k, n in sorted(explained.items()))


def stages_frame(d: Differential, ex: Explanation | None = None) -> pl.DataFrame:
    ex = explain(d) if ex is None else ex
    rows = []
    for s in d.stages:
        f = s.first
        e = ex.stage(s.stage)
        rows.append({
            "explained": _named(e.explained) or None,
            "unexplained": len(e.unexplained),
            "stage": s.stage, "official": s.official, "port": s.port, "identical": s.identical,
            "share": s.share, "official_unknown": len(s.official_unknown),
            "port_unknown": len(s.port_unknown), "differing": len(s.pairs),
            "official_only": len(s.unmatched_official), "port_only": len(s.unmatched_port),
            "official_embeddings": s.official_embeddings, "port_embeddings": s.port_embeddings,
            "embeddings_identical": s.embeddings_identical,
            "first_official": f.pair.official.request_id if f and f.pair.official else None,
            "first_port": f.pair.port.request_id if f and f.pair.port else None,
            "first_similarity": f.pair.ratio if f else None,
            "first_diff": f.diff if f else None,
            "first_diff_cut_lines": f.cut_lines if f else None,
            "official_params": _params(s.official_params), "port_params": _params(s.port_params),
        })
    schema = {"share": pl.Float64(), "first_similarity": pl.Float64(),
              "embeddings_identical": pl.Int64(), "first_diff_cut_lines": pl.Int64(),
              "first_official": pl.String(), "first_port": pl.String(), "first_diff": pl.String()}
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_cell(s: StageDiff) -> str:
    f = s.first
    if f is None:
        if s.official or s.port:
            return "none"
        return "embedding calls only (below)" if s.official_embeddings or s.port_embeddings else "—"
    a, b = f.pair.official, f.pair.port
    if a is not None and b is not None:
        return f"`{_cell(a.request_id)}` ↔ `{_cell(b.request_id)}` (similarity {f.pair.ratio:.3f})"
    if a is not None:
        return f"only in official: `{_cell(a.request_id)}`"
    return f"only in port: `{_cell(b.request_id)}`" if b is not None else "—"


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _stage_table(d: Differential) -> list[str]:
    out = ["| stage | official | port | identical | share | first difference |",
           "|---|---:|---:|---:|---:|---|"]
    for s in d.stages:
        share = "—" if s.share is None else f"{s.share:.3f}"
        out.append(f"| {s.stage} | {s.official} | {s.port} | {s.identical} | {share} "
                   f"| {_first_cell(s)} |")
    notes = [f"- {s.stage}: {len(s.official_unknown)} official and {len(s.port_unknown)} port "
             "requests whose content the cache does not hold (failed requests are not cached)"
             for s in d.stages if s.official_unknown or s.port_unknown]
    notes += [f"- {s.stage}: embedding calls official {s.official_embeddings}, port "
              f"{s.port_embeddings}; {_embedding_note(s)}"
              for s in d.stages if s.official_embeddings or s.port_embeddings]
    return out + ([""] + notes if notes else [])


def _embedding_note(s: StageDiff) -> str:
    if s.embeddings_identical is None:
        return "inputs not stored, not compared"
    return f"{s.embeddings_identical} with identical inputs"


def _settings(d: Differential) -> list[str]:
    out = ["## Request settings (not part of identity)", "",
           "| stage | official | port |", "|---|---|---|"]
    for s in d.stages:
        if s.official or s.port:
            a, b = _cell(_params(s.official_params)), _cell(_params(s.port_params))
            out.append(f"| {s.stage} | {a or '—'} | {b or '—'} |")
    return out


def _diffs(d: Differential) -> list[str]:
    out = ["## First difference per stage", ""]
    for s in d.stages:
        f = s.first
        if f is None:
            continue
        cut = f"; {f.cut_lines} of {f.total_lines} diff lines cut" if f.cut_lines else ""
        counts = (f"differing pairs {len(s.pairs)}, {len(s.unmatched_official)} only in "
                  f"official, {len(s.unmatched_port)} only in port{cut}")
        out += [f"### {s.stage}", "", f"{_first_cell(s)}; {counts}", ""]
        body = f.diff or "(the rendered messages are equal: they differ in content encoding only)"
        fence = _fence(body)
        out += [f"{fence}diff", body, fence, ""]
    return out if len(out) > 2 else []


def _frame_table(df: pl.DataFrame) -> list[str]:
    def fmt(v: object) -> str:
        return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    out = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    return out + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]


def _explained(ex: Explanation) -> list[str]:
    """Per stage: the listed deviations that explain its differences, and what none explains."""
    lines = ["## Listed deviations (analysis/deviations.py)", ""]
    if not ex.deviations:
        return lines + [f"no deviations are listed for official method {ex.method!r}: every "
                        "difference above is unexplained by design"]
    lines += ["| stage | identical | explained by (differences) | unexplained |", "|---|---:|---|---:|"]
    for s in ex.stages:
        lines.append(f"| {s.stage} | {s.identical} | {_named(s.explained) or '—'} | "
                     f"{len(s.unexplained)} |")
    lines += ["", "Where each is listed: " + "; ".join(
        f"**{d.name}**: {d.listed}" for d in ex.deviations)]
    if ex.unexplained:
        lines += ["", f"Unexplained ({len(ex.unexplained)}, first 20):", ""]
        lines += [f"- {u}" for u in ex.unexplained[:20]]
    return lines


def differential_markdown(d: Differential, ex: Explanation | None = None) -> str:
    caches = " and ".join(f"`{c}`" for c in dict.fromkeys(d.cache_dirs))
    lines = ["# Request-level differential", "",
             f"official: `{d.official}` · port: `{d.port}` · response cache: {caches}", "",
             IDENTICAL, ""]
    lines += _stage_table(d) + [""] + _settings(d) + [""] + _explained(explain(d) if ex is None else ex) + [""]
    lines += _diffs(d)
    lines += ["## Memory sizes per conversation", ""]
    lines += _frame_table(d.memory) if d.memory.width > 1 else ["no memory tables in either run"]
    lines += ["", f"## Retrieved sets: overlap@{d.k} by text", ""]
    if d.questions.height:
        means = overlap_means(d.questions).rename({"mean_overlap": f"mean overlap@{d.k}"})
        lines += _frame_table(means)
        lines += ["", OVERLAP.format(QUESTIONS)]
    else:
        lines.append("no question retrieved by both runs (retrievals.parquet missing or disjoint)")
    return "\n".join(lines) + "\n"


def write_differential(d: Differential, out: Path) -> dict[str, Path]:
    """Write the four files (rendered first, each replaced atomically); their paths."""
    out = Path(out)
    ex = explain(d)  # once for both files
    md, stages = differential_markdown(d, ex), stages_frame(d, ex)
    paths = {"md": out / MD, "stages": out / STAGES, "questions": out / QUESTIONS,
             "memory": out / MEMORY}
    atomic_write_parquet(paths["stages"], stages)
    atomic_write_parquet(paths["questions"], d.questions)
    atomic_write_parquet(paths["memory"], d.memory)
    atomic_write_text(paths["md"], md)  # last: its presence says the others are complete
    return paths
