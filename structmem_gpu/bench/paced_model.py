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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CHARS_PER_TOKEN = 4.0  # English text and JSON, Llama/Qwen-class tokenizers: ~3.5-4.5


@dataclass(frozen=True)
class TimingModel:
    decode_base_s: float = 0.0065  # fixed cost of one decode step (weights read once per step)
    decode_per_seq_s: float = 0.00006  # added per running sequence (KV reads, sampling)
    prefill_tokens_per_s: float = 30000.0  # prompt tokens processed per second, charged per step
    max_num_seqs: int = 256  # sequences one step may hold (vLLM's --max-num-seqs)
    time_scale: float = 1.0  # real time = model time / time_scale (the mock's speed-up)

    def step_s(self, running: int, prefill_tokens: int) -> float:
        """Model seconds of one step with `running` sequences decoding and `prefill_tokens`
        prompt tokens of newly admitted sequences."""
        if running <= 0:
            return 0.0
        return (self.decode_base_s + self.decode_per_seq_s * running
                + prefill_tokens / self.prefill_tokens_per_s)

    def tokens(self, chars: int) -> int:
        return max(1, math.ceil(chars / CHARS_PER_TOKEN))


@dataclass
class Seq:
    ident: Any
    prompt_tokens: int
    completion_tokens: int
    done_tokens: int = 0


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

    def submit(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def held(self) -> int:
        return len(self.waiting) + len(self.running)

    def step(self) -> tuple[float, list[Seq]]:
        """One step: (its model seconds, the sequences that finished in it)."""
        prefill = 0
        while self.waiting and len(self.running) < self.model.max_num_seqs:
            s = self.waiting.popleft()
            prefill += s.prompt_tokens
            self.running.append(s)
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
