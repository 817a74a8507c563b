"""report/report.md from the report.json dict (pure text; no plotting, no heavy imports).

Scores print as percentages with n beside them; published figures that match the run's
configuration print side by side with their source, e.g.

    | category | this run (judge acc., n) | StructMem: StructMem paper, Table 1 ... |
    |---|---|---|
    | 1 multi-hop | 50.0 (n=4) | 68.77 |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from structmem_gpu.eval.published import PublishedRow, shown_label

_METRIC_LABELS = {
    "judge_accuracy": "judge accuracy",
    "f1_locomo": "F1 (LoCoMo)",
    "bleu1": "BLEU-1",
    "f1_mem0": "F1 (Mem0)",
    "task_averaged_accuracy": "task-averaged accuracy",
}


def pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "–" if not ci else f"[{pct(ci[0])}, {pct(ci[1])}]"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def _score_row(label: str, g: Mapping[str, Any]) -> list[str]:
    return [
        label,
        str(g["n"]),
        pct(g["judge_accuracy"]),
        _ci(g["judge_accuracy_ci95"]),
        _ci(g.get("judge_accuracy_ci95_conversations")),
        pct(g.get("mde_paired")),
        pct(g.get("judge_accuracy_judged")),
        str(g.get("unjudged", 0)),
        pct(g["f1_locomo"]),
        pct(g["f1_mem0"]),
        pct(g["bleu1"]),
        pct(g["evidence_recall"]),
    ]


def _few_clusters(rep: Mapping[str, Any]) -> str:
    """The caveat of a cluster interval from few clusters (LoCoMo: 10 conversations)."""
    k = rep["overall"].get("conversations")
    if not k or k >= 30 or k == rep["overall"].get("n"):
        return ""
    return (f"With {k} conversations the cluster interval covers less than 95% (a percentile "
            f"bootstrap over few clusters is too narrow; a t interval on conversation means "
            f"with {k - 1} degrees of freedom is the usual fix). ")


def score_groups(rep: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], bool]]:
    """(label, scores, is_total) per category, then overall without adversarial (when the
    report has it) and overall: the rows of every score table."""
    out = [(f"{c} {g['name']}", g, False) for c, g in rep["by_category"].items()]
    if "overall_without_adversarial" in rep:
        out.append(("overall without adversarial", rep["overall_without_adversarial"], True))
    return out + [("overall", rep["overall"], True)]


def scores_section(rep: Mapping[str, Any]) -> list[str]:
    head = [
        "category",
        "n",
        "judge acc.",
        "95% CI (questions)",
        "95% CI (conversations)",
        "MDE (paired)",
        "judge acc. (judged only)",
        "unjudged",
        "F1 (LoCoMo)",
        "F1 (Mem0)",
        "BLEU-1",
        "evidence recall",
    ]
    rows = [_score_row(f"**{label}**" if total else label, g) for label, g, total in score_groups(rep)]
    models = ", ".join(rep["judge_models"].get(rep["judge"] or "", [])) or "–"
    out = [f"## Scores (judge `{rep['judge']}`: {models})", ""]
    audits = rep.get("judge_audit") or {}
    if rep.get("judge") in audits:  # eval/judge_audit.py: the judge's own error rates
        from structmem_gpu.eval.judge_audit import one_line

        audit = audits[rep["judge"]]
        out += [f"Judge audit of `{rep['judge']}`: "
                + (audit["line"] if audit else one_line(None)) + ".", ""]
    out += _table(head, rows)
    out.append(
        f"Unjudged (judge reply without a readable label): {rep['unjudged']}; they count as "
        f"WRONG in `judge acc.`, as in the published pipelines, and are left out of "
        f"`judge acc. (judged only)`. "
        f"Evidence recall excludes {rep['evidence_recall_excluded']} questions without resolvable "
        f"evidence or retrievals. CI: {rep['settings']['bootstrap_resamples']} bootstrap "
        f"resamples, seed {rep['settings']['bootstrap_seed']}; `(questions)` resamples questions "
        f"as if independent, `(conversations)` resamples whole conversations "
        f"({rep['overall'].get('conversations') or '–'} here). {_few_clusters(rep)}`MDE (paired)`: "
        f"the smallest accuracy difference a paired comparison at this n detects (McNemar, "
        f"alpha 0.05, power 0.8) against a run of equal accuracy with independent errors "
        f"(docs/evaluation.md \"Intervals\")."
    )
    return out + [""]


def judges_section(rep: Mapping[str, Any]) -> list[str]:
    if len(rep["by_judge"]) < 2:
        return []
    head = ["judge", "models", "n judged", "unjudged", "judge acc.", "95% CI"]
    rows = [
        [
            j,
            ", ".join(s["judge_models"]),
            str(s["overall"]["n"]),
            str(s["unjudged"]),
            pct(s["overall"]["judge_accuracy"]),
            _ci(s["overall"]["judge_accuracy_ci95"]),
        ]
        for j, s in rep["by_judge"].items()
    ]
    return ["## All judges (overall)", ""] + _table(head, rows)


def longmemeval_section(rep: Mapping[str, Any]) -> list[str]:
    lme = rep.get("longmemeval")
    if not lme:
        return []
    rows = [
        ["overall (micro)", pct(lme["overall_accuracy"]), str(lme["overall_n"])],
        [
            "task-averaged (unweighted over types)",
            pct(lme["task_averaged_accuracy"]),
            f"{lme['task_averaged_types']} types",
        ],
        ["abstention", pct(lme["abstention_accuracy"]), str(lme["abstention_n"])],
    ]
    return (
        ["## LongMemEval", ""]
        + _table(["metric", "accuracy", "n"], rows)
        + [
            "Hypotheses for LongMemEval's evaluate_qa.py: `report/longmemeval_hypotheses.jsonl`.",
            "",
        ]
    )


def _ours(rep: Mapping[str, Any], metric: str, cat: str | None) -> str:
    if metric == "task_averaged_accuracy":
        return pct((rep.get("longmemeval") or {}).get("task_averaged_accuracy"))
    group = rep["overall"] if cat is None else rep["by_category"].get(cat)
    if not group or metric not in group:
        return "–"
    n = f" (n={group['n']})" if metric == "judge_accuracy" else ""
    return pct(group[metric]) + n


def published_section(rep: Mapping[str, Any], rows: Sequence[PublishedRow]) -> list[str]:
    if not rows:
        why = rep.get("published_excluded")
        scope = rep.get("category_scope", rep["categories"])
        reason = (
            f"this is a harness run ({why}), never comparable with a paper"
            if why
            else (
                f"no published row fixes exactly this run's settings (method, benchmark, "
                f"ablation switches, k values, reader/judge protocol, category scope {scope})"
            )
        )
        return ["## Published figures", "", f"None shown: {reason}.", ""]
    out = [
        "## Published figures for this configuration",
        "",
        (
            "Rows whose every fixed setting matches this run (method, benchmark, ablation "
            "switches, k values, protocols, category scope). Published numbers use other "
            "backbones and judges (listed per row): compare trends, not absolute values. "
            "Scores in percent."
        ),
        "",
    ]
    ours_cats = set(rep["categories"])
    notes = rep.get("published_notes")
    for row in rows:
        cat5 = (" Their J includes category 5 (adversarial; this run scores it by "
                f"{CAT5_RULES.get(rep.get('category_5_rule') or 'rule')})."
                if 5 in row.categories else "")
        out.append(
            f"**{shown_label(row, notes)}** — {row.source}; {row.paper}; judge {row.judge_model}; "
            f"categories {list(row.categories)}.{cat5}"
        )
        out.append("")
        table: list[list[str]] = []
        for metric, value in row.overall.items():
            same = ours_cats == set(row.categories)
            ours = (
                _ours(rep, metric, None)
                if same or metric == "task_averaged_accuracy"
                else f"n/a (published covers categories {list(row.categories)})"
            )
            table.append([f"overall {_METRIC_LABELS.get(metric, metric)}", ours, f"{value:.2f}"])
        for metric, cats in row.by_category.items():
            for cat, value in cats.items():
                name = rep["category_names"].get(cat, cat)
                table.append(
                    [
                        f"{cat} {name} {_METRIC_LABELS.get(metric, metric)}",
                        _ours(rep, metric, cat),
                        f"{value:.2f}",
                    ]
                )
        out += _table(["figure", "this run", "published"], table)
        if "build_cost" in row.extra:
            c = row.extra["build_cost"]
            out += [
                (
                    f"Published build cost: {c.get('calls')} calls, "
                    f"{c.get('prompt_tokens'):,} prompt + {c.get('completion_tokens'):,} "
                    f"completion tokens, {c.get('wall_s')} s."
                ),
                "",
            ]
    return out


def quality_section(rep: Mapping[str, Any]) -> list[str]:
    stages = list(dict.fromkeys([*rep["parse_failure_rate"], *rep["truncation_rate"]]))
    if not stages:
        return []
    rows = [
        [s, pct(rep["parse_failure_rate"].get(s)), pct(rep["truncation_rate"].get(s))]
        for s in stages
    ]
    limit = pct(rep["settings"]["max_parse_failure_rate"], 0)
    out = [f"## LLM output quality (limit: parse failures ≤ {limit}%)", ""] + _table(
        ["stage", "parse failure %", "truncated %"], rows
    )
    over = rep.get("over_context") or {}
    if over:  # not sent: their content is missing from this run (counted as parse failures)
        listed = ", ".join(f"{s}: {n}" for s, n in over.items())
        out += ["", "**Requests over the model's context, not sent** (their content is "
                f"missing): {listed}."]
    return out


def system_section(rep: Mapping[str, Any]) -> list[str]:
    """A baseline system's own account: memories kept, dropped (where, why), failures."""
    sysrep = rep.get("system")
    if not sysrep:
        return []
    out = [f"## Baseline system: {sysrep['system']} {sysrep.get('version') or ''}".rstrip(), "",
           f"{sysrep['conversations']} conversations built; {sysrep['memories']} memories kept, "
           f"{sysrep['dropped']} dropped by the system (a model reply it could not use)"
           + (f"; searches lost {sysrep['search_dropped']} results the same way"
              if sysrep.get("search_dropped") else "") + ".", ""]
    if sysrep["drops"]:
        out += _table(["where: why", "times"], [[k, str(v)] for k, v in sysrep["drops"].items()])
        out += [""]
    dropped = {c: n for c, n in sysrep["dropped_by_conversation"].items() if n}
    if dropped:
        out += ["Dropped per conversation: " + ", ".join(f"{c} {n}" for c, n in dropped.items()),
                ""]
    for f in sysrep["failed"]:
        out += [f"**Failed** {f['phase']} of {f['conv_id']}: {f['error']} (its questions see "
                "no memory; `force=true` retries it)."]
    return out


