"""A continuous-batching timing model of one GPU serving engine (vLLM-like), for the paced mock.

    model = TimingModel(time_scale=20)              # 8B model, BF16, one H100/H200-class GPU
    eng = Engine(model)
    eng.submit(Seq("a", prompt_tokens=300, completion_tokens=3))
    dt, done = eng.step()                           # model seconds of this step, finished seqs

One engine step: admit waiting sequences while fewer than `max_num_seqs` run (first come,
first served), charge their prefill to this step, then every running sequence decodes one
token; a sequence leaves after `completion_tokens` tokens (its first token comes with its
prefill step, as in vLLM). Step time, in model seconds:

    decode_base_s + decode_per_seq_s * running + prefill_tokens_admitted / prefill_tokens_per_s

Defaults: 6.5 ms + 0.06 ms per running sequence (about 150 tokens/s single-stream and 11.7 k
tokens/s at 256 sequences, near the ~12.5 k published for an 8B BF16 model on one H100 with
vLLM), prefill 30,000 prompt tokens/s, max_num_seqs 256. These are parameters of a
simulation, not measurements of a GPU. `time_scale` divides every time when the mock server
plays the model in real time (20 = a step of 21.9 ms at 256 sequences takes 1.1 ms), so that a
LongMemEval-S-size build runs in minutes on a CPU; predictions are given on the model's scale.
Token counts: the mock takes prompt tokens = characters / CHARS_PER_TOKEN of the messages and
completion tokens = characters / CHARS_PER_TOKEN of the scripted reply (at least 1).

Prefix caching, as vLLM's automatic prefix cache (on by default in vLLM's V1 engine; our vLLM
profiles keep it on): a prompt is cut into blocks of BLOCK_TOKENS tokens (BLOCK_CHARS
characters here), each block named by a hash chained over every block before it; at admission
a sequence's leading blocks already in the cache are not prefilled (at least one token always
is, as in vLLM), and its blocks enter the cache. The cache holds `kv_cache_tokens` tokens and
drops the least recently used blocks. A simplification: vLLM never evicts a running
sequence's blocks (it evicts other cached blocks instead), which this model does not track;
with the system prompts reused by every request they stay cached either way.
`prefix_caching=False` charges every prompt token.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CHARS_PER_TOKEN = 4.0  # English text and JSON, Llama/Qwen-class tokenizers: ~3.5-4.5
BLOCK_TOKENS = 16  # vLLM's KV-cache block size (its default on CUDA)
BLOCK_CHARS = int(BLOCK_TOKENS * CHARS_PER_TOKEN)


def prompt_blocks(parts: Sequence[str]) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a prompt made of `parts` (role tags and message
    texts in order): block i's hash covers blocks 0..i, so equal hashes mean equal prefixes."""
    text = "\x1f".join(parts)
    h, out = 0, []
    for i in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
        h = hash((h, text[i:i + BLOCK_CHARS]))
        out.append(h)
    return tuple(out)


@dataclass(frozen=True)
class TimingModel:
    decode_base_s: float = 0.0065  # fixed cost of one decode step (weights read once per step)
    decode_per_seq_s: float = 0.00006  # added per running sequence (KV reads, sampling)
    prefill_tokens_per_s: float = 30000.0  # prompt tokens processed per second, charged per step
    max_num_seqs: int = 256  # sequences one step may hold (vLLM's --max-num-seqs)
    time_scale: float = 1.0  # real time = model time / time_scale (the mock's speed-up)
    prefix_caching: bool = True  # vLLM's automatic prefix caching (its default)
    # KV-cache capacity in tokens: an H200 at gpu_memory_utilization 0.9 (~127 GB) less an 8B
    # model's 16 GB of BF16 weights leaves ~110 GB; Llama-3.1-8B's KV is 128 KiB per token
    # (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes): ~840 k tokens
    kv_cache_tokens: int = 800_000

    def step_s(self, running: int, prefill_tokens: int) -> float:
        """Model seconds of one step with `running` sequences decoding and `prefill_tokens`
        prompt tokens of newly admitted sequences."""
        if running <= 0:
            return 0.0
        return (self.decode_base_s + self.decode_per_seq_s * running
                + prefill_tokens / self.prefill_tokens_per_s)

    def tokens(self, chars: int) -> int:
        return max(1, math.ceil(chars / CHARS_PER_TOKEN))


