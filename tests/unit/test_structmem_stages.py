"""StructMem stages end to end on the bundled sample: scripted LLM, fake encoder, real FAISS-CPU."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import display_text, load_benchmark
from structmem_gpu.embed.cache import text_sha
from structmem_gpu.embed.encoder import Encoder
from structmem_gpu.llm.scripted import Responder, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.structmem import consolidate, embed, extract, retrieve
from structmem_gpu.methods.structmem.windows import count_windows
from structmem_gpu.stage import Stage, StageContext
from tests.unit.test_embed_encoder import CountingModel

CONF = Path(__file__).resolve().parents[2] / "conf"
_TURN_LINE = re.compile(r"^\[(\d+)\] ([^:]+): (.*)$", re.MULTILINE)


@cache
def cfg_for(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=["debug=scripted", *overrides])


class FakeBackends:
    """What StageContext needs from `Backends`: one LLM and one encoder."""

    def __init__(self, responders: dict[str, Responder] | None = None) -> None:
        self.scripted = ScriptedLLM(responders)
        self.model = CountingModel()
        self.enc = Encoder(self.model, "fake-bow")

    def llm(self, role: str = "llm") -> ScriptedLLM:
        return self.scripted

    def encoder(self) -> Encoder:
        return self.enc


def echo(req: LLMRequest) -> str:
    """Extraction responder: one item per numbered turn, text '<speaker>: <turn text>'."""
    limit = req.schema["properties"]["entries"]["items"]["properties"]["text"]["maxLength"]
    items = [
        {"turn": int(n), "text": f"{who}: {text}"[:limit]}
        for n, who, text in _TURN_LINE.findall(req.messages[-1].content)
    ]
    return json.dumps({"entries": items})


def run_stage(run: RunDir, cfg: DictConfig, backends: FakeBackends, stage: Stage) -> StageContext:
    ctx = StageContext(job=JobConfig.from_cfg(cfg), run=run, stage=stage, backends=backends)  # type: ignore[arg-type]
    out = stage.run(ctx)
    assert set(out) == set(stage.writes)
    for name, df in out.items():
        run.write_table(name, df)  # conforms to schemas.py: a wrong dtype fails here
    return ctx


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    turns, questions = load_benchmark("sample", sample_path, None, None)
    r = RunDir(tmp_path / "run")
    r.write_table("turns", turns)
    r.write_table("questions", questions)
    return r


def build_memory(run: RunDir, cfg: DictConfig, backends: FakeBackends) -> None:
    run_stage(run, cfg, backends, extract.STAGE)
    run_stage(run, cfg, backends, embed.STAGE)


# ---- extract ---------------------------------------------------------------------------------


def test_extract_maps_local_turn_numbers_in_one_batch(run: RunDir) -> None:
    ctx = run_stage(run, cfg_for(), FakeBackends({"extract": echo}), extract.STAGE)
    turns, entries = run.read_table("turns"), run.read_table("entries")
    assert ctx.batches == 1
    assert ctx.notes["requests"] == 2 * ctx.notes["windows"] == ctx.request_frames[0].height
    assert ctx.request_frames[0]["request_id"].n_unique() == ctx.notes["requests"]
    assert ctx.notes["turns_covered"] == turns.height and ctx.notes["rejected_items"] == 0
    joined = entries.join(
        turns.select("event_id", "text", "image_caption", pl.col("speaker").alias("turn_speaker")),
        on="event_id",
        how="left",
    )
    assert joined.height == entries.height == 2 * turns.height
    for r in joined.iter_rows(named=True):
        assert r["speaker"] == r["turn_speaker"]
        assert f"{r['speaker']}: {display_text(r['text_right'], r['image_caption'])}".startswith(
            r["text"]
        )
        assert r["entry_id"] == extract.entry_id(r["conv_id"], r["event_id"], r["kind"], r["text"])
    assert set(entries["kind"]) == {"fact", "relation"}
    assert entries.filter(pl.col("kind") == "relation")["prompt_version"].unique().to_list() == [
        "relational/3"
    ]


def test_extract_out_of_range_turn_is_recorded_never_bound(run: RunDir) -> None:
    def relation_out_of_range(req: LLMRequest) -> str:
        if not req.prompt_version.startswith("relational"):
            return echo(req)
        n = req.schema["properties"]["entries"]["items"]["properties"]["turn"]["maximum"]
        return json.dumps({"entries": [{"turn": n + 1, "text": "bound to no turn"}]})

    ctx = run_stage(run, cfg_for(), FakeBackends({"extract": relation_out_of_range}), extract.STAGE)
    entries, log = run.read_table("entries"), ctx.request_frames[0]
    assert set(entries["kind"]) == {"fact"}  # nothing clamped onto the last turn
    failed = log.filter(~pl.col("parse_ok"))
    assert failed.height == ctx.notes["windows"] == ctx.notes["parse_failures"]
    assert failed["prompt_version"].unique().to_list() == ["relational/3"]
    assert all("maximum" in e or "is not one of" in e for e in failed["error"].to_list())


def test_extract_failed_parse_is_recorded_not_dropped(run: RunDir) -> None:
    responder = {
        "extract": lambda req: (
            "Sorry, no JSON today." if req.prompt_version.startswith("factual") else echo(req)
        )
    }
    ctx = run_stage(run, cfg_for(), FakeBackends(responder), extract.STAGE)
    log = ctx.request_frames[0]
    failed = log.filter(~pl.col("parse_ok"))
    assert failed.height == ctx.notes["windows"] == ctx.notes["parse_failures"]
    assert failed["attempts"].to_list() == [2] * failed.height  # one repair, then recorded
    assert failed["reply"].unique().to_list() == ["Sorry, no JSON today."]
    assert set(run.read_table("entries")["kind"]) == {"relation"}


def test_extract_is_deterministic_across_reruns(run: RunDir) -> None:
    a = run_stage(run, cfg_for(), FakeBackends(), extract.STAGE)
    first = run.read_table("entries")
    b = run_stage(run, cfg_for(), FakeBackends(), extract.STAGE)
    assert (
        a.request_frames[0]["request_id"].to_list() == b.request_frames[0]["request_id"].to_list()
    )
    assert first.equals(run.read_table("entries"))


def test_embed_rows_align_with_entries(run: RunDir) -> None:
    backends = FakeBackends({"extract": echo})
    build_memory(run, cfg_for(), backends)
    entries, emb = run.read_table("entries"), run.read_table("entry_embeddings")
    assert emb["item_id"].to_list() == entries["entry_id"].to_list()
    assert emb["text_hash"].to_list() == [text_sha(t) for t in entries["text"]]
    mat = embed.embedding_matrix(emb)
    np.testing.assert_allclose(np.linalg.norm(mat, axis=1), 1.0, rtol=1e-5)
    assert set(emb["model"]) == {"fake-bow"}


# ---- consolidate -----------------------------------------------------------------------------


def _checked_syntheses(run: RunDir) -> pl.DataFrame:
    """Syntheses joined with what every provenance id must satisfy (shared by several tests)."""
    entries, syn = run.read_table("entries"), run.read_table("syntheses")
    times = dict(zip(entries["entry_id"], entries["event_time"], strict=True))
    event_of = dict(zip(entries["entry_id"], entries["event_id"], strict=True))
    for r in syn.iter_rows(named=True):
        buffer, seeds, context = (
            set(r["buffer_entry_ids"]),
            r["seed_entry_ids"],
            r["context_entry_ids"],
        )
        assert buffer and not buffer & set(seeds) and not buffer & set(context)
        seed_events = {event_of[s] for s in seeds}
        expected = {e for e, ev in event_of.items() if ev in seed_events} - buffer
        assert set(context) == expected  # every entry of every seed event, nothing else
        assert [times[c] for c in context] == sorted(times[c] for c in context)
        assert all(r["window_start"] <= times[b] <= r["window_end"] for b in buffer)
    return syn


def test_consolidate_historical_seeds_in_one_batch(run: RunDir) -> None:
    cfg, backends = cfg_for(), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    ctx = run_stage(run, cfg, backends, consolidate.STAGE)
    entries, syn = run.read_table("entries"), _checked_syntheses(run)
    times = dict(zip(entries["entry_id"], entries["event_time"], strict=True))
    conv_of = dict(zip(entries["entry_id"], entries["conv_id"], strict=True))
    assert (
        ctx.batches == 1 and syn.height == ctx.notes["windows"] == count_windows(entries, 3600) == 8
    )
    for r in syn.iter_rows(named=True):
        assert all(times[s] < r["window_start"] for s in r["seed_entry_ids"])  # strictly older
        n_history = sum(
            t < r["window_start"] and conv_of[e] == r["conv_id"] for e, t in times.items()
        )
        assert len(r["seed_entry_ids"]) == min(int(cfg.consolidate.seed_k), n_history)
    assert syn.filter(pl.col("window_index") == 0)["seed_entry_ids"].list.len().max() == 0
    emb = run.read_table("synthesis_embeddings")
    assert sorted(emb["item_id"]) == sorted(syn.filter("parse_ok")["synth_id"])


def test_consolidate_global_scope_uses_future_but_never_the_buffer(run: RunDir) -> None:
    cfg, backends = (
        cfg_for("consolidate.seed_scope=global", "consolidate.seed_k=5"),
        FakeBackends({"extract": echo}),
    )
    build_memory(run, cfg, backends)
    run_stage(run, cfg, backends, consolidate.STAGE)
    syn, entries = _checked_syntheses(run), run.read_table("entries")
    times = dict(zip(entries["entry_id"], entries["event_time"], strict=True))
    first = syn.filter(pl.col("window_index") == 0).row(0, named=True)
    assert len(first["seed_entry_ids"]) == 5 and all(
        times[s] > first["window_end"] for s in first["seed_entry_ids"]
    )


def test_seed_k_zero_gives_buffer_only_syntheses(run: RunDir) -> None:
    cfg, backends = cfg_for("consolidate.seed_k=0"), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    ctx = run_stage(run, cfg, backends, consolidate.STAGE)
    syn = run.read_table("syntheses")
    assert syn.height == ctx.notes["windows"] > 0
    assert (
        syn["seed_entry_ids"].list.len().max() == 0
        and syn["context_entry_ids"].list.len().max() == 0
    )


def test_consolidate_disabled_sends_nothing(run: RunDir) -> None:
    cfg, backends = cfg_for("consolidate.enabled=false"), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    calls, embedded = backends.scripted.calls, len(backends.model.embedded)
    ctx = run_stage(run, cfg, backends, consolidate.STAGE)
    assert (
        ctx.batches == 0
        and backends.scripted.calls == calls
        and len(backends.model.embedded) == embedded
    )
    assert (
        run.read_table("syntheses").height == 0
        and run.read_table("synthesis_embeddings").height == 0
    )


def test_mean_query_mode_encodes_no_buffer_text(run: RunDir) -> None:
    cfg, backends = cfg_for("consolidate.query_mode=mean"), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    before = len(backends.model.embedded)
    run_stage(run, cfg, backends, consolidate.STAGE)
    new = backends.model.embedded[before:]
    assert set(new) <= set(run.read_table("syntheses")["text"])  # only synthesis texts


def test_empty_synthesis_is_kept_but_not_embedded(run: RunDir) -> None:
    def blank_first_window(req: LLMRequest) -> str:
        return "" if "(none)" in req.messages[-1].content else "A narrative."

    cfg, backends = cfg_for(), FakeBackends({"extract": echo, "consolidate": blank_first_window})
    build_memory(run, cfg, backends)
    ctx = run_stage(run, cfg, backends, consolidate.STAGE)
    syn, emb = run.read_table("syntheses"), run.read_table("synthesis_embeddings")
    failed = syn.filter(~pl.col("parse_ok"))
    assert failed.height == ctx.notes["parse_failures"] == 2  # window 0 of both conversations
    assert set(emb["item_id"]) == set(syn.filter("parse_ok")["synth_id"])


# ---- retrieve --------------------------------------------------------------------------------


def test_retrieve_dual_circuit_within_the_conversation(run: RunDir) -> None:
    cfg, backends = (
        cfg_for("retrieve.entries_k=7", "retrieve.syntheses_k=2"),
        FakeBackends({"extract": echo}),
    )
    build_memory(run, cfg, backends)
    run_stage(run, cfg, backends, consolidate.STAGE)
    before = len(backends.model.embedded)
    ctx = run_stage(run, cfg, backends, retrieve.STAGE)
    ret, questions = run.read_table("retrievals"), run.read_table("questions")
    owner = {
        **dict(
            zip(
                run.read_table("entries")["entry_id"],
                run.read_table("entries")["conv_id"],
                strict=True,
            )
        ),
        **dict(
            zip(
                run.read_table("syntheses")["synth_id"],
                run.read_table("syntheses")["conv_id"],
                strict=True,
            )
        ),
    }
    selected = questions.filter(pl.col("category").is_in([1, 2, 3, 4]))
    assert (
        set(ret["question_id"]) == set(selected["question_id"])
        and ctx.notes["questions"] == selected.height
    )
    assert len(backends.model.embedded) - before <= selected.height  # one batch of question texts
    for (qid, circuit), part in ret.group_by("question_id", "circuit"):
        assert part.height == {"entries": 7, "syntheses": 2}[circuit]
        part = part.sort("rank")
        assert part["rank"].to_list() == list(range(part.height))
        assert part["score"].to_list() == sorted(part["score"].to_list(), reverse=True)
        assert all(owner[i] == part["conv_id"][0] == qid.split(":")[0] for i in part["item_id"])


def test_retrieve_without_syntheses_tables(run: RunDir) -> None:
    cfg, backends = cfg_for("benchmark.categories=[1]"), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    ctx = run_stage(run, cfg, backends, retrieve.STAGE)
    ret = run.read_table("retrievals")
    assert set(ret["circuit"]) == {"entries"} and ctx.notes["rows_syntheses"] == 0
    cats = run.read_table("questions").filter(
        pl.col("question_id").is_in(ret["question_id"].unique().to_list())
    )["category"]
    assert set(cats) == {1}


def test_missing_entry_embedding_is_a_clear_error(run: RunDir) -> None:
    cfg, backends = cfg_for(), FakeBackends({"extract": echo})
    build_memory(run, cfg, backends)
    emb = run.read_table("entry_embeddings")
    run.write_table("entry_embeddings", emb.slice(1))
    with pytest.raises(RuntimeError, match="entry_embeddings: 1 item"):
        run_stage(run, cfg, backends, consolidate.STAGE)


def test_reference_dir_runs_extract_and_consolidate_on_the_checkout_prompts(run: RunDir) -> None:
    checkout = Path(__file__).resolve().parents[1] / "fixtures" / "lightmem_checkout"
    line = re.compile(r"^\[[^\]]+\] (\d+)\.([^:]+): (.*)$", re.MULTILINE)

    def reference_reply(req: LLMRequest) -> str:
        kind = "fact" if req.prompt_version.startswith("reference-fact") else "relation"
        items = [{"source_id": int(i), kind: f"{who} said: {text}"[:80]}
                 for i, who, text in line.findall(req.messages[-1].content)]
        return json.dumps({"data": items})

    seen: list[str] = []

    def synthesis_reply(req: LLMRequest) -> str:
        seen.append(req.messages[-1].content)
        return "A narrative."

    cfg = cfg_for(f"prompts.reference_dir={checkout}")
    backends = FakeBackends({"extract": reference_reply, "consolidate": synthesis_reply})
    ctx = run_stage(run, cfg, backends, extract.STAGE)
    entries, turns = run.read_table("entries"), run.read_table("turns")
    assert ctx.notes["prompt_variant"] == "reference" and ctx.notes["rejected_items"] == 0
    assert entries.height == 2 * turns.height  # every source id mapped back to its own turn
    joined = entries.join(turns.select("event_id", pl.col("speaker").alias("ts")), on="event_id")
    assert (joined["speaker"] == joined["ts"]).all()
    assert all(t.startswith(f"{s} said: ") for s, t in zip(joined["speaker"], joined["text"], strict=True))
    run_stage(run, cfg, backends, embed.STAGE)
    cctx = run_stage(run, cfg, backends, consolidate.STAGE)
    syn = run.read_table("syntheses")
    assert syn.height == cctx.notes["windows"] and set(syn["prompt_version"]) == {
        f"reference-synthesis/{syn['prompt_version'][0].split('/')[1]}"
    }
    assert seen and all(m.startswith("FIXTURE synthesis prompt.") and "{" not in m for m in seen)


class PromptRecordingModel(CountingModel):
    """CountingModel that also records the instruction (sentence-transformers prompt) per text."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str | None] = []

    def encode(self, inputs: list[str], **kwargs: Any) -> np.ndarray:
        self.prompts.extend([kwargs.get("prompt")] * len(inputs))
        return super().encode(inputs, **kwargs)


