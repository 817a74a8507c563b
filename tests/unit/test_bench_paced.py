"""The GPU-paced mock's timing model and the busy-fraction arithmetic, on tiny hand-checked cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from structmem_gpu.bench.paced_model import Engine, Seq, TimingModel, engine_model, simulate


def test_step_time_is_decode_plus_per_sequence_plus_prefill() -> None:
    m = TimingModel()
    assert m.step_s(0, 0) == 0.0
    assert m.step_s(1, 0) == pytest.approx(0.00656)
    assert m.step_s(256, 0) == pytest.approx(0.0065 + 256 * 0.00006)  # 21.86 ms
    assert m.step_s(2, 600) == pytest.approx(0.0065 + 2 * 0.00006 + 600 / 30000)
    # the published anchor points: ~150 tokens/s single stream, ~11.7 k tokens/s at 256
    assert 1 / m.step_s(1, 0) == pytest.approx(152.4, abs=0.1)
    assert 256 / m.step_s(256, 0) == pytest.approx(11711, abs=1)



def test_fp8_engine_divides_every_step_by_the_published_factor() -> None:
    """--paced-engine fp8: the vLLM docs' "up to 1.6x" throughput for FP8, on every term."""
    bf16, fp8 = engine_model("bf16", time_scale=10), engine_model("fp8", time_scale=10)
    assert bf16 == TimingModel(time_scale=10) and fp8.time_scale == 10
    for running, prefill in ((1, 0), (256, 0), (2, 600), (256, 40_000)):
        assert fp8.step_s(running, prefill) == pytest.approx(bf16.step_s(running, prefill) / 1.6)
    with pytest.raises(ValueError, match="bf16, fp8"):
        engine_model("int4")

def test_two_sequences_by_hand() -> None:
    # step 1: both admitted (600 prompt tokens), both decode; b (1 token) leaves
    # step 2, 3: a alone; a leaves after its third token
    eng = Engine(TimingModel())
    eng.submit(Seq("a", 300, 3))
    eng.submit(Seq("b", 300, 1))
    dt1, done1 = eng.step()
    assert dt1 == pytest.approx(0.0065 + 2 * 0.00006 + 0.02) and [s.ident for s in done1] == ["b"]
    dt2, done2 = eng.step()
    dt3, done3 = eng.step()
    assert dt2 == dt3 == pytest.approx(0.00656) and not done2 and [s.ident for s in done3] == ["a"]
    assert eng.model_time_s == pytest.approx(0.02662 + 2 * 0.00656)
    assert eng.decoded_tokens == 4 and eng.held() == 0


def test_max_num_seqs_queues_the_rest_and_counts_saturated_time() -> None:
    m = TimingModel(max_num_seqs=1)
    eng = Engine(m)
    for name in ("a", "b"):
        eng.submit(Seq(name, 0, 2))
    order = []
    while eng.held():
        _, done = eng.step()
        order += [s.ident for s in done]
    assert order == ["a", "b"] and eng.steps == 4
    assert eng.saturated_s == pytest.approx(eng.model_time_s)  # always 1 of 1 running
    assert simulate([Seq("x", 0, 2), Seq("y", 0, 2)], m) == pytest.approx(4 * 0.00656)
    # time_scale only changes how fast the mock plays it, never the model time
    assert simulate([Seq("x", 0, 2)], TimingModel(time_scale=20)) == pytest.approx(2 * 0.00656)


