"""Fidelity audits on the real stack (llama.cpp + SmolLM2, debug=ci) over the sample run.

    python -m pytest tests/integration -q -k audit

Copies the session's `structmem_sample_run` and runs audit_extraction (a seeded sample of 20
entries) + audit_consolidation (every window) + report on the copy. Asserts structure and
count consistency, never the quality of a 135M model's verdicts. Uncached LLM budget: 20
extraction verdicts + one K=0 synthesis and one link audit per window (~7 each on the sample).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.core.artifacts import RunDir
from tests.fixtures.llm import llamacpp_missing
from tests.fixtures.pipeline import SAMPLE_RUN, run_pipeline

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]

# Entries audited (a seeded sample): 6 requests at ~6 s each on 2 cores instead of 20.
SAMPLE = 6


def test_audits_on_sample_run(
    structmem_sample_run: Path, ci_overrides: list[str], tmp_path: Path
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(structmem_sample_run, copy)
    run_pipeline(
        [
            *ci_overrides,
            *SAMPLE_RUN,
            "stages=[audit_extraction,audit_consolidation,report]",
            f"audit.extraction.sample_size={SAMPLE}",
            # SmolLM2 on 2 cores: short reasons, at most 3 short links per window.
            "audit.extraction.max_tokens=64",
            "audit.consolidation.max_tokens=160",
            "audit.consolidation.max_links=3",
        ],
        copy,
    )
    run = RunDir(copy)
    ext, con = run.read_table("audit_extraction"), run.read_table("audit_consolidation")
    syn = run.read_table("syntheses")
    assert ext.height == SAMPLE and ext["entry_id"].n_unique() == SAMPLE
    assert set(ext["kind"]) <= {"fact", "relation"}
    assert ext.filter(pl.col("label").is_null())["supported"].is_null().all()
    assert con.height == syn.filter(pl.col("parse_ok")).height > 0
    judged = con.filter(pl.col("judged").fill_null(False))
    assert (judged["n_links"] == judged["links"].list.len()).all()
    assert (judged["n_spurious"] <= judged["n_links"]).all()

    summary = json.loads((copy / "report" / "audit.json").read_text())
    for name, j in summary["extraction"]["judges"].items():
        o = j["overall"]
        assert o["n"] + o["unjudged"] == SAMPLE
        assert (
            o["n"]
            == ext.filter((pl.col("judge_name") == name) & pl.col("supported").is_not_null()).height
        )
        assert o["rate"] is None or 0.0 <= o["rate"] <= 1.0
        assert sum(k["n"] for k in j["by_kind"].values()) == o["n"]
        assert sum(c["n"] for c in j["by_conv"].values()) == o["n"]
    for j in summary["consolidation"]["judges"].values():
        o = j["overall"]
        assert o["windows"] == con.height and o["windows_judged"] + o["unjudged"] == o["windows"]
        assert o["total"] == int(judged["n_links"].sum()) and o["spurious"] == int(
            judged["n_spurious"].sum()
        )
        assert o["rate"] is None or 0.0 <= o["rate"] <= 1.0
    assert summary["consolidation"]["prompt_variant"] == "constrained"
    md = (copy / "report" / "audit.md").read_text()
    assert "### Extraction" in md and "### Consolidation" in md
    assert (copy / "report" / "report.md").exists()
    req = run.read_table("requests")
    assert req.filter(pl.col("stage") == "audit_extraction").height == SAMPLE
    # K=0 synthesis + one link audit per window with related entries (the others are rule rows).
    asked = con.filter(~pl.col("judge_model").str.starts_with("rule:"))
    assert asked.height > 0
    assert req.filter(pl.col("stage") == "audit_consolidation").height == 2 * asked.height
