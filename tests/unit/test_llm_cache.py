"""Response cache: keying, write-through, reruns with zero calls, concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.llm.cache import CACHE_FILE, CachedBackend, ResponseCache, cache_key, iter_rows
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling
from tests.fixtures.llm import OneAtATime

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "string", "maxLength": 20}},
    "required": ["a"],
}


def req(i: int, **kw: Any) -> LLMRequest:
    base = LLMRequest(
        request_id=f"r{i}",
        stage="extract",
        prompt_version="p/1",
        messages=(Message("system", "s"), Message("user", f"message number {i}")),
        schema=SCHEMA,
        sampling=Sampling(max_tokens=32),
    )
    return replace(base, **kw)


# --- keying ---------------------------------------------------------------------------------


def test_key_depends_on_everything_that_changes_the_reply() -> None:
    r = req(0)
    k = cache_key("m|a|", r)
    assert cache_key("m|a|", r) == k
    assert cache_key("m|b|", r) != k  # different weights: never shared
    assert cache_key("m|a|rev2", r) != k  # different revision
    assert cache_key("m|a|", r, {"reasoning_effort": "low"}) != k
    assert cache_key("m|a|", replace(r, sampling=Sampling(max_tokens=33))) != k
    assert cache_key("m|a|", replace(r, sampling=Sampling(max_tokens=32, temperature=0.7))) != k
    assert cache_key("m|a|", replace(r, sampling=Sampling(max_tokens=32, seed=1))) != k
    assert cache_key("m|a|", replace(r, prompt_version="p/2")) != k
    assert cache_key("m|a|", replace(r, schema=None)) != k
    assert cache_key("m|a|", replace(r, messages=r.messages[1:])) != k
    # request id, stage and conversation do not change the computation
    assert cache_key("m|a|", replace(r, request_id="other", stage="x", conv_id="c")) == k


def test_different_model_misses(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    a = CachedBackend(ScriptedLLM(model_id="model-a"), cache)
    b_inner = ScriptedLLM(model_id="model-b")
    b = CachedBackend(b_inner, cache)
    a.generate([req(0)])
    [res] = b.generate([req(0)])
    assert not res.cache_hit and b_inner.calls == 1 and res.model == "model-b"
    assert len(cache) == 2


# --- behaviour ------------------------------------------------------------------------------


def test_rerun_makes_zero_calls_and_keeps_token_counts(tmp_path: Path) -> None:
    inner = ScriptedLLM()
    llm = CachedBackend(inner, ResponseCache(tmp_path))
    reqs = [req(i) for i in range(6)]
    first = llm.generate(reqs)
    assert inner.calls == 6 and not any(r.cache_hit for r in first)
    second = CachedBackend(inner, ResponseCache(tmp_path)).generate(reqs)  # a new process, same dir
    assert inner.calls == 6
    assert [r.request_id for r in second] == [r.request_id for r in first]
    for a, b in zip(first, second, strict=True):
        assert b.cache_hit and b.attempts == 0 and b.parse_ok
        assert (b.text, b.data, b.prompt_tokens, b.completion_tokens, b.finish_reason) == (
            a.text,
            a.data,
            a.prompt_tokens,
            a.completion_tokens,
            a.finish_reason,
        )
        assert b.messages_hash == a.messages_hash


def test_failures_are_not_cached_and_resent(tmp_path: Path) -> None:
    inner = ScriptedLLM(
        {"extract": lambda r: "bad" if "1" in r.messages[1].content else '{"a": "ok"}'}
    )
    llm = CachedBackend(inner, ResponseCache(tmp_path))
    out = llm.generate([req(0), req(1)])
    assert [r.parse_ok for r in out] == [True, False]
    assert inner.calls == 3  # r1: first try + repair
    out2 = llm.generate([req(0), req(1)])
    assert [r.cache_hit for r in out2] == [True, False] and inner.calls == 5


def test_duplicates_in_one_batch_are_sent_once(tmp_path: Path) -> None:
    inner = ScriptedLLM()
    llm = CachedBackend(inner, ResponseCache(tmp_path))
    out = llm.generate([req(0), req(1), replace(req(0), request_id="dup")])
    assert inner.calls == 2
    assert [r.request_id for r in out] == ["r0", "r1", "dup"]
    assert out[2].text == out[0].text and out[2].cache_hit and out[2].attempts == 0


def test_messages_retrievable_from_hash(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    [res] = CachedBackend(ScriptedLLM(), cache).generate([req(3)])
    assert cache.messages_for(res.messages_hash) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "message number 3"},
    ]
    assert cache.messages_for("unknown") is None
    [row] = list(iter_rows(cache, model="scripted"))
    assert row["parse_ok"] == 1 and row["attempts"] == 1 and row["finish_reason"] == "stop"


def test_write_through_survives_a_crash_mid_batch(tmp_path: Path) -> None:
    class Crashing(ScriptedLLM):
        def _reply(self, r: LLMRequest) -> Any:
            if self.calls >= 3:
                raise KeyboardInterrupt  # the job dies after three requests
            return super()._reply(r)

    class OneByOne(Crashing, OneAtATime):
        """Crashes after three requests, finishing them one at a time (like the HTTP client)."""

    reqs = [req(i) for i in range(6)]
    with pytest.raises(KeyboardInterrupt):
        CachedBackend(OneByOne(), ResponseCache(tmp_path)).generate(reqs)
    inner = ScriptedLLM()
    out = CachedBackend(inner, ResponseCache(tmp_path)).generate(reqs)
    assert [r.cache_hit for r in out] == [True, True, True, False, False, False]
    assert inner.calls == 3


def test_backend_without_on_result_still_cached(tmp_path: Path) -> None:
    class Plain:
        model_id = "plain"

        def __init__(self) -> None:
            self.inner = ScriptedLLM(model_id="plain")

        def generate(self, requests: Any, *, desc: str = "") -> list[LLMResult]:
            return self.inner.generate(requests)

    cache = ResponseCache(tmp_path)
    CachedBackend(Plain(), cache).generate([req(0)])
    assert len(cache) == 1


def test_storage_is_segments_without_sqlite(tmp_path: Path) -> None:
    CachedBackend(ScriptedLLM(), ResponseCache(tmp_path)).generate([req(0), req(1)])
    assert [p.suffix for p in (tmp_path / CACHE_FILE / "seg").iterdir()] == [".seg"]
    assert not list(tmp_path.rglob("*.sqlite*"))


def _writer(cache_dir: str, worker: int, n: int) -> None:
    llm = CachedBackend(ScriptedLLM(), ResponseCache(Path(cache_dir)))
    # Overlapping request sets: every worker writes some keys the others write too.
    llm.generate([req(i) for i in range(worker * n // 2, worker * n // 2 + n)])


def test_concurrent_writers(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 200)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert len(ResponseCache(tmp_path)) == 3 * 100 + 200  # distinct keys 0..499
