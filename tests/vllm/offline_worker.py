"""Run one stage's requests through the vllm_offline backend (LLM.chat) in the vLLM env.

    <vllm python> tests/vllm/offline_worker.py requests.json llm_cfg.json results.json

Runs under the vLLM CPU environment (.venv-vllm), which has vLLM but not the rest of the
project's stack, so the test builds the requests in its own process and hands them over as
JSON; this worker builds the backend through the factory (the same code path as
`llm.backend=vllm_offline`) and writes one result per request, in order.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main() -> int:
    from structmem_gpu.llm import factory
    from structmem_gpu.llm.types import LLMRequest, Message, Sampling

    reqs_path, cfg_path, out_path = (Path(a) for a in sys.argv[1:4])
    reqs = [
        LLMRequest(
            request_id=r["request_id"],
            stage=r["stage"],
            messages=tuple(Message(**m) for m in r["messages"]),
            prompt_version=r["prompt_version"],
            sampling=Sampling(**r["sampling"]),
            schema=r["schema"],
            conv_id=r["conv_id"],
        )
        for r in json.loads(reqs_path.read_text())
    ]
    c = factory.llm_settings(json.loads(cfg_path.read_text()))
    backend = factory._offline_backend(c)
    try:
        results = backend.generate(reqs, desc="offline")
    finally:
        backend.close()
    out = [dataclasses.asdict(r) for r in results]
    out_path.write_text(json.dumps({"results": out, "engine_calls": backend.calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
