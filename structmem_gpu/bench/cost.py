"""LLM cost of a run from its requests.parquet, extrapolated to full LoCoMo, next to the paper.

    python jobs/bench.py cost --run-dir outputs/runs/sample/structmem

Per stage and per conversation: calls, cache hits, prompt / completion tokens and the prefix
tokens the server reports as cached (vLLM's `usage.prompt_tokens_details.cached_tokens`;
llama.cpp reports none, so the column is null there). Cache-hit rows keep the token counts of
the original computation (request_log.py), so a cached rerun reports the same cost.

Extrapolation to the full benchmark (LoCoMo: 10 conversations, 5,882 turns, 1,540 questions
in categories 1-4) scales build stages by turns (their requests are per window of turns and
per session) and per-question stages by questions answered:

    full = run_value * 5882 / run_turns            # extract, consolidate, frames, ...
    full = run_value * 1540 / run_answer_calls     # answer, judge, SEEM's retrieve

Which stage is which is the stage's own declaration (`Stage.per_question`: it reads the
questions table), looked up in the method of the config the run saved.

next to the paper's Table 1 build cost (1.501 M input, 0.436 M output tokens, 1,056 calls).
The reference code counts one call per extraction *batch* while it sends two requests
(docs/methods.md "StructMem: reference code"), so its "calls" and our request counts are not
the same unit.
A run with capped replies (debug=ci) under-reports completion tokens; say so when comparing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from structmem_gpu.core.artifacts import RunDir



def question_stages(run_dir: Path | None = None) -> frozenset[str]:
    """Stages whose requests are per question (Stage.per_question), as the run's method
    declares them (stage_lookup.RunStages: the config the run saved, then the packaged
    methods' stages of those names; None = the packaged methods')."""
    from structmem_gpu.stage_lookup import RunStages
    from structmem_gpu.core.stage_parts import QUESTION

    return RunStages(run_dir).names(QUESTION)


@dataclass(frozen=True)
class Target:
    name: str
    conversations: int
    turns: int
    questions: int


LOCOMO = Target(
    "LoCoMo (10 conversations, 5,882 turns, 1,540 questions in categories 1-4)", 10, 5882, 1540
)
# Paper Table 1, StructMem build on LoCoMo with gpt-4o-mini (docs/replication.md "Replicating the papers").
PAPER_TABLE1: dict[str, float] = {
    "prompt_tokens": 1_501_000,
    "completion_tokens": 436_000,
    "calls": 1056,
    "wall_s": 22854,
}
_SUMS = ("calls", "cache_hits", "prompt_tokens", "completion_tokens", "cached_tokens", "truncated")


def _aggregate(requests: pl.DataFrame, by: Sequence[str]) -> pl.DataFrame:
    return (
        requests.group_by(list(by), maintain_order=True)
        .agg(
            pl.len().alias("calls"),
            pl.col("cache_hit").sum().alias("cache_hits"),
            pl.col("prompt_tokens").fill_null(0).sum().alias("prompt_tokens"),
            pl.col("completion_tokens").fill_null(0).sum().alias("completion_tokens"),
            # null when the server never reported prefix-cache hits for this group
            pl.col("cached_tokens").sum().alias("cached_tokens"),
            pl.col("cached_tokens").is_not_null().any().alias("_has_cached"),
            (pl.col("finish_reason") == "length").sum().alias("truncated"),
        )
        .with_columns(
            pl.when(pl.col("_has_cached"))
            .then(pl.col("cached_tokens"))
            .otherwise(None)
            .alias("cached_tokens")
        )
        .drop("_has_cached")
        .sort(list(by))
    )


def stage_table(requests: pl.DataFrame) -> list[dict[str, Any]]:
    """One row per stage: calls, cache hits, tokens, cached prefix tokens, truncated replies."""
    return _aggregate(requests, ["stage"]).to_dicts() if requests.height else []


def conversation_table(requests: pl.DataFrame) -> list[dict[str, Any]]:
    """One row per (conversation, stage); requests shared by conversations have conv_id null."""
    return _aggregate(requests, ["conv_id", "stage"]).to_dicts() if requests.height else []


def extrapolate(
    stage_rows: Sequence[Mapping[str, Any]],
    *,
    run_turns: int,
    run_questions: int,
    target: Target = LOCOMO,
    per_question: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Scale each stage's calls and tokens to `target` (build stages by turns, the stages of
    `per_question` by questions; None = the packaged methods' per-question stages)."""
    qa_stages = question_stages() if per_question is None else per_question
    rows = []
    for r in stage_rows:
        qa = r["stage"] in qa_stages
        base = run_questions if qa else run_turns
        factor = (target.questions if qa else target.turns) / base if base > 0 else None
        row: dict[str, Any] = {
            "stage": r["stage"],
            "basis": "questions" if qa else "turns",
            "factor": None if factor is None else round(factor, 3),
        }
        for key in ("calls", "prompt_tokens", "completion_tokens"):
            row[key] = None if factor is None else round(float(r[key]) * factor)
        rows.append(row)
    build = [r for r in rows if r["basis"] == "turns"]
    total = {
        k: sum(r[k] or 0 for r in build) for k in ("calls", "prompt_tokens", "completion_tokens")
    }
    return {
        "target": target.name,
        "per_stage": rows,
        "build_total": total,
        "build_vs_paper": compare_to_paper(total),
    }