def test_build_requests_sample_as_the_reference_and_seed_query_is_an_entry(run: RunDir) -> None:
    # the reference extracts and synthesises at temperature 0.1 / top_p 0.1 and embeds the
    # joined buffer like any memory text: no question instruction on the seed query
    from structmem_gpu.llm.client import request_body

    seen: list[LLMRequest] = []

    def recording(responder: Responder) -> Responder:
        return lambda req: (seen.append(req), responder(req))[1]

    cfg = cfg_for("embedder.instructions.query=QUESTION-INSTRUCTION")
    backends = FakeBackends({"extract": recording(echo), "consolidate": recording(lambda r: "ok")})
    backends.model = PromptRecordingModel()
    backends.enc = Encoder(backends.model, "fake-bow")
    build_memory(run, cfg, backends)
    before = len(backends.model.embedded)
    run_stage(run, cfg, backends, consolidate.STAGE)
    stages = {r.stage for r in seen}
    assert stages == {"extract", "consolidate"}
    for req in seen:
        body = request_body(req, served_name="m", flavor="vllm")
        assert (body["temperature"], body["top_p"]) == (0.1, 0.1), req.stage
    queries = [
        (text, prompt)
        for text, prompt in zip(backends.model.embedded[before:], backends.model.prompts[before:],
                                strict=True)
        if "\n" in text  # the joined buffers (entries and syntheses here are one line each)
    ]
    assert queries and all(prompt is None for _, prompt in queries)