# The engines `jobs/bench.py paced --paced-engine` plays. "bf16": TimingModel's defaults above
# (the reference setting: an 8B model in BF16). "fp8": vLLM's online FP8 W8A8 quantisation
# (conf/llm/vllm_llama3_1_8b_fp8.yaml, an opt-in deviation that changes replies): every step
# time divided by FP8_SPEEDUP, the "up to a 1.6x improvement in throughput" the vLLM docs
# publish for FP8 (docs.vllm.ai, Quantization > FP8 W8A8). A published upper bound, not a
# measurement of ours; the KV cache is left at the BF16 figure (FP8 weights would free ~8 GB
# more: a larger prefix cache, which the system prompts do not need).
FP8_SPEEDUP = 1.6
ENGINES = ("bf16", "fp8")


def engine_model(engine: str, **kw: Any) -> TimingModel:
    """The TimingModel of `engine` (ENGINES), with `kw` (max_num_seqs, time_scale, ...)."""
    if engine == "bf16":
        return TimingModel(**kw)
    if engine == "fp8":
        base = TimingModel()
        return TimingModel(decode_base_s=base.decode_base_s / FP8_SPEEDUP,
                           decode_per_seq_s=base.decode_per_seq_s / FP8_SPEEDUP,
                           prefill_tokens_per_s=base.prefill_tokens_per_s * FP8_SPEEDUP, **kw)
    raise ValueError(f"unknown paced engine {engine!r}: one of {', '.join(ENGINES)}")


@dataclass
class Seq:
    ident: Any
    prompt_tokens: int
    completion_tokens: int
    done_tokens: int = 0
    blocks: tuple[int, ...] = ()  # prompt_blocks() of its prompt; () = nothing to share
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission


@dataclass
class PrefixCache:
    """Block hashes in least-recently-used order, at most `capacity_blocks` of them."""

    capacity_blocks: int
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def admit(self, blocks: Sequence[int]) -> int:
        """Blocks of this prompt's leading run already cached; all its blocks become the most
        recently used."""
        hit = 0
        for h in blocks:
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            hit += 1
        for h in blocks[hit:]:
            self.blocks[h] = None
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
        return hit


