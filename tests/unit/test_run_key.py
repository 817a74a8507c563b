"""Run directories keyed by the configuration (structmem_gpu/config/run_key.py, conf/config.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from structmem_gpu.config.run_key import MAX_CHARS, run_key
from structmem_gpu.config.result_keys import launch_key

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_no_result_changing_override_keeps_the_plain_directory() -> None:
    assert run_key([]) == ""
    launch_only = ["paths.output_dir=/x", "paths.cache_dir=/c", "force=true", "stages=[judge,report]",
                   "llm.base_url=http://127.0.0.1:9/v1", "dry_run=true", "cache.llm=false",
                   "hydra.run.dir=/r", "judge=second_cpu", "judge.llm.base_url=http://h/v1",
                   "method=flat", "benchmark=locomo", "preempt.grace_s=5", "report.plots=false"]
    assert run_key(launch_only) == ""


def test_result_changing_overrides_name_the_directory_sorted() -> None:
    assert run_key(["debug=scripted"]) == "debug=scripted"
    assert run_key(["debug=scripted", "consolidate.seed_k=5"]) == "consolidate.seed_k=5,debug=scripted"
    assert run_key(["consolidate.seed_k=5", "debug=scripted"]) == run_key(["debug=scripted", "consolidate.seed_k=5"])
    assert run_key(["llm=vllm_qwen2_5_7b"]) == "llm=vllm_qwen2_5_7b"
    assert run_key(["+extract.max_items=4"]) == "extract.max_items=4"


def test_shards_get_their_own_directories() -> None:
    a = run_key(["num_shards=4", "shard_index=0"])
    b = run_key(["num_shards=4", "shard_index=1"])
    assert a == "num_shards=4,shard_index=0" and a != b


def test_benchmark_path_is_hashed_and_two_files_differ() -> None:
    a = run_key(["benchmark.path=data/locomo10.json"])
    b = run_key(["benchmark.path=other/locomo10.json"])
    assert a.startswith("benchmark.path=locomo10.json-") and "/" not in a
    assert a != b and a == run_key(["benchmark.path=data/locomo10.json"])


def test_sweep_keys_keep_method_benchmark_and_judge() -> None:
    assert run_key(["method=flat", "judge=second_cpu"], "sweep") == "judge=second_cpu,method=flat"
    assert run_key(["method=flat"], "run") == ""
    assert run_key(["paths.output_dir=/x", "method=flat"], "sweep") == "method=flat"


def test_unsafe_characters_and_long_keys() -> None:
    key = run_key(["extract.perspectives=[fact]", "llm.model=Qwen/Qwen2.5-7B"])
    assert "[" not in key and "/" not in key  # no glob brackets, no nested directories
    long = run_key([f"seem.ablation.k{i}=true" for i in range(30)])
    assert len(long) <= MAX_CHARS
    other = run_key([f"seem.ablation.k{i}=true" for i in range(29)] + ["seem.ablation.k29=false"])
    assert long != other  # the hash of the whole tells them apart


@pytest.mark.parametrize("key,expected", [("llm.max_in_flight", True), ("judge.llm.base_url", True),
                                          ("judge.panel", False), ("retrieve.entries_k", False),
                                          ("paths.data_dir", True), ("shard_index", False)])
def test_launch_keys(key: str, expected: bool) -> None:
    assert launch_key(key) is expected


def _run_dir(*overrides: str) -> str:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
    return str(cfg.hydra.run.dir)


def test_hydra_run_dir_uses_the_key() -> None:
    assert _run_dir().endswith("outputs/runs/sample/structmem")
    assert _run_dir("debug=scripted").endswith("outputs/runs/sample/structmem/debug=scripted")
    assert _run_dir("debug=scripted", "consolidate.seed_k=5").endswith(
        "runs/sample/structmem/consolidate.seed_k=5,debug=scripted")
    assert _run_dir("method=flat", "judge=second_cpu").endswith("runs/sample/flat")


def test_changed_keys_name_only_what_can_change_a_result() -> None:
    from structmem_gpu.config.run_changes import changed_keys, describe

    old = {"consolidate": {"seed_k": 15}, "paths": {"cache_dir": "/a"}, "llm": {"base_url": "x", "model": "m"}}
    new = {"consolidate": {"seed_k": 5}, "paths": {"cache_dir": "/b"}, "llm": {"base_url": "y", "model": "m"},
           "retrieve": {"entries_k": 8}}
    changes = changed_keys(old, new)
    assert changes == [("consolidate.seed_k", 15, 5), ("retrieve.entries_k", None, 8)]
    line = describe(Path("/r"), changes, ["consolidate", "report"])
    assert "2 keys changed (consolidate.seed_k: 15 -> 5, retrieve.entries_k: None -> 8)" in line
    assert line.endswith("replaces the tables of stages consolidate, report")
    assert changed_keys(old, {**old, "force": True}) == []


def test_the_package_imports_without_omegaconf() -> None:
    """.venv-vllm runs `python -m structmem_gpu.llm.convert` with none of our dependencies."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['omegaconf'] = None; "
            "import structmem_gpu, structmem_gpu.llm.convert; print('imported')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=CONF.parent, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]
