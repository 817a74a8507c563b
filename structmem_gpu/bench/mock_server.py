"""A zero-latency OpenAI-compatible chat server: the `client` bench part's counterpart.

    python -m structmem_gpu.bench.mock_server --port 8123 --reply reply.txt
    # POST /v1/chat/completions -> the same completion (content = reply.txt) for every request
    # GET  anything             -> {"object": "list", "data": [{"id": "mock"}]} (readiness)

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


class _Connection(asyncio.Protocol):
    """One keep-alive connection: answer each complete request in arrival order."""

    def __init__(self, chat: bytes, other: bytes) -> None:
        self.chat, self.other = chat, other
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
            del self.buf[:total]
            assert self.transport is not None
            self.transport.write(self.chat if is_post else self.other)


async def serve(port: int, reply_text: str) -> None:
    chat, other = http_response(completion_payload(reply_text)), http_response(_MODELS)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(chat, other), "127.0.0.1", port, backlog=4096
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"mock chat server on 127.0.0.1:{port}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--reply", type=Path, required=True, help="file holding the reply content")
    args = ap.parse_args(argv)
    asyncio.run(serve(args.port, args.reply.read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
