"""Stage `fusion`: associative fusion of the EEF_0 frames as a wavefront
(docs/methods.md "SEEM: fusion", "SEEM: schedule").

    python jobs/run.py method=seem stages=[fusion] seem.fusion.window=1

Fusion is sequential inside a conversation, so all conversations advance together: step t
handles frame t of every conversation (`window` = 1) or frames [t*w, (t+1)*w) (windowed),
with ONE LLM batch per step, or two with `strict_two_call` (judge batch, then a merge batch
for the positives). Hence, recorded in ctx.notes and in the manifest's build_cost.batches:

    batches = steps_with_requests x sub_batches_per_step  <=  ceil(longest / window) x sub_batches
    (sub_batches_per_step = 2 with strict_two_call when a step has a positive, else 1)

In the per-frame variant the first step never sends anything (frame 1 has no earlier frame),
so a conversation of n passages gives n - 1 steps with requests. Fused frames are re-embedded
in one encoder call per step. The result equals running the conversations one after the
other (tests/unit/test_seem_fusion.py). Writes `frames` (schemas.FRAMES, with provenance
and fusion history) and `frame_of` (Phi: every passage -> its one frame).

ctx.notes: conversations, passages, frames, longest_conversation, window, strict_two_call,
sub_batches_per_step, steps, steps_with_requests, batches, requests, judged, positives,
merged_passages, parse_failures, cap_skips, floor_skips, frame_sizes.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from structmem_gpu.core import schemas as core_schemas
from structmem_gpu.llm.types import LLMRequest, LLMResult
from structmem_gpu.methods.seem.fusion_requests import (
    PairJob,
    WindowJob,
    fallback_merge,
    fused_content,
    judged_same,
    pair_request,
    parse_groups,
    window_request,
)
from structmem_gpu.methods.seem.model import Event, FrameContent, events_from_rows, render_frame
from structmem_gpu.methods.seem.passages import Passage, by_conversation, passage_list, passages_from_turns
from structmem_gpu.methods.seem.schemas import FRAME_OF, FRAMES
from structmem_gpu.methods.seem.settings import FrameSettings, FusionSettings
from structmem_gpu.methods.seem.store import ConversationStore
from structmem_gpu.stage import (
    EMBEDDER_IDENTITY,
    LLM_IDENTITY,
    EstimateInputs,
    Stage,
    StageContext,
    StageEstimate,
)

log = logging.getLogger(__name__)

LLMCall = Callable[[list[LLMRequest], str], list[LLMResult]]
Encode = Callable[[list[str]], np.ndarray]


@dataclass
class FusionStats:
    steps: int = 0
    steps_with_requests: int = 0
    batches: int = 0
    requests: int = 0
    judged: int = 0  # pair jobs / windows sent
    positives: int = 0  # merges applied (pairs judged same; groups joined or founded)
    parse_failures: int = 0
    cap_skips: int = 0
    floor_skips: int = 0


class Wavefront:
    """Advances every conversation's store one frame (or one window) per step."""

    def __init__(self, stores: Sequence[ConversationStore], s: FusionSettings, f: FrameSettings,
                 llm: LLMCall, encode: Encode) -> None:
        self.stores, self.s, self.f, self.llm, self.encode = list(stores), s, f, llm, encode
        self.stats = FusionStats()
        self._wave = ""  # "wave t/N" of the step being sent, shown in its request bar

    def run(self) -> FusionStats:
        w = self.s.window
        self.stats.steps = max((math.ceil(len(st) / w) for st in self.stores), default=0)
        # One outer bar over the waves (hundreds on LoCoMo); each wave's request bar sits
        # under it and is cleared when the wave is done.
        waves = tqdm(range(self.stats.steps), desc="seem fusion", unit="wave", mininterval=1.0,
                     dynamic_ncols=True)
        for step in waves:
            self._wave = f"wave {step + 1}/{self.stats.steps}"
            before = self.stats.batches
            if w == 1:
                self._pair_step(step)
            else:
                self._window_step(step)
            self.stats.steps_with_requests += self.stats.batches > before
        waves.close()
        return self.stats

    def _call(self, requests: list[LLMRequest], desc: str) -> list[LLMResult]:
        if not requests:
            return []
        self.stats.batches += 1
        self.stats.requests += len(requests)
        return self.llm(requests, f"{desc} {self._wave}")

    def _reembed(self, touched: Sequence[tuple[ConversationStore, int]]) -> None:
        """New vectors for the frames fused in this step: one encoder call for all conversations."""
        unique = list({(id(st), i): (st, i) for st, i in touched}.values())
        if not unique:
            return
        vecs = self.encode([st.frames[i].rendering for st, i in unique])
        for (st, i), v in zip(unique, vecs, strict=True):
            st.set_vector(i, v)

    def _candidate(self, st: ConversationStore, position: int) -> tuple[int, float] | None:
        """The earlier frame to judge against, or None (no frames, at the cap, below the floor)."""
        hit = st.top1(st.initial_vectors[position])
        if hit is None:
            return None
        if st.room(hit[0], self.s.max_provenance) < 1:
            self.stats.cap_skips += 1
            return None
        if self.s.skip_judge_below is not None and hit[1] < self.s.skip_judge_below:
            self.stats.floor_skips += 1
            return None
        return hit

    # ---- per-frame (the paper) ----------------------------------------------------------
    def _pair_step(self, t: int) -> None:
        jobs = []
        for st in self.stores:
            if t >= len(st):
                continue
            hit = self._candidate(st, t)
            if hit is None:
                st.insert(t)
            else:
                jobs.append(PairJob(st, t, hit[0], hit[1]))
        if self.s.strict_two_call:
            judged = self._call([pair_request(j, "judge", self.s, self.f) for j in jobs], "seem fusion judge")
            flags = [judged_same(r) for r in judged]
            positive = [j for j, flag in zip(jobs, flags, strict=True) if flag]
            merged = self._call([pair_request(j, "merge", self.s, self.f) for j in positive], "seem fusion merge")
            by_job = {id(j): r for j, r in zip(positive, merged, strict=True)}
            replies = [(flag, by_job.get(id(j))) for j, flag in zip(jobs, flags, strict=True)]
            kind = "two_call"
        else:
            results = self._call([pair_request(j, "judge_fuse", self.s, self.f) for j in jobs], "seem fusion")
            replies = [(judged_same(r), r) for r in results]
            kind = "judge_fuse"
        self.stats.judged += len(jobs)
        touched = [self._apply_pair(job, flag, res, t, kind) for job, (flag, res) in zip(jobs, replies, strict=True)]
        self._reembed([x for x in touched if x is not None])

    def _apply_pair(self, job: PairJob, flag: bool | None, res: LLMResult | None, step: int,
                    kind: str) -> tuple[ConversationStore, int] | None:
        st = job.store
        if flag is None:
            self.stats.parse_failures += 1
        if not flag:
            st.insert(job.position)
            return None
        content = fused_content(res, self.f, self.s) or fallback_merge(
            st.frames[job.target].content, [st.initial[job.position]], self.s.max_events)
        history = {"step": step, "pids": [st.passages[job.position].pid],
                   "request_id": res.request_id if res is not None else None,
                   "similarity": job.similarity, "kind": kind}
        st.merge(job.target, [job.position], content, history)
        self.stats.positives += 1
        return st, job.target

    # ---- windowed (author's Strategy C) ---------------------------------------------------
    def _window_step(self, k: int) -> None:
        w, jobs = self.s.window, []
        for st in self.stores:
            positions = tuple(range(k * w, min((k + 1) * w, len(st))))
            if not positions:
                continue
            cands: dict[int, float] = {}
            for p in positions:
                hit = self._candidate(st, p)
                if hit is not None:
                    cands[hit[0]] = max(cands.get(hit[0], -math.inf), hit[1])
            if len(positions) == 1 and not cands:
                st.insert(positions[0])
                continue
            jobs.append(WindowJob(st, positions, tuple(cands), tuple(cands.values())))
        results = self._call([window_request(j, self.s, self.f) for j in jobs], "seem fusion window")
        self.stats.judged += len(jobs)
        touched: list[tuple[ConversationStore, int]] = []
        for job, res in zip(jobs, results, strict=True):
            touched.extend(self._apply_window(job, res, k))
        self._reembed(touched)

    def _apply_window(self, job: WindowJob, res: LLMResult, step: int) -> list[tuple[ConversationStore, int]]:
        st, cap = job.store, self.s.max_provenance
        if not res.parse_ok:
            self.stats.parse_failures += 1
        assigned: set[int] = set()
        founders: list[tuple[int, list[int], FrameContent | None]] = []
        touched: list[tuple[ConversationStore, int]] = []
        for g in parse_groups(res, job, self.f, self.s):
            members = [job.positions[m] for m in g.members]
            history = {"step": step, "request_id": res.request_id, "kind": "window",
                       "similarity": None if g.earlier is None else job.similarities[g.earlier]}
            if g.earlier is not None:
                target = job.candidates[g.earlier]
                take = members[: st.room(target, cap)]  # overflow members stand on their own
                if take:
                    merged = g.content or fallback_merge(st.frames[target].content,
                                                         [st.initial[p] for p in take], self.s.max_events)
                    st.merge(target, take, merged, {**history, "pids": [st.passages[p].pid for p in take]})
                    assigned.update(take)
                    touched.append((st, target))
                    self.stats.positives += 1
            elif len(members) >= 2:
                take = members[:cap]
                founded = g.content or fallback_merge(st.initial[take[0]], [st.initial[p] for p in take[1:]],
                                                      self.s.max_events)
                founders.append((take[0], take, founded))
                assigned.update(take)
                self.stats.positives += 1
        founders.extend((p, [p], None) for p in job.positions if p not in assigned)
        for first, take, content in sorted(founders, key=lambda x: x[0]):  # chronological insertion
            if content is None:
                st.insert(first)
                continue
            history = {"step": step, "pids": [st.passages[p].pid for p in take[1:]], "request_id": res.request_id,
                       "similarity": None, "kind": "window"}
            touched.append((st, st.found_group(take, content, history)))
        return touched