def cost_section(rep: Mapping[str, Any]) -> list[str]:
    rows = []
    for stage, c in rep["build_cost"].items():
        wall = "–" if c.get("wall_s") is None else f"{c['wall_s']:.1f}"
        rows.append(
            [
                stage,
                str(c["calls"]),
                str(c["cache_hits"]),
                f"{c['prompt_tokens']:,}",
                f"{c['completion_tokens']:,}",
                wall,
            ]
        )
    return ["## Build cost", ""] + _table(
        ["stage", "calls", "cache hits", "prompt tokens", "completion tokens", "wall s"], rows
    )


# What `judge.input` means, as the report says it.
JUDGE_INPUTS = {
    "reply": "the reader's whole reply (`reply`)",
    "answer": "the extracted answer (`answer`)",
}

# The line report.md and the closing table open with when the answer model's profile says
# `llm.structure_only: true` (the CPU and scripted profiles).
STRUCTURE_ONLY_LINE = (
    "Structure-only run (llm.structure_only): these scores test the pipeline's structure, "
    "not memory quality, and are not comparable with any paper."
)


def structure_only_lines(rep: Mapping[str, Any]) -> list[str]:
    return [STRUCTURE_ONLY_LINE, ""] if rep.get("structure_only") else []


# How a report says which category-5 rule it used (report.json category_5_rule).
CAT5_RULES = {
    "rule": "LoCoMo's \"not mentioned\" rule on the free answer, no LLM call (eval.cat5=rule)",
    "forced_choice": "LoCoMo's paper protocol, a forced choice between \"Not mentioned in the "
                     "conversation\" and the adversarial answer (eval.cat5=forced_choice)",
}


