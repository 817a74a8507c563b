"""Stage `load`: benchmark file -> tables/turns.parquet + tables/questions.parquet +
tables/conversations.parquet (each kept conversation's speaker_a / speaker_b, data.load_speakers).

LongMemEval writes `turns` in the compact layout (tables/turn_sessions.parquet +
tables/turn_haystacks.parquet, structmem_gpu/core/turns_store.py): the file is streamed and each
distinct session stored once; `RunDir.read_table("turns")` expands it for every reader.

    python jobs/run.py benchmark=locomo benchmark.path=locomo10.json stages=[load] hydra.run.dir=DIR

Sharding happens here: with num_shards > 1 only this shard's conversations are kept (LoCoMo:
conversations; LongMemEval: questions, each its own conversation). The assignment balances text
volume, not counts, so shards take similar LLM time: a shard pays once per UNIQUE session
(session_hash; equal LongMemEval sessions in several haystacks are extracted once, the
content-keyed response cache dedupes them inside a batch), so a question costs a shard only
the sessions it does not hold yet, plus its question text. Greedy, largest first, preferring
the shard that already holds a question's sessions as long as that keeps the shards balanced
(see assign_shards); ties go to the lower shard index, so every job of an array computes the
same assignment.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from structmem_gpu.data.locomo import LOCOMO_SHA256
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.core.hashing import file_sha256
from structmem_gpu.core.stage_parts import INPUT
from structmem_gpu.stage import Stage, StageContext
from structmem_gpu.core.turns_store import CompactTurns

if TYPE_CHECKING:
    from structmem_gpu.config.job import JobConfig

log = logging.getLogger(__name__)


def assign_shards(sessions: Mapping[str, Mapping[str, int]], num_shards: int,
                  own: Mapping[str, int] | None = None) -> dict[str, int]:
    """conv_id -> shard, balancing the volume of unique sessions per shard; deterministic.

    `sessions[conv]` maps each session_hash the conversation reads to its text volume (a hash
    shared by several conversations costs a shard once); `own[conv]` is volume that belongs to
    the conversation alone (its questions). Largest conversation first (ties by conv_id). Each
    goes to the shard where it costs least (sessions the shard already holds are free) among
    the shards it fits in without raising the load above max(ideal share, current largest
    load); ties: the lower resulting load, then the lower shard index. When it fits nowhere,
    the shard with the lowest resulting load. Without shared sessions this is plain
    largest-first-to-the-lightest-shard (LPT).
    """
    if num_shards < 1:
        raise ConfigError(f"num_shards={num_shards} must be >= 1")
    own = own or {}
    unique: dict[str, int] = {}
    for vols in sessions.values():
        unique.update(vols)
    ideal = (sum(unique.values()) + sum(own.get(c, 0) for c in sessions)) / num_shards
    total = {c: sum(v.values()) + own.get(c, 0) for c, v in sessions.items()}
    loads = [0] * num_shards
    held: list[set[str]] = [set() for _ in range(num_shards)]
    out: dict[str, int] = {}
    for conv in sorted(sessions, key=lambda c: (-total[c], c)):
        vols = sessions[conv]
        cost = [sum(v for h, v in vols.items() if h not in held[s]) + own.get(conv, 0)
                for s in range(num_shards)]
        cap = max(ideal, max(loads))
        fits = [s for s in range(num_shards) if loads[s] + cost[s] <= cap]
        if fits:
            shard = min(fits, key=lambda s: (cost[s], loads[s] + cost[s], s))
        else:
            shard = min(range(num_shards), key=lambda s: (loads[s] + cost[s], s))
        loads[shard] += cost[shard]
        held[shard].update(vols)
        out[conv] = shard
    return out


def shard_assignment(volumes: Mapping[str, int], num_shards: int) -> dict[str, int]:
    """conv_id -> shard for conversations that share nothing (volume per conversation)."""
    return assign_shards({c: {c: v} for c, v in volumes.items()}, num_shards)


def shard_volumes(turns: pl.DataFrame, questions: pl.DataFrame
                  ) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(conv -> {session_hash: chars}, conv -> question chars) from the load tables."""
    chars = (pl.col("text").str.len_chars().fill_null(0)
             + pl.col("image_caption").str.len_chars().fill_null(0))
    per = (turns.group_by("conv_id", "session_hash").agg(chars.sum().alias("v"))
           .sort("conv_id", "session_hash"))
    sessions: dict[str, dict[str, int]] = {}
    for conv, h, v in per.iter_rows():
        sessions.setdefault(conv, {})[h] = int(v)
    q_chars = pl.col("question").str.len_chars().fill_null(0).sum().alias("v")
    q = questions.group_by("conv_id").agg(q_chars)
    own = {c: int(v) for c, v in q.iter_rows()}
    for conv in own:  # a conversation with questions but no turns still needs a shard
        sessions.setdefault(conv, {})
    return sessions, own


