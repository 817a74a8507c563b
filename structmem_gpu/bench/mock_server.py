"""A zero-latency OpenAI-compatible chat server: the `client` bench part's counterpart.

    python -m structmem_gpu.bench.mock_server --port 8123 --reply reply.txt
    # POST /v1/chat/completions -> the same completion (content = reply.txt) for every request
    # GET  anything             -> {"object": "list", "data": [{"id": "mock"}]} (readiness)

    python -m structmem_gpu.bench.mock_server --port 8123 --paced --time-scale 20 --stats s.json
    # GPU-paced (the `paced` bench part): each POST gets the scripted LLM's reply for its
    # messages and schema (llm/scripted.fake_reply), delivered when a continuous-batching
    # engine (bench/paced_model.py: 6.5 ms + 0.06 ms per sequence per decode step, prefill at
    # 30,000 tokens/s less prefix-cache hits, max_num_seqs 256, all times / time_scale) has
    # decoded it; on SIGTERM it writes the arrival/finish times and engine totals to --stats.

It does as little as an HTTP/1.1 keep-alive server can (one asyncio protocol, no body parsing,
one pre-encoded response), so that a benchmark against it measures the client, not the
server. Bound to 127.0.0.1 only; it stops on SIGTERM/SIGINT and when its parent dies
(launched through llm/server.launch_server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)")
_MODELS = b'{"object": "list", "data": [{"id": "mock"}]}'


def completion_payload(text: str) -> bytes:
    """The chat completion every POST gets (usage as vLLM reports it)."""
    return json.dumps(
        {
            "id": "mock",
            "object": "chat.completion",
            "model": "mock",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "total_tokens": 120,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
    ).encode()


def http_response(body: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


class _HTTPConnection(asyncio.Protocol):
    """One keep-alive connection: splits the byte stream into complete requests, in arrival
    order, and hands each to `respond` (HTTP/1.1 without pipelining reorders nothing)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CONTENT_LENGTH.search(self.buf, 0, end)
            total = end + 4 + (int(m.group(1)) if m else 0)
            if len(self.buf) < total:
                return  # the body is still arriving
            is_post = self.buf.startswith(b"POST")
            body = bytes(self.buf[end + 4 : total])
            del self.buf[:total]
            assert self.transport is not None
            self.respond(is_post, body)

    def respond(self, is_post: bool, body: bytes) -> None:
        raise NotImplementedError


