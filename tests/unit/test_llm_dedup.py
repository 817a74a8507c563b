"""In-batch dedup without the cache: each distinct request sent once, copies share results."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from structmem_gpu.llm.dedup import DedupBackend, cache_key
from structmem_gpu.llm.factory import open_llm
from structmem_gpu.llm.scripted import ScriptedFailure, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Message, Sampling

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def req(i: int, **kw: Any) -> LLMRequest:
    base = LLMRequest(
        request_id=f"r{i}",
        stage="extract",
        prompt_version="p/1",
        messages=(Message("user", f"session text {i}"),),
        schema=SCHEMA,
        sampling=Sampling(max_tokens=16),
    )
    return replace(base, **kw)


def test_copies_are_sent_once_and_keep_their_own_ids() -> None:
    inner = ScriptedLLM()
    llm = DedupBackend(inner)
    batch = [req(0), req(1), replace(req(0), request_id="copy-a"), replace(req(0), request_id="b")]
    seen: dict[int, str] = {}
    out = llm.generate(batch, on_result=lambda i, r: seen.__setitem__(i, r.request_id))
    assert inner.calls == 2 and (llm.sent, llm.shared) == (2, 2)
    assert [r.request_id for r in out] == ["r0", "r1", "copy-a", "b"]
    assert [r.cache_hit for r in out] == [False, False, True, True]
    assert [r.attempts for r in out] == [1, 1, 0, 0]
    assert out[2].text == out[0].text and out[3].text == out[0].text
    assert seen == {0: "r0", 1: "r1", 2: "copy-a", 3: "b"}  # every slot reported once


def test_requests_that_differ_in_anything_but_id_are_all_sent() -> None:
    inner = ScriptedLLM()
    batch = [req(0), replace(req(0), request_id="x", sampling=Sampling(max_tokens=17))]
    assert cache_key("m", batch[0]) != cache_key("m", batch[1])
    out = DedupBackend(inner).generate(batch)
    assert inner.calls == 2 and not any(r.cache_hit for r in out)


def test_a_failed_original_fails_its_copies_too() -> None:
    def fail(_: LLMRequest) -> str:
        raise ScriptedFailure("server gone")

    llm = DedupBackend(ScriptedLLM({"extract": fail}))
    out = llm.generate([req(0), replace(req(0), request_id="copy")])
    assert [r.request_id for r in out] == ["r0", "copy"]
    assert not any(r.parse_ok for r in out) and not any(r.cache_hit for r in out)
    assert out[1].error == out[0].error and out[0].error


def test_open_llm_dedups_with_the_cache_off(tmp_path: Path) -> None:
    cfg = {"backend": "scripted", "served_name": "scripted"}
    with open_llm(cfg, log_dir=tmp_path, cache_dir=None) as llm:
        out = llm.generate([req(0), replace(req(0), request_id="copy"), req(1)])
        assert isinstance(llm, DedupBackend) and llm.shared == 1
        assert llm.inner.calls == 2  # type: ignore[attr-defined]  # attribute of the inner backend
    assert [r.cache_hit for r in out] == [False, True, False]
