"""SEEM stages end to end on the bundled sample: scripted LLM, hashed bag-of-words encoder.

Also the harness other SEEM unit tests import (`build_memory`, `run_stage`, `FakeBackends`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import polars as pl
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.data import load_benchmark
from structmem_gpu.embed.encoder import Encoder
from structmem_gpu.llm.scripted import Responder, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.seem import frames, fusion, graph, retrieve
from structmem_gpu.methods.seem.schemas import TABLES
from structmem_gpu.stage import Stage, StageContext
from tests.unit.test_embed_encoder import CountingModel

CONF = Path(__file__).resolve().parents[2] / "conf"


@cache
def seem_cfg(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=["debug=scripted", "method=seem", *overrides])


class FakeBackends:
    def __init__(self, responders: dict[str, Responder] | None = None) -> None:
        self.scripted = ScriptedLLM(responders)
        self.enc = Encoder(CountingModel(dim=64), "fake-bow")

    def llm(self, role: str = "llm") -> ScriptedLLM:
        return self.scripted

    def encoder(self) -> Encoder:
        return self.enc


def run_stage(run: RunDir, cfg: DictConfig, backends: FakeBackends, stage: Stage) -> StageContext:
    ctx = StageContext(job=JobConfig.from_cfg(cfg), run=run, stage=stage, backends=backends)  # type: ignore[arg-type]
    out = stage.run(ctx)
    assert set(out) == set(stage.writes)
    for name, df in out.items():
        if name in TABLES:
            assert df.schema == pl.Schema(TABLES[name]), name
        run.write_table(name, df)
    return ctx


def new_run(root: Path, sample: Path) -> RunDir:
    turns, questions = load_benchmark("sample", sample, None, None)
    run = RunDir(root)
    run.write_table("turns", turns)
    run.write_table("questions", questions)
    return run


def build_memory(run: RunDir, cfg: DictConfig, backends: FakeBackends) -> dict[str, StageContext]:
    return {s.name: run_stage(run, cfg, backends, s) for s in (frames.STAGE, fusion.STAGE, graph.STAGE)}


@pytest.fixture
def run(tmp_path: Path, sample_path: Path) -> RunDir:
    return new_run(tmp_path / "run", sample_path)


def test_registry_and_config_name_the_stages() -> None:
    cfg = seem_cfg()
    stages = stage_registry(cfg)
    assert list(cfg.method.stages) == ["load", "frames", "fusion", "graph", "retrieve", "answer", "judge", "report"]
    assert all(name in stages for name in cfg.method.stages)
    structmem = stage_registry(seem_cfg("method=structmem"))
    assert stages["answer"] is structmem["answer"]  # the shared stage, reused
    for variant in ("seem_no_fact_context", "seem_no_ppr", "seem_no_rpe", "seem_no_eef"):
        vcfg = seem_cfg(f"method={variant}")
        switch = variant.removeprefix("seem_no_")
        assert vcfg.method.name == variant and not vcfg.seem.ablation[switch]
        switches = ("fact_context", "ppr", "rpe", "eef")
        # w/o EEF also names the RPE it implies (no RPE without frames: the Table 3 row's switches)
        off = {k for k in switches if not vcfg.seem.ablation[k]}
        assert off == ({"eef", "rpe"} if switch == "eef" else {switch})
        assert not vcfg.seem.ablation.rpe_without_eef
    both = seem_cfg("method=seem_no_eef_rpe").seem.ablation
    assert not both.eef and both.rpe and both.rpe_without_eef  # "w/o EEF", RPE kept


@pytest.mark.parametrize("per_request", [1, 3])
def test_frames_one_batch_one_frame_per_passage(run: RunDir, per_request: int) -> None:
    cfg = seem_cfg(f"seem.passages_per_request={per_request}")
    ctx = run_stage(run, cfg, FakeBackends(), frames.STAGE)
    turns, eef, passages = run.read_table("turns"), run.read_table("frames_extracted"), run.read_table("passages")
    assert ctx.batches == 1
    assert sorted(eef["pid"]) == sorted(turns["event_id"]) == sorted(passages["pid"])
    sessions = turns.group_by("conv_id", "session_index").len()["len"].to_list()
    assert ctx.notes["requests"] == sum(-(-n // per_request) for n in sessions)
    assert eef["parse_ok"].all() and not eef["fallback"].any()
    assert (eef["events"].list.len() <= cfg.seem.frames.max_events * cfg.seem.frames.max_actions_schema).all()


def test_frames_fallback_on_failed_extraction(run: RunDir) -> None:
    ctx = run_stage(run, seem_cfg(), FakeBackends({"frames": lambda req: "no json"}), frames.STAGE)
    eef, turns = run.read_table("frames_extracted"), run.read_table("turns")
    assert eef["fallback"].all() and ctx.notes["fallbacks"] == turns.height
    assert (eef["events"].list.len() == 0).all()
    text = dict(zip(turns["event_id"], turns["text"], strict=True))
    assert all(text[p].startswith(s[:20]) for p, s in zip(eef["pid"], eef["summary"], strict=True))


def test_build_stages_provenance_resolves_to_turns(run: RunDir) -> None:
    ctxs = build_memory(run, seem_cfg(), FakeBackends())
    events = set(run.read_table("turns")["event_id"])
    fr, fo, facts = run.read_table("frames"), run.read_table("frame_of"), run.read_table("facts")
    assert sorted(fo["pid"]) == sorted(events)  # Phi covers every passage exactly once
    assert set(fr.explode("provenance")["provenance"]) == events
    assert all(p.split(":")[0] == c for c, ps in zip(fr["conv_id"], fr["provenance"], strict=True) for p in ps)
    assert set(facts.explode("provenance")["provenance"]) <= events
    nodes, edges = run.read_table("graph_nodes"), run.read_table("graph_edges")
    assert set(edges["src"]) | set(edges["dst"]) <= set(nodes["node_id"])
    assert nodes.filter(pl.col("kind") == "passage")["name"].sort().to_list() == sorted(events)
    assert ctxs["graph"].batches == 1 and ctxs["frames"].batches == 1
    longest = run.read_table("passages").group_by("conv_id").len()["len"].max()
    assert ctxs["fusion"].batches == ctxs["fusion"].notes["steps_with_requests"] <= longest
    assert ctxs["fusion"].notes["steps"] == longest


def test_full_stage_chain_answers_every_question(run: RunDir) -> None:
    cfg, backends = seem_cfg(), FakeBackends()
    build_memory(run, cfg, backends)
    ctx = run_stage(run, cfg, backends, retrieve.STAGE)
    answer_stage = stage_registry(seem_cfg())["answer"]
    run_stage(run, cfg, backends, answer_stage)
    questions = run.read_table("questions").filter(pl.col("category").is_in([1, 2, 3, 4]))
    answers = run.read_table("answers")
    assert sorted(answers["question_id"]) == sorted(questions["question_id"])
    assert ctx.batches == 2  # query quadruples, then the filter
    ret = run.read_table("retrievals")
    assert set(ret["circuit"]) == {"facts", "frames", "turns"}


def test_answer_prompt_holds_facts_frames_and_chronological_passages(run: RunDir) -> None:
    seen: list[LLMRequest] = []

    def capture(req: LLMRequest) -> str:
        seen.append(req)
        return "Biscuit"

    cfg, backends = seem_cfg(), FakeBackends({"answer": capture})
    build_memory(run, cfg, backends)
    run_stage(run, cfg, backends, retrieve.STAGE)
    run_stage(run, cfg, backends, stage_registry(seem_cfg())["answer"])
    user = seen[0].messages[-1].content
    assert seen[0].prompt_version == "seem_answer/1"
    heads = [user.index(h) for h in ("Relevant facts", "Episodic memories:", "Conversation excerpts", "Question:")]
    assert heads == sorted(heads)
    excerpt = user[heads[2]:heads[3]].splitlines()[1:]
    sessions = [int(line.split(",")[0].removeprefix("[session ")) for line in excerpt]
    assert len(excerpt) >= cfg.seem.retrieve.p_ret_k and sessions == sorted(sessions)
    assert user.count("[Memory ") >= 1
