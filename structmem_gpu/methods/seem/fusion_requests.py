"""Fusion requests and replies: per-frame pairs and windowed groups (docs/methods.md
"SEEM: fusion").

Three request kinds, all stage "fusion":

- `judge_fuse` (default): one request per (new frame, most similar earlier frame), reply
  `{same_event, summary|null, events|null}`;
- `judge` then `merge` (`seem.fusion.strict_two_call`): a yes/no request, then a merge
  request for the positives only;
- `window` (`seem.fusion.window` > 1): w new frames + their earlier candidates in one request,
  reply `{groups: [{new: [..], earlier: k|null, summary, events}]}`.

Replies are validated by the client against the schema; what still comes back wrong (a
parse failure) counts as "different" and the new frame stands on its own, so a failure never
loses a passage. A positive without usable merged content keeps the earlier summary and
concatenates the events (`fallback_merge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from structmem_gpu.llm.types import LLMRequest, LLMResult, Sampling, request_id
from structmem_gpu.methods.seem.model import FrameContent, content_from_reply, render_frame
from structmem_gpu.methods.seem.settings import FrameSettings, FusionSettings
from structmem_gpu.methods.seem.store import ConversationStore
from structmem_gpu.methods.seem.prompts import (
    fuse_window as seem_fuse_window,
    judge as seem_judge,
    judge_fuse as seem_judge_fuse,
    merge as seem_merge,
)
from structmem_gpu.methods.seem.prompts.judge_fuse import FrameView, evidence_line

STAGE_NAME = "fusion"


@dataclass(frozen=True)
class PairJob:
    store: ConversationStore
    position: int  # the new passage
    target: int  # index of the most similar earlier frame
    similarity: float


@dataclass(frozen=True)
class WindowJob:
    store: ConversationStore
    positions: tuple[int, ...]  # the new passages of this window, chronological
    candidates: tuple[int, ...]  # earlier frame indices shown as M1..Mk
    similarities: tuple[float, ...]  # best cosine of a new frame to each candidate


@dataclass(frozen=True)
class Group:
    members: tuple[int, ...]  # 0-based indices into WindowJob.positions
    earlier: int | None  # 0-based index into WindowJob.candidates
    content: FrameContent | None


def _view(store: ConversationStore, content: FrameContent, positions: Sequence[int], chars: int) -> FrameView:
    lines = []
    for pos in positions:
        p = store.passages[pos]
        when = f"{p.session_time:%Y-%m-%d %H:%M}" if p.session_time else "?"
        lines.append(evidence_line(p.speaker, when, p.display, chars))
    return FrameView(render_frame(content.summary, content.events), tuple(lines))


def frame_view(store: ConversationStore, index: int, chars: int) -> FrameView:
    f = store.frames[index]
    return _view(store, f.content, f.provenance, chars)


def new_view(store: ConversationStore, position: int, chars: int) -> FrameView:
    return _view(store, store.initial[position], (position,), chars)


def _request(conv_id: str, kind: str, version: str, messages: Any, schema: dict[str, Any],
             s: FusionSettings) -> LLMRequest:
    sampling = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)
    rid = request_id(STAGE_NAME, conv_id, kind, version, messages[-1].content, schema, asdict(sampling))
    return LLMRequest(request_id=rid, stage=STAGE_NAME, conv_id=conv_id, messages=messages, prompt_version=version,
                      schema=schema, sampling=sampling)


def pair_request(job: PairJob, kind: str, s: FusionSettings, f: FrameSettings) -> LLMRequest:
    """kind: "judge_fuse" | "judge" | "merge"."""
    earlier = frame_view(job.store, job.target, s.evidence_chars)
    new = new_view(job.store, job.position, s.evidence_chars)
    if kind == "judge_fuse":
        return _request(job.store.conv_id, kind, seem_judge_fuse.VERSION, seem_judge_fuse.build_messages(earlier, new),
                        seem_judge_fuse.reply_schema(f.bounds, s.max_events), s)
    if kind == "judge":
        return _request(job.store.conv_id, kind, seem_judge.VERSION, seem_judge.build_messages(earlier, new),
                        seem_judge.SCHEMA, s)
    if kind == "merge":
        return _request(job.store.conv_id, kind, seem_merge.VERSION, seem_merge.build_messages(earlier, new),
                        seem_merge.reply_schema(f.bounds, s.max_events), s)
    raise ValueError(f"unknown fusion request kind {kind!r}")


def window_request(job: WindowJob, s: FusionSettings, f: FrameSettings) -> LLMRequest:
    earlier = [frame_view(job.store, j, s.evidence_chars) for j in job.candidates]
    new = [new_view(job.store, p, s.evidence_chars) for p in job.positions]
    schema = seem_fuse_window.reply_schema(len(new), len(earlier), f.bounds, s.max_events)
    return _request(job.store.conv_id, "window", seem_fuse_window.VERSION,
                    seem_fuse_window.build_messages(earlier, new), schema, s)


def judged_same(result: LLMResult) -> bool | None:
    """The reply's same_event flag; None when the reply is unusable (counted as different)."""
    if not result.parse_ok or not isinstance(result.data, dict):
        return None
    flag = result.data.get("same_event")
    return flag if isinstance(flag, bool) else None


def fused_content(result: LLMResult | None, f: FrameSettings, s: FusionSettings) -> FrameContent | None:
    if result is None or not result.parse_ok:
        return None
    return content_from_reply(result.data, f.max_actions, s.max_events)


def fallback_merge(base: FrameContent, others: Sequence[FrameContent], max_events: int) -> FrameContent:
    """Earlier summary, events of all frames in order without duplicates, capped."""
    events = list(dict.fromkeys([*base.events, *(e for o in others for e in o.events)]))
    return FrameContent(base.summary, tuple(events[:max_events]))


def parse_groups(result: LLMResult, job: WindowJob, f: FrameSettings, s: FusionSettings) -> list[Group]:
    """Valid groups in reply order: known members not used by an earlier group, one earlier
    frame per group at most and each earlier frame in one group at most."""
    if not result.parse_ok or not isinstance(result.data, dict):
        return []
    taken: set[int] = set()
    used_earlier: set[int] = set()
    out = []
    for g in result.data.get("groups") or []:
        if not isinstance(g, dict):
            continue
        members = sorted({m - 1 for m in g.get("new") or [] if isinstance(m, int) and not isinstance(m, bool)
                          and 1 <= m <= len(job.positions)} - taken)
        if not members:
            continue
        e = g.get("earlier")
        earlier = e - 1 if isinstance(e, int) and not isinstance(e, bool) and 1 <= e <= len(job.candidates) else None
        if earlier in used_earlier:
            earlier = None
        taken.update(members)
        if earlier is not None:
            used_earlier.add(earlier)
        out.append(Group(tuple(members), earlier, content_from_reply(g, f.max_actions, s.max_events)))
    return out
