"""The dry run's per-stage request counts against what the stages send (scripted LLM, sample).

For every method in conf/method (and a few switches that change what a stage sends), the
dry-run estimate (each Stage's own estimate hook, node/dry_run.py) is set beside the
requests.parquet of a scripted run of the same configuration: a row marked exact must equal
the stage's count, a row marked as an upper bound (requests that depend on earlier replies)
must not be below it. The encoder is the harness's hashing stand-in (bench/harness.py), so
SEEM's wavefront runs in seconds; the request counts do not depend on which encoder embeds.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.bench.harness import hashing_encoder
from structmem_gpu.node.dry_run import estimate
from tests.fixtures.pipeline import compose_cfg, compose_job, options, run_pipeline, system_method

# The baseline systems' methods send what their own code decides: the dry run says "not
# estimated: external system" for them (test_a_system_method_is_not_estimated_by_name).
# Read from the method YAMLs (system_method), not composed: this runs at collection.
SYSTEM_METHODS = [m for m in options("method") if system_method(m)]
METHODS = [m for m in options("method") if m not in SYSTEM_METHODS]
BASE = ["debug=scripted", "benchmark=sample"]
# Switches that change what a stage sends, beside each method's defaults.
SWITCHES = {
    # windowed fusion over 8-passage requests (the CI profile's SEEM deviations)
    "seem-windowed": ["method=seem", "seem.fusion.window=5", "seem.passages_per_request=8"],
    # two calls per judged pair (judge, then merge for the positives)
    "seem-two-call": ["method=seem", "seem.fusion.strict_two_call=true", "seem.retrieve.fact_filter=false"],
    # the offline update after extraction, every category judged
    "structmem-update": ["method=structmem", "stages=[load,extract,embed,update,retrieve,answer,judge]",
                         "benchmark.categories=[1,2,3,4,5]"],
    # the fidelity audits (run only when listed); max_items makes the entry count a bound
    "structmem-audits": ["method=structmem", "extract.max_items=3",
                         "stages=[load,extract,embed,consolidate,audit_extraction,audit_consolidation]"],
}
CASES = {**{m: [f"method={m}"] for m in METHODS}, **SWITCHES}


def sent_per_stage(run_dir: Path) -> dict[str, int]:
    path = run_dir / "tables" / "requests.parquet"
    if not path.exists():
        return {}
    return dict(pl.read_parquet(path).group_by("stage").len().iter_rows())


@pytest.mark.e2e  # e2e: a whole scripted run per method to compare with its dry run
@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_counts_equal_or_bound_the_scripted_run(case: str, tmp_path: Path) -> None:
    overrides = [*BASE, *CASES[case], f"paths.cache_dir={tmp_path / 'cache'}"]
    est = estimate(compose_job(overrides))
    rows = {r["stage"]: r for r in est["stages"]}
    with hashing_encoder():
        run_pipeline(overrides, tmp_path / "run")
    sent = sent_per_stage(tmp_path / "run")
    assert set(sent) <= set(rows), f"stages sent requests the dry run does not list: {set(sent) - set(rows)}"
    for name, row in rows.items():
        n = sent.get(name, 0)
        assert row["requests"] is not None, f"{case}: stage {name} is not estimated"
        if row["bound"]:
            assert row["requests"] >= n, f"{case}: {name} bound {row['requests']} < {n} sent"
        else:
            assert row["requests"] == n, f"{case}: {name} estimated {row['requests']}, sent {n}"
        if row["requests"]:
            assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
    assert est["complete"]


def test_a_system_method_is_not_estimated_by_name() -> None:
    assert "mem0" in SYSTEM_METHODS
    for method in SYSTEM_METHODS:
        rows = {r["stage"]: r for r in estimate(compose_job([*BASE, f"method={method}"]))["stages"]}
        for stage in ("system_build", "system_search"):
            assert rows[stage]["requests"] is None
            assert rows[stage]["basis"].startswith("not estimated: external system ")
            assert "(2 conversations)" in rows[stage]["basis"]
        assert rows["answer"]["requests"] is not None  # our reader on stand-in hits


def test_the_sample_seem_estimate_covers_every_llm_stage() -> None:
    """The issue's example: SEEM on the sample was 36 estimated requests of 249 sent (frames,
    fusion and graph "not estimated", retrieve "no LLM"); every stage now says its count."""
    rows = {r["stage"]: r for r in estimate(compose_job([*BASE, "method=seem"]))["stages"]}
    assert rows["frames"]["requests"] == rows["graph"]["requests"] == 67  # one per passage
    assert not rows["frames"]["bound"] and not rows["graph"]["bound"]
    assert rows["fusion"]["bound"] and rows["fusion"]["requests"] == 67 - 2  # all but each conversation's first
    assert rows["retrieve"]["bound"] and rows["retrieve"]["requests"] == 2 * 18  # query + filter per question
    assert sum(r["requests"] for r in rows.values()) >= 249


def test_seem_and_graph_readers_render_their_own_prompts_on_stand_ins() -> None:
    """SEEM's and graph memory's answer rows come from their own readers (answer.prompt) on
    the stand-in memories their stages' hooks leave, not from the StructMem template."""
    from structmem_gpu.eval.answer import AnswerSettings, reader_prompts
    from structmem_gpu.node.dry_run import estimate_inputs

    for method, marker in (("seem", "Summary: "), ("graph_memory", "Relations between entities:")):
        cfg = compose_job([*BASE, f"method={method}"])
        est = estimate(cfg)
        answer = next(r for r in est["stages"] if r["stage"] == "answer")
        assert "reader's own prompts" in answer["basis"] and "StructMem template" not in answer["basis"]
        inp = estimate_inputs(cfg)  # every hook run in order: stand-ins left for the reader
        prompts = reader_prompts(inp, inp.job.settings(AnswerSettings))
        assert prompts is not None and len(prompts) == inp.selected.height
        assert all(marker in m[-1].content for m in prompts), method
    ret = inp.stand_ins["retrievals"]
    assert set(ret["circuit"]) == {"entries", "relations"}


