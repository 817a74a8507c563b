"""The reference's topic segmentation and extraction batching as plain state machines
(zjunlp/LightMem 8fc9a91, `factory/memory_buffer/sensory_memory.py` and
`short_term_memory.py`; docs/methods.md "Compression and topic segmentation").
Our own code, no torch: the two model signals come from the caller.

Per conversation, the reference calls `add_memory` once per turn with two messages, the
(compressed) user text and an empty assistant placeholder, and on the last turn forces a cut
and a flush. `conversation_plan` replays that: a generator that yields a `CutNeed` each time
the sensory buffer must cut (the buffer's user texts, for the attention signal, and its
"user + ' ' + assistant" turn strings, for the embedding signal) and receives `CutSignals`
back, so the segment stage can advance every conversation to its next cut, compute all
pending cuts' signals in one batched pass, and resume them together.

The rules, as the reference code has them:
- the sensory buffer takes user messages while its model-token count (each text encoded with
  the segmenter's tokenizer, special tokens included) stays <= `max_tokens` (512);
- a message that does not fit cuts the buffer: attention boundaries (local maxima of the
  adjacent-sentence attention, `attention_boundaries`) and cosine cuts between adjacent turns
  (threshold 0.2, raised by 0.05 while <= 0.5 until any cut appears) are kept where a cosine
  cut lies within +-3 of an attention boundary; none agreeing = the cosine cuts alone; no
  attention boundary or no cosine cut = the whole buffer is one segment. The turns after the
  last cut stay in the buffer;
- a message that alone exceeds the budget of an empty buffer is its own ("oversize") segment;
- on the last turn the forced cut REPLACES the segments that adding that turn produced (the
  reference assigns the forced cut's result over them): those turns never reach extraction
  (`LOST` segments, counted);
- segments accumulate into extraction batches while their user texts (joined by spaces)
  stay within `batch_tokens` (512) of the extraction model's encoding (o200k); a segment that
  would exceed it releases the batch first; the last turn flushes the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np

# Why a segment ended (the `reason` column of the segments table).
AGREED = "agreed"  # cosine cut within +-3 of an attention boundary
COSINE_ONLY = "cosine_only"  # cosine cuts, none near an attention boundary
NO_ATTENTION_CUT = "no_attention_cut"  # whole buffer: the attention signal gave no boundary
NO_COSINE_CUT = "no_cosine_cut"  # whole buffer: no adjacent cosine < 0.5
NO_TURN_PAIRS = "no_turn_pairs"  # whole buffer: no user/assistant pair to embed
OVERSIZE = "oversize"  # one message longer than the buffer
FORCED = "forced"  # the remainder at the conversation's end
LOST = "lost_at_last_turn"  # produced while adding the last turn, then overwritten

AGREE_WINDOW = 3  # turns between a cosine cut and an attention boundary that still agree
COSINE_START, COSINE_STEP, COSINE_MAX = 0.2, 0.05, 0.5


@dataclass
class Msg:
    role: str  # "user" | "assistant"
    content: str
    turn: int  # position of the turn in the conversation (0-based)


@dataclass(frozen=True)
class CutNeed:
    """What a cut needs computed: the buffer's user texts (attention) and turn strings
    (embeddings)."""

    texts: tuple[str, ...]
    turn_texts: tuple[str, ...]


@dataclass(frozen=True)
class CutSignals:
    attention_cuts: tuple[int, ...]  # boundaries proposed by the attention signal
    embeddings: np.ndarray | None  # one row per turn string (None when there are none)


@dataclass
class Segment:
    turns: list[int]  # turn positions with a user message in the segment
    reason: str
    user_texts: list[str]
    released_at: int  # the turn whose add_memory call produced it
    batch: int | None = None  # extraction batch (None = lost)
    # the turn whose add_memory call sent its batch: batches sent by one call share their
    # source-id numbering and per-session time offsets (assign_sequence_numbers_with_timestamps
    # runs over the call's whole extract_list)
    batch_call: int | None = None


@dataclass
class ConversationPlan:
    segments: list[Segment] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)  # segment indices per batch
    cuts: int = 0  # buffer cuts that needed signals


def attention_boundaries(matrix: np.ndarray) -> list[int]:
    """Boundaries from the row-normalised sentence attention matrix M (n x n, M[i, :i] sums
    to 1): with outer[k] = M[k+1, k], every k in 1..len(outer)-2 where outer[k] is a strict
    local maximum (the reference's `propose_cut`)."""
    n = matrix.shape[0]
    outer = [float(matrix[i, i - 1]) for i in range(1, n)]
    return [k for k in range(1, len(outer) - 1) if outer[k - 1] < outer[k] > outer[k + 1]]


def sentence_attention(att: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """M from one sequence's head- and layer-averaged attention `att` (L x L, L = CLS + the
    sentences' tokens + SEP): M[i, j] (j < i) = the mean over sentence i's tokens of their
    summed attention to sentence j's tokens, the first and last 3 positions left out (a
    sequence shorter than 6 drops its first and last tenth), each row normalised to sum 1."""
    seq_len = att.shape[0]
    valid = np.ones(seq_len, dtype=bool)
    k = 3
    if seq_len >= 2 * k:
        valid[:k] = False
        valid[-k:] = False
    elif seq_len > 0:
        cut = max(0, seq_len // 10)
        valid[:cut] = False
        valid[-cut:] = False  # cut == 0 clears everything, as the reference does
    n = len(spans)
    m = np.zeros((n, n), dtype=float)
    positions = []
    for start, end in spans:
        pos = np.arange(start, end)
        positions.append(pos[valid[pos]] if pos.size else pos)
    for i in range(n):
        if positions[i].size == 0 or spans[i][1] == spans[i][0]:
            continue
        row = []
        for j in range(i):
            if positions[j].size == 0:
                row.append(0.0)
                continue
            row.append(float(att[np.ix_(positions[i], positions[j])].sum(axis=1).mean()))
        if row:
            vals = np.array(row, dtype=float)
            total = vals.sum()
            if total > 0:
                vals = vals / total
            m[i, :i] = vals
    return m


def cosine_cuts(embeddings: np.ndarray) -> list[int]:
    """Cuts i+1 where adjacent turns' cosine < threshold, the threshold starting at 0.2 and
    raised by 0.05 (accumulated in floating point, as the reference does) while <= 0.5 and
    no cut was found."""
    sims = []
    for i in range(len(embeddings) - 1):
        a, b = embeddings[i], embeddings[i + 1]
        sims.append(float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))))
    cuts: list[int] = []
    threshold = COSINE_START
    while threshold <= COSINE_MAX and not cuts:
        cuts = [i + 1 for i, s in enumerate(sims) if s < threshold]
        if not cuts:
            threshold += COSINE_STEP
    return cuts


