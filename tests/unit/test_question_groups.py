"""Question groups (structmem_gpu/run/groups.py): `question_groups=N` runs the job's stages per
group of ~N conversations, each group a child process (jobs/run.py), then merges them.

The grouped job through jobs/run.py (what docs/scale-out.md shows) must give the scores, answers,
judgments, retrievals and entries of the same job run at once (in-process, the same config
but question_groups): the groups are shards, and StructMem's work is per conversation.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.run import groups

ROOT = Path(__file__).resolve().parents[2]
# 9 questions x 6 sessions of 3 turns, dates drawn per haystack (LongMemEval's recipe).
SPEC = HaystackFileSpec(questions=9, sessions=6, pool=30, turns_per_session=3)
# Per-conversation tables, compared sorted (a merge lists them shard by shard).
COMPARED = {"questions": ["question_id"], "answers": ["question_id"],
            "judgments": ["question_id", "judge_name"], "retrievals": ["question_id", "circuit", "rank"],
            "syntheses": ["conv_id", "window_index"]}


def test_group_overrides_replace_shard_keys_and_run_dir() -> None:
    got = groups.group_overrides(
        ["debug=scripted", "num_shards=1", "hydra.run.dir=/x", "question_groups=5",
         "+shard_index=0", "consolidate.seed_k=3"], 1, 4)
    assert got == ["debug=scripted", "consolidate.seed_k=3", "num_shards=4", "shard_index=1",
                   "question_groups=null", "group_plan=null"]
    planned = groups.group_overrides(["group_plan=/old.json"], 0, 2, Path("/r/groups/plan.json"))
    assert planned[-1] == "group_plan=/r/groups/plan.json" and "group_plan=/old.json" not in planned
    assert groups.group_dirs(Path("/r"), 2) == [Path("/r/groups/g0-of-2"),
                                                Path("/r/groups/g1-of-2")]


def test_question_groups_refused_in_a_sharded_job(compose_config) -> None:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.core.errors import StructMemError

    with pytest.raises(StructMemError, match="question_groups=3: expected null in a sharded"):
        JobConfig.from_cfg(compose_config(["question_groups=3", "num_shards=2"]))


@pytest.fixture(scope="module")
def grouped_and_whole(tmp_path_factory) -> tuple[Path, Path]:
    from tests.fixtures.pipeline import run_pipeline

    base = tmp_path_factory.mktemp("groups")
    data = write_longmemeval(SPEC, base / "lme.json")
    common = ["debug=scripted", "benchmark=longmemeval", f"benchmark.path={data}",
              f"paths.cache_dir={base / 'cache'}"]
    grouped = base / "grouped"
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "run.py"), *common,
                           "question_groups=4", f"hydra.run.dir={grouped}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    whole = base / "whole"
    run_pipeline(common, whole)
    return grouped, whole


@pytest.mark.e2e  # e2e: a grouped job of child processes and whole scripted runs
def test_grouped_job_equals_the_whole_job(grouped_and_whole) -> None:
    grouped, whole = (RunDir(p) for p in grouped_and_whole)
    dirs = sorted(d for d in (grouped.root / "groups").iterdir() if d.is_dir())
    assert [d.name for d in dirs] == ["g0-of-3", "g1-of-3", "g2-of-3"]  # ceil(9 / 4)
    sizes = [RunDir(d).read_table("questions").height for d in dirs]
    assert sum(sizes) == SPEC.questions and max(sizes) < SPEC.questions
    for name, keys in COMPARED.items():
        a, b = (r.read_table(name).sort(keys) for r in (grouped, whole))
        assert_frame_equal(a, b, check_exact=True)
    drop = ["request_id"]  # a shared extraction request is named once per group
    e_g, e_w = (r.read_table("entries").sort("entry_id").drop(drop) for r in (grouped, whole))
    assert e_g.height > 0
    assert_frame_equal(e_g, e_w, check_exact=True)
    reports = [json.loads((r.report_dir / "report.json").read_text()) for r in (grouped, whole)]
    for key in ("overall", "by_category", "unjudged"):
        assert reports[0][key] == reports[1][key], key
    assert reports[0]["overall"]["n"] == SPEC.questions
    merged = grouped.load_manifest()
    assert merged["merged"]["num_shards"] == 3 and merged["config_hash"] == (
        whole.load_manifest()["config_hash"])
    turns = grouped.read_table("turns").sort("conv_id", "session_index", "turn_index")
    assert_frame_equal(turns, whole.read_table("turns").sort("conv_id", "session_index",
                                                             "turn_index"))


@pytest.mark.e2e  # e2e: reads the grouped job's runs (child processes)
def test_groups_load_only_their_questions_from_the_plan(grouped_and_whole, compose_config,
                                                        tmp_path) -> None:
    """The parent's plan lists each group's questions; a group's load (which reads only
    those) gives the rows the shard assignment over the whole file gives."""
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.core.errors import ConfigError
    from structmem_gpu.data.longmemeval import load_longmemeval_compact
    from structmem_gpu.methods import load as load_stage

    grouped, _ = grouped_and_whole
    plan = json.loads((grouped / "groups" / "plan.json").read_text())
    assert plan["num_shards"] == 3 and sum(len(m) for m in plan["members"]) == SPEC.questions
    assert plan["abstention_line"] is RunDir(grouped / "groups" / "g0-of-3").stage_entry(
        "load")["notes"]["abstention_line"]
    data = grouped.parent / "lme.json"
    full, questions = load_longmemeval_compact(data)
    for i, members in enumerate(plan["members"]):
        group = RunDir(grouped / "groups" / f"g{i}-of-3")
        assert group.read_table("questions")["question_id"].to_list() == members
        whole_rows, _ = load_stage.apply_shard_compact(full, questions, i, 3)
        assert_frame_equal(group.read_table("turns"), whole_rows.expand())
    # A plan of another number of groups is refused, naming it.
    job = JobConfig.from_cfg(compose_config(
        ["debug=scripted", "benchmark=longmemeval", f"benchmark.path={data}", "num_shards=2",
         "shard_index=0", f"group_plan={grouped / 'groups' / 'plan.json'}"]))
    with pytest.raises(ConfigError, match="was written for 3 groups"):
        load_stage.read_group_plan(job, load_stage.benchmark_sha256(job))


@pytest.mark.e2e  # e2e: reads the grouped job's runs (child processes)
def test_merge_streams_tables_shard_by_shard(grouped_and_whole) -> None:
    """The merged tables are the shards' rows, in shard order (the streamed path)."""
    grouped, _ = grouped_and_whole
    dirs = sorted(d for d in (grouped / "groups").iterdir() if d.is_dir())
    parts = [RunDir(d).read_table("entry_embeddings") for d in dirs]
    assert_frame_equal(RunDir(grouped).read_table("entry_embeddings"), pl.concat(parts))
    assert not (grouped / "tables.merging").exists()