def test_seem_stand_in_frames_are_expected_frames_not_schema_maxima() -> None:
    """A stand-in frame restates its passage (summary up to summary_chars) with short roles;
    raising the schema limits (max_chars, max_events) does not lengthen it."""
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.methods.seem.fusion import stand_in_frames
    from structmem_gpu.methods.seem.settings import FrameSettings
    from structmem_gpu.node.dry_run import load_turns_questions

    small = JobConfig.from_cfg(compose_cfg([*BASE, "method=seem"]))
    large = JobConfig.from_cfg(compose_cfg([*BASE, "method=seem", "seem.frames.max_chars=500",
                                            "seem.frames.max_events=20"]))
    turns, _ = load_turns_questions(small)
    a = stand_in_frames(turns, small.settings(FrameSettings))
    b = stand_in_frames(turns, large.settings(FrameSettings))
    assert a.height == turns.height and a["rendering"].to_list() == b["rendering"].to_list()
    assert all(r.count("Event ") == 1 for r in a["rendering"].to_list())


def test_stand_in_entries_hold_the_share_of_max_items_a_reply_holds() -> None:
    """Without extract.max_items one entry per turn (no cap to take a share of); with it the
    measured share of the cap, at least one entry per window."""
    from structmem_gpu.methods.structmem.extract import REPLY_FILL, expected_items

    assert expected_items(7, None) == 7
    assert expected_items(8, 3) == round(3 * REPLY_FILL) == 2
    assert expected_items(2, 10) == round(2 * REPLY_FILL)
    assert expected_items(1, 1) == 1
    assert 0 < REPLY_FILL < 1


@pytest.mark.parametrize("once", ["false", "true"])
@pytest.mark.parametrize("dates", ["fixed", "per_haystack"])
def test_longmemeval_extraction_estimate_counts_distinct_sessions(
        dates: str, once: str, tmp_path: Path) -> None:
    """LongMemEval's extraction plans over the distinct (content, date) sessions (or the
    distinct contents, once_per_content), not over every haystack occurrence: the estimate
    counts the requests the stage sends, on both date shapes of the generator."""
    from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval

    spec = HaystackFileSpec(questions=6, sessions=5, pool=10, turns_per_session=3, dates=dates)
    data = write_longmemeval(spec, tmp_path / "lme.json")
    overrides = ["debug=scripted", "benchmark=longmemeval", f"benchmark.path={data}",
                 "stages=[load,extract]", f"extract.once_per_content={once}",
                 f"paths.cache_dir={tmp_path / 'cache'}"]
    row = next(r for r in estimate(compose_job(overrides))["stages"] if r["stage"] == "extract")
    with hashing_encoder():
        run_pipeline(overrides, tmp_path / "run")
    sent = sent_per_stage(tmp_path / "run")["extract"]
    places = spec.questions * spec.sessions * 2  # every haystack place, both perspectives
    shared = dates == "fixed" or once == "true"  # pool sessions recur as one request
    assert (sent < places if shared else sent <= places)
    assert not row["bound"] and row["requests"] == sent, (row["requests"], sent)


def test_compressed_or_segmented_input_takes_the_plain_path(tmp_path: Path, monkeypatch) -> None:
    """extract.input=compressed | segments reads per-conversation tables (compressed_turns,
    segments), so LongMemEval's compact turns do not switch the stage to the per-session plan,
    and the dry run estimates the plain path's windows too."""
    from types import SimpleNamespace

    from structmem_gpu.core import turns_store
    from structmem_gpu.methods.structmem import extract

    monkeypatch.setattr(turns_store, "has_compact", lambda run: True)
    run = SimpleNamespace(table_path=lambda name: tmp_path / f"{name}.parquet")
    for kind, per_session in (("turns", True), ("compressed", False), ("segments", False)):
        ctx = SimpleNamespace(settings=SimpleNamespace(input=kind), run=run)
        assert extract.per_session_applies(ctx) is per_session, kind


@pytest.mark.parametrize("experiment", ["structmem_locomo_reference_code",
                                        "flat_locomo_reference_code"])
def test_update_read_post_dry_runs(experiment: str) -> None:
    """update.read=post: the readers read the store after the offline update; the update
    stage's estimate leaves its stand-in (no decisions), so the dry run renders the readers'
    prompts instead of stopping on a missing entry_updates table (it exited 2)."""
    est = estimate(compose_job(["debug=scripted", "benchmark=sample", f"experiment={experiment}",
                                "update.enabled=true", "update.read=post"]))
    rows = {r["stage"]: r for r in est["stages"]}
    assert rows["update"]["requests"] > 0 and rows["answer"]["requests"] > 0
    assert rows["answer"]["prompt_tokens"] > 0
