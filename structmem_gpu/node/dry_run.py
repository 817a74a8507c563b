"""Dry run: LLM requests and estimated tokens per stage, without contacting a server.

    python jobs/run.py benchmark=locomo benchmark.path=data/locomo10.json dry_run=true
    python jobs/bench.py dry-run benchmark=locomo benchmark.path=data/locomo10.json

Loads the benchmark (and applies the shard), then asks every stage of the job to describe
itself (`Stage.describe`, structmem_gpu/stage.py): a stage with an estimate hook builds its
requests with its own request builders on the loaded turns and questions and counts them; a
stage without one says 0 when its `uses` names no LLM role, else "not estimated". A row is
EXACT when the stage's requests do not depend on earlier replies (extract, SEEM frames and
graph, answer), an UPPER BOUND, marked "<=", when they do (SEEM fusion and retrieve's fact
filter, graph-memory dedup, consolidate, update, judge; each row's basis says why). Prompt
tokens are the real messages' where the prompt does not depend on replies, else the stage's
builders on stand-ins of the configured sizes; completion tokens are rough (a typical reply,
capped by the stage's max_tokens).

Tokens are counted by the job's own model where this machine has it: with
`llm.backend=llamacpp`, the GGUF's tokenizer and chat template (llama_cpp, vocabulary only:
no weights), which is what llama.cpp reports as usage.prompt_tokens; else `llm.tokenizer` when
it is local (a folder or an HF id in the local cache), with its chat template; otherwise
characters / 4 + 4 per message (docs/performance.md "Dry run" has the measured ratios).
Then the GPU memory plan (structmem_gpu/node/gpu_plan.py): per stage, what each GPU holds; a
plan that cannot fit ends the dry run with its one-line refusal (exit 2).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.eval.selection import selected_questions
from structmem_gpu.llm.prompt_counter import TokenCounter
from structmem_gpu.llm.types import Message
from structmem_gpu.stage import EstimateInputs, StageEstimate

log = logging.getLogger(__name__)

# StructMem paper, LoCoMo build of the 10 conversations (gpt-4o-mini): calls, input, output.
PAPER_BUILD = {"requests": 1056, "prompt_tokens": 1_501_000, "completion_tokens": 436_000}


class ContextCheck:
    """The context guard's rule for one llm config, without a server: the configured context
    (`llm.n_ctx` / `llm.max_model_len`) and the guard's own prompt counter."""

    def __init__(self, llm: LLMSettings) -> None:
        from structmem_gpu.llm.factory import config_guard

        self.guard = config_guard(llm)
        self.limit = self.guard.limit
        self.counter = self.guard.counter

    def over(self, messages: Sequence[Message], max_tokens: int) -> bool:
        return not self.guard.fits(messages, max_tokens)


def token_counter(llm: LLMSettings) -> TokenCounter:
    """The model's own prompt count where this machine has the model: a llama.cpp GGUF
    (`gguf_counter`), else `llm.tokenizer` when local (with its chat template), else characters
    / 4 + 4 per message: an estimate, so a missing tokenizer is no error here (the windows are
    another matter: extract.window_tokenizer)."""
    from structmem_gpu.llm.tokens import CHARS_COUNTER, optional_counter

    from structmem_gpu.llm.backends import backend

    own = backend(llm.backend).token_counter(llm)  # llama.cpp: the GGUF's own
    if own is not None:
        return own
    spec = llm.tokenizer if llm.tokenizer is not None else llm.model
    found = None
    if spec not in (None, "chars"):
        found = optional_counter(str(spec), llm.revision if spec == llm.model else None)
    if found is None:
        return TokenCounter("chars/4", CHARS_COUNTER.messages)
    return TokenCounter(f"tokenizer:{spec}", found.messages)


