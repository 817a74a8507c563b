"""Question groups: a big job (LongMemEval-M) built in bounded memory.

    python jobs/run.py benchmark=longmemeval benchmark.path=FILE question_groups=50

With `question_groups=N` the job's conversations (LongMemEval: one per question) are split
into K = ceil(conversations / N) groups by the shard assignment (methods/load.py: balanced by
text volume) and every stage runs per group, one group after another, each in a fresh child
process with its own run directory `<run_dir>/groups/g<i>-of-<K>/` (the job's overrides plus
`num_shards=K shard_index=i`). A group's memory goes back to the system when its process
ends, so the job's peak follows N, not the number of questions: extraction, embedding,
consolidation and retrieval plan, send and write one group at a time, and its vectors are
the group's tables on disk. Then the groups are merged into the run directory (run/merge.py,
one table at a time, shard by shard) and the report is rendered there over every question.
The parent loads the benchmark once to count and assign the questions (the load stage's
shard assignment) and writes the assignment to `<run_dir>/groups/plan.json`; each group then
loads only its own questions (`group_plan=`), instead of reading the whole file again.

The groups are the job's shards, so their tables and scores are those of a sharded job
(`num_shards=K`, merged): per-conversation work is unchanged, and work shared across
conversations is shared within a group only (StructMem's per-session extraction; on
LongMemEval's per-haystack dates almost nothing is shared anyway, and the response cache
answers a repeated request). Rerunning the command resumes: a finished group skips its
stages (fingerprints), and the merge and report are redone. Each child starts the job's LLM
backend itself: with a managed vLLM server that is one start per group, so on a GPU node
prefer few large groups or an external server (`llm.base_url`).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import atomic_write_text
from structmem_gpu.core.errors import StructMemError
from structmem_gpu.core.turns_store import CompactTurns

__all__ = ["GroupError", "group_dirs", "group_overrides", "plan_groups", "run_grouped"]

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
GROUPS_DIR = "groups"
# Overrides a group replaces: its own shard keys and run directory; no group groups again.
_REPLACED = ("num_shards=", "shard_index=", "question_groups=", "group_plan=",
             "hydra.run.dir=", "hydra.output_subdir=")
PLAN_FILE = "plan.json"

Launch = Callable[[int, int, Path, list[str]], int]  # (index, groups, dir, overrides) -> exit


class GroupError(StructMemError):
    """A group's child process failed; `exit_code` is its code (75 = preempted: requeue)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def plan_groups(job: JobConfig, run_dir: Path, size: int) -> tuple[int, int, Path | None]:
    """(conversations, groups, plan file) of the job's conversations after its selection
    (benchmark.conversations, max_sessions), read by the load stage's own loader. LongMemEval
    (streamed into the compact layout, ~0.5 GB at 500 questions) also gets its assignment
    written to `<run_dir>/groups/plan.json`, so that each group loads only its questions
    (methods/load.py read_group_plan); other benchmarks are small and let each group assign
    itself."""
    from structmem_gpu.methods import load

    turns, questions = load.read_benchmark(job)
    if not isinstance(turns, CompactTurns):
        n = int(turns["conv_id"].n_unique())
        return n, max(1, math.ceil(n / size)), None
    order = turns.conversations()  # file order, the order a group's loader keeps
    n = len(order)
    groups = max(1, math.ceil(n / size))
    assign = load.compact_assignment(turns, questions, groups) if groups > 1 else {}
    plan = {"benchmark_sha256": load.benchmark_sha256(job), "num_shards": groups,
            "members": [[c for c in order if assign.get(c, 0) == i] for i in range(groups)],
            # the whole selection's choice, which a group's own questions may not show
            "abstention_line": load.abstention_line(job, questions)}
    path = run_dir / GROUPS_DIR / PLAN_FILE
    atomic_write_text(path, json.dumps(plan))
    return n, groups, path


def group_dirs(run_dir: Path, groups: int) -> list[Path]:
    return [run_dir / GROUPS_DIR / f"g{i}-of-{groups}" for i in range(groups)]


def group_overrides(overrides: Sequence[str], index: int, groups: int,
                    plan: Path | None = None) -> list[str]:
    """The job's command-line overrides for group `index` of `groups`."""
    kept = [o for o in overrides if not o.lstrip("+~").startswith(_REPLACED)]
    return [*kept, f"num_shards={groups}", f"shard_index={index}", "question_groups=null",
            f"group_plan={'null' if plan is None else plan}"]


def launch_run(index: int, groups: int, gdir: Path, overrides: list[str]) -> int:
    """The default launcher: `python jobs/run.py <overrides> hydra.run.dir=<gdir>`, its
    output on this job's terminal and log."""
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *overrides, f"hydra.run.dir={gdir}"]
    log.info("group %d of %d: %s", index + 1, groups, " ".join(cmd))
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def run_grouped(job: JobConfig, run_dir: Path, overrides: Sequence[str], *,
                launch: Launch = launch_run, report: bool = True) -> list[Path]:
    """Run every group (children, in order), then merge them into `run_dir`; the group
    directories. The caller holds `run_dir` (core/runlock.py)."""
    from structmem_gpu.run.merge import merge_shards

    size = job.root.question_groups
    if size is None:
        raise ValueError("run_grouped needs question_groups set")
    n, groups, plan = plan_groups(job, run_dir, size)
    dirs = group_dirs(run_dir, groups)
    log.info("question_groups=%d: %d conversations in %d group(s) under %s", size, n, groups,
             run_dir / GROUPS_DIR)
    for i, gdir in enumerate(dirs):
        code = launch(i, groups, gdir, group_overrides(overrides, i, groups, plan))
        if code != 0:
            raise GroupError(f"group {i + 1} of {groups} ({gdir}) exited with code {code}; "
                             "rerun the same command to resume it", code)
    merge_shards(dirs, run_dir, job, report=report, overwrite=True)
    return dirs