# ---- tables ---------------------------------------------------------------------------------


def build_stores(passages: pl.DataFrame, eef: pl.DataFrame, encode: Encode) -> list[ConversationStore]:
    """One store per conversation; all EEF_0 renderings embedded in one encoder call."""
    content = {pid: FrameContent(summary, events_from_rows(events))
               for pid, summary, events in eef.select("pid", "summary", "events").iter_rows()}
    convs = by_conversation(passage_list(passages))
    missing = [p.pid for ps in convs.values() for p in ps if p.pid not in content]
    if missing:
        raise RuntimeError(f"frames_extracted has no frame for {len(missing)} passages (e.g. {missing[:3]}); "
                           "rerun stage frames (force=true)")
    ordered = [p for ps in convs.values() for p in ps]
    vecs = encode([render_frame(content[p.pid].summary, content[p.pid].events) for p in ordered])
    stores, start = [], 0
    for conv_id, ps in convs.items():
        stores.append(ConversationStore.create(conv_id, ps, [content[p.pid] for p in ps], vecs[start : start + len(ps)]))
        start += len(ps)
    return stores


def frame_tables(stores: Sequence[ConversationStore]) -> tuple[pl.DataFrame, pl.DataFrame]:
    frames: list[dict[str, Any]] = []
    frame_of: list[dict[str, Any]] = []
    for st in stores:
        for f in st.frames:
            pids = st.pids(f)
            times = [t for p in f.provenance if (t := st.passages[p].session_time) is not None]
            frames.append({"frame_id": f.frame_id, "conv_id": st.conv_id, "summary": f.content.summary,
                           "events": [e.as_dict() for e in f.content.events],
                           "provenance": pids, "time_start": min(times, default=None),
                           "time_end": max(times, default=None), "n_merges": f.n_merges,
                           "history": [dict(h) for h in f.history]})
            frame_of.extend({"pid": pid, "conv_id": st.conv_id, "frame_id": f.frame_id} for pid in pids)
    return core_schemas.frame(frames, FRAMES), core_schemas.frame(frame_of, FRAME_OF)