class _Connection(_HTTPConnection):
    """The zero-latency server: the same canned reply to every chat request."""

    def __init__(self, chat: bytes, other: bytes) -> None:
        super().__init__()
        self.chat, self.other = chat, other

    def respond(self, is_post: bool, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(self.chat if is_post else self.other)


async def _serve_until_signal(port: int, factory: Callable[[], asyncio.Protocol],
                              banner: str) -> None:
    """Listen on 127.0.0.1:port until SIGTERM/SIGINT; `banner` is the line tests wait for."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(banner, flush=True)
    async with server:
        await stop.wait()


async def serve(port: int, reply_text: str) -> None:
    chat, other = http_response(completion_payload(reply_text)), http_response(_MODELS)
    await _serve_until_signal(port, lambda: _Connection(chat, other),
                              f"mock chat server on 127.0.0.1:{port}")


# ---- the GPU-paced mode ----------------------------------------------------------------------


def scripted_completion(body: dict) -> tuple[str, int, int, tuple[int, ...]]:
    """(reply text, prompt tokens, completion tokens, prompt block hashes) for one chat request
    body: the scripted LLM's reply for its messages and schema, token counts from characters,
    blocks over the role-tagged messages in order (what vLLM's prefix cache would share)."""
    from structmem_gpu.bench.paced_model import TimingModel, prompt_blocks
    from structmem_gpu.llm.scripted import fake_reply
    from structmem_gpu.llm.types import LLMRequest, Message

    rf = body.get("response_format") or {}
    schema = (rf.get("json_schema") or {}).get("schema") or rf.get("schema")
    msgs = tuple(Message(m["role"], m["content"]) for m in body.get("messages", []))
    text = fake_reply(LLMRequest(request_id="m", stage="paced", prompt_version="m",
                                 messages=msgs, schema=schema))
    tm = TimingModel()
    blocks = prompt_blocks([x for m in msgs for x in (m.role, m.content)])
    return text, tm.tokens(sum(len(m.content) for m in msgs)), tm.tokens(len(text)), blocks


class PacedServer:
    """The engine loop plus per-request bookkeeping (times on CLOCK_MONOTONIC, which every
    process on the host shares, so the bench can line them up with the client's)."""

    def __init__(self, model: object) -> None:
        from structmem_gpu.bench.paced_model import Engine

        self.engine = Engine(model)  # type: ignore[arg-type]
        self.model = model
        self.wake = asyncio.Event()
        self.arrivals: list[float] = []
        self.finishes: list[float] = []
        # (real end time, model seconds) of every step, so the bench can split the engine's
        # time between the run's phases (build, evaluation)
        self.step_ends: list[float] = []
        self.step_model_s: list[float] = []
        self.t0 = time.monotonic()

    def submit(self, body: bytes, reply: asyncio.Future) -> None:
        from structmem_gpu.bench.paced_model import Seq

        self.arrivals.append(time.monotonic())
        text, p_tok, c_tok, blocks = scripted_completion(json.loads(body))
        self.engine.submit(Seq((reply, text, p_tok, c_tok), p_tok, c_tok, blocks=blocks))
        self.wake.set()

    async def run(self) -> None:
        scale = float(self.model.time_scale)  # type: ignore[attr-defined]
        due = time.monotonic()
        while True:
            if not self.engine.held():
                self.wake.clear()
                await self.wake.wait()
                due = time.monotonic()  # idle time is not owed to the model
            dt, done = self.engine.step()
            due = max(due, time.monotonic() - 0.05) + dt / scale  # keep pace; never bank >50 ms
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.monotonic()
            if dt > 0:
                self.step_ends.append(now)
                self.step_model_s.append(dt)
            for s in done:
                fut, text, p_tok, c_tok = s.ident
                self.finishes.append(now)
                if not fut.done():
                    fut.set_result(http_response(
                        _paced_payload(text, p_tok, c_tok, s.cached_tokens)))

    def stats(self) -> dict:
        e = self.engine
        return {"model": dict(vars(self.model)), "model_time_s": e.model_time_s, "steps": e.steps,
                "saturated_model_s": e.saturated_s, "decoded_tokens": e.decoded_tokens,
                "prefill_tokens": e.prefill_tokens, "cached_tokens": e.cached_tokens,
                "arrivals": self.arrivals, "finishes": self.finishes,
                "step_ends": self.step_ends, "step_model_s": self.step_model_s}


def _paced_payload(text: str, p_tok: int, c_tok: int, cached: int) -> bytes:
    return json.dumps({
        "id": "paced", "object": "chat.completion", "model": "mock",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": p_tok, "completion_tokens": c_tok,
                  "total_tokens": p_tok + c_tok, "prompt_tokens_details": {"cached_tokens": cached}},
    }).encode()


class _PacedConnection(_HTTPConnection):
    """A chat request goes to the paced engine; its reply is written when the engine's
    simulated step finishes it (replies stay in request order on a connection)."""

    def __init__(self, server: PacedServer, other: bytes) -> None:
        super().__init__()
        self.server, self.other = server, other

    def respond(self, is_post: bool, body: bytes) -> None:
        assert self.transport is not None
        if not is_post:
            self.transport.write(self.other)
            return
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(self._send)
        self.server.submit(body, fut)

    def _send(self, fut: asyncio.Future) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(fut.result())


async def serve_paced(port: int, model: object, stats_path: Path | None) -> None:
    paced = PacedServer(model)
    engine = asyncio.create_task(paced.run())
    await _serve_until_signal(port, lambda: _PacedConnection(paced, http_response(_MODELS)),
                              f"paced mock chat server on 127.0.0.1:{port} ({model})")
    engine.cancel()
    if stats_path is not None:
        tmp = stats_path.with_name(stats_path.name + ".tmp")
        tmp.write_text(json.dumps(paced.stats()), encoding="utf-8")
        tmp.replace(stats_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--reply", type=Path, default=None, help="file holding the reply content")
    ap.add_argument("--paced", action="store_true", help="GPU-paced scripted replies")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--no-prefix-caching", action="store_true",
                    help="paced: charge every prompt token (vLLM --no-enable-prefix-caching)")
    ap.add_argument("--stats", type=Path, default=None, help="paced: stats file written on exit")
    ap.add_argument("--engine", default="bf16",
                    help="paced: the engine played (bench/paced_model.py ENGINES)")
    args = ap.parse_args(argv)
    if args.paced:
        from structmem_gpu.bench.paced_model import engine_model

        model = engine_model(args.engine, max_num_seqs=args.max_num_seqs,
                             time_scale=args.time_scale, prefix_caching=not args.no_prefix_caching)
        asyncio.run(serve_paced(args.port, model, args.stats))
        return 0
    if args.reply is None:
        ap.error("--reply is required without --paced")
    asyncio.run(serve(args.port, args.reply.read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