class SensoryBuffer:
    """The reference's sensory buffer (SenMemBufferManager) for one conversation."""

    def __init__(self, max_tokens: int, count: Callable[[str], int]) -> None:
        self.max_tokens = max_tokens
        self.count = count
        self.buffer: list[Msg] = []
        self.pending: list[Msg] = []
        self.tokens = 0

    def add(self, msgs: Sequence[Msg]) -> Generator[CutNeed, CutSignals, list[tuple[list[Msg], str]]]:
        out: list[tuple[list[Msg], str]] = []
        self.pending.extend(msgs)
        while self.pending:
            taken = 0  # the processed messages are always a prefix of `pending`
            for pos, m in enumerate(self.pending):
                if m.role != "user":
                    self.buffer.append(m)
                    taken = pos + 1
                    continue
                n = self.count(m.content)
                if self.tokens + n <= self.max_tokens:
                    self.buffer.append(m)
                    self.tokens += n
                    taken = pos + 1
                    continue
                if self.tokens == 0 and not any(b.role == "user" for b in self.buffer):
                    seg = [m]
                    taken = pos + 1
                    if pos + 1 < len(self.pending) and self.pending[pos + 1].role == "assistant":
                        seg.append(self.pending[pos + 1])
                        taken = pos + 2
                    out.append((seg, OVERSIZE))
                    break
                out.extend((yield from self.cut(force=False)))
                break
            del self.pending[:taken]
        return out

    def cut(self, force: bool) -> Generator[CutNeed, CutSignals, list[tuple[list[Msg], str]]]:
        if not self.buffer:
            self.tokens = 0
            return []
        texts = [m.content for m in self.buffer if m.role == "user"]
        if not texts:
            self.buffer.clear()
            self.tokens = 0
            return []
        pairs = [
            self.buffer[i].content + " " + self.buffer[i + 1].content
            for i in range(0, len(self.buffer) - 1, 2)
            if self.buffer[i].role == "user" and self.buffer[i + 1].role == "assistant"
        ]
        signals = yield CutNeed(tuple(texts), tuple(pairs))
        if not signals.attention_cuts:
            return self._whole(NO_ATTENTION_CUT)
        if not pairs:
            return self._whole(NO_TURN_PAIRS)
        assert signals.embeddings is not None and len(signals.embeddings) == len(pairs)
        fine = cosine_cuts(signals.embeddings)
        if not fine:
            return self._whole(NO_COSINE_CUT)
        agreed = [fb for fb in fine
                  if any(abs(fb - cb) <= AGREE_WINDOW for cb in signals.attention_cuts)]
        reason = AGREED if agreed else COSINE_ONLY
        bounds = sorted(set(agreed or fine))
        out: list[tuple[list[Msg], str]] = []
        start = 0
        for b in bounds:
            out.append((self.buffer[start : 2 * b], reason))
            start = 2 * b
        if force:
            out.append((self.buffer[start:], FORCED))
            start = len(self.buffer)
        if start > 0:
            del self.buffer[:start]
            self.tokens = sum(self.count(m.content) for m in self.buffer if m.role == "user")
        return out

    def _whole(self, reason: str) -> list[tuple[list[Msg], str]]:
        seg = list(self.buffer)
        self.buffer.clear()
        self.tokens = 0
        return [(seg, reason)]