def category_5_lines(rep: Mapping[str, Any]) -> list[str]:
    """Which category-5 rule the run used and, under forced choice, its own score."""
    rule = rep.get("category_5_rule")
    if rule is None:
        return []
    out = [f"Category 5 (adversarial): scored by {CAT5_RULES.get(rule, rule)}."]
    block = (rep.get("category_5_forced_choice") or {}).get(rep.get("judge") or "")
    if block:
        out[0] += (f" Forced choice: {pct(block['judge_accuracy'])}% of {block['n']} "
                   f"(95% CI {_ci(block['judge_accuracy_ci95'])}, questions; "
                   f"{block['unjudged']} replies named no option), reported apart and in no "
                   "overall or published-comparable number.")
    return out + [""]


def weights_line(rep: Mapping[str, Any]) -> list[str]:
    """Which weights produced the run: per role, the repository and its resolved snapshot."""
    parts = []
    for w in rep.get("weights") or []:
        version = w.get("snapshot") or w.get("revision")
        shown = f"{w['repository']}@{version}" if version else str(w["repository"])
        parts.append(f"{w['role']} `{shown}`")
    return ["Weights: " + "; ".join(parts) + ".", ""] if parts else []


def render_markdown(rep: Mapping[str, Any], published: Sequence[PublishedRow]) -> str:
    names = ", ".join(f"{k} = {v}" for k, v in rep["category_names"].items())
    protocols = rep.get("protocols") or {}
    lines = [
        *structure_only_lines(rep),
        f"# Report: {rep['benchmark']} / {rep['method']}",
        "",
        f"{rep['questions']} questions, categories {rep['categories']}. Category ids: {names}.",
        "",
        (
            f"Protocols: reader `{protocols.get('answer', '?')}`, judge "
            f"`{protocols.get('judge', '?')}`; the LLM judge saw "
            f"{JUDGE_INPUTS.get(protocols.get('judge_input', ''), 'an unrecorded input')} "
            f"(judge.input; docs/evaluation.md \"Evaluation protocols\"). Lexical metrics score the "
            "extracted answer."
        ),
        "",
        *weights_line(rep),
        *category_5_lines(rep),
        *[f"{k.capitalize()}: {protocols[k]}." for k in ("compression", "segmentation") if k in protocols],
    ]
    if "texts" in protocols or "qa_store" in protocols:
        lines += [
            f"Texts: {protocols.get('texts', '?')} (prompts.sources; docs/evaluation.md \"Official texts\")"
            + (f"; QA read the {protocols['qa_store']} store (update.read)"
               if "qa_store" in protocols else "") + ".",
            "",
        ]
    for section in (
        scores_section(rep),
        judges_section(rep),
        longmemeval_section(rep),
        published_section(rep, published),
        quality_section(rep),
        system_section(rep),
        cost_section(rep),
    ):
        lines += section
    return "\n".join(lines).rstrip() + "\n"


