"""SEEM fusion: the wavefront equals sequential fusion, provenance is a capped union, batch counts.

Synthetic conversations (no files), the scripted LLM (replies derived from the request text
only, so any schedule that sends the same requests gets the same replies) and a hashed
bag-of-words encoder.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from structmem_gpu.embed.encoder import Encoder
from structmem_gpu.llm.scripted import Responder, ScriptedLLM
from structmem_gpu.llm.types import LLMRequest
from structmem_gpu.methods.seem.fusion import Wavefront, frame_tables
from structmem_gpu.methods.seem.model import Event, FrameContent, render_frame
from structmem_gpu.methods.seem.passages import Passage
from structmem_gpu.methods.seem.settings import FrameSettings, FusionSettings
from structmem_gpu.methods.seem.store import ConversationStore
from tests.unit.test_embed_encoder import CountingModel

TOPICS = ["marathon training plan", "rescue dog adoption", "pottery class", "new job interview"]
BASE_CFG: dict[str, dict[str, Any]] = {
    "frames": {"max_tokens": 256, "temperature": 0.0, "max_events": 3, "max_participants": 2,
               "max_actions_schema": 3, "max_actions": 2, "max_chars": 60, "summary_chars": 200,
               "fallback_chars": 50},
    "fusion": {"window": 1, "strict_two_call": False, "skip_judge_below": None, "max_provenance": 100,
               "max_events": 4, "evidence_chars": 80, "max_tokens": 256, "temperature": 0.0},
}


def settings(**fusion: Any) -> tuple[FusionSettings, FrameSettings]:
    cfg = OmegaConf.create({"seem": {"frames": BASE_CFG["frames"], "fusion": {**BASE_CFG["fusion"], **fusion}}})
    return FusionSettings.from_cfg(cfg), FrameSettings.from_cfg(cfg)


def conversation(conv_id: str, n: int) -> tuple[list[Passage], list[FrameContent]]:
    t0 = datetime(2024, 3, 3, 14, 15)
    passages, contents = [], []
    for i in range(n):
        topic = TOPICS[(i // 2 + len(conv_id)) % len(TOPICS)]  # pairs of turns on one topic
        who = "Lena" if i % 2 == 0 else "Tomas"
        text = f"{who} talks about the {topic} (turn {i})"
        passages.append(Passage(f"{conv_id}:D1:{i + 1}", conv_id, i, 1, i, t0 + timedelta(days=i), who, text, None))
        contents.append(FrameContent(f"{who} discussed the {topic}.", (Event((who,), (f"{who} discussed {topic}",),
                                                                               None, None, None, None),)))
    return passages, contents


def stores(lengths: dict[str, int], encoder: Encoder) -> list[ConversationStore]:
    out = []
    for conv_id, n in lengths.items():
        ps, cs = conversation(conv_id, n)
        vecs = encoder.encode([render_frame(c.summary, c.events) for c in cs])
        out.append(ConversationStore.create(conv_id, ps, cs, vecs))
    return out


def run(lengths: dict[str, int], responders: dict[str, Responder] | None = None, **fusion: Any
        ) -> tuple[list[ConversationStore], Wavefront, ScriptedLLM]:
    s, f = settings(**fusion)
    enc = Encoder(CountingModel(), "fake-bow")
    llm = ScriptedLLM(responders)
    st = stores(lengths, enc)
    wave = Wavefront(st, s, f, lambda reqs, desc: llm.generate(reqs, desc=desc), enc.encode)
    wave.run()
    return st, wave, llm


def snapshot(st: ConversationStore) -> list[tuple[object, ...]]:
    return [(f.frame_id, f.content, f.provenance, f.n_merges, tuple(json.dumps(h, sort_keys=True) for h in f.history))
            for f in st.frames]


LENGTHS = {"a": 7, "b": 4, "c": 9}
VARIANTS: list[dict[str, Any]] = [{}, {"strict_two_call": True}, {"window": 3}, {"max_provenance": 2},
                                     {"skip_judge_below": 0.5}]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_wavefront_equals_sequential_order(variant: dict[str, Any]) -> None:
    together, _, _ = run(LENGTHS, **variant)
    for conv_id, n in LENGTHS.items():
        [alone], _, _ = run({conv_id: n}, **variant)
        mine = next(s for s in together if s.conv_id == conv_id)
        assert snapshot(mine) == snapshot(alone)
        assert mine.frame_of == alone.frame_of
    assert any(f.n_merges for st in together for f in st.frames)  # the scripted judge merged something


def _always_same(req: LLMRequest) -> str:
    if req.prompt_version.startswith("seem_judge_fuse"):
        return json.dumps({"same_event": True, "summary": "merged", "events": None})
    return json.dumps({"same_event": True})


def test_provenance_is_a_chronological_union_under_the_cap() -> None:
    stores_, wave, _ = run({"a": 12}, {"fusion": _always_same}, max_provenance=3)
    [st] = stores_
    covered = [p for f in st.frames for p in f.provenance]
    assert sorted(covered) == list(range(12))  # every passage in exactly one frame
    for f in st.frames:
        assert len(f.provenance) <= 3 and list(f.provenance) == sorted(f.provenance)
        assert len(f.provenance) == 1 + sum(len(h["pids"]) for h in f.history) == 1 + f.n_merges
        assert f.frame_id == f"frame:{st.passages[f.provenance[0]].pid}"  # founded by its first passage
        merged_in = [pid for h in f.history for pid in h["pids"]]  # each merge adds exactly its new passage
        assert sorted([f.frame_id.removeprefix("frame:"), *merged_in]) == sorted(st.pids(f))
    assert wave.stats.cap_skips > 0 and any(len(f.provenance) == 3 for f in st.frames)
    assert any(f.content.summary == "merged" for f in st.frames)


def test_fused_frames_table_keeps_history_and_phi() -> None:
    stores_, _, _ = run({"a": 6, "b": 3}, {"fusion": _always_same}, max_provenance=4)
    frames, frame_of = frame_tables(stores_)
    assert frame_of.height == 9 and frame_of["pid"].n_unique() == 9
    prov = {pid: fid for fid, ps in zip(frames["frame_id"], frames["provenance"], strict=True) for pid in ps}
    assert prov == dict(zip(frame_of["pid"], frame_of["frame_id"], strict=True))
    assert (frames["history"].list.len() == frames["n_merges"]).all()
    assert (frames["time_start"] <= frames["time_end"]).all()


def test_positive_without_merged_content_keeps_earlier_summary_and_all_events() -> None:
    def same_without_content(req: LLMRequest) -> str:
        return json.dumps({"same_event": True, "summary": None, "events": None})

    [st], _, _ = run({"a": 2}, {"fusion": same_without_content})
    [frame] = st.frames
    assert frame.content.summary == st.initial[0].summary
    assert frame.content.events == st.initial[0].events + st.initial[1].events


def test_unusable_judge_reply_counts_as_different() -> None:
    [st], wave, _ = run({"a": 4}, {"fusion": lambda req: "not json"})
    assert len(st.frames) == 4 and wave.stats.parse_failures == 3


@pytest.mark.parametrize("variant,sub", [({}, 1), ({"strict_two_call": True}, 2)])
def test_batches_equal_longest_conversation_times_sub_batches(variant: dict[str, Any], sub: int) -> None:
    _, wave, _ = run(LENGTHS, {"fusion": _always_same}, **variant)
    longest = max(LENGTHS.values())
    # Frame 1 of every conversation has nothing to compare with: longest - 1 steps send requests.
    assert wave.stats.steps == longest and wave.stats.steps_with_requests == longest - 1
    assert wave.stats.batches == sub * (longest - 1)
    assert wave.stats.requests == sub * sum(n - 1 for n in LENGTHS.values())


def test_windowed_batches_and_groups() -> None:
    def groups(req: LLMRequest) -> str:
        assert req.schema is not None
        n_new = req.schema["properties"]["groups"]["maxItems"]
        earlier = req.schema["properties"]["groups"]["items"]["properties"]["earlier"]
        target = 1 if "anyOf" in earlier else None
        return json.dumps({"groups": [{"new": list(range(1, n_new + 1)), "earlier": target, "summary": "grouped",
                                       "events": []}]})

    stores_, wave, _ = run(LENGTHS, {"fusion": groups}, window=3, max_provenance=5)
    assert wave.stats.steps == wave.stats.batches == math.ceil(max(LENGTHS.values()) / 3)
    for st in stores_:
        covered = sorted(p for f in st.frames for p in f.provenance)
        assert covered == list(range(len(st)))
        assert all(len(f.provenance) <= 5 for f in st.frames)
        assert st.frames[0].provenance[:3] == (0, 1, 2)  # the first window founded one frame


def test_re_embedding_happens_once_per_step() -> None:
    calls: list[int] = []
    s, f = settings()
    enc = Encoder(CountingModel(), "fake-bow")
    st = stores({"a": 5, "b": 5}, enc)
    llm = ScriptedLLM({"fusion": _always_same})

    def encode(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        return enc.encode(texts)

    Wavefront(st, s, f, lambda reqs, desc: llm.generate(reqs), encode).run()
    assert calls == [2, 2, 2, 2]  # one call per step with requests, both conversations' fused frames



def test_each_wave_is_labelled_and_one_outer_bar_counts_them(capsys: pytest.CaptureFixture[str]) -> None:
    s, f = settings()
    enc = Encoder(CountingModel(), "fake-bow")
    llm = ScriptedLLM(None)
    descs: list[str] = []

    def call(reqs, desc):  # type: ignore[no-untyped-def]
        descs.append(desc)
        return llm.generate(reqs, desc=desc)

    wave = Wavefront(stores(LENGTHS, enc), s, f, call, enc.encode)
    stats = wave.run()
    assert stats.steps == max(LENGTHS.values())
    assert descs and all(d.startswith("seem fusion") and " wave " in d for d in descs)
    steps = [int(d.rsplit(" ", 1)[1].split("/")[0]) for d in descs]
    assert steps == sorted(steps) and all(d.endswith(f"/{stats.steps}") for d in descs)
    err = capsys.readouterr().err
    assert f"{stats.steps}/{stats.steps}" in err and "wave" in err  # the outer bar, finished
