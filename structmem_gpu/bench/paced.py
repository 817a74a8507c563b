"""`jobs/bench.py paced`: the builds against a GPU-paced mock server — is the GPU kept busy?

    python jobs/bench.py paced                      # LoCoMo-size and LongMemEval-S-size builds
    python jobs/bench.py paced --paced-sizes locomo --paced-time-scale 10

A simulation, not a GPU measurement. The mock (bench/mock_server.py --paced) answers each
request with the scripted LLM's reply, delivered when a continuous-batching timing model
(bench/paced_model.py: decode step 6.5 ms + 0.06 ms per running sequence, prefill 30,000
prompt tokens/s, vLLM's automatic prefix caching unless --paced-no-prefix-caching,
max_num_seqs 256, every time divided by `time_scale`) has decoded it. The
StructMem build (load, extract, embed, consolidate, then its evaluation: retrieve, answer,
judge) and the SEEM build (load, frames, fusion, graph) run in this process on synthetic data
sized like LoCoMo (bench/synthetic.py: 10 conversations x 27 sessions x 22 turns = 5,940
turns; LoCoMo has 5,882 in 272 sessions) and like LongMemEval-S (bench/longmemeval_synthetic.py,
LongMemEval's format: 500 questions x 50 haystack sessions of 18 turns drawn from a pool of
20,000, assistant turns ~1 kB as in the real file, ~119 k tokens of history a question against
the real ~115 k; loaded in the compact layout, each distinct session extracted once), the LLM attached over HTTP (the real client, max_in_flight 512, no
response cache), the hashing stand-in encoder. A tiny build per method runs first,
unreported, so one-time imports do not count as per-request CPU. Per build:

- busy_fraction: share of the build's wall time during which the server holds max_num_seqs
  requests, or every request the run could send at that moment (the requests of the batches
  the pipeline has handed the client and not yet got back). Not busy = the framework's fault:
  CPU work between batches, stage barriers, a client that is slow to send.
- wave_limited_share: share of wall time busy only because the run had fewer than
  max_num_seqs requests to send (order-dependent waves, e.g. SEEM's fusion per conversation,
  and batch tails): inherent to the method, reported separately.
- per stage: requests, framework CPU ms per request (this process's CPU time during the stage:
  stage logic, HTTP client, parsing, validation; less the hashing stand-in encoder's own CPU,
  reported as encoder_cpu_s: a GPU encoder does that work on the GPU), busy fraction,
  wave-limited share, and where its not-busy seconds went (not_busy: before its first send,
  after its last reply, between its batches, or with requests the client had not yet sent).
- predicted_gpu_s: the engine's own time on the model's scale (sum of its step times) plus the
  real seconds during which it held nothing (framework time that a GPU run also spends); the
  encoder's GPU time is not modelled.

Benchmarks measure ratios on a 2-core machine shared with other work, not absolute speeds:
the server and the pipeline share the cores, so a time scale that asks the client for more
requests per second than these cores give lowers the busy fraction (the default 10 keeps the
demand near 500 requests/s). Run under `flock /tmp/structmem-llm.lock`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from structmem_gpu.bench.harness import (BenchSettings, HashingModel, compose, hashing_encoder,
                                         run_pipeline)
from structmem_gpu.bench.paced_model import busy_shares, not_busy_seconds, timelines
from structmem_gpu.bench.longmemeval_synthetic import HaystackFileSpec, write_longmemeval
from structmem_gpu.bench.synthetic import SyntheticSpec, write_locomo
from structmem_gpu.methods.registry import method_stages
from structmem_gpu.core.stage_parts import BUILD, INPUT, QUESTION

log = logging.getLogger(__name__)

SIZES: dict[str, SyntheticSpec | HaystackFileSpec] = {
    "tiny": SyntheticSpec(conversations=2, sessions=2, turns_per_session=6),  # smoke test
    "tiny_longmemeval": HaystackFileSpec(questions=3, sessions=3, pool=4, turns_per_session=4),
    "locomo": SyntheticSpec(conversations=10, sessions=27, turns_per_session=22,
                            questions_per_conversation=20),
    # LongMemEval's own format (bench/longmemeval_synthetic.py: ~1 kB assistant turns, as the
    # real file's), loaded like the real one: the compact turns layout, each distinct session
    # extracted once. 500 questions x 50 sessions drawn from a pool of 20,000, 18 turns a
    # session: ~119 k tokens (characters / 4) of history a question and ~256 MB, against
    # ~115 k Llama-3 tokens and 278 MB for the real longmemeval_s.json. Dates are drawn per
    # haystack, as LongMemEval's recipe draws them: a shared pool session is a distinct
    # (turns, date) session in nearly every haystack.
    "longmemeval_s": HaystackFileSpec(questions=500, sessions=50, pool=20000,
                                      turns_per_session=18),
    # The same with one date per pool session (the earlier shortcut): the shape every
    # LongMemEval figure of docs/performance.md before 2026-12-04 was measured on
    # (~14,700 distinct sessions for 25,000 haystack places).
    "longmemeval_s_fixed_dates": HaystackFileSpec(questions=500, sessions=50, pool=20000,
                                                  turns_per_session=18, dates="fixed"),
    # a tenth of it (50 questions, pool 2,000), for a machine where the whole one does not
    # fit the time
    "longmemeval_s_tenth": HaystackFileSpec(questions=50, sessions=50, pool=2000,
                                            turns_per_session=18),
    # The same with 10 turns a session (~66 k tokens a question, ~0.6 of the real history):
    # the size docs/performance.md's earlier LongMemEval-format figures were measured on.
    "longmemeval_s_short_sessions": HaystackFileSpec(questions=500, sessions=50, pool=20000,
                                                     turns_per_session=10, dates="fixed"),
    # The earlier stand-in: LongMemEval-S's shape in LoCoMo's format (~20-word turns, about a
    # tenth of the real tokens; every occurrence of a shared session planned, copies merged by
    # the client's in-batch dedup), kept to compare with the figures measured on it.
    "longmemeval_s_locomo_format": SyntheticSpec(conversations=500, sessions=50,
                                                 turns_per_session=10,
                                                 questions_per_conversation=1,
                                                 shared_pool=20000),
}
# The methods whose builds are paced (a build = the method's input and build stages, as its
# stages declare them: methods/registry.method_stages).
PACED_METHODS = ("structmem", "seem")
# Methods whose per-question stages also run, reported as the evaluation phase (the
# LongMemEval-S target is build + evaluation); SEEM's is not run here (its build alone is long).
EVALUATED = ("structmem",)


def build_stages(method: str) -> tuple[str, ...]:
    return method_stages(method, INPUT, BUILD)


def evaluation_stages(method: str) -> tuple[str, ...]:
    return method_stages(method, QUESTION) if method in EVALUATED else ()
GRID_S = 0.0005  # resolution of the busy-fraction timeline (real seconds)


# ---- recording what the run could send -------------------------------------------------------


class Recorder:
    """Wraps the HTTP backend: per generate call, its stage, size, start, end and the time each
    result came back (CLOCK_MONOTONIC, shared with the server process)."""

    def __init__(self, inner: Any, calls: list[dict[str, Any]]) -> None:
        self._inner, self._calls = inner, calls
        self.model_id = inner.model_id

    streams = True  # as the HTTP backend: a stream's requests count from the call's start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def generate(self, requests: Any, *, desc: str = "", on_result: Any = None,
                 total: int | None = None) -> Any:
        done: list[float] = []
        lock = threading.Lock()

        def seen(i: int, res: Any) -> None:
            with lock:
                done.append(time.monotonic())
            if on_result is not None:
                on_result(i, res)

        extra = {} if isinstance(requests, Sequence) else {"total": total}
        t0, c0 = time.monotonic(), time.process_time()
        out = self._inner.generate(requests, desc=desc, on_result=seen, **extra)
        # A stream's requests all count as sendable from the call's start: planning them while
        # the server waits is the framework's time (client_behind), not a wave.
        self._calls.append({"stage": desc, "n": len(out), "t0": t0, "t1": time.monotonic(),
                            "done": sorted(done), "cpu_s": time.process_time() - c0})
        return out


@contextlib.contextmanager
def recording(calls: list[dict[str, Any]], stages: list[dict[str, Any]]) -> Iterator[None]:
    """Within the block: every HTTP backend is recorded, and every stage's wall and CPU span."""
    from structmem_gpu.run import pipeline
    from structmem_gpu.llm import factory

    real_http, real_run_one = factory._http_backend, pipeline._run_one

    def http(*a: Any, **k: Any) -> Any:
        return Recorder(real_http(*a, **k), calls)

    def run_one(stage: Any, *a: Any, **k: Any) -> Any:
        t0, c0, e0 = time.monotonic(), time.process_time(), HashingModel.cpu_s
        try:
            return real_run_one(stage, *a, **k)
        finally:
            stages.append({"stage": stage.name, "t0": t0, "t1": time.monotonic(),
                           "cpu_s": time.process_time() - c0,
                           "encoder_cpu_s": HashingModel.cpu_s - e0})

    with mock.patch.object(factory, "_http_backend", http), \
            mock.patch.object(pipeline, "_run_one", run_one):
        yield