def fusion_notes(stores: Sequence[ConversationStore], stats: FusionStats, s: FusionSettings) -> dict[str, Any]:
    sizes = Counter(len(f.provenance) for st in stores for f in st.frames)
    return {
        "conversations": len(stores), "passages": sum(len(st) for st in stores),
        "frames": sum(len(st.frames) for st in stores), "longest_conversation": max((len(st) for st in stores), default=0),
        "window": s.window, "strict_two_call": s.strict_two_call,
        "sub_batches_per_step": 2 if s.strict_two_call else 1,
        "merged_passages": sum(len(f.provenance) - 1 for st in stores for f in st.frames),
        "frame_sizes": {str(k): v for k, v in sorted(sizes.items())}, **asdict(stats),
    }


def run_fusion(ctx: StageContext) -> dict[str, pl.DataFrame]:
    s: FusionSettings = ctx.settings
    f = s.frames
    stores = build_stores(ctx.read("passages"), ctx.read("frames_extracted"), ctx.encode)
    wave = Wavefront(stores, s, f, lambda reqs, desc: ctx.generate(reqs, desc=desc), ctx.encode)
    stats = wave.run()
    frames, frame_of = frame_tables(stores)
    ctx.notes.update(fusion_notes(stores, stats, s))
    if stats.parse_failures:
        log.warning("fusion: %d unusable replies counted as 'different' (see requests.parquet)", stats.parse_failures)
    log.info("fusion: %s", ctx.notes)
    return {"frames": frames, "frame_of": frame_of}


# ---- dry run (Stage.estimate) ------------------------------------------------------------

FUSION_COMPLETION = 80  # a verdict, and for "same" a fused frame of max_events short events


