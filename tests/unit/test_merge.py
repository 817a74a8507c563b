"""Merging shard run directories (structmem_gpu/run/merge.py, jobs/report.py merge).

Runs the whole pipeline on the bundled sample with the scripted LLM (deterministic, no
server): once unsharded and as two shards. The merged tables must hold the same row sets as
the unsharded run's; incomplete or inconsistent shard sets must fail naming the shard.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from jobs.report import main as report_main
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.run.merge import MergeError, discover_run_dirs, merge_shards, sum_costs
from tests.fixtures.pipeline import compose_job, run_pipeline

# Columns that describe how a request was served, not what it computed.
VOLATILE = ("latency_s", "cache_hit", "attempts", "cached_tokens")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("merge")
    base = [
        "debug=scripted",
        f"paths.cache_dir={root / 'cache'}",
        "benchmark=sample",
        "method=structmem",
    ]
    out = {"root": root}
    run_pipeline(base, root / "whole")
    out["whole"] = root / "whole"
    for i in range(2):
        d = root / "sweep" / f"num_shards=2,shard_index={i}"
        run_pipeline([*base, f"shard_index={i}", "num_shards=2"], d)
        out[f"s{i}"] = d
    return out


BASE = ["debug=scripted", "benchmark=sample", "method=structmem"]


def _rows(df: pl.DataFrame) -> pl.DataFrame:
    df = df.drop([c for c in VOLATILE if c in df.columns])
    return df.sort(df.columns)


@pytest.mark.e2e  # e2e: sharded scripted runs
def test_two_shards_merge_into_the_unsharded_tables(runs: dict[str, Path], tmp_path: Path) -> None:
    result = merge_shards([runs["s0"], runs["s1"]], tmp_path / "merged", compose_job(BASE))
    whole, merged = RunDir(runs["whole"]), RunDir(tmp_path / "merged")
    names = sorted(p.stem for p in whole.tables_dir.glob("*.parquet"))
    assert sorted(result.tables) == names
    for name in names:
        a, b = whole.read_table(name), merged.read_table(name)
        assert a.schema == b.schema, name
        assert _rows(a).equals(_rows(b)), f"table {name} differs after merging"
    # Each shard really holds part of the sample.
    for i in range(2):
        assert (
            0
            < RunDir(runs[f"s{i}"]).read_table("questions").height
            < whole.read_table("questions").height
        )
    rep_a = json.loads((whole.report_dir / "report.json").read_text())
    rep_b = json.loads((merged.report_dir / "report.json").read_text())
    for key in ("overall", "by_category", "unjudged", "questions", "config_hash"):
        assert rep_a[key] == rep_b[key], key


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_merged_manifest_lists_sources_and_sums_costs(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    merge_shards([runs["s1"], runs["s0"]], tmp_path / "m", compose_job(BASE))
    man = RunDir(tmp_path / "m").load_manifest()
    assert man["merged"]["sources"] == [str(runs["s0"]), str(runs["s1"])]
    assert (man["shard_index"], man["num_shards"]) == (0, 1)
    shards = [RunDir(runs[f"s{i}"]).load_manifest() for i in range(2)]
    for stage in ("extract", "consolidate", "answer", "judge"):
        got = man["stages"][stage]["build_cost"]
        for key in ("calls", "prompt_tokens", "completion_tokens"):
            assert got[key] == sum(s["stages"][stage]["build_cost"][key] for s in shards)
        assert man["stages"][stage]["status"] == "done"
        assert RunDir(tmp_path / "m").outputs_intact(man["stages"][stage])
    assert man["stages"]["report"]["status"] == "done"  # regenerated on the merged tables


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_missing_shard_fails_naming_it(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MergeError, match=r"missing shard\(s\) \[1\] of num_shards=2"):
        merge_shards([runs["s0"]], tmp_path / "m", compose_job(BASE))
    assert not (tmp_path / "m").exists()  # nothing written


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_duplicate_shard_fails(runs: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "copy0"
    shutil.copytree(runs["s0"], copy)
    with pytest.raises(MergeError, match="more than once"):
        merge_shards([runs["s0"], copy, runs["s1"]], tmp_path / "m", compose_job(BASE))


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_config_hash_mismatch_names_the_shard(runs: dict[str, Path], tmp_path: Path) -> None:
    odd = tmp_path / "odd1"
    run_pipeline(
        [
            "debug=scripted",
            f"paths.cache_dir={runs['root'] / 'cache'}",
            "benchmark=sample",
            "consolidate.seed_k=3",
            "shard_index=1",
            "num_shards=2",
            "stages=[load]",
        ],
        odd,
    )
    with pytest.raises(MergeError, match=rf"shard 1 \({odd}\) has config_hash \w+"):
        merge_shards([runs["s0"], odd], tmp_path / "m", compose_job(BASE))


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_unfinished_stage_names_the_shard(runs: dict[str, Path], tmp_path: Path) -> None:
    part = tmp_path / "part1"
    run_pipeline(
        [
            "debug=scripted",
            f"paths.cache_dir={runs['root'] / 'cache'}",
            *BASE,
            "shard_index=1",
            "num_shards=2",
            "stages=[load,extract]",
        ],
        part,
    )
    with pytest.raises(MergeError, match=rf"stage '\w+' is not finished in shard 1 \({part}\)"):
        merge_shards([runs["s0"], part], tmp_path / "m", compose_job(BASE))


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_overlapping_conversations_fail(runs: dict[str, Path], tmp_path: Path) -> None:
    fake = tmp_path / "fake1"
    shutil.copytree(runs["s0"], fake)
    man = RunDir(fake).load_manifest()
    man["shard_index"] = 1
    RunDir(fake).save_manifest(man)
    with pytest.raises(MergeError, match="conversation 'sample-\\d' is in both shard 0"):
        merge_shards([runs["s0"], fake], tmp_path / "m", compose_job(BASE))


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_report_config_must_match_the_shards(runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(MergeError, match="pass the overrides the shards ran with"):
        merge_shards(
            [runs["s0"], runs["s1"]], tmp_path / "m", compose_job([*BASE, "retrieve.entries_k=7"])
        )


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_without_saved_hydra_config_the_error_says_what_to_pass(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(MergeError, match="no .hydra/config.yaml"):
        merge_shards([runs["s0"], runs["s1"]], tmp_path / "m")


@pytest.mark.e2e  # e2e: sharded scripted runs
def test_cli_discovers_shards_in_a_sweep_dir(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    sweep = runs["s0"].parent
    assert discover_run_dirs([sweep]) == sorted([runs["s0"].resolve(), runs["s1"].resolve()])
    out = tmp_path / "merged"
    assert report_main(["merge", str(out), str(sweep), "--override", *BASE]) == 0
    assert "merged 2 shards" in capsys.readouterr().out
    assert (out / "report" / "report.md").is_file()
    # A second merge into the same place needs --force; the error names the directory.
    assert report_main(["merge", str(out), str(sweep), "--override", *BASE]) == 2
    assert f"{out} already holds a run" in capsys.readouterr().err
    assert report_main(["merge", str(out), str(sweep), "--force", "--override", *BASE]) == 0


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_cli_missing_shard_exit_code(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    assert report_main(["merge", str(tmp_path / "m"), str(runs["s1"]), "--no-report"]) == 2
    assert "missing shard(s) [0] of num_shards=2" in capsys.readouterr().err


def test_sum_costs() -> None:
    got = sum_costs(
        [
            {"calls": 2, "wall_s": 1.0, "llm_wall_s": 0.5, "overhead_share": 0.5},
            {"calls": 3, "wall_s": 3.0, "llm_wall_s": 2.5, "overhead_share": 0.1},
        ]
    )
    assert got == {
        "calls": 5,
        "wall_s": 4.0,
        "llm_wall_s": 3.0,
        "wall_s_max": 3.0,
        "overhead_share": 0.25,
    }


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_cli_merges_a_sweep_crossed_with_shards_per_config(
    runs: dict[str, Path], tmp_path: Path, capsys
) -> None:
    sweep = tmp_path / "sweep"
    for k in (3, 4):
        for i in range(2):
            run_pipeline(
                [
                    *BASE,
                    f"paths.cache_dir={runs['root'] / 'cache'}",
                    "stages=[load]",
                    f"consolidate.seed_k={k}",
                    f"shard_index={i}",
                    "num_shards=2",
                ],
                sweep / f"consolidate.seed_k={k},num_shards=2,shard_index={i}",
            )
    out = tmp_path / "merged"
    # Without --by-config the two configs refuse to merge...
    assert report_main(["merge", str(out), str(sweep), "--no-report"]) == 2
    assert "different configs" in capsys.readouterr().err
    # ...with it, each config's shards become one run directory named by its overrides.
    assert report_main(["merge", str(out), str(sweep), "--no-report", "--by-config"]) == 0
    whole = RunDir(runs["whole"]).read_table("turns").height
    for k in (3, 4):
        merged = RunDir(out / f"consolidate.seed_k={k}")
        assert merged.read_table("turns").height == whole
        assert len(merged.load_manifest()["merged"]["sources"]) == 2


@pytest.mark.e2e  # e2e: reads the module's sharded scripted runs
def test_empty_shards_merge(runs: dict[str, Path], tmp_path: Path) -> None:
    """More shards than conversations (LoCoMo has 10): the empty shards run and merge."""
    dirs = []
    for i in range(3):
        dirs.append(tmp_path / f"s{i}")
        run_pipeline(
            [
                *BASE,
                f"paths.cache_dir={runs['root'] / 'cache'}",
                "stages=[load]",
                f"shard_index={i}",
                "num_shards=3",
            ],
            dirs[-1],
        )
    assert RunDir(dirs[2]).read_table("turns").height == 0
    result = merge_shards(dirs, tmp_path / "m", report=False)
    whole = RunDir(runs["whole"])
    for name in ("turns", "questions"):
        assert _rows(RunDir(tmp_path / "m").read_table(name)).equals(_rows(whole.read_table(name)))
    assert result.report is None
