"""In-process vLLM engine backend: the whole request list in one `LLM.chat` call.

The only module that imports `vllm`, and only when the first batch runs (an import costs ~11 s
and needs the `gpu` extra). Validation and repair are shared with the HTTP path: invalid
replies are re-sent together as a second `LLM.chat` call (structured.run_in_rounds).

    backend = VLLMOfflineBackend(model="Qwen/Qwen2.5-7B-Instruct", served_name="qwen2.5-7b",
                                 model_id="qwen2.5-7b|Qwen/Qwen2.5-7B-Instruct|",
                                 engine_kwargs={"max_model_len": 8192, "seed": 0})
    results = backend.generate(requests, desc="extract")
    backend.close()

Structured output uses `SamplingParams(structured_outputs=StructuredOutputsParams(json=...))`
(vLLM 0.33; the old guided-decoding parameters raise or are ignored: docs/design.md
"Backend notes").
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from structmem_gpu.core import preempt
from structmem_gpu.llm.structured import OnResult, RawReply, run_in_rounds, vllm_schema
from structmem_gpu.llm.types import LLMRequest, LLMResult

logger = logging.getLogger(__name__)


def sampling_params(req: LLMRequest) -> Any:
    """vLLM `SamplingParams` for one request (explicit values, structured output if a schema)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    s = req.sampling
    so = None
    if req.schema is not None:  # integer bounds, not the enum llama.cpp needs (structured.py)
        so = StructuredOutputsParams(json=vllm_schema(dict(req.schema)))
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_tokens,
        seed=s.seed,
        structured_outputs=so,
    )


class VLLMOfflineBackend:
    """`LLMBackend` over an in-process `vllm.LLM` engine (created lazily, freed by close())."""

    def __init__(
        self,
        *,
        model: str,
        served_name: str,
        model_id: str,
        engine_kwargs: Mapping[str, Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        repair_attempts: int = 1,
        progress: bool = True,
        env: Mapping[str, str] | None = None,
        reply_params: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.served_name = served_name
        self.model_id = model_id
        self.engine_kwargs = dict(engine_kwargs or {})
        self.chat_template_kwargs = dict(chat_template_kwargs) if chat_template_kwargs else None
        self.repair_attempts = repair_attempts
        self.progress = progress
        self.calls = 0  # requests handed to the engine (repairs included)
        self.env = dict(env or {})  # llm.server_env: set before vllm loads (e.g. CPU KV space)
        # Reply knobs away from their defaults (config.identity.reply_params): cache key part.
        self.reply_params = dict(reply_params or {})
        self._llm: Any | None = None

    @property
    def cache_params(self) -> dict[str, Any]:
        """As HTTPBackend.cache_params: the chat extras every request carries and the reply
        knobs away from their defaults."""
        extras = {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        return {**extras, **self.reply_params}

    def __repr__(self) -> str:
        return f"VLLMOfflineBackend(model={self.model!r}, model_id={self.model_id!r})"

    def engine(self) -> Any:
        if self._llm is None:
            import os

            for k, v in self.env.items():
                os.environ.setdefault(k, v)  # an explicit environment variable wins
            logger.info("loading vLLM engine for %s with %s", self.model, self.engine_kwargs)
            t = time.monotonic()
            with preempt.interruptible("vLLM engine load"):  # a stop signal ends the load now
                from vllm import LLM

                self._llm = LLM(model=self.model, **self.engine_kwargs)
            logger.info("vLLM engine ready in %.0f s", time.monotonic() - t)
        return self._llm

    def _send(self, reqs: list[LLMRequest]) -> list[RawReply]:
        llm = self.engine()
        self.calls += len(reqs)
        t = time.monotonic()
        outs = llm.chat(
            [[m.as_dict() for m in r.messages] for r in reqs],
            sampling_params=[sampling_params(r) for r in reqs],
            use_tqdm=self.progress,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        # One call: every request's latency is the call's wall time (they all wait for it).
        wall = time.monotonic() - t
        replies = []
        for o in outs:
            c = o.outputs[0]
            replies.append(
                RawReply(
                    text=c.text,
                    finish_reason=str(c.finish_reason or "stop"),
                    prompt_tokens=len(o.prompt_token_ids or []),
                    completion_tokens=len(c.token_ids),
                    cached_tokens=getattr(o, "num_cached_tokens", None),
                    latency_s=wall,
                )
            )
        return replies

    def generate(
        self, requests: Sequence[LLMRequest], *, desc: str = "", on_result: OnResult | None = None
    ) -> list[LLMResult]:
        logger.info("%s: %d requests to the in-process vLLM engine", desc or "llm", len(requests))
        return run_in_rounds(
            requests,
            self._send,
            model=self.model_id,
            repair_attempts=self.repair_attempts,
            on_result=on_result,
        )

    def close(self) -> None:
        """Shut the engine down so its GPU memory can be reused (e.g. by a judge model)."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        # vLLM v1 runs the engine in a child process; shutting its client down ends it and
        # frees the GPU. Older layouts lack the attribute; then garbage collection does it.
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        gc.collect()