def apply_shard(turns: pl.DataFrame, questions: pl.DataFrame, shard_index: int, num_shards: int
                ) -> tuple[pl.DataFrame, pl.DataFrame]:
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ConfigError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    if num_shards == 1:
        return turns, questions
    sessions, own = shard_volumes(turns, questions)
    assign = assign_shards(sessions, num_shards, own)
    keep = [c for c, s in assign.items() if s == shard_index]
    if not keep:
        log.warning("shard %d of %d holds no conversation (only %d to share out)",
                    shard_index, num_shards, len(assign))
    return turns.filter(pl.col("conv_id").is_in(keep)), questions.filter(pl.col("conv_id").is_in(keep))


def _benchmark_args(job: "JobConfig") -> dict[str, Any]:
    b = job.root.benchmark
    convs = None if b.conversations is None else list(b.conversations)
    return {"name": b.name, "path": b.path, "conversations": convs,
            "max_sessions": b.max_sessions}


def benchmark_sha256(job: "JobConfig") -> str | None:
    """The benchmark file's sha256, so an edited file invalidates `load` and everything after."""
    args = _benchmark_args(job)
    path = args["path"]
    if path is None and args["name"] == "sample":
        from structmem_gpu.data import sample_path

        path = str(sample_path())
    if not path or not Path(path).is_file():
        return None
    st = Path(path).stat()
    digest = _sha256_of(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if args["name"] == "sample" and digest == LOCOMO_SHA256:
        # The run would be named `sample` and never matched to the papers' LoCoMo rows.
        raise ConfigError(f"benchmark.path={path} is the official LoCoMo file (sha256 "
                          f"{digest[:12]}...) under benchmark=sample; pass benchmark=locomo")
    return digest


@functools.lru_cache(maxsize=8)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    # The preflight, run_stages and the load fingerprint all ask for it before the first
    # stage; a LongMemEval file is GBs, so read it once per (file, size, mtime).
    return file_sha256(path)


def compact_layout(name: str) -> bool:
    """Whether benchmark `name`'s turns are written in the compact layout (turns_store.py):
    LongMemEval, whose haystacks share sessions (LongMemEval-M: each ~12x over 500
    questions). LoCoMo and the sample keep the plain turns.parquet (no session is shared)."""
    return name == "longmemeval"


def writes_compact(job: "JobConfig") -> bool:
    """Whether the job's load stage writes its turns in the compact layout."""
    b = job.root.benchmark
    return compact_layout(b.name) and b.path is not None


def compact_assignment(turns: CompactTurns, questions: pl.DataFrame,
                       num_shards: int) -> dict[str, int]:
    """conv_id -> shard, as apply_shard assigns them (balanced by volume)."""
    sessions = turns.session_volumes()
    q_chars = pl.col("question").str.len_chars().fill_null(0).sum().alias("v")
    own = {c: int(v) for c, v in questions.group_by("conv_id").agg(q_chars).iter_rows()}
    for conv in own:
        sessions.setdefault(conv, {})
    return assign_shards(sessions, num_shards, own)


def abstention_line(job: "JobConfig", questions: pl.DataFrame) -> bool:
    """Whether the job's whole question selection (before sharding or grouping) holds
    abstention questions: the paper reader's abstention line is one choice per job, so every
    shard and question group renders the prompts the unsharded job renders."""
    from structmem_gpu.eval.answer import wants_abstention
    from structmem_gpu.eval.selection import selected_questions

    return wants_abstention(selected_questions(job, questions))


def read_group_plan(job: "JobConfig", sha256: str | None) -> dict[str, Any]:
    """A question-grouped parent's plan (job.root.group_plan, written by run/groups.py:
    {"benchmark_sha256", "num_shards", "members": [[conv_id, ...], ...], "abstention_line"});
    ConfigError when it belongs to another file or number of groups."""
    import json

    path = Path(str(job.root.group_plan))
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"group_plan={path}: cannot read the question groups' plan ({exc})"
                          ) from exc
    shards = job.root.num_shards
    if plan.get("num_shards") != shards or plan.get("benchmark_sha256") != sha256:
        raise ConfigError(f"group_plan={path} was written for {plan.get('num_shards')} groups "
                          f"of another benchmark file or selection, not num_shards={shards} of "
                          f"this one; rerun the grouped job (question_groups=N), which "
                          f"rewrites it")
    return plan


