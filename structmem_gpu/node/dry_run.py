"""Dry run: LLM requests and estimated tokens per stage, without contacting a server.

    python jobs/run.py benchmark=locomo benchmark.path=data/locomo10.json dry_run=true
    python jobs/bench.py dry-run benchmark=locomo benchmark.path=data/locomo10.json

Loads the benchmark (and applies the shard), then per stage of the method:
- extract: the stage's own `plan_windows` / `build_request`: exact request count, prompt tokens
  of the real messages; completion tokens estimated as one item per turn (the turn's length,
  capped by max_item_chars and max_items) plus JSON framing, capped at extract.max_tokens;
- consolidate: the greedy windows over the turns' times (entries inherit their turn's time,
  so the count equals the stage's whenever every turn yields an entry); prompt tokens of the
  real synthesis messages built with the turns standing in for the entries (one per turn and
  perspective) and seed_k seed events; completion min(max_tokens, 450) (200-350 words);
- update: an upper bound, one request per entry (entries: one per turn and perspective);
- answer / judge: one request per selected question (judge: minus category 5, scored by
  rule, times the judges of the panel); prompts of the real answer / judge templates filled
  with stand-ins of the configured sizes (entries_k entries, syntheses_k syntheses);
- compress / segment (no LLM): the compression volume (turns and o200k tokens in, about
  `compress.rate` of them out) and the extraction batches, APPROXIMATE: each turn stands in
  for its compression by its first `rate` share of words, each turn for a topic segment, packed
  to `segment.batch_tokens` o200k tokens per conversation (the real cuts need the model); with
  `extract.input=segments` / `compressed` the extract row is estimated on the same stand-ins;
- stages without an LLM: 0; other LLM stages (SEEM, graph_memory): "not estimated".
Tokens come from `llm.tokenizer` when it is on this machine (a local folder or an HF id already
in the local cache), with its chat template; otherwise characters / 4 + 4 per message.
Then the GPU memory plan (structmem_gpu/node/gpu_plan.py): per stage, what each GPU holds; a plan
that cannot fit ends the dry run with its one-line refusal (exit 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import polars as pl
from omegaconf import DictConfig, OmegaConf

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.tokens import CHARS
from structmem_gpu.llm.types import Message

log = logging.getLogger(__name__)

NO_LLM_STAGES = frozenset(
    {"load", "embed", "retrieve", "report", "audit_extraction", "audit_consolidation"}
)
SYNTHESIS_COMPLETION = 450  # tokens of a 200-350-word narrative
ANSWER_COMPLETION = 16  # a short phrase (answer.protocol=reasoned)
# answer.protocol=paper: a few reasoning steps with the date arithmetic, then the answer line
ANSWER_PAPER_COMPLETION = 200
JUDGE_COMPLETION = 40  # one sentence of reasoning + label (judge.protocol=reasoned)
JUDGE_PAPER_COMPLETION = 8  # {"label": "CORRECT"} (judge.protocol=paper)
CHARS_PER_TOKEN = 4
# The reader the answer estimate renders (other readers are estimated with its template).
STRUCTMEM_READER = "structmem_gpu.methods.structmem.context:build_prompts"
BUILD_STAGES = ("extract", "consolidate", "update")
# StructMem paper, LoCoMo build of the 10 conversations (gpt-4o-mini): calls, input, output.
PAPER_BUILD = {"requests": 1056, "prompt_tokens": 1_501_000, "completion_tokens": 436_000}


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    requests: int | None  # None = not estimated
    prompt_tokens: int | None
    completion_tokens: int | None
    basis: str
    # requests the context guard would not send (llm/context_guard.py); None = not estimated
    over_context: int | None = None
    window_plan: str | None = None  # extract: digest of the windows (the job's manifest shows it)


class ContextCheck:
    """The context guard's rule for one llm config, without a server: the configured context
    (`llm.n_ctx` / `llm.max_model_len`) and the guard's own prompt counter."""

    def __init__(self, llm_cfg: Any) -> None:
        from structmem_gpu.llm.factory import config_guard

        self.guard = config_guard(llm_cfg)
        self.limit = self.guard.limit
        self.counter = self.guard.counter

    def over(self, messages: Sequence[Message], max_tokens: int) -> bool:
        return not self.guard.fits(messages, max_tokens)


