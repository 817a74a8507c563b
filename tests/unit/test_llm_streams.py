"""Request streams (llm/types.py): a stage may hand `generate` an iterator, whose requests are
planned while the first ones are already at the server. Every layer gives the results of the
same requests as a list, in order; the HTTP client draws only as workers free up."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.client import HTTPBackend
from structmem_gpu.llm.dedup import DedupBackend
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.seeded import SeededBackend
from structmem_gpu.llm.types import LLMRequest, Message, Sampling, streams
from tests.fixtures.llm import FakeServer, completion

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def req(i: int, rid: str | None = None) -> LLMRequest:
    return LLMRequest(request_id=rid or f"r{i}", stage="test", prompt_version="t/1",
                      messages=(Message("user", str(i)),), schema=SCHEMA,
                      sampling=Sampling(max_tokens=8))


def http(fake: FakeServer, max_in_flight: int = 3) -> HTTPBackend:
    return HTTPBackend(base_url=fake.url, served_name="fake", model_id="fake|m|",
                       max_in_flight=max_in_flight, request_timeout_s=5, max_retries=1,
                       retry_backoff_s=0.01, progress=False)


def numbers(body: dict[str, Any], k: int) -> tuple[int, bytes, float]:
    n = int(body["messages"][-1]["content"])
    return 200, completion(json.dumps({"n": n})), 0.005


def test_the_client_draws_a_stream_only_as_workers_free_up(
    fake_chat_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from structmem_gpu.llm import client

    monkeypatch.setattr(client, "DRAW_AHEAD", 4)  # drawn 4 at a time
    fake_chat_server.behaviour = numbers
    answered: list[int] = []
    at_draw: list[tuple[int, int]] = []  # (index drawn, replies back by then)

    def planned() -> Iterator[LLMRequest]:
        for i in range(20):
            at_draw.append((i, len(answered)))
            yield req(i)

    out = http(fake_chat_server, max_in_flight=3).generate(
        planned(), on_result=lambda i, r: answered.append(i), total=20)
    assert [r.request_id for r in out] == [f"r{i}" for i in range(20)]
    assert [r.data for r in out] == [{"n": i} for i in range(20)]
    # never more than max_in_flight + DRAW_AHEAD drawn and not answered: the rest were planned
    # while the first were at the server
    assert all(i - back <= 3 + 4 for i, back in at_draw)
    assert at_draw[-1][1] >= 12


def test_dedup_and_cache_stream_the_same_results_as_a_list(
    fake_chat_server: FakeServer, tmp_path: Path
) -> None:
    fake_chat_server.behaviour = numbers
    batch = [req(0), req(1), req(0, "copy"), req(2), req(1, "copy-1"), req(3), req(4)]
    listed = DedupBackend(http(fake_chat_server)).generate(batch)
    sent_for_list = len(fake_chat_server.bodies)
    dedup = DedupBackend(http(fake_chat_server))
    streamed = dedup.generate(iter(batch), total=len(batch))
    assert sent_for_list == 5 and len(fake_chat_server.bodies) == 10  # each distinct once
    assert [(r.request_id, r.data, r.cache_hit) for r in streamed] == [
        (r.request_id, r.data, r.cache_hit) for r in listed]
    assert (dedup.sent, dedup.shared) == (5, 2)

    # The cache looks a stream up a chunk at a time (3 here): a second stream is all hits.
    cache = ResponseCache(tmp_path)
    first = CachedBackend(http(fake_chat_server), cache)
    first.LOOKUP_CHUNK = 3
    seen: dict[int, str] = {}
    out = first.generate(iter(batch), on_result=lambda i, r: seen.__setitem__(i, r.request_id))
    assert [r.data for r in out] == [r.data for r in listed] and first.misses == 5
    assert seen == {i: r.request_id for i, r in enumerate(batch)}  # every slot reported once
    before = len(fake_chat_server.bodies)
    again = CachedBackend(http(fake_chat_server), cache)
    again.LOOKUP_CHUNK = 3
    hits = again.generate(iter([*batch, req(5)]))
    assert len(fake_chat_server.bodies) == before + 1 and again.hits == 7 and again.misses == 1
    assert [r.cache_hit for r in hits] == [True] * 7 + [False]
    assert [r.data for r in hits] == [{"n": n} for n in (0, 1, 0, 2, 1, 3, 4, 5)]
    cache.close()


def test_a_stream_reaches_a_backend_that_does_not_stream_as_a_list() -> None:
    inner = ScriptedLLM()
    assert not streams(inner) and streams(DedupBackend(inner))
    got: list[Any] = []
    real = inner.generate

    def listed(requests: Any, **kw: Any) -> Any:
        got.append(type(requests))
        return real(requests, **kw)

    inner.generate = listed  # type: ignore[method-assign]
    seeded = SeededBackend(DedupBackend(inner), seed=3)
    out = seeded.generate(req(i) for i in range(4))
    assert got == [list] and [r.request_id for r in out] == ["r0", "r1", "r2", "r3"]


def test_seeded_streams_carry_the_seed(fake_chat_server: FakeServer) -> None:
    fake_chat_server.behaviour = numbers
    out = SeededBackend(DedupBackend(http(fake_chat_server)), seed=7).generate(
        (req(i) for i in range(3)), total=3)
    assert [r.data for r in out] == [{"n": i} for i in range(3)]
    assert {b["seed"] for b in fake_chat_server.bodies} == {7}


def test_copies_in_a_stream_keep_their_ids() -> None:
    out = DedupBackend(ScriptedLLM()).generate(iter([req(0), replace(req(0), request_id="c")]))
    assert [r.request_id for r in out] == ["r0", "c"] and out[1].cache_hit


def test_a_stage_context_streams_and_logs_every_request(
    fake_chat_server: FakeServer, tmp_path: Path
) -> None:
    from structmem_gpu.config.job import JobConfig
    from structmem_gpu.core.artifacts import RunDir
    from structmem_gpu.methods.structmem.consolidate import STAGE
    from structmem_gpu.stage import StageContext
    from tests.unit.test_structmem_stages import FakeBackends, cfg_for

    fake_chat_server.behaviour = numbers
    backends = FakeBackends()
    opened: list[str] = []
    real = backends.llm
    backends.llm = lambda role="llm": opened.append(role) or real(role)  # type: ignore[method-assign]
    ctx = StageContext(job=JobConfig.from_cfg(cfg_for()), run=RunDir(tmp_path / "run"),
                       stage=STAGE, backends=backends)  # type: ignore[arg-type]
    assert ctx.generate(iter(())) == [] and opened == [] and ctx.batches == 0  # no LLM opened
    out = ctx.generate((req(i) for i in range(5)), backend=DedupBackend(http(fake_chat_server)),
                       total=5)
    assert [r.data for r in out] == [{"n": i} for i in range(5)]
    listed = ctx.generate(req(i) for i in range(5, 7))  # the scripted LLM does not stream
    assert [r.request_id for r in listed] == ["r5", "r6"] and opened == ["llm"]
    logged = [f["request_id"].to_list() for f in ctx.request_frames]
    assert logged == [[f"r{i}" for i in range(5)], ["r5", "r6"]] and ctx.batches == 2