# ---- the arithmetic ------------------------------------------------------------------------


def _phase(names: Sequence[str], stages: Sequence[dict[str, Any]], grid: np.ndarray,
           held: np.ndarray, avail: np.ndarray, server: dict[str, Any]) -> dict[str, Any] | None:
    """Busy shares and predicted GPU time of the stages named (one phase of the run)."""
    spans = [s for s in stages if s["stage"] in names]
    if not spans:
        return None
    t0, t1 = min(s["t0"] for s in spans), max(s["t1"] for s in spans)
    sel = (grid >= t0) & (grid < t1)
    ends = np.asarray(server.get("step_ends") or [])
    model_s = float(np.asarray(server.get("step_model_s") or [])[(ends >= t0) & (ends < t1)].sum()
                    ) if ends.size else 0.0
    idle = float((held[sel] == 0).sum() * GRID_S)
    return {"stages": list(names), "wall_s": round(t1 - t0, 3),
            **busy_shares(held[sel], avail[sel], int(server["model"]["max_num_seqs"])),
            "engine_model_s": round(model_s, 2), "idle_real_s": round(idle, 2),
            "predicted_gpu_s": round(model_s + idle, 1)}


def analyse(calls: Sequence[dict[str, Any]], stages: Sequence[dict[str, Any]],
            server: dict[str, Any], phases: dict[str, Sequence[str]] | None = None
            ) -> dict[str, Any]:
    m = server["model"]
    t0, t1 = min(s["t0"] for s in stages), max(s["t1"] for s in stages)
    grid = np.arange(t0, t1, GRID_S)
    held, avail = timelines(grid, calls, server["arrivals"], server["finishes"])
    idle_real_s = float((held == 0).sum() * GRID_S)
    split = {name: _phase(names, stages, grid, held, avail, server)
             for name, names in (phases or {}).items()}
    per_stage = []
    for s in stages:
        sel = (grid >= s["t0"]) & (grid < s["t1"])
        inside = [c for c in calls if s["t0"] <= c["t0"] < s["t1"]]
        n = sum(c["n"] for c in inside)
        client_s = sum(c.get("cpu_s", 0.0) for c in inside)
        enc_s = s.get("encoder_cpu_s", 0.0)
        own_s = s["cpu_s"] - enc_s  # the framework's: the stand-in encoder's CPU is GPU work
        row = {"stage": s["stage"], "wall_s": round(s["t1"] - s["t0"], 3), "requests": n,
               "cpu_s": round(own_s, 3), "encoder_cpu_s": round(enc_s, 3),
               "cpu_ms_per_request": round(1000 * own_s / n, 3) if n else None,
               # of which inside the backend's generate: HTTP client, reply validation,
               # result callbacks; the rest is the stage's own planning and tables
               "client_cpu_ms_per_request": round(1000 * client_s / n, 3) if n else None}
        if n:
            row.update(busy_shares(held[sel], avail[sel], int(m["max_num_seqs"])))
            # where its not-busy seconds went (planning, tables, a slow client)
            row["not_busy"] = not_busy_seconds(grid[sel], held[sel], avail[sel],
                                               int(m["max_num_seqs"]), inside, GRID_S)
        per_stage.append(row)
    requests = sum(c["n"] for c in calls)
    return {
        "wall_s": round(t1 - t0, 3), "requests": requests,
        **busy_shares(held, avail, int(m["max_num_seqs"])),
        "engine_model_s": round(server["model_time_s"], 2),
        "idle_real_s": round(idle_real_s, 2),
        "predicted_gpu_s": round(server["model_time_s"] + idle_real_s, 1),
        "decoded_tokens": server["decoded_tokens"], "engine_steps": server["steps"],
        # prompt tokens computed and those the prefix cache served
        "prefill_tokens": server.get("prefill_tokens"), "cached_tokens": server.get("cached_tokens"),
        "phases": {k: v for k, v in split.items() if v is not None},
        "stages": per_stage,
    }