class TokenCounter:
    """Counts the tokens of a chat request: a HF tokenizer with its chat template, or chars/4."""

    def __init__(self, name: str, count: Callable[[Sequence[Message]], int]) -> None:
        self.name = name
        self._count = count

    def messages(self, messages: Sequence[Message]) -> int:
        return self._count(messages)


def token_counter(llm_cfg: Any) -> TokenCounter:
    """`llm.tokenizer` when it is on this machine (with its chat template), else characters / 4
    + 4 per message: an estimate, so a missing tokenizer is no error here (the windows are
    another matter: extract.window_tokenizer)."""
    from structmem_gpu.llm.tokens import CHARS_COUNTER, optional_counter

    get = (lambda k: llm_cfg.get(k)) if llm_cfg is not None else (lambda k: None)
    spec = get("tokenizer") if get("tokenizer") is not None else get("model")
    found = None
    if spec not in (None, "chars"):
        found = optional_counter(str(spec), get("revision") if spec == get("model") else None)
    if found is None:
        return TokenCounter("chars/4", CHARS_COUNTER.messages)
    return TokenCounter(f"tokenizer:{spec}", found.messages)


def load_turns_questions(cfg: DictConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The benchmark's turns and questions as the load stage would produce them (shard applied)."""
    from structmem_gpu.data import load_benchmark
    from structmem_gpu.methods.load import apply_shard

    b = cfg.benchmark
    convs = OmegaConf.to_container(b.conversations) if b.get("conversations") is not None else None
    turns, questions = load_benchmark(
        str(b.name), None if b.get("path") is None else str(b.path), convs, b.get("max_sessions")
    )  # type: ignore[arg-type]
    return apply_shard(turns, questions, int(cfg.shard_index), int(cfg.num_shards))


def estimate_extract(
    cfg: DictConfig, turns: pl.DataFrame, counter: TokenCounter, check: ContextCheck | None = None
) -> StageEstimate:
    from structmem_gpu.methods.structmem.extract import (
        ExtractSettings,
        build_request,
        plan_from_settings,
        window_plan_hash,
    )

    s = ExtractSettings.from_cfg(cfg)
    llm_cfg = OmegaConf.select(cfg, "llm", default=None)
    if s.input != "turns":
        turns = approximate_compressed(cfg, turns)
    try:
        if s.input == "segments":
            windows, packer = approximate_batches(cfg, turns), "o200k"
        else:
            windows, packer = plan_from_settings(turns, s, llm_cfg)
        plan: str | None = window_plan_hash(windows)
        missing = None
    except ConfigError as err:
        # The window tokenizer is not on this machine (a login node before `jobs/data.py
        # models`, a CI machine): the job stops on it (preflight); the dry run still plans,
        # by characters / 4, and says these are not the job's windows.
        windows, packer = plan_from_settings(turns, s.model_copy(update={"window_tokenizer": CHARS}), llm_cfg)
        plan, missing = None, str(err)
    prompt = completion = n = over = 0
    for kind in s.perspectives:
        for w in windows:
            req = build_request(w, kind, s)
            prompt += counter.messages(req.messages)
            over += check is not None and check.over(req.messages, req.sampling.max_tokens)
            # One item per turn restating it (capped by the schema), plus the JSON framing.
            mean_chars = sum(len(t.text) for t in w.turns) / max(len(w.turns), 1)
            item_tokens = min(mean_chars, s.max_item_chars) / CHARS_PER_TOKEN + 8
            items = len(w.turns) if s.max_items is None else min(len(w.turns), s.max_items)
            completion += int(min(s.max_tokens, 6 + items * item_tokens))
            n += 1
    return StageEstimate(
        "extract",
        n,
        prompt,
        completion,
        (f"APPROXIMATE ({s.input}: stand-in compression, see compress/segment rows): " if s.input != "turns" else "")
        + f"{len(windows)} windows x {len(s.perspectives)} perspectives (exact prompts"
        + (f"; batches of <= {OmegaConf.select(cfg, 'segment.batch_tokens', default=512)} {packer} tokens"
           if s.input == "segments" else
           f"; packed to {s.window_tokens} tokens by {packer}" if s.window_tokens else "")
        + (f"; window plan {plan})" if plan else
           f"; APPROXIMATE: not the job's windows, a real job stops on: {missing})"),
        None if check is None else over,
        plan,
    )


def _o200k() -> tuple[Callable[[str], int], str]:
    try:
        from structmem_gpu.llm.tiktoken_data import o200k_counter

        return o200k_counter(), "o200k"
    except ConfigError:  # quicktok-v1 not installed (the preflight names it): characters / 4
        return (lambda t: (len(t) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN), "chars/4"


def approximate_compressed(cfg: DictConfig, turns: pl.DataFrame) -> pl.DataFrame:
    """Each turn's reference message cut to its first `compress.rate` share of words: a
    stand-in of the compression's volume (the model decides which words)."""
    import math

    from structmem_gpu.methods.structmem.compress import reference_message

    rate = float(OmegaConf.select(cfg, "compress.rate", default=0.6))

    def cut(text: str) -> str:
        words = text.split()
        return " ".join(words[: math.ceil(rate * len(words))])

    texts = [cut(reference_message(t, c)) for t, c in zip(turns["text"], turns["image_caption"], strict=True)]
    return turns.with_columns(pl.Series("text", texts, pl.String), pl.lit(None, pl.String).alias("image_caption"))


def approximate_batches(cfg: DictConfig, turns: pl.DataFrame) -> list[Any]:
    """Extraction batches over `turns` (already stand-in compressed): every turn its own topic
    segment, packed per conversation to `segment.batch_tokens` o200k tokens (a turn that would
    exceed it starts the next batch), across sessions, as the reference's short-term buffer."""
    from structmem_gpu.methods.structmem.extract import ExtractionWindow, _turn_view

    budget = int(OmegaConf.select(cfg, "segment.batch_tokens", default=512))
    count, _ = _o200k()
    out: list[Any] = []
    ordered = turns.sort("conv_id", "session_index", "turn_index")
    for (conv_id,), frame in ordered.group_by("conv_id", maintain_order=True):
        views = [_turn_view(r) for r in frame.iter_rows(named=True)]
        batch: list[Any] = []
        used = 0
        for v in [*views, None]:
            need = 0 if v is None else count(v.text)
            if batch and (v is None or used + need > budget):
                topics = tuple((i, 1) for i in range(len(out), len(out) + len(batch)))
                out.append(ExtractionWindow(str(conv_id), batch[0].session_index, batch[0].session_time,
                                            tuple(batch), (), topics))
                batch, used = [], 0
            if v is not None:
                batch.append(v)
                used += need
    return out


def estimate_compress(cfg: DictConfig, turns: pl.DataFrame) -> StageEstimate:
    from structmem_gpu.methods.structmem.compress import reference_message

    count, name = _o200k()
    texts = [reference_message(t, c) for t, c in zip(turns["text"], turns["image_caption"], strict=True)]
    tokens = sum(count(t) for t in texts)
    rate = float(OmegaConf.select(cfg, "compress.rate", default=0.6))
    model = OmegaConf.select(cfg, "compress.model", default="?")
    return StageEstimate("compress", 0, 0, 0,
                         f"no LLM: LLMLingua-2 ({model}) over {sum(bool(t.strip()) for t in texts):,} "
                         f"turns, {tokens:,} {name} tokens in, about {int(rate * tokens):,} out "
                         f"(rate {rate})", 0)


def estimate_segment(cfg: DictConfig, turns: pl.DataFrame) -> StageEstimate:
    batches = approximate_batches(cfg, approximate_compressed(cfg, turns))
    cross = sum(len({t.session_index for t in w.turns}) > 1 for w in batches)
    return StageEstimate("segment", 0, 0, 0,
                         f"no LLM: APPROXIMATE {len(batches):,} extraction batches ({cross:,} "
                         "spanning sessions; turns standing in for topic segments)", 0)


def estimate_consolidate(
    cfg: DictConfig, turns: pl.DataFrame, counter: TokenCounter, check: ContextCheck | None = None
) -> StageEstimate:
    from structmem_gpu.methods.structmem.consolidate import ConsolidateSettings
    from structmem_gpu.methods.structmem.windows import windows_by_conversation
    from structmem_gpu.methods.structmem.prompts import synthesis

    s = ConsolidateSettings.from_cfg(cfg)
    if not s.enabled:
        return StageEstimate("consolidate", 0, 0, 0, "consolidate.enabled=false")
    kinds = [str(k) for k in cfg.extract.perspectives]
    cap = int(cfg.extract.max_item_chars)
    frame = turns.rename({"session_time": "event_time"})
    prompt = n = over = 0
    for rows, wins in windows_by_conversation(frame, s.window_seconds).values():
        recs = [
            synthesis.Record(r["event_time"], r["speaker"], k, (r["text"] or "")[:cap])
            for r in rows.iter_rows(named=True)
            for k in kinds
        ]
        per = len(kinds)
        for w in wins:
            buffer = recs[w.start * per : w.end * per]
            pool = (
                recs[: w.start * per]
                if s.seed_scope == "historical"
                else recs[: w.start * per] + recs[w.end * per :]
            )
            if not s.seed_exclude_buffer:
                pool = pool + buffer
            context = pool[-s.seed_k * per :] if s.seed_k else []
            msgs = synthesis.build_messages(s.prompt_variant, buffer, context)
            prompt += counter.messages(msgs)
            over += check is not None and check.over(msgs, s.max_tokens)
            n += 1
    return StageEstimate(
        "consolidate",
        n,
        prompt,
        n * min(s.max_tokens, SYNTHESIS_COMPLETION),
        "greedy windows over turn times; turns stand in for entries",
        None if check is None else over,
    )


UPDATE_COMPLETION = 60  # {"action": "update", "new_memory": "<one sentence>"}


def estimate_update(
    cfg: DictConfig, turns: pl.DataFrame, counter: TokenCounter, check: ContextCheck | None = None
) -> StageEstimate:
    """Offline update: an UPPER BOUND of one request per entry (every entry a candidate; the
    stage sends one per entry that reaches update.score_threshold in another's queue), entries
    estimated at one per turn and perspective; each prompt = the update prompt with the turn
    as target and one candidate (the next turn of the conversation)."""
    from structmem_gpu.methods.structmem.update import UpdateSettings, system_prompt
    from structmem_gpu.methods.structmem.prompts import update as P

    s = UpdateSettings.from_cfg(cfg)
    if not s.enabled:
        return StageEstimate("update", 0, 0, 0, "update.enabled=false")
    system, _ = system_prompt(s)
    per = len(list(cfg.extract.perspectives))
    cap = int(cfg.extract.max_item_chars)
    prompt = n = over = 0
    for (_,), part in turns.group_by("conv_id", maintain_order=True):
        texts = [(t or "")[:cap] for t in part["text"].to_list()]
        for i, text in enumerate(texts):
            msgs = P.build_messages(system, text, texts[i + 1 : i + 2] or [text])
            prompt += per * counter.messages(msgs)
            over += per * (check is not None and check.over(msgs, s.max_tokens))
            n += per
    return StageEstimate(
        "update", n, prompt, n * min(s.max_tokens, UPDATE_COMPLETION),
        "upper bound: every entry a candidate (one per turn and perspective)",
        None if check is None else over,
    )


def _selected(cfg: DictConfig, questions: pl.DataFrame) -> pl.DataFrame:
    from structmem_gpu.eval.selection import selected_questions

    return selected_questions(cfg, questions)


def estimate_answer(
    cfg: DictConfig,
    turns: pl.DataFrame,
    questions: pl.DataFrame,
    counter: TokenCounter,
    check: ContextCheck | None = None,
) -> StageEstimate:
    from structmem_gpu.eval.prompts import answer_structmem as P

    qs = _selected(cfg, questions)
    k = int(OmegaConf.select(cfg, "retrieve.entries_k", default=0) or 0)
    sk = int(OmegaConf.select(cfg, "retrieve.syntheses_k", default=0) or 0)
    if not bool(OmegaConf.select(cfg, "consolidate.enabled", default=False)):
        sk = 0
    # Entries are extraction items, at most extract.max_item_chars long (the reply schema).
    cap = OmegaConf.select(cfg, "extract.max_item_chars", default=None)
    texts = [(x or "")[: int(cap)] if cap else x for x in turns["text"].to_list()]
    t = datetime(2023, 5, 8)
    entries = (
        [
            P.MemoryLine(turns["speaker"][i % turns.height], t, texts[i % len(texts)])
            for i in range(k)
        ]
        if texts
        else []
    )
    # A synthesis is as long as its reply: min(consolidate.max_tokens, a 350-word narrative).
    synth_tokens = min(
        int(OmegaConf.select(cfg, "consolidate.max_tokens", default=0) or 0), SYNTHESIS_COMPLETION
    )
    synth = [P.SynthesisLine(t, t, "word " * int(synth_tokens * 0.75))] * sk
    paper = str(OmegaConf.select(cfg, "answer.protocol", default="paper")) == "paper"
    if paper:
        from structmem_gpu.eval.prompts import answer_paper as A

        block = [
            A.render_entries([A.PaperEntry(e.speaker, e.time, e.text) for e in entries]),
            A.render_summaries([s.text for s in synth]),
        ]
        prompts = [A.build_messages(q, block) for q in qs["question"].to_list()]
    else:
        prompts = [P.build_messages(q, entries, synth) for q in qs["question"].to_list()]
    prompt = sum(counter.messages(m) for m in prompts)
    max_tokens = int(cfg.answer.max_tokens)
    over = None if check is None else sum(check.over(m, max_tokens) for m in prompts)
    note = (
        ""
        if str(OmegaConf.select(cfg, "answer.prompt", default="")) == STRUCTMEM_READER
        else " (StructMem template as a stand-in for answer.prompt)"
    )
    comp = min(int(cfg.answer.max_tokens), ANSWER_PAPER_COMPLETION if paper else ANSWER_COMPLETION)
    return StageEstimate(
        "answer",
        qs.height,
        prompt,
        qs.height * comp,
        f"1 per selected question; {k} entries + {sk} syntheses{note}",
        over,
    )


def estimate_judge(
    cfg: DictConfig, questions: pl.DataFrame, counter: TokenCounter,
    check: ContextCheck | None = None,
) -> StageEstimate:
    from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL
    from structmem_gpu.eval.prompts import judge_locomo, judge_locomo_paper

    qs = _selected(cfg, questions).filter(pl.col("category") != LOCOMO_ADVERSARIAL)
    panel = OmegaConf.select(cfg, "judge.panel", default=None)
    judges = len(panel) if panel else 1
    paper = str(OmegaConf.select(cfg, "judge.protocol", default="paper")) == "paper"
    build = judge_locomo_paper.build_messages if paper else judge_locomo.build_messages
    # judge.input=reply after the paper reader: the judge reads the reader's whole reply.
    whole = (str(OmegaConf.select(cfg, "judge.input", default="reply")) == "reply"
             and str(OmegaConf.select(cfg, "answer.protocol", default="paper")) == "paper")
    reply_tokens = min(int(cfg.answer.max_tokens), ANSWER_PAPER_COMPLETION)
    stand_in = "word " * int(reply_tokens * 0.75) if whole else "a short generated answer"
    prompts = [
        build(q, a or "", stand_in)
        for q, a in qs.select("question", "answer").iter_rows()
    ]
    prompt = sum(counter.messages(m) for m in prompts)
    over = None if check is None else judges * sum(
        check.over(m, int(cfg.judge.max_tokens)) for m in prompts
    )
    comp = min(int(cfg.judge.max_tokens), JUDGE_PAPER_COMPLETION if paper else JUDGE_COMPLETION)
    return StageEstimate(
        "judge",
        qs.height * judges,
        prompt * judges,
        qs.height * judges * comp,
        f"1 per selected question (category 5 by rule) x {judges} judge(s)",
        over,
    )


def estimate(cfg: DictConfig) -> dict[str, Any]:
    """Requests and tokens per stage of the configured method (no server, nothing written)."""
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.methods.registry import stage_registry

    names = list(cfg.stages) if cfg.get("stages") else list(cfg.method.stages)
    registry = stage_registry(cfg)  # the method's stages, as the run would resolve them
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ConfigError(
            f"method '{cfg.method.name}' has no stage(s) {unknown}; it has {sorted(registry)}"
        )
    turns, questions = load_turns_questions(cfg)
    llm_cfg = OmegaConf.select(cfg, "llm", default=None)
    counter = token_counter(llm_cfg)
    check = ContextCheck(llm_cfg)
    judge_llm = OmegaConf.select(cfg, "judge.llm", default=None)
    judge_check = check if judge_llm is None else ContextCheck(judge_llm)
    rows: list[StageEstimate] = []
    for name in names:
        if name in NO_LLM_STAGES:
            rows.append(StageEstimate(name, 0, 0, 0, "no LLM", 0))
        elif name == "extract":
            rows.append(estimate_extract(cfg, turns, counter, check))
        elif name == "compress":
            rows.append(estimate_compress(cfg, turns))
        elif name == "segment":
            rows.append(estimate_segment(cfg, turns))
        elif name == "consolidate":
            rows.append(estimate_consolidate(cfg, turns, counter, check))
        elif name == "update":
            rows.append(estimate_update(cfg, turns, counter, check))
        elif name == "answer":
            rows.append(estimate_answer(cfg, turns, questions, counter, check))
        elif name == "judge":
            rows.append(estimate_judge(cfg, questions, counter, judge_check))
        else:
            rows.append(StageEstimate(name, None, None, None, "LLM stage: not estimated"))
    known = [r for r in rows if r.requests is not None]
    return {
        "method": str(cfg.method.name),
        "benchmark": str(cfg.benchmark.name),
        "conversations": turns["conv_id"].n_unique(),
        "turns": turns.height,
        "questions": questions.height,
        "questions_selected": _selected(cfg, questions).height,
        "tokenizer": counter.name,
        "context": {"tokens": check.limit.tokens, "source": check.limit.source,
                    "counter": check.counter.name},
        "stages": [asdict(r) for r in rows],
        "total": {
            k: sum(getattr(r, k) or 0 for r in known)
            for k in ("requests", "prompt_tokens", "completion_tokens")
        },
        "complete": len(known) == len(rows),
        "build": {
            k: sum(getattr(r, k) or 0 for r in known if r.stage in BUILD_STAGES)
            for k in ("requests", "prompt_tokens", "completion_tokens")
        },
        "paper_build": PAPER_BUILD
        if str(cfg.method.name) == "structmem" and str(cfg.benchmark.name) == "locomo"
        else None,
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
        {"stage": "total", **est["total"], "basis": "" if est["complete"] else "(known stages)"},
    ]:

        def f(v: Any) -> str:
            return "?" if v is None else f"{v:,}"

        lines.append(
            f"{r['stage']:<14}{f(r['requests']):>10}{f(r['prompt_tokens']):>14}"
            f"{f(r['completion_tokens']):>16}  {r['basis']}"
        )
    lines += over_context_lines(est)
    b = est.get("build") or {}
    if b.get("requests"):
        built = " + ".join(n for n in BUILD_STAGES if any(r["stage"] == n for r in est["stages"]))
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


def print_dry_run(cfg: DictConfig) -> dict[str, Any]:
    """The jobs/run.py `dry_run=true` hook: print the estimate table and the GPU memory plan;
    returns the estimate. A plan that cannot fit raises GpuPlanError with its one line (exit
    2), as the job itself would before its first stage."""
    from structmem_gpu.core.errors import GpuPlanError
    from structmem_gpu.eval.published import comparison_lines
    from structmem_gpu.node.gpu_plan import job_stages, plan

    # first, so a user knows which paper rows the run will be set beside before a GPU-hour
    print("\n".join(comparison_lines(cfg)) + "\n", flush=True)
    est = estimate(cfg)
    print(format_estimate(est))
    memory = plan(cfg, job_stages(cfg))
    print("\n" + memory.format(), flush=True)
    if memory.refusal:
        raise GpuPlanError(memory.refusal)
    return est