def test_prefix_cache_skips_the_shared_leading_blocks() -> None:
    """vLLM's automatic prefix caching, by hand: the second prompt shares its first two
    16-token blocks (the same 128 characters first), so only its other tokens are prefilled."""
    from structmem_gpu.bench.paced_model import BLOCK_CHARS, prompt_blocks

    system = "s" * (2 * BLOCK_CHARS - 8)  # with the role tags: 2 whole shared blocks
    a = prompt_blocks(["system", system, "user", "a" * 200])
    b = prompt_blocks(["system", system, "user", "b" * 200])
    assert len(a) == len(b) == (len("system") + len(system) + len("user") + 200 + 3) // BLOCK_CHARS
    assert a[:2] == b[:2] and a[2] != b[2]  # chained: a differing block changes every later one
    m = TimingModel()
    eng = Engine(m)
    eng.submit(Seq("a", 100, 1, blocks=a))
    dt_a, _ = eng.step()
    assert dt_a == pytest.approx(m.step_s(1, 100))  # cold cache: every token prefilled
    eng.submit(Seq("b", 100, 1, blocks=b))
    dt_b, [seq_b] = eng.step()
    assert seq_b.cached_tokens == 32 and dt_b == pytest.approx(m.step_s(1, 100 - 32))
    # a prompt wholly in the cache still computes one token (vLLM recomputes the last)
    eng.submit(Seq("a2", 100, 1, blocks=a))
    _, [seq] = eng.step()
    assert seq.cached_tokens == min(len(a) * 16, 99)
    assert eng.cached_tokens == 32 + seq.cached_tokens
    assert eng.prefill_tokens == 300 - eng.cached_tokens
    # off: every token charged, as before the cache was modelled
    off = Engine(TimingModel(prefix_caching=False))
    for name in ("a", "b"):
        off.submit(Seq(name, 100, 1, blocks=a))
        off.step()
    assert off.cached_tokens == 0 and off.prefill_tokens == 200


def test_prefix_cache_drops_the_least_recently_used_blocks() -> None:
    from structmem_gpu.bench.paced_model import PrefixCache

    c = PrefixCache(capacity_blocks=3)
    assert c.admit((1, 2)) == 0
    assert c.admit((1, 3)) == 1  # block 1 shared; 3 added; 1 now most recent
    assert c.admit((4,)) == 0  # over capacity: 2, the least recently used, goes
    assert list(c.blocks) == [1, 3, 4]
    assert c.admit((1, 2)) == 1  # 2 was dropped


def test_the_stand_in_encoder_counts_its_own_cpu() -> None:
    from structmem_gpu.bench.harness import HashingModel

    before = HashingModel.cpu_s
    HashingModel(dim=8).encode(["word " * 20000])
    assert HashingModel.cpu_s > before


def test_busy_fraction_counts_what_the_run_could_send() -> None:
    from structmem_gpu.bench.paced_model import busy_shares, timelines

    grid = np.arange(0.0, 10.0, 1.0)  # 10 instants
    # One batch of 3 requests from t=1 to t=6; results back at 3, 4, 5.5.
    calls = [{"n": 3, "t0": 1.0, "t1": 6.0, "done": [3.0, 4.0, 5.5]}]
    # The server got them at 1.5, 2.5 (slow client) and 2.5; finished at 2.9, 3.9, 5.4.
    held, avail = timelines(grid, calls, [1.5, 2.5, 2.5], [2.9, 3.9, 5.4])
    assert held.tolist() == [0, 0, 1, 2, 1, 1, 0, 0, 0, 0]
    assert avail.tolist() == [0, 3, 3, 2, 1, 1, 0, 0, 0, 0]
    out = busy_shares(held, avail, max_num_seqs=2)
    # busy at t=3 (holds 2 = max_num_seqs), 4 and 5 (holds all 1 the run could send); t=1, 2:
    # the run could send 3 but the server held 0 and 1 (framework's fault); t=0, 6..9: nothing
    # to send (between batches: the framework's time too).
    assert out["busy_fraction"] == 0.3
    assert out["wave_limited_share"] == 0.2  # t=4, 5: fewer than max_num_seqs to send
    assert out["saturated_share"] == 0.1