def filled(text: str, chars: int) -> str:
    """`chars` characters of `text`, repeated as needed: stand-in prose of a given length."""
    text = text.strip() or "x"
    return ((text + " ") * (chars // (len(text) + 1) + 1))[:chars]


# A frame role is a short phrase: 8 to 33 characters, 18 on average, in the frames SmolLM2
# wrote on the sample (debug=ci, 2026-12-02, every role of 67 frames); the schema's
# max_chars only caps it (200 in the default profile, which no role comes near).
ROLE_CHARS = 18


def stand_in_frame(p: Passage, f: FrameSettings) -> FrameContent:
    """A frame as a reply is expected to hold it: the summary restating the passage (its text
    up to summary_chars, as the frames estimate's completion assumes) and one event whose
    participant is the speaker and whose action and roles are short phrases (ROLE_CHARS, at
    most max_chars) written with the passage's words. The schema's limits (max_events events
    with every role at max_chars) would make a bound a 1-3 sentence frame never comes near:
    twice SmolLM2's frames on the sample."""
    text = p.display
    role = filled(text, min(ROLE_CHARS, f.max_chars))
    event = Event((p.speaker[: f.max_chars],)[: f.max_participants], (role,), role, role, role, role)
    return FrameContent(filled(text, min(len(text.strip()) or 1, f.summary_chars)),
                        (event,)[: f.max_events])


def stand_in_frames(turns: pl.DataFrame, f: FrameSettings) -> pl.DataFrame:
    """One stand-in frame per passage (`stand_in_frame`), unmerged: frame_id (= pid),
    conv_id, rendering, provenance, time_start. What the frames hook leaves as
    frames_extracted and the fusion hook as frames (its estimate merges nothing)."""
    rows = [{"frame_id": p.pid, "conv_id": p.conv_id, "provenance": [p.pid], "time_start": p.session_time,
             "rendering": render_frame(c.summary, c.events)}
            for p in passage_list(passages_from_turns(turns)) for c in [stand_in_frame(p, f)]]
    return pl.DataFrame(rows, schema={"frame_id": pl.String, "conv_id": pl.String,
                                      "provenance": pl.List(pl.String), "time_start": pl.Datetime("us"),
                                      "rendering": pl.String})


def estimate_fusion(inp: EstimateInputs) -> StageEstimate:
    """An UPPER BOUND: which frame a new one is judged against, and whether it merges, depends
    on the extracted frames (replies of `frames`), so the count is the most the wavefront can
    send: window 1, every frame but a conversation's first (twice with strict_two_call);
    windowed, every window but a lone first one. Prompts: the stage's own request builders on
    stand-in frames (`stand_in_frame`; no merges), each new frame judged against the previous
    (window: against the window's length of earlier frames)."""
    s = inp.job.settings(FusionSettings)
    f = s.frames or inp.job.settings(FrameSettings)
    passages = passage_list(passages_from_turns(inp.turns))
    prompt = n = over = 0
    for conv_id, ps in by_conversation(passages).items():
        initial = [stand_in_frame(p, f) for p in ps]
        st = ConversationStore.create(conv_id, ps, initial, np.zeros((len(ps), 1), dtype=np.float32))
        requests: list[LLMRequest] = []
        if s.window == 1:
            for t in range(len(ps)):
                if t:
                    job = PairJob(st, t, t - 1, 0.0)
                    kinds = ("judge", "merge") if s.strict_two_call else ("judge_fuse",)
                    requests += [pair_request(job, kind, s, f) for kind in kinds]
                st.insert(t)
        else:
            for k in range(math.ceil(len(ps) / s.window)):
                positions = tuple(range(k * s.window, min((k + 1) * s.window, len(ps))))
                cands = tuple(range(max(0, len(st.frames) - s.window), len(st.frames)))
                if len(positions) > 1 or cands:
                    requests.append(window_request(WindowJob(st, positions, cands, (0.0,) * len(cands)), s, f))
                for p in positions:
                    st.insert(p)
        for req in requests:
            prompt += inp.counter.messages(req.messages)
            over += inp.over(req.messages, s.max_tokens)
        n += len(requests)
    inp.stand_ins["frames"] = stand_in_frames(inp.turns, f)  # no merges, as counted above
    return StageEstimate(
        "fusion", n, prompt, n * min(s.max_tokens, FUSION_COMPLETION),
        f"upper bound: every judgeable frame sent (window {s.window}"
        f"{', two calls' if s.strict_two_call else ''}); stand-in frames from the passages",
        over if inp.checked else None, bound=True, build=True,
    )


STAGE = Stage(
    name="fusion", run=run_fusion, reads=("passages", "frames_extracted"), writes=("frames", "frame_of"),
    settings=FusionSettings, depends=(*EMBEDDER_IDENTITY, *LLM_IDENTITY),
    uses=("llm", "encoder"), estimate=estimate_fusion,
)
