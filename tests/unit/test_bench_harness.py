"""Bench harness plumbing: reference schedule, hashing encoder, scale worker, bench.md."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.bench.harness import (
    BenchSettings,
    HashingModel,
    ReferenceScheduleBackend,
    hashing_encoder,
    reference_order,
    reference_schedule,
)
from structmem_gpu.bench.report import md_table, render_markdown
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Message

CONF = Path(__file__).resolve().parents[2] / "conf"


def _req(rid: str, conv: str, version: str, stage: str = "extract") -> LLMRequest:
    return LLMRequest(
        request_id=rid,
        stage=stage,
        conv_id=conv,
        prompt_version=version,
        messages=(Message("user", f"text of {rid}"),),
    )


def test_reference_order_interleaves_perspectives_per_conversation() -> None:
    # Our batch: perspective-major over all conversations (as run_extract builds it).
    batch = [
        _req("f-a1", "a", "factual/1"),
        _req("f-a2", "a", "factual/1"),
        _req("f-b1", "b", "factual/1"),
        _req("r-a1", "a", "relational/1"),
        _req("r-a2", "a", "relational/1"),
        _req("r-b1", "b", "relational/1"),
    ]
    order = [batch[i].request_id for i in reference_order(batch)]
    assert order == ["f-a1", "r-a1", "f-a2", "r-a2", "f-b1", "r-b1"]


def test_reference_order_keeps_single_prompt_batches() -> None:
    batch = [_req(f"c{i}", "a" if i < 2 else "b", "synthesis/1", "consolidate") for i in range(4)]
    assert reference_order(batch) == [0, 1, 2, 3]


class _Recorder:
    """Inner backend that records the size of every batch it gets."""

    def __init__(self) -> None:
        self.inner = ScriptedLLM()
        self.model_id = self.inner.model_id
        self.batches: list[list[str]] = []

    def generate(self, requests: Sequence[LLMRequest], *, desc: str = "") -> list[Any]:
        self.batches.append([r.request_id for r in requests])
        return self.inner.generate(requests, desc=desc)


def test_reference_backend_sends_one_at_a_time_and_keeps_result_order() -> None:
    batch = [
        _req("f-a1", "a", "factual/1"),
        _req("f-b1", "b", "factual/1"),
        _req("r-a1", "a", "relational/1"),
    ]
    inner = _Recorder()
    seen: list[int] = []
    results = ReferenceScheduleBackend(inner).generate(batch, on_result=lambda i, r: seen.append(i))
    assert [len(b) for b in inner.batches] == [1, 1, 1]
    assert [b[0] for b in inner.batches] == ["f-a1", "r-a1", "f-b1"]
    assert [r.request_id for r in results] == ["f-a1", "f-b1", "r-a1"]  # input order
    assert sorted(seen) == [0, 1, 2]


def test_reference_schedule_wraps_every_backend_the_pipeline_opens(tmp_path: Path) -> None:
    from structmem_gpu.llm import factory

    with reference_schedule():
        with factory.open_llm(
            {"backend": "scripted", "served_name": "scripted"}, log_dir=tmp_path, cache_dir=None
        ) as be:
            assert isinstance(be, ReferenceScheduleBackend)
    with factory.open_llm(
        {"backend": "scripted", "served_name": "scripted"}, log_dir=tmp_path, cache_dir=None
    ) as be:
        assert not isinstance(be, ReferenceScheduleBackend)


def test_hashing_encoder_is_deterministic_and_unit_norm() -> None:
    from structmem_gpu.embed import encoder as enc_mod

    with hashing_encoder(dim=64):
        enc = enc_mod.open_encoder({}, cache_dir=None)
        a = enc.encode(["Mara went kayaking", "Jonas baked bread", "Mara went kayaking"])
    assert a.shape == (3, 64) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert np.array_equal(a[0], a[2]) and not np.array_equal(a[0], a[1])
    assert enc_mod.open_encoder.__name__ == "open_encoder"  # restored after the block
    assert HashingModel(8).get_embedding_dimension() == 8


def test_settings_scripted_overrides_drop_the_user_llm_choice(tmp_path: Path) -> None:
    s = BenchSettings(
        CONF,
        tmp_path,
        ("debug=ci",),
        ("llm=vllm_server", "llm.model=x", "embedder.device=cpu"),
        base_url="http://127.0.0.1:1/v1",
    )
    scripted = s.overrides_for(["stages=[load]"], scripted=True)
    assert scripted == ["debug=ci", "embedder.device=cpu", "stages=[load]", "llm=scripted"]
    real = s.overrides_for(cache_off=True, cache_dir=tmp_path)
    assert "llm.base_url=http://127.0.0.1:1/v1" in real and "cache.llm=false" in real
    assert real[-1] == f"paths.cache_dir={tmp_path}"


def test_scale_worker_measures_every_stage(tmp_path: Path) -> None:
    from structmem_gpu.bench.scale_worker import main
    from structmem_gpu.bench.synthetic import SyntheticSpec, write_locomo

    data = write_locomo(SyntheticSpec(3, sessions=2, turns_per_session=3), tmp_path / "d.json")
    out = tmp_path / "r.json"
    rc = main(
        [
            "--conf-dir",
            str(CONF),
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(out),
            "--encoder",
            "hashing",
            "debug=ci",
            "llm=scripted",
            "benchmark=locomo",
            f"benchmark.path={data}",
            "cache.llm=false",
            f"paths.cache_dir={tmp_path / 'cache'}",
            "stages=[load,extract,embed,consolidate]",
        ]
    )
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["stages"]) == {"load", "extract", "embed", "consolidate"}
    for st in res["stages"].values():
        assert st["peak_rss_mb"] > 0 and st["wall_s"] >= 0
    assert res["stages"]["extract"]["calls"] == 3 * 2 * 2  # windows x perspectives
    assert res["counts"]["turns"] == 18 and res["encoder"] == "hashing"


def test_md_table_and_render_markdown() -> None:
    assert md_table([{"a": 1.5, "b": None}], ["a", "b"]).splitlines()[-1] == "| 1.500 | - |"
    assert md_table([], ["a"]) == "_(no rows)_"
    text = render_markdown({"meta": {"profile": "cpu", "overrides": []}, "cost": {"error": "boom"}})
    assert "## LLM cost" in text and "**failed:** boom" in text


@pytest.mark.parametrize("argv", [["nonsense"], ["--profile", "tpu"]])
def test_cli_rejects_unknown_parts(argv: list[str]) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_cli", CONF.parent / "jobs" / "bench.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit):
        mod.parse(argv)


def test_every_part_has_its_method_and_its_report_section() -> None:
    """PART_SPECS is the one list of parts: each names a Suite method, and bench/report.py
    renders each part's bench.json entry (a part without a section would be silently unshown)."""
    from structmem_gpu.bench.report import SECTIONS
    from structmem_gpu.bench.suite import DEFAULT_PARTS, NO_LLM_PARTS, PART_SPECS, Suite

    assert all(callable(getattr(Suite, p.method, None)) for p in PART_SPECS.values())
    assert {name.replace("-", "_") for name in PART_SPECS} == {key for key, _, _ in SECTIONS}
    assert "paced" not in DEFAULT_PARTS and "build" in DEFAULT_PARTS
    assert "paced" in NO_LLM_PARTS and "llm" not in NO_LLM_PARTS
