"""Topic segmentation and extraction batching (methods/structmem/segmenting.py) against the
reference's own code: LightMem 8fc9a91's `sensory_memory.py` (numpy only) and
`short_term_memory.py` are read from the checkout at test time (never stored here), executed
in a test namespace, and driven turn by turn as `LightMemory.add_memory` drives them
(user message + empty assistant placeholder; on the last turn a forced cut whose result
replaces that turn's segments, then a flush). Both sides get the same signals: a fake
attention segmenter and a fake embedder with topic-clustered vectors, so every branch
(agreed cuts, cosine-only cuts, no cut at any threshold, oversize messages, the forced
remainder) is reached.

The checkout: STRUCTMEM_OFFICIAL_DIR/lightmem.git (tests/official_repos.py); unset: skipped.
"""

from __future__ import annotations

import hashlib
import types

import numpy as np
import pytest

from structmem_gpu.methods.structmem import segmenting as S
from tests import official_repos
from tests.official_repos import load_module, stub_modules

def lightmem_source(path: str) -> str:
    """A file of LightMem at the pinned commit, from STRUCTMEM_OFFICIAL_DIR (tests/official_repos)."""
    return official_repos.show("lightmem", path)


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    sensory = load_module("ref_sensory", lightmem_source("src/lightmem/factory/memory_buffer/sensory_memory.py"))
    # short_term_memory imports resolve_tokenizer from the (heavy) lightmem package: a stand-in
    # that returns the tokenizer it is given, as the real one does for tokenizer objects.
    stub = {n: types.ModuleType(n) for n in ("lightmem", "lightmem.memory", "lightmem.memory.utils")}
    stub["lightmem.memory.utils"].resolve_tokenizer = lambda t: t  # type: ignore[attr-defined]
    with stub_modules(stub):
        short = load_module("ref_short", lightmem_source("src/lightmem/factory/memory_buffer/short_term_memory.py"))
    return sensory, short


class WordTokenizer:
    """Model tokens: words + 2 (CLS/SEP), like `tokenizer.encode` with special tokens."""

    def __init__(self, extra: int) -> None:
        self.extra = extra

    def encode(self, text: str) -> list[int]:
        return [0] * (len(text.split()) + self.extra)