# ---- one build against the paced server -------------------------------------------------------


@contextlib.contextmanager
def paced_server(log_dir: Path, stats: Path, time_scale: float,
                 max_num_seqs: int, prefix_caching: bool = True,
                 engine: str = "bf16") -> Iterator[Any]:
    from structmem_gpu.llm.server import launch_server

    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}

    def build(port: int) -> list[str]:
        return [sys.executable, "-m", "structmem_gpu.bench.mock_server", "--port", str(port),
                "--paced", "--time-scale", str(time_scale), "--max-num-seqs", str(max_num_seqs),
                "--stats", str(stats), "--engine", engine,
                *(() if prefix_caching else ("--no-prefix-caching",))]

    with launch_server(build, ready_path="/v1/models", log_dir=log_dir, name="paced",
                       startup_timeout_s=60, death_signal=signal.SIGKILL, env=env) as srv:
        yield srv


def run_build(settings: BenchSettings, size: str, method: str, *, time_scale: float,
              max_num_seqs: int = 256, max_in_flight: int = 512,
              prefix_caching: bool = True, engine: str = "bf16",
              tag: str = "") -> dict[str, Any]:
    spec = SIZES[size]
    data = settings.path("data", f"paced-{size}.json")
    lme = isinstance(spec, HaystackFileSpec)
    if not data.exists():
        if lme:
            write_longmemeval(spec, data)
        else:
            write_locomo(spec, data)
    name = (f"paced-{method}-{size}{'' if prefix_caching else '-no-prefix-caching'}"
            f"{'' if engine == 'bf16' else '-' + engine}{tag}")
    stats = settings.path("paced", f"{name}.server.json")
    calls: list[dict[str, Any]] = []
    stages: list[dict[str, Any]] = []
    with paced_server(settings.path("paced", "logs", name).parent, stats, time_scale,
                      max_num_seqs, prefix_caching, engine) as srv:
        # Not the profile's overrides: debug=ci caps replies, and reply lengths drive the model.
        cfg = compose(settings.conf_dir, [
            *(o for o in settings.user_overrides if not o.split("=", 1)[0].lstrip("+~")
              .startswith("llm")),
            f"method={method}", f"benchmark={'longmemeval' if lme else 'locomo'}",
            f"benchmark.path={data}",
            "benchmark.conversations=null", "benchmark.max_sessions=null",
            f"stages=[{','.join((*build_stages(method), *evaluation_stages(method)))}]",
            "llm=external",
            f"llm.base_url={srv.base_url}", "llm.served_name=mock", "llm.model=mock",
            f"llm.max_in_flight={max_in_flight}", "llm.repair_attempts=0",
            "++llm.progress=false", "cache.llm=false", "cache.embeddings=false",
            f"paths.cache_dir={settings.out_dir / 'cache' / name}",
        ])
        with hashing_encoder(), recording(calls, stages):
            run_pipeline(cfg, settings.out_dir / "runs" / name)
        srv.stop()
    server = json.loads(stats.read_text())
    out = analyse(calls, stages, server,
                  {"build": build_stages(method), "evaluation": evaluation_stages(method)})
    row = {"build": method, "size": size, "time_scale": time_scale,
           "max_num_seqs": max_num_seqs, "max_in_flight": max_in_flight,
           "prefix_caching": prefix_caching, "engine": engine,
           "format": "longmemeval" if lme else "locomo",
           "conversations": spec.questions if lme else spec.conversations,
           "sessions": spec.sessions, "turns_per_session": spec.turns_per_session,
           "pool": spec.pool if lme else spec.shared_pool, **out}
    # Each build's row on disk as it ends: a bench stopped later keeps the finished builds.
    settings.path("paced", f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")
    return row


def run_paced(settings: BenchSettings, *, sizes: Sequence[str] = tuple(SIZES),
              methods: Sequence[str] = PACED_METHODS, time_scale: float = 10.0,
              prefix_caching: bool = True, engine: str = "bf16",
              warm_up: bool = True) -> dict[str, Any]:
    rows = []
    if warm_up:
        # One tiny build per method first, not reported: the first build of a process pays
        # one-time imports (torch through the GPU plan, the stage modules: ~3 s of CPU) that
        # would otherwise land in its first stages' CPU per request. A job pays them once.
        for method in methods:
            log.info("paced: warm-up (%s build, tiny size; not reported)", method)
            run_build(settings, "tiny", method, time_scale=time_scale, tag="-warm-up")
    for size in sizes:
        for method in methods:
            log.info("paced: %s build, %s size", method, size)
            try:
                rows.append(run_build(settings, size, method, time_scale=time_scale,
                                      prefix_caching=prefix_caching, engine=engine))
            except Exception as e:  # noqa: BLE001 - one failed build is reported, the rest run
                log.exception("paced %s/%s failed", method, size)
                rows.append({"build": method, "size": size, "error": f"{type(e).__name__}: {e}"})
    return {"simulation": "GPU-paced mock (bench/paced_model.py): decode step 6.5 ms + 0.06 ms "
            "per running sequence, prefill 30,000 tokens/s, prefix caching "
            f"{'on (16-token blocks, 800 k tokens of KV cache)' if prefix_caching else 'off'}, "
            f"max_num_seqs 256, engine {engine}"
            f"{' (every step time / 1.6: the vLLM docs published FP8 figure)' if engine == 'fp8' else ''}"
            "; not a GPU measurement", "rows": rows}