def closing_lines(rep: Mapping[str, Any], published: Sequence[PublishedRow]) -> list[str]:
    """The headline table a job prints when it ends (like lm-evaluation-harness's): per
    category and overall, judge accuracy with its 95% CI, F1, BLEU-1, n and unjudged, with
    the overall figure of every matching published row below it."""
    head = ["category", "n", "judge acc.", "95% CI", "unjudged", "F1", "BLEU-1"]
    rows = [[label, str(g["n"]), pct(g["judge_accuracy"]), _ci(g["judge_accuracy_ci95"]),
             str(g.get("unjudged", 0)), pct(g["f1_locomo"]), pct(g["bleu1"])]
            for label, g, _ in score_groups(rep)]
    out = [*structure_only_lines(rep),
           f"{rep['benchmark']} / {rep['method']}, judge {rep['judge']} (scores in percent)", ""]
    out += _table(head, rows)
    for row in published:
        figures = ", ".join(f"{_METRIC_LABELS.get(m, m)} {v:.2f}" for m, v in row.overall.items())
        label = shown_label(row, rep.get("published_notes"))
        out.append(f"published: {label} ({row.source}; judge {row.judge_model}): {figures}")
    if not published:
        why = rep.get("published_excluded")
        out.append(f"published: none for this configuration{f' (harness run: {why})' if why else ''}")
    return out


def closing_table(report_json: Any) -> str | None:
    """closing_lines for a report/report.json file (None when there is none)."""
    import json
    from pathlib import Path

    from structmem_gpu.eval.published import load_published

    path = Path(report_json)
    if not path.is_file():
        return None
    rep = json.loads(path.read_text(encoding="utf-8"))
    ids = set(rep.get("published") or [])
    rows = [r for r in load_published() if r.id in ids]
    return "\n".join(closing_lines(rep, rows)).rstrip() + "\n"