def compare_to_paper(build_total: Mapping[str, float]) -> dict[str, float | None]:
    """ours / paper for calls, prompt and completion tokens of the build."""
    return {
        f"{k}_ratio": round(build_total[k] / PAPER_TABLE1[k], 4) if PAPER_TABLE1[k] else None
        for k in ("calls", "prompt_tokens", "completion_tokens")
    }


def run_counts(run_dir: Path) -> dict[str, int]:
    """Turns, conversations and answer calls of a run directory (for the extrapolation)."""
    tables = run_dir / "tables"
    run = RunDir(run_dir)
    turns = run.read_table("turns") if run.has_table("turns") else None  # either layout
    out = {
        "turns": 0 if turns is None else turns.height,
        "conversations": 0 if turns is None else turns["conv_id"].n_unique(),
    }
    answers = tables / "answers.parquet"
    out["questions_answered"] = (
        pl.read_parquet(answers, glob=False).height if answers.exists() else 0
    )
    return out


def cost_report(run_dir: Path, target: Target = LOCOMO) -> dict[str, Any]:
    """Everything `jobs/bench.py cost` reports for one run directory."""
    path = run_dir / "tables" / "requests.parquet"
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no requests table (has an LLM stage of this run finished?)"
        )
    requests = pl.read_parquet(path, glob=False)
    counts = run_counts(run_dir)
    per_stage = stage_table(requests)
    notes = []
    manifest = run_dir / "manifest.json"
    if manifest.exists():
        recorded = json.loads(manifest.read_text())
        capped = [
            s
            for s, e in recorded.get("stages", {}).items()
            if any(
                int(v.get("max_tokens", 10**6) or 10**6) < 256
                for v in (e.get("config") or {}).values()
                if isinstance(v, dict)
            )
        ]
        if capped:
            notes.append(
                f"replies capped below 256 tokens in {capped} (e.g. debug=ci): completion "
                "tokens are a lower bound of an uncapped run"
            )
    if not any(r["cached_tokens"] is not None for r in per_stage):
        notes.append(
            "the server reported no cached prefix tokens (llama.cpp never does; vLLM does)"
        )
    return {
        "run_dir": str(run_dir),
        **counts,
        "per_stage": per_stage,
        "per_conversation": conversation_table(requests),
        "extrapolation": extrapolate(
            per_stage,
            run_turns=counts["turns"],
            run_questions=counts["questions_answered"] or _calls(per_stage, "answer"),
            target=target,
            per_question=question_stages(run_dir),
        ),
        "paper_table1": dict(PAPER_TABLE1),
        "notes": notes,
    }


def _calls(rows: Sequence[Mapping[str, Any]], stage: str) -> int:
    return sum(int(r["calls"]) for r in rows if r["stage"] == stage)
