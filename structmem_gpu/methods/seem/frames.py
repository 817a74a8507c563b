"""Stage `frames`: F_ext, one Episodic Event Frame (EEF_0) per passage
(docs/methods.md "SEEM: frames").

    python jobs/run.py method=seem stages=[load,frames]

Passages (one per turn) are grouped by `request_groups` (`seem.passages_per_request`, default
1 = the spec) and every request of every conversation goes out in ONE `ctx.generate` batch.
A reply that still fails after the client's repair attempt gets the spec's fallback: summary =
the first `seem.frames.fallback_chars` characters of the text, no events. Writes
`passages` and `frames_extracted`; one frames_extracted row:

    {"pid": "sample-1:D1:3", "conv_id": "sample-1",
     "summary": "Lena is running her first half marathon and bought blue running shoes.",
     "events": [{"participants": ["Lena"], "action": ["Lena bought new running shoes"], "time": null,
                 "location": null, "reason": "to finish in under two hours", "method": null}],
     "request_id": "frames:5b1e…", "prompt_version": "seem_frame/1", "parse_ok": true, "fallback": false}

ctx.notes: passages, requests, passages_per_request, parse_failures, fallbacks, truncated,
events_mean.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import polars as pl

from structmem_gpu.core import schemas as core_schemas
from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.seem.model import FrameContent, content_from_reply
from structmem_gpu.methods.seem.passages import (
    Passage,
    passage_list,
    passages_from_turns,
    request_groups,
)
from structmem_gpu.methods.seem.schemas import FRAMES_EXTRACTED
from structmem_gpu.methods.seem.settings import FrameSettings
from structmem_gpu.methods.seem.prompts import frame as seem_frame
from structmem_gpu.llm.tokens import CHARS_PER_TOKEN
from structmem_gpu.stage import LLM_IDENTITY, EstimateInputs, Stage, StageContext, StageEstimate

log = logging.getLogger(__name__)

STAGE_NAME = "frames"


def build_request(group: Sequence[Passage], s: FrameSettings) -> LLMRequest:
    messages = seem_frame.build_messages(group[0].session_time, [p.prompt_tuple for p in group])
    schema = seem_frame.reply_schema(len(group), s.bounds)
    sampling = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)
    rid = request_id(STAGE_NAME, group[0].conv_id, [p.pid for p in group], seem_frame.VERSION,
                     messages[-1].content, schema, asdict(sampling))
    return LLMRequest(request_id=rid, stage=STAGE_NAME, conv_id=group[0].conv_id, messages=messages,
                      prompt_version=seem_frame.VERSION, schema=schema, sampling=sampling)


def reply_items(result: LLMResult, n: int) -> list[Any]:
    """The reply's frame object(s), one per passage of the request (None where missing)."""
    if not result.parse_ok or not isinstance(result.data, dict):
        return [None] * n
    if n == 1:
        return [result.data]
    frames = result.data.get("frames")
    frames = frames if isinstance(frames, list) else []
    return [frames[i] if i < len(frames) else None for i in range(n)]


def fallback(p: Passage, s: FrameSettings) -> FrameContent:
    """A failed extraction's frame: the text's first characters, no events (docs/methods.md
    "SEEM: frames")."""
    return FrameContent((p.display or p.speaker)[: s.fallback_chars], ())


def frame_rows(group: Sequence[Passage], req: LLMRequest, res: LLMResult, s: FrameSettings) -> list[dict[str, Any]]:
    rows = []
    for p, item in zip(group, reply_items(res, len(group)), strict=True):
        content = content_from_reply(item, s.max_actions, s.bounds.max_events)
        used_fallback = content is None
        content = content or fallback(p, s)
        rows.append({"pid": p.pid, "conv_id": p.conv_id, "summary": content.summary,
                     "events": [e.as_dict() for e in content.events], "request_id": req.request_id,
                     "prompt_version": req.prompt_version, "parse_ok": bool(res.parse_ok), "fallback": used_fallback})
    return rows


def run_frames(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: FrameSettings = ctx.settings
    per_request = s.passages_per_request
    passages_df = passages_from_turns(ctx.read("turns"))
    groups = request_groups(passage_list(passages_df), per_request)
    requests = [build_request(g, s) for g in groups]
    results = ctx.generate(requests, desc="seem frames")  # one batch, all conversations
    rows = [r for g, q, res in zip(groups, requests, results, strict=True) for r in frame_rows(g, q, res, s)]
    frames = core_schemas.frame(rows, FRAMES_EXTRACTED)
    ctx.notes.update(
        passages=passages_df.height, requests=len(requests), passages_per_request=per_request,
        parse_failures=sum(not r.parse_ok for r in results), fallbacks=int(frames["fallback"].sum()),
        truncated=sum(r.finish_reason == "length" for r in results),
        events_mean=round(float(frames["events"].list.len().cast(pl.Float64).mean() or 0.0), 2))  # type: ignore[arg-type]
    if ctx.notes["fallbacks"]:
        log.warning("frames: %d of %d passages got the fallback frame (see requests.parquet)",
                    ctx.notes["fallbacks"], passages_df.height)
    log.info("frames: %s", ctx.notes)
    return {"passages": passages_df, "frames_extracted": frames}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

FRAME_EVENT_TOKENS = 40  # one event's slots in JSON (participants, action, time, place...)


def estimate_frames(inp: EstimateInputs) -> StageEstimate:
    """Exact: the stage's own passage groups and request builder on the loaded turns.
    Completion per passage: its summary (the text up to summary_chars) and one event."""
    s = inp.job.settings(FrameSettings)
    groups = request_groups(passage_list(passages_from_turns(inp.turns)), s.passages_per_request)
    prompt = completion = over = 0
    for g in groups:
        req = build_request(g, s)
        prompt += inp.counter.messages(req.messages)
        over += inp.over(req.messages, s.max_tokens)
        reply = sum(min(len(p.display), s.summary_chars) // CHARS_PER_TOKEN + FRAME_EVENT_TOKENS for p in g)
        completion += min(s.max_tokens, reply)
    from structmem_gpu.methods.seem.fusion import stand_in_frames  # fusion imports this module

    inp.stand_ins["frames_extracted"] = stand_in_frames(inp.turns, s)
    return StageEstimate(STAGE_NAME, len(groups), prompt, completion,
                         f"{sum(map(len, groups))} passages in groups of <= {s.passages_per_request} (exact prompts)",
                         over if inp.checked else None, build=True)


STAGE = Stage(
    name=STAGE_NAME, run=run_frames, reads=("turns",), writes=("passages", "frames_extracted"),
    settings=FrameSettings, depends=LLM_IDENTITY,
    uses=("llm",), estimate=estimate_frames,
)