class BatchBuffer:
    """The reference's short-term buffer (ShortMemBufferManager, messages_use=user_only)."""

    def __init__(self, max_tokens: int, count: Callable[[str], int]) -> None:
        self.max_tokens = max_tokens
        self.count = count
        self.buffer: list[int] = []
        self.tokens = 0

    def segment_tokens(self, seg: Segment) -> int:
        return self.count(" ".join(seg.user_texts))

    def add(self, segs: Sequence[tuple[int, Segment]], force: bool) -> list[list[int]]:
        out = []
        for index, seg in segs:
            need = self.segment_tokens(seg)
            if self.tokens + need > self.max_tokens and self.buffer:
                out.append(self.buffer)
                self.buffer, self.tokens = [], 0
            self.buffer.append(index)
            self.tokens += need
        if force and self.buffer:
            out.append(self.buffer)
            self.buffer, self.tokens = [], 0
        return out


def conversation_plan(
    texts: Sequence[str],
    model_tokens: Callable[[str], int],
    batch_tokens: Callable[[str], int],
    buffer_tokens: int = 512,
    batch_budget: int = 512,
) -> Generator[CutNeed, CutSignals, ConversationPlan]:
    """Replay the reference's per-turn add_memory over one conversation's (compressed) user
    texts; yields a CutNeed per cut, returns the segments and extraction batches."""
    sbuf = SensoryBuffer(buffer_tokens, model_tokens)
    stm = BatchBuffer(batch_budget, batch_tokens)
    plan = ConversationPlan()
    last = len(texts) - 1
    for t, text in enumerate(texts):
        msgs = [Msg("user", text, t), Msg("assistant", "", t)]
        raw = yield from _counting(sbuf.add(msgs), plan)
        if t == last:
            for seg_msgs, reason in raw:  # overwritten by the forced cut below (reference)
                plan.segments.append(_segment(seg_msgs, LOST, t))
            raw = yield from _counting(sbuf.cut(force=True), plan)
        new = []
        for seg_msgs, reason in raw:
            plan.segments.append(_segment(seg_msgs, reason, t))
            new.append((len(plan.segments) - 1, plan.segments[-1]))
        for batch in stm.add(new, force=t == last):
            for i in batch:
                plan.segments[i].batch = len(plan.batches)
                plan.segments[i].batch_call = t
            plan.batches.append(batch)
    return plan


def _counting(gen: Generator[CutNeed, CutSignals, list], plan: ConversationPlan):  # type: ignore[type-arg]
    """Pass a buffer generator's needs through, counting them."""
    try:
        need = next(gen)
    except StopIteration as stop:
        return stop.value
    while True:
        plan.cuts += 1
        signals = yield need
        try:
            need = gen.send(signals)
        except StopIteration as stop:
            return stop.value


def _segment(msgs: Sequence[Msg], reason: str, released_at: int) -> Segment:
    users = [m for m in msgs if m.role == "user"]
    return Segment([m.turn for m in users], reason, [m.content for m in users], released_at)


def run_plans(
    convs: dict[str, Generator[CutNeed, CutSignals, ConversationPlan]],
    signals: Callable[[list[CutNeed]], list[CutSignals]],
) -> dict[str, ConversationPlan]:
    """Advance every conversation to its next cut, compute all pending cuts' signals in one
    call (`signals`: one batched attention pass and one encoder call), resume them together;
    until every conversation is done."""
    done: dict[str, ConversationPlan] = {}
    pending: dict[str, CutNeed] = {}
    for key, gen in convs.items():
        try:
            pending[key] = next(gen)
        except StopIteration as stop:
            done[key] = stop.value
    while pending:
        keys = list(pending)
        answers = signals([pending[k] for k in keys])
        pending = {}
        for key, answer in zip(keys, answers, strict=True):
            try:
                pending[key] = convs[key].send(answer)
            except StopIteration as stop:
                done[key] = stop.value
    return done