def apply_shard_compact(turns: CompactTurns, questions: pl.DataFrame, shard_index: int,
                        num_shards: int) -> tuple[CompactTurns, pl.DataFrame]:
    """apply_shard for the compact layout: the same assignment, without expanding."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ConfigError(f"shard_index={shard_index} must be in [0, num_shards={num_shards})")
    if num_shards == 1:
        return turns, questions
    assign = compact_assignment(turns, questions, num_shards)
    keep = [c for c, s in assign.items() if s == shard_index]
    if not keep:
        log.warning("shard %d of %d holds no conversation (only %d to share out)",
                    shard_index, num_shards, len(assign))
    return turns.filter_conversations(keep), questions.filter(pl.col("conv_id").is_in(keep))


def read_benchmark(job: "JobConfig", only: Sequence[str] | None = None
                   ) -> tuple[CompactTurns | pl.DataFrame, pl.DataFrame]:
    """(turns, questions) of the job's benchmark after its selection, before sharding: the
    turns as CompactTurns for a LongMemEval file (compact_layout), else the plain frame.
    `only`: these conversations instead of benchmark.conversations (a question group's)."""
    args = _benchmark_args(job)
    if only is not None:
        args["conversations"] = list(only)
    if writes_compact(job):
        from structmem_gpu.data.longmemeval import load_longmemeval_compact

        return load_longmemeval_compact(args["path"], args["conversations"],
                                        args["max_sessions"])
    from structmem_gpu.data import load_benchmark

    return load_benchmark(**args)


def read_speakers(job: "JobConfig", conversations: Sequence[str]) -> pl.DataFrame:
    """schemas.CONVERSATIONS of the kept conversations: the benchmark's speaker_a / speaker_b
    (LoCoMo's named roles, LongMemEval's user and assistant)."""
    from structmem_gpu.data import load_speakers

    args = _benchmark_args(job)
    return load_speakers(args["name"], args["path"], list(conversations))


def run_load(ctx: StageContext) -> dict[str, Any]:
    shard, shards = ctx.job.root.shard_index, ctx.job.root.num_shards
    if writes_compact(ctx.job):
        from structmem_gpu.data.longmemeval import repeated_sessions

        if ctx.job.root.group_plan is not None and shards > 1:  # a question group's child
            # only this group's questions: assigned once by the parent (run/groups.py)
            plan = read_group_plan(ctx.job, benchmark_sha256(ctx.job))
            compact, questions = read_benchmark(ctx.job, plan["members"][shard])
            whole_abstention = plan.get("abstention_line")  # null: a plan of an older run
            if whole_abstention is not None:
                ctx.notes["abstention_line"] = bool(whole_abstention)
        else:
            compact, questions = read_benchmark(ctx.job)
            ctx.notes["abstention_line"] = abstention_line(ctx.job, questions)
            compact, questions = apply_shard_compact(compact, questions, shard, shards)
        names = compact.sessions.select("session_key", "session_id").unique("session_key")
        ctx.notes.update(conversations=compact.haystacks["conv_id"].n_unique(),
                         turns=compact.turn_count, sessions=compact.haystacks.height,
                         questions=questions.height, layout="compact",
                         distinct_sessions=names.height,  # distinct contents (id + turns)
                         distinct_dated_sessions=compact.haystacks.select(
                             "session_key", "session_hash").n_unique(),
                         distinct_session_turns=compact.sessions.height)
        # Haystacks that list a session id twice keep both copies (data/longmemeval.py).
        ctx.notes["repeated_sessions"] = repeated_sessions(
            compact.haystacks.join(names, on="session_key", how="left"))
        log.info("loaded %s", ctx.notes)
        convs = compact.haystacks["conv_id"].unique(maintain_order=True).to_list()
        return {"turns": compact, "questions": questions,
                "conversations": read_speakers(ctx.job, convs)}

    turns, questions = read_benchmark(ctx.job)
    ctx.notes["abstention_line"] = abstention_line(ctx.job, questions)
    turns, questions = apply_shard(turns, questions, shard, shards)
    from structmem_gpu.data.longmemeval import repeated_sessions

    ctx.notes.update(conversations=turns["conv_id"].n_unique(), turns=turns.height,
                     sessions=turns.select("conv_id", "session_index").unique().height,
                     questions=questions.height)
    if ctx.job.root.benchmark.name == "longmemeval":
        # Haystacks that list a session id twice keep both copies (data/longmemeval.py).
        ctx.notes["repeated_sessions"] = repeated_sessions(turns)
    log.info("loaded %s", ctx.notes)
    convs = turns["conv_id"].unique(maintain_order=True).to_list()
    return {"turns": turns, "questions": questions, "conversations": read_speakers(ctx.job, convs)}


STAGE = Stage(
    # conversations: added after version 2; a run loaded before has none, and its readers
    # (system_build) fall back to the speakers' order of appearance
    name="load", run=run_load, writes=("turns", "questions", "conversations"),
    depends=("benchmark.name", "benchmark.path", "benchmark.conversations", "benchmark.max_sessions",
             "shard_index", "num_shards"),
    extra_fingerprint=benchmark_sha256,
    # 2: shard assignment by unique-session volume (a rerun must not mix old and new shards).
    version="2",
    uses=(),
    part=INPUT,  # reads no questions, builds no memory: no cost table counts it
)