def _seed(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def fake_attention_cuts(texts: list[str]) -> list[int]:
    """Deterministic per buffer: a random M from the texts' hash, then the real boundary rule;
    some buffers get no boundary at all."""
    rng = np.random.default_rng(_seed("|".join(texts)))
    n = len(texts)
    if rng.random() < 0.15:
        return []
    m = np.tril(rng.random((n, n)), -1)
    return S.attention_boundaries(m)


def fake_embedding(turn: str) -> np.ndarray:
    """Topic-clustered vectors: the text's first word names its topic."""
    topic = turn.split()[0] if turn.split() else "none"
    base = np.random.default_rng(_seed(topic)).normal(size=16)
    noise = np.random.default_rng(_seed(turn)).normal(size=16)
    return (base + 0.9 * noise).astype(np.float32)


class FakeSegmenter:
    def propose_cut(self, texts: list[str]) -> list[int]:
        return fake_attention_cuts(list(texts))


class FakeEmbedder:
    def embed(self, text: str) -> list[float]:
        return fake_embedding(text).tolist()


def conversation(seed: int, long_turns: bool) -> list[str]:
    rng = np.random.default_rng(seed)
    texts, topic = [], 0
    for _ in range(int(rng.integers(5, 70))):
        if rng.random() < 0.2:
            topic += 1
        words = int(rng.integers(200, 700)) if long_turns and rng.random() < 0.05 else int(rng.integers(1, 60))
        texts.append(" ".join([f"topic{topic}"] + [f"w{int(x)}" for x in rng.integers(0, 50, words)]))
    return texts


def reference_batches(sensory, short, texts: list[str], max_tokens: int) -> list[list[list[int]]]:  # type: ignore[no-untyped-def]
    """What LightMemory.add_memory does with segmentation on, one turn per call."""
    sbuf = sensory.SenMemBufferManager(max_tokens=max_tokens, tokenizer=WordTokenizer(2))
    stm = short.ShortMemBufferManager(max_tokens=512, tokenizer=WordTokenizer(0))
    seg, emb = FakeSegmenter(), FakeEmbedder()
    out = []
    for t, text in enumerate(texts):
        last = t == len(texts) - 1
        msgs = [{"role": "user", "content": text, "turn": t}, {"role": "assistant", "content": "", "turn": t}]
        segments = sbuf.add_messages(msgs, seg, emb)
        if last:
            segments = sbuf.cut_with_segmenter(seg, emb, True)
        _, batches = stm.add_segments(segments, "user_only", last)
        # each batch with the add_memory call (turn) that sent it
        out += [(t, [[m["turn"] for m in s if m["role"] == "user"] for s in batch]) for batch in batches]
    return out


def our_signals(needs: list[S.CutNeed]) -> list[S.CutSignals]:
    return [
        S.CutSignals(tuple(fake_attention_cuts(list(n.texts))),
                     np.vstack([fake_embedding(t) for t in n.turn_texts]) if n.turn_texts else None)
        for n in needs
    ]


@pytest.mark.parametrize("max_tokens,long_turns", [(512, False), (512, True), (90, True)])
def test_segments_and_batches_equal_the_reference(reference, max_tokens: int, long_turns: bool) -> None:  # type: ignore[no-untyped-def]
    sensory, short = reference
    words, plain = WordTokenizer(2), WordTokenizer(0)
    convs = {f"c{i}": conversation(1000 * max_tokens + i, long_turns) for i in range(40)}
    plans = S.run_plans(
        {k: S.conversation_plan(v, lambda s: len(words.encode(s)), lambda s: len(plain.encode(s)), max_tokens, 512)
         for k, v in convs.items()},
        our_signals,
    )
    reasons: set[str] = set()
    shared_calls = 0
    for key, texts in convs.items():
        plan = plans[key]
        ours = [(plan.segments[batch[0]].batch_call, [plan.segments[i].turns for i in batch])
                for batch in plan.batches]
        assert ours == reference_batches(sensory, short, texts, max_tokens), key
        calls = [c for c, _ in ours]
        shared_calls += len(calls) - len(set(calls))  # batches sent by a call with another
        reasons |= {s.reason for s in plan.segments}
        # every turn is in exactly one segment, lost ones included
        assert sorted(t for s in plan.segments for t in s.turns) == list(range(len(texts)))
    # the branches this test is meant to reach were reached
    expected = {S.AGREED, S.NO_ATTENTION_CUT, S.LOST}
    expected |= {S.OVERSIZE} if long_turns else set()
    expected |= {S.FORCED, S.COSINE_ONLY, S.NO_COSINE_CUT} if max_tokens == 512 else set()
    assert expected <= reasons, reasons
    assert shared_calls > 0  # one add_memory call sending two batches was reached


def test_cosine_cuts_raise_the_threshold() -> None:
    e = np.array([[1.0, 0.0], [0.8, 0.6], [0.6, 0.8]])  # adjacent cosines 0.8 and 0.96
    assert S.cosine_cuts(e) == []  # nothing below 0.5
    e2 = np.array([[1.0, 0.0], [0.7, 0.71414], [0.0, 1.0]])  # cosines 0.7 and ~0.71
    assert S.cosine_cuts(e2) == []
    e3 = np.array([[1.0, 0.0], [0.42, 0.9075], [0.0, 1.0]])  # cosines 0.42, 0.91: cut at 1 at 0.45
    assert S.cosine_cuts(e3) == [1]


def test_attention_boundaries_are_strict_local_maxima() -> None:
    m = np.zeros((6, 6))
    outer = [0.1, 0.5, 0.2, 0.2, 0.9]  # M[k+1, k]
    for k, v in enumerate(outer):
        m[k + 1, k] = v
    assert S.attention_boundaries(m) == [1]  # 0.9 is the last element: never a boundary