@dataclass
class Engine:
    """The scheduler state; `step()` advances it by one engine step."""

    model: TimingModel
    waiting: deque[Seq] = field(default_factory=deque)
    running: list[Seq] = field(default_factory=list)
    model_time_s: float = 0.0
    steps: int = 0
    saturated_s: float = 0.0  # model time of steps that ran max_num_seqs sequences
    decoded_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens charged (computed)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    cache: PrefixCache | None = None

    def __post_init__(self) -> None:
        if self.model.prefix_caching and self.cache is None:
            self.cache = PrefixCache(self.model.kv_cache_tokens // BLOCK_TOKENS)

    def submit(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def held(self) -> int:
        return len(self.waiting) + len(self.running)

    def step(self) -> tuple[float, list[Seq]]:
        """One step: (its model seconds, the sequences that finished in it)."""
        prefill = 0
        while self.waiting and len(self.running) < self.model.max_num_seqs:
            s = self.waiting.popleft()
            if self.cache is not None and s.blocks:
                hit = self.cache.admit(s.blocks) * BLOCK_TOKENS
                s.cached_tokens = max(0, min(hit, s.prompt_tokens - 1))
            prefill += s.prompt_tokens - s.cached_tokens
            self.cached_tokens += s.cached_tokens
            self.running.append(s)
        self.prefill_tokens += prefill
        dt = self.model.step_s(len(self.running), prefill)
        if len(self.running) >= self.model.max_num_seqs:
            self.saturated_s += dt
        done, still = [], []
        for s in self.running:
            s.done_tokens += 1
            (done if s.done_tokens >= s.completion_tokens else still).append(s)
        self.decoded_tokens += len(self.running)
        self.running = still
        self.model_time_s += dt
        self.steps += 1 if dt > 0 else 0
        return dt, done


def simulate(seqs: list[Seq], model: TimingModel) -> float:
    """Model seconds to serve `seqs`, all submitted at time 0 (for tests and estimates)."""
    eng = Engine(model)
    for s in seqs:
        eng.submit(s)
    while eng.held():
        eng.step()
    return eng.model_time_s


# ---- the busy fraction (bench/paced.py) ----------------------------------------------------


def timelines(grid: np.ndarray, calls: Sequence[dict[str, Any]], arrivals: Sequence[float],
              finishes: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(held, available) at each grid time: requests the server holds (arrived, not finished)
    and requests the run could send (handed to the client in a generate call, not back yet)."""
    held = (np.searchsorted(np.sort(np.asarray(arrivals)), grid, side="right")
            - np.searchsorted(np.sort(np.asarray(finishes)), grid, side="right"))
    avail = np.zeros(grid.shape, dtype=np.int64)
    for c in calls:
        inside = (grid >= c["t0"]) & (grid < c["t1"])
        back = np.searchsorted(np.asarray(c["done"]), grid[inside], side="right")
        avail[inside] += c["n"] - back
    return held, avail


def not_busy_seconds(grid: np.ndarray, held: np.ndarray, avail: np.ndarray, max_num_seqs: int,
                     calls: Sequence[dict[str, Any]], step_s: float) -> dict[str, float]:
    """Where a stage's not-busy time went (seconds on `grid`, one stage's span): before its first
    generate call (planning), after its last one returned (tables, embeddings), between its
    calls (nothing handed to the client), and client_behind (requests handed over but not yet
    at the server, or the server short of them: the client too slow to send)."""
    need = np.minimum(avail, max_num_seqs)
    idle = ~((held >= max_num_seqs) | ((avail > 0) & (held >= need)))
    if not calls or grid.size == 0:
        return {"before_first_send_s": round(float(idle.sum() * step_s), 3),
                "after_last_reply_s": 0.0, "between_batches_s": 0.0, "client_behind_s": 0.0}
    first, last = min(c["t0"] for c in calls), max(c["t1"] for c in calls)
    before, after = grid < first, grid >= last
    behind = idle & (avail > 0)
    between = idle & ~before & ~after & ~behind
    return {"before_first_send_s": round(float((idle & before).sum() * step_s), 3),
            "after_last_reply_s": round(float((idle & after).sum() * step_s), 3),
            "between_batches_s": round(float(between.sum() * step_s), 3),
            "client_behind_s": round(float(behind.sum() * step_s), 3)}


def busy_shares(held: np.ndarray, avail: np.ndarray, max_num_seqs: int) -> dict[str, float]:
    """busy: the server holds max_num_seqs, or every request the run could send (and at least
    one); wave_limited: busy while the run could send fewer than max_num_seqs."""
    if held.size == 0:
        return {"busy_fraction": 0.0, "wave_limited_share": 0.0, "saturated_share": 0.0}
    need = np.minimum(avail, max_num_seqs)
    busy = (held >= max_num_seqs) | ((avail > 0) & (held >= need))
    wave = busy & (avail < max_num_seqs) & (held < max_num_seqs)
    return {"busy_fraction": round(float(busy.mean()), 4),
            "wave_limited_share": round(float(wave.mean()), 4),
            "saturated_share": round(float((held >= max_num_seqs).mean()), 4)}
