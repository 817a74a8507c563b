"""Fidelity audits (methods/structmem/audit*.py; summaries in eval/audit.py) on the bundled
sample with scripted judges (no server).

python -m pytest tests/unit -q -k audit
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from structmem_gpu.config.job import JobConfig
from omegaconf import DictConfig, OmegaConf

from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.eval import audit
from structmem_gpu.eval.agreement import cohen_kappa, fleiss_kappa
from structmem_gpu.llm.scripted import Responder, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.structmem import audit_consolidation, audit_extraction, consolidate
from structmem_gpu.methods.structmem.audit import AuditSettings
from tests.unit.test_structmem_stages import FakeBackends, build_memory, cfg_for, echo, run_stage

MALFORMED = '{"reason": "cut off mid-sente'


class PanelBackends(FakeBackends):
    """FakeBackends plus a judge panel: one scripted backend per judge name."""

    def __init__(
        self, responders: dict[str, Responder], judges: dict[str, dict[str, Responder]]
    ) -> None:
        super().__init__(responders)
        self.panel = [
            (name, ScriptedLLM(r, model_id=f"scripted-{name}")) for name, r in judges.items()
        ]

    def judges(self) -> list[tuple[str, ScriptedLLM]]:
        return self.panel


def with_audit(cfg: DictConfig, **extraction: Any) -> DictConfig:
    base = cfg.copy()
    OmegaConf.set_struct(base, False)  # works whether or not config.yaml has the audit group yet
    return OmegaConf.merge(base, {"audit": {"seed": 0, "extraction": extraction}})  # type: ignore[return-value]


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    turns, questions = load_benchmark("sample", sample_path, None, None)
    r = RunDir(tmp_path / "run")
    r.write_table("turns", turns)
    r.write_table("questions", questions)
    build_memory(r, cfg_for(), FakeBackends({"extract": echo}))
    return r


def _memory(req: LLMRequest) -> str:
    return req.messages[1].content.rsplit("Memory (", 1)[1]  # [1]: repairs append messages


# ---- sampling --------------------------------------------------------------------------------
def test_sampling_is_reproducible_with_a_fixed_seed(run: RunDir) -> None:
    entries = run.read_table("entries")
    a = audit_extraction.sample_entries(entries, 10, seed=7)["entry_id"].to_list()
    b = audit_extraction.sample_entries(entries.reverse(), 10, seed=7)["entry_id"].to_list()
    c = audit_extraction.sample_entries(entries, 10, seed=8)["entry_id"].to_list()
    assert a == b and len(set(a)) == 10  # independent of table order
    assert a != c
    assert audit_extraction.sample_entries(entries, None, 0).height == entries.height
    assert audit_extraction.sample_entries(entries, 10**6, 0).height == entries.height


# ---- extraction audit ------------------------------------------------------------------------
def test_extraction_audit_unjudged_is_recorded_and_excluded(run: RunDir) -> None:
    def strict(req: LLMRequest) -> str:  # facts supported, relations not
        label = "SUPPORTED" if _memory(req).startswith("fact") else "UNSUPPORTED"
        return json.dumps({"reason": "checked the source turn", "label": label})

    def flaky(req: LLMRequest) -> str:  # malformed on every relation: unjudged, not supported
        return MALFORMED if not _memory(req).startswith("fact") else strict(req)

    backends = PanelBackends(
        {}, {"a": {"audit_extraction": strict}, "b": {"audit_extraction": flaky}}
    )
    cfg = with_audit(cfg_for(), sample_size=12)
    ctx = run_stage(run, cfg, backends, audit_extraction.STAGE)
    df = run.read_table("audit_extraction")
    assert ctx.batches == 2 and df.height == 24  # one batch and one row per (entry, judge)
    assert df.group_by("entry_id", "judge_name").len()["len"].max() == 1
    b = df.filter(pl.col("judge_name") == "b")
    bad = b.filter(pl.col("kind") == "relation")
    assert bad.height > 0
    assert bad["label"].is_null().all() and bad["supported"].is_null().all()
    assert all(r == MALFORMED for r in bad["reply_raw"])
    summary = json.loads((run.report_dir / "audit.json").read_text())["extraction"]
    sb, sa = summary["judges"]["b"]["overall"], summary["judges"]["a"]["overall"]
    n_rel = bad.height
    assert sb["unjudged"] == n_rel and sb["n"] == 12 - n_rel and sb["positive"] == 0
    assert sb["rate"] == 0.0  # the unjudged relations never count as supported or unsupported
    assert sa["n"] == 12 and sa["positive"] == n_rel and sa["rate"] == round(n_rel / 12, 4)
    assert summary["judges"]["a"]["by_kind"]["relation"]["rate"] == 1.0
    assert summary["judges"]["a"]["by_kind"]["fact"]["rate"] == 0.0
    assert 0.0 <= sa["ci95"][0] <= sa["rate"] <= sa["ci95"][1] <= 1.0
    assert sum(c["n"] for c in summary["judges"]["a"]["by_conv"].values()) == 12
    # Agreement is over the entries both judges labelled (the facts): full agreement on one
    # label -> kappa undefined (None), n = the facts.
    pair = summary["agreement"]["pairs"][0]
    assert pair["n"] == 12 - n_rel and pair["agreement"] == 1.0 and pair["cohen_kappa"] is None
    md = (run.report_dir / "audit.md").read_text()
    assert "Extraction: unsupported entries" in md and "| b | overall |" in md
    # Every audit request shows the source turn and the entry, bounded by the schema.
    req = run.read_table("requests") if run.has_table("requests") else None
    assert req is None or req.height == 0 or "audit_extraction" in set(req["stage"])


def test_extraction_audit_request_shows_window_source_and_bounded_reason(run: RunDir) -> None:
    cfg = with_audit(cfg_for(), sample_size=3, max_tokens=40, reason_max_chars=500)
    s = AuditSettings.from_cfg(cfg)
    assert s.reason_chars() == int((40 - 24) * 1.5)  # lowered to what fits in max_tokens
    entries = audit_extraction.sample_entries(run.read_table("entries"), 3, 0)
    windows = audit_extraction.plan_from_settings(
        run.read_table("turns"), audit_extraction.ExtractSettings.from_cfg(cfg),
        JobConfig.from_cfg(cfg).root.llm)[0]
    items, orphans = audit_extraction.audit_items(entries, windows)
    assert orphans == 0 and len(items) == 3
    for it in items:
        req = audit_extraction.build_request(it, "j", s)
        user = req.messages[-1].content
        assert it.entry["text"] in user and f"Source turn: [{it.source_index}]" in user
        assert len(it.window.turns) <= int(cfg.extract.turns_per_request)
        assert req.schema["properties"]["reason"]["maxLength"] == s.reason_chars()
        assert list(req.schema["properties"]) == ["reason", "label"]  # reason before label


# ---- agreement (hand-computed) ---------------------------------------------------------------
def test_kappa_on_hand_computed_example() -> None:
    rows = []
    for j, labels in (("a", [True, True, False, False]), ("b", [True, False, False, False])):
        for i, sup in enumerate(labels):
            rows.append(
                {
                    "entry_id": f"e{i}",
                    "conv_id": "c",
                    "kind": "fact",
                    "judge_name": j,
                    "judge_model": f"m-{j}",
                    "supported": sup,
                }
            )
    summary = audit.extraction_summary(pl.DataFrame(rows), resamples=200, seed=0)
    pair = summary["agreement"]["pairs"][0]
    # p_o = 3/4, p_e = 1/2*1/4 + 1/2*3/4 = 1/2 -> kappa = 0.5
    assert pair["cohen_kappa"] == 0.5 == cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0])
    # P_bar = 3/4, P_e = (3/8)^2 + (5/8)^2 = 34/64 -> kappa = (0.75 - 0.53125) / 0.46875
    expected = (0.75 - 34 / 64) / (1 - 34 / 64)
    assert math.isclose(summary["agreement"]["fleiss_kappa"], round(expected, 4))
    assert math.isclose(fleiss_kappa([[2, 0], [1, 1], [0, 2], [0, 2]]), expected)
    # Unsupported rates: a 2/4, b 3/4.
    assert summary["judges"]["a"]["overall"]["rate"] == 0.5
    assert summary["judges"]["b"]["overall"]["rate"] == 0.75


# ---- consolidation audit ---------------------------------------------------------------------
def test_count_links() -> None:
    reply = {"links": [{"link": "x", "verdict": "grounded"}, {"link": "y", "verdict": "spurious"}]}
    assert audit_consolidation.count_links(reply, "") == (["x", "y"], ["grounded", "spurious"])
    assert audit_consolidation.count_links(None, json.dumps(reply)) == (
        ["x", "y"],
        ["grounded", "spurious"],
    )
    assert audit_consolidation.count_links(None, '```json\n{"links": []}\n```') == ([], [])
    assert audit_consolidation.count_links(None, '{"links": [{"link": "x", "verd') is None
    assert (
        audit_consolidation.count_links(None, '{"links": [{"link": "x", "verdict": "maybe"}]}')
        is None
    )
    assert audit_consolidation.count_links(None, '{"other": 1}') is None
    assert audit_consolidation.count_links(None, "") is None


def test_consolidation_audit_counts_links_and_reuses_k0_requests(run: RunDir) -> None:
    cfg = with_audit(cfg_for("consolidate.seed_k=3"))
    run_stage(run, cfg, FakeBackends({"extract": echo}), consolidate.STAGE)
    syntheses = run.read_table("syntheses")
    convs = sorted(set(syntheses["conv_id"]))
    assert len(convs) >= 2

    def links(req: LLMRequest) -> str:
        if req.schema is None:  # summary A (free text)
            return "Summary A: the period only."
        # First conversation: 1 grounded + 2 spurious per window; others: 1 grounded.
        first = any(f"({convs[0]}" in m.content for m in req.messages) or req.conv_id == convs[0]
        items = [{"link": "follows the earlier plan", "verdict": "grounded"}]
        if first:
            items += [{"link": "invented trip", "verdict": "spurious"}] * 2
        return json.dumps({"links": items})

    def broken(req: LLMRequest) -> str:
        return "Summary A." if req.schema is None else '{"links": [{"link": "cut'

    backends = PanelBackends(
        {"audit_consolidation": links},
        {"a": {"audit_consolidation": links}, "b": {"audit_consolidation": broken}},
    )
    ctx = run_stage(run, cfg, backends, audit_consolidation.STAGE)
    assert ctx.batches == 3  # summary A, judge a, judge b: one batch each
    df = run.read_table("audit_consolidation")
    n_win = syntheses.filter(pl.col("parse_ok")).height
    assert df.height == 2 * n_win
    # Windows without related entries (each conversation's first: no history) are rule rows.
    n_rule = syntheses.filter(
        pl.col("parse_ok") & (pl.col("context_entry_ids").list.len() == 0)
    ).height
    assert n_rule >= len(convs)
    rule = df.filter(pl.col("judge_model") == audit_consolidation.RULE_NO_CONTEXT)
    assert rule.height == 2 * n_rule and (rule["n_links"] == 0).all() and rule["judged"].all()
    a = df.filter((pl.col("judge_name") == "a") & ~pl.col("judge_model").str.starts_with("rule:"))
    n_ask, n_first = a.height, a.filter(pl.col("conv_id") == convs[0]).height
    assert n_ask == n_win - n_rule and n_first > 0
    assert a["n_spurious"].sum() == 2 * n_first and a["n_links"].sum() == n_ask + 2 * n_first
    assert set(a["prompt_variant"]) == {"constrained"} and set(a["seed_k"]) == {3}
    b = df.filter((pl.col("judge_name") == "b") & ~pl.col("judge_model").str.starts_with("rule:"))
    assert b["judged"].is_null().all() and b["n_links"].is_null().all()
    summary = json.loads((run.report_dir / "audit.json").read_text())["consolidation"]
    oa, ob = summary["judges"]["a"]["overall"], summary["judges"]["b"]["overall"]
    assert (oa["spurious"], oa["total"]) == (2 * n_first, n_ask + 2 * n_first)
    assert oa["rate"] == round(oa["spurious"] / oa["total"], 4) and oa["unjudged"] == 0
    assert ob["total"] == 0 and ob["rate"] is None and ob["unjudged"] == n_ask
    assert ob["windows"] == n_win and ob["windows_judged"] == n_rule
    assert summary["judges"]["a"]["by_conv"][convs[0]]["rate"] == round(2 / 3, 4)
    assert "Consolidation: spurious cross-event links" in (run.report_dir / "audit.md").read_text()
    # Summary A requests are exactly a seed_k=0 consolidate run's (so the cache serves them).
    audit_a = ctx.request_frames[0]
    assert set(audit_a["stage"]) == {"audit_consolidation"}
    k0 = run_stage(
        RunDir(run.root),
        cfg_for("consolidate.seed_k=0"),
        FakeBackends({"extract": echo}),
        consolidate.STAGE,
    )
    assert audit_a.height == n_ask
    assert set(audit_a["messages_hash"]) <= set(k0.request_frames[0]["messages_hash"])