@pytest.mark.e2e  # e2e: a grouped job of child processes and whole scripted runs
def test_shards_render_the_whole_jobs_answer_prompts(longmemeval_example_path: Path,
                                                      tmp_path: Path) -> None:
    """The paper reader's abstention line is one choice per job (the load stage's note over the
    whole selection): a shard holding no abstention question still renders it when the job's
    selection has one, so shards and question groups send the whole job's answer requests."""
    common = ["debug=scripted", "benchmark=longmemeval",
              f"benchmark.path={longmemeval_example_path}", "method=structmem",
              "stages=[load,extract,embed,consolidate,retrieve,answer]",
              f"paths.cache_dir={tmp_path / 'cache'}"]
    from tests.fixtures.pipeline import run_pipeline

    def answer_ids(run: Path) -> set[str]:
        return set(RunDir(run).read_table("requests").filter(
            pl.col("stage") == "answer")["request_id"])

    run_pipeline(common, tmp_path / "whole")
    whole = RunDir(tmp_path / "whole")
    assert whole.read_table("questions")["is_abstention"].to_list().count(True) == 1
    shards = []
    for i in range(2):
        run_pipeline([*common, "num_shards=2", f"shard_index={i}"], tmp_path / f"s{i}")
        shards.append(RunDir(tmp_path / f"s{i}"))
        assert shards[-1].stage_entry("load")["notes"]["abstention_line"] is True
    # one question per shard: one of them holds no abstention question
    assert sorted(s.read_table("questions")["is_abstention"].to_list()[0] for s in shards) == [
        False, True]
    assert answer_ids(tmp_path / "s0") | answer_ids(tmp_path / "s1") == answer_ids(tmp_path / "whole")


def test_sharded_dry_run_renders_the_whole_jobs_abstention_line(longmemeval_example_path: Path,
                                                                 compose_config) -> None:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.node.dry_run import described

    base = ["debug=scripted", "benchmark=longmemeval", f"benchmark.path={longmemeval_example_path}",
            "stages=[load]"]
    assert described(JobConfig.from_cfg(compose_config(base)))[0].abstention_line is None
    for i in range(2):
        job = JobConfig.from_cfg(compose_config([*base, "num_shards=2", f"shard_index={i}"]))
        inputs, _ = described(job)
        assert inputs.selected.height == 1 and inputs.abstention_line is True
