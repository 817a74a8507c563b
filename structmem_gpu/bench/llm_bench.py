"""`jobs/bench.py llm`: client throughput and the client's own overhead against ONE server.

    python jobs/bench.py llm                           # launches llama.cpp (CPU profile)
    python jobs/bench.py llm llm=vllm_server llm.base_url=http://127.0.0.1:8000/v1 \
        llm.served_name=qwen

The same N real extraction requests (the sample's first windows, built by the extract stage's
own `plan_windows` / `build_request`, replies capped at `max_tokens`) are sent three times, no
cache anywhere:

| pass | what |
|---|---|
| raw | a minimal synchronous httpx loop (same JSON bodies), one request at a time |
| client x1 | HTTPBackend with max_in_flight=1 (retry/validation/bookkeeping included) |
| client xK | HTTPBackend with the configured llm.max_in_flight (the batched path) |

Overhead per request = client wall time not spent waiting on HTTP, (wall - sum of per-request
HTTP latencies) / n, for the raw loop and client x1 (robust to server noise), and the wall
difference client x1 - raw per request (what a user sees; noisy on a shared machine).
Repairs are off (repair_attempts=0) so every pass sends exactly N requests. raw and client x1
alternate for `rounds` rounds; each mode reports its fastest round (robust to a transient
slowdown of a shared machine; all rounds are in `wall_s_rounds`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.bench.fit import rate
from structmem_gpu.config.job import JobConfig
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.llm.types import LLMRequest

log = logging.getLogger(__name__)


def sample_requests(job: JobConfig, n: int, max_tokens: int) -> list[LLMRequest]:
    """The first n extraction requests of the configured benchmark (both perspectives)."""
    from structmem_gpu.data import load_benchmark
    from structmem_gpu.methods.structmem.extract import (
        ExtractSettings,
        build_request,
        plan_from_settings,
    )

    b = job.root.benchmark
    turns, _ = load_benchmark(b.name, b.path, None, b.max_sessions)
    s = job.settings(ExtractSettings)
    llm = job.root.llm
    windows, _ = plan_from_settings(turns, s, llm)
    per_window = len(s.perspectives)
    if len(windows) * per_window < n:
        # A small benchmark (the bundled sample) has too few windows for a GPU-sized batch:
        # top up with synthetic conversations of the same format (distinct prompts).
        import tempfile

        from structmem_gpu.bench.synthetic import SyntheticSpec, write_locomo

        need = -(-(n - len(windows) * per_window) // per_window)
        spec = SyntheticSpec(
            max(1, -(-need // 4)), sessions=4, turns_per_session=min(s.turns_per_request or 8, 8)
        )
        with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
            extra, _ = load_benchmark(
                "locomo", write_locomo(spec, Path(tmp) / "s.json"), None, None
            )
        windows += plan_from_settings(extra, s, llm)[0]
    reqs = [build_request(w, kind, s) for w in windows for kind in s.perspectives][:n]
    return [
        dataclasses.replace(r, sampling=dataclasses.replace(r.sampling, max_tokens=max_tokens))
        for r in reqs
    ]


def _raw_pass(base_url: str, bodies: Sequence[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    import httpx

    lat, out_tokens, in_tokens = [], 0, 0
    t0 = time.perf_counter()
    with httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False) as client:
        for body in bodies:
            t = time.perf_counter()
            resp = client.post("/chat/completions", json=body)
            lat.append(time.perf_counter() - t)
            resp.raise_for_status()
            usage = resp.json().get("usage") or {}
            out_tokens += int(usage.get("completion_tokens") or 0)
            in_tokens += int(usage.get("prompt_tokens") or 0)
    wall = time.perf_counter() - t0
    return _row("raw httpx loop", 1, len(bodies), wall, sum(lat), in_tokens, out_tokens)


def _client_pass(
    llm: LLMSettings, in_flight: int, requests: Sequence[LLMRequest], log_dir: Path
) -> dict[str, Any]:
    from structmem_gpu.llm.factory import open_llm

    timed = llm.model_copy(update={"max_in_flight": in_flight, "repair_attempts": 0, "progress": False})
    with open_llm(timed, log_dir=log_dir, cache_dir=None, name="bench-client") as backend:
        t0 = time.perf_counter()
        results = backend.generate(list(requests), desc=f"bench x{in_flight}")
        wall = time.perf_counter() - t0
    failed = sum(r.finish_reason == "error" for r in results)
    row = _row(
        f"client x{in_flight}",
        in_flight,
        len(results),
        wall,
        sum(r.latency_s for r in results),
        sum(r.prompt_tokens for r in results),
        sum(r.completion_tokens for r in results),
    )
    row["errors"] = failed
    # Capped replies often stop mid-JSON: they still count for throughput, and the table says so.
    row["unparsed"] = sum(r.finish_reason != "error" and not r.parse_ok for r in results)
    return row


def _row(
    mode: str, in_flight: int, n: int, wall: float, http_s: float, p_tok: int, c_tok: int
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "mode": mode,
        "in_flight": in_flight,
        "requests": n,
        "wall_s": round(wall, 3),
        "requests_per_s": rate(n, wall),
        "prompt_tokens": p_tok,
        "completion_tokens": c_tok,
        "output_tokens_per_s": rate(c_tok, wall),
        "mean_latency_s": round(http_s / n, 4) if n else None,
    }
    # Time outside the HTTP round trips is meaningful only when requests do not overlap.
    row["overhead_ms_per_request"] = (
        round(1000 * (wall - http_s) / n, 3) if n and in_flight == 1 else None
    )
    return row


def run_llm_bench(
    job: JobConfig, base_url: str, *, n: int, max_tokens: int, log_dir: Path, rounds: int = 1
) -> dict[str, Any]:
    """The passes over the same requests; rows plus the derived overhead figures."""
    from structmem_gpu.llm.client import request_body
    from structmem_gpu.llm.factory import _http_backend, llm_settings

    llm_cfg = llm_settings(job.root.llm.model_copy(update={"base_url": base_url}))
    # the bodies the client sends: its flavor and request extras, as the factory builds it
    client = _http_backend(llm_cfg, base_url)
    requests = sample_requests(job, n, max_tokens)
    bodies = [
        request_body(r, served_name=client.served_name, flavor=client.flavor,
                     extra_body=client.extra_body)
        for r in requests
    ]
    # One unmeasured request first: the server's first request pays one-time setup.
    timeout = llm_cfg.request_timeout_s
    _raw_pass(base_url, bodies[:1], timeout)
    # Raw and client x1 alternate for `rounds` rounds and each keeps its fastest round: on a
    # shared machine a transient slowdown then hits neither figure.
    raws, ones = [], []
    for _ in range(max(1, rounds)):
        raws.append(_raw_pass(base_url, bodies, timeout))
        ones.append(_client_pass(llm_cfg, 1, requests, log_dir))
    raw, one = (min(rs, key=lambda r: r["wall_s"]) for rs in (raws, ones))
    raw["wall_s_rounds"] = [r["wall_s"] for r in raws]
    one["wall_s_rounds"] = [r["wall_s"] for r in ones]
    k = llm_cfg.max_in_flight
    rows = [raw, one]
    if k > 1:
        rows.append(_client_pass(llm_cfg, k, requests, log_dir))
    n_sent = max(len(requests), 1)
    return {
        "server": {
            "base_url": base_url,
            "backend": llm_cfg.backend,
            "model": llm_cfg.served_name,
        },
        "max_tokens": max_tokens,
        "rounds": rounds,
        "rows": rows,
        "client_overhead_ms_per_request": one["overhead_ms_per_request"],
        "client_minus_raw_ms_per_request": round(
            1000 * (one["wall_s"] - raw["wall_s"]) / n_sent, 3
        ),
        "batched_speedup_vs_raw": round(raw["wall_s"] / rows[-1]["wall_s"], 4)
        if rows[-1]["wall_s"]
        else None,
    }