def whole_benchmark(job: JobConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The benchmark's turns and questions after its selection, before sharding (plain)."""
    from structmem_gpu.data import load_benchmark

    b = job.root.benchmark
    return load_benchmark(
        str(b.name), None if b.path is None else str(b.path),
        None if b.conversations is None else list(b.conversations), b.max_sessions,
    )


def load_turns_questions(job: JobConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The benchmark's turns and questions as the load stage would produce them (shard applied)."""
    return shard_of(job, *whole_benchmark(job))


def shard_of(job: JobConfig, turns: pl.DataFrame, questions: pl.DataFrame
             ) -> tuple[pl.DataFrame, pl.DataFrame]:
    from structmem_gpu.methods.load import apply_shard

    return apply_shard(turns, questions, int(job.root.shard_index), int(job.root.num_shards))


def stage_rows(inputs: EstimateInputs, names: Sequence[str], registry: Any) -> list[StageEstimate]:
    """Each named stage's description of itself (Stage.describe)."""
    return [replace_name(registry[n].describe(inputs), n) for n in names]


def replace_name(row: StageEstimate, name: str) -> StageEstimate:
    """The row under the job's name for the stage (a method may map one Stage under another
    name, e.g. turn_rag's embed)."""
    from dataclasses import replace

    return row if row.stage == name else replace(row, stage=name)


def described(job: JobConfig) -> tuple[EstimateInputs, list[StageEstimate]]:
    """Every stage of the job described (Stage.describe, in run order, each hook leaving its
    stand-ins for the hooks after it), with the inputs they read and wrote."""
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.methods.registry import stage_registry

    names = job.stage_names
    registry = stage_registry(job)  # the method's stages, as the run would resolve them
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ConfigError(
            f"method '{job.root.method.name}' has no stage(s) {unknown}; it has {sorted(registry)}"
        )
    turns, questions = whole_benchmark(job)  # read once; the shard is taken below
    if job.root.num_shards > 1:  # the answer prompt's line is the whole job's (load's note)
        from structmem_gpu.methods.load import abstention_line

        abstention = abstention_line(job, questions)
    else:
        abstention = None  # decided from the questions, as the answer stage decides it
    turns, questions = shard_of(job, turns, questions)
    counter = token_counter(job.root.llm)
    check = ContextCheck(job.root.llm)
    judge_llm = job.settings(JudgeSettings).llm if job.has("judge") else None
    judge_check = check if judge_llm is None else ContextCheck(judge_llm)
    selected = selected_questions(job, questions)
    inputs = EstimateInputs(job, turns, questions, selected, counter, check, judge_check,
                            abstention_line=abstention)
    return inputs, stage_rows(inputs, names, registry)


def estimate_inputs(job: JobConfig) -> EstimateInputs:
    """The inputs after every stage described itself: the stand-in tables included."""
    return described(job)[0]


def estimate(job: JobConfig) -> dict[str, Any]:
    """Requests and tokens per stage of the configured method (no server, nothing written)."""
    inputs, rows = described(job)
    job, turns, questions, selected = inputs.job, inputs.turns, inputs.questions, inputs.selected
    counter, check = inputs.counter, inputs.check
    assert isinstance(check, ContextCheck)
    known = [r for r in rows if r.requests is not None]
    method, benchmark = str(job.root.method.name), str(job.root.benchmark.name)
    return {
        "method": method,
        "benchmark": benchmark,
        "conversations": turns["conv_id"].n_unique(),
        "turns": turns.height,
        "questions": questions.height,
        "questions_selected": selected.height,
        "tokenizer": counter.name,
        "context": {"tokens": check.limit.tokens, "source": check.limit.source,
                    "counter": check.counter.name},
        "stages": [asdict(r) for r in rows],
        "total": {
            k: sum(getattr(r, k) or 0 for r in known)
            for k in ("requests", "prompt_tokens", "completion_tokens")
        },
        "complete": len(known) == len(rows),
        "bound": any(r.bound for r in known),
        "build_stages": [r.stage for r in rows if r.build],
        "build": {
            k: sum(getattr(r, k) or 0 for r in known if r.build)
            for k in ("requests", "prompt_tokens", "completion_tokens")
        },
        "paper_build": PAPER_BUILD if method == "structmem" and benchmark == "locomo" else None,
    }


def format_estimate(est: dict[str, Any]) -> str:
    head = (
        f"dry run (no server contacted): method={est['method']} benchmark={est['benchmark']}: "
        f"{est['conversations']} conversations, {est['turns']} turns, "
        f"{est['questions_selected']} of {est['questions']} questions selected; "
        f"tokens by {est['tokenizer']}"
    )
    lines = [
        head,
        "",
        f"{'stage':<14}{'requests':>10}{'prompt tok':>14}{'completion tok':>16}  basis",
    ]
    for r in [
        *est["stages"],
        {"stage": "total", **est["total"], "bound": est.get("bound", False),
         "basis": "" if est["complete"] else "(known stages)"},
    ]:

        def f(v: Any) -> str:
            # "<=": an upper bound (the stage's requests depend on earlier replies)
            return "?" if v is None else f"{'<=' if r.get('bound') else ''}{v:,}"

        lines.append(
            f"{r['stage']:<14}{f(r['requests']):>10}{f(r['prompt_tokens']):>14}"
            f"{f(r['completion_tokens']):>16}  {r['basis']}"
        )
    lines += over_context_lines(est)
    b = est.get("build") or {}
    if b.get("requests"):
        built = " + ".join(est.get("build_stages") or [])
        lines += [
            "",
            f"build ({built}): {b['requests']:,} requests, "
            f"{b['prompt_tokens'] / 1e6:.3f} M prompt + {b['completion_tokens'] / 1e6:.3f} M "
            "completion tokens",
        ]
    p = est.get("paper_build")
    if p:
        lines.append(
            f"paper (StructMem, LoCoMo, gpt-4o-mini): {p['requests']:,} calls, "
            f"{p['prompt_tokens'] / 1e6:.3f} M input + {p['completion_tokens'] / 1e6:.3f} M "
            "output tokens"
        )
    return "\n".join(lines)


def over_context_lines(est: dict[str, Any]) -> list[str]:
    """The stages with requests the context guard would not send, by name (none: one line)."""
    ctx = est.get("context") or {}
    if ctx.get("tokens") is None:
        return ["", "model context unknown: over-context requests not checked"]
    over = [r for r in est["stages"] if r.get("over_context")]
    head = (f"over the model's context ({ctx['tokens']:,} tokens, {ctx['source']}; "
            f"counted by {ctx['counter']}):")
    if not over:
        return ["", f"{head} 0 requests"]
    listed = ", ".join(f"{r['stage']} {r['over_context']:,} of {r['requests']:,}" for r in over)
    return ["", f"{head} {listed} requests would not be sent (recorded as over_context failures)"]


def print_dry_run(job: JobConfig) -> dict[str, Any]:
    """The jobs/run.py `dry_run=true` hook: print the estimate table and the GPU memory plan;
    returns the estimate. A plan that cannot fit raises GpuPlanError with its one line (exit
    2), as the job itself would before its first stage."""
    from structmem_gpu.core.errors import GpuPlanError
    from structmem_gpu.eval.published import comparison_lines
    from structmem_gpu.node.gpu_plan import job_stages, plan

    # first, so a user knows which paper rows the run will be set beside before a GPU-hour
    print("\n".join(comparison_lines(job)) + "\n", flush=True)
    est = estimate(job)
    print(format_estimate(est))
    memory = plan(job, job_stages(job))
    print("\n" + memory.format(), flush=True)
    if memory.refusal:
        raise GpuPlanError(memory.refusal)
    return est