def test_not_busy_seconds_say_where_the_idle_time_went() -> None:
    from structmem_gpu.bench.paced_model import not_busy_seconds, timelines

    grid = np.arange(0.0, 10.0, 1.0)
    # Two calls: t=1..3 (2 requests, back at 2.5 and 2.9) and t=5..8 (1 request, back at 7.5).
    calls = [{"n": 2, "t0": 1.0, "t1": 3.0, "done": [2.5, 2.9]},
             {"n": 1, "t0": 5.0, "t1": 8.0, "done": [7.5]}]
    # Server: the first call's requests arrive at 1.5 and 1.5 (t=1 behind), the second's at 6.5
    # (t=5, 6 behind).
    held, avail = timelines(grid, calls, [1.5, 1.5, 6.5], [2.4, 2.8, 7.4])
    out = not_busy_seconds(grid, held, avail, 4, calls, 1.0)
    assert out == {"before_first_send_s": 1.0,  # t=0
                   "after_last_reply_s": 2.0,  # t=8, 9
                   "between_batches_s": 2.0,  # t=3, 4: nothing handed to the client
                   "client_behind_s": 3.0}  # t=1, 5, 6


@pytest.mark.e2e  # e2e: whole scripted pipeline runs
@pytest.mark.parametrize(("size", "engine"), [("tiny", "bf16"), ("tiny_longmemeval", "fp8")])
def test_paced_bench_runs_a_tiny_build_end_to_end(tmp_path: object, size: str, engine: str) -> None:
    """The paced mock answers the real HTTP client with scripted replies, the build parses
    them, and the report has its fields (values are not asserted: a benchmark, not a timing)."""
    from pathlib import Path

    from structmem_gpu.bench.harness import BenchSettings
    from structmem_gpu.bench.paced import run_paced

    conf = Path(__file__).resolve().parents[2] / "conf"
    out = run_paced(BenchSettings(conf_dir=conf, out_dir=Path(str(tmp_path))), sizes=(size,),
                    methods=("structmem",), time_scale=50, engine=engine, warm_up=False)
    [row] = out["rows"]
    assert "error" not in row, row
    # the mock played the engine asked for (its stats carry the timing model's parameters)
    [stats] = Path(str(tmp_path)).rglob("paced-structmem-*.server.json")
    assert row["engine"] == engine and json.loads(stats.read_text())["model"][
        "prefill_tokens_per_s"] == pytest.approx(30000 * (1.6 if engine == "fp8" else 1))
    assert row["format"] == ("longmemeval" if size.endswith("longmemeval") else "locomo")
    assert row["requests"] > 0 and 0.0 <= row["busy_fraction"] <= 1.0
    assert row["engine_model_s"] > 0 and row["predicted_gpu_s"] >= row["engine_model_s"]
    # the two perspectives' requests share their system prompts: the prefix cache serves some
    assert row["prefix_caching"] and row["cached_tokens"] > 0 and row["prefill_tokens"] > 0
    extract = next(s for s in row["stages"] if s["stage"] == "extract")
    assert extract["requests"] > 0 and extract["cpu_ms_per_request"] > 0
    # the stand-in encoder's CPU is reported apart (extract encodes nothing; the tiny build's
    # embed takes well under the 1 ms the figure is rounded to)
    assert extract["encoder_cpu_s"] == 0 and all(s["encoder_cpu_s"] >= 0 for s in row["stages"])
    assert "simulation" in out and "not a GPU measurement" in out["simulation"]
    # the run's phases: the build, then the evaluation (retrieve, answer, judge)
    build, evaluation = row["phases"]["build"], row["phases"]["evaluation"]
    assert build["stages"][-1] == "consolidate" and evaluation["stages"] == ["retrieve", "answer", "judge"]
    for ph in (build, evaluation):
        assert ph["engine_model_s"] > 0 and ph["predicted_gpu_s"] >= ph["engine_model_s"]
    # each figure is rounded to 0.01 s: three roundings of up to 0.005 each
    assert build["engine_model_s"] + evaluation["engine_model_s"] <= row["engine_model_s"] + 0.015
    assert {s["stage"] for s in row["stages"]} >= {"answer", "judge"}
