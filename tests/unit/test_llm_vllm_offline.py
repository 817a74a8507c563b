"""In-process vLLM backend: wiring checked against a stand-in `vllm` package (CPU), and the
real engine under the gpu marker (needs vllm + CUDA + STRUCTMEM_VLLM_TEST_MODEL)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from structmem_gpu.llm.factory import open_llm
from structmem_gpu.llm.types import LLMRequest, Message, Sampling

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

FAKE_VLLM = textwrap.dedent(
    """
    # Stand-in for the vllm 0.33 offline API surface this project uses.
    import json
    from types import SimpleNamespace
    CHATS = []
    ENGINES = []

    class SamplingParams:
        def __init__(self, temperature, top_p, max_tokens, seed, structured_outputs=None):
            self.__dict__.update(locals())

    class LLM:
        def __init__(self, model, **kw):
            ENGINES.append((model, kw))

        def chat(self, conversations, sampling_params, use_tqdm, chat_template_kwargs=None):
            CHATS.append((conversations, sampling_params, chat_template_kwargs))
            outs = []
            for conv, sp in zip(conversations, sampling_params):
                last = conv[-1]["content"]
                if sp.structured_outputs is None:
                    text = "free " + last
                elif last.isdigit() and int(last) % 2 == 0:
                    text = "not json"          # even numbers need a repair
                else:
                    text = json.dumps({"n": len(conv)})
                outs.append(SimpleNamespace(
                    prompt_token_ids=[0] * 10, num_cached_tokens=6,
                    outputs=[SimpleNamespace(text=text, token_ids=[1, 2, 3], finish_reason="stop")]))
            return outs
    """
)
FAKE_SP = textwrap.dedent(
    """
    class StructuredOutputsParams:
        def __init__(self, json=None, **kw):
            self.json = json
    """
)


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("the real vllm is installed; the stand-in would shadow it")
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKE_VLLM)
    (pkg / "sampling_params.py").write_text(FAKE_SP)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__("vllm")
    for name in ("vllm", "vllm.sampling_params"):
        sys.modules.pop(name, None)


def reqs() -> list[LLMRequest]:
    out = [
        LLMRequest(
            request_id=f"r{i}",
            stage="extract",
            prompt_version="t/1",
            messages=(Message("user", str(i)),),
            schema=SCHEMA,
            sampling=Sampling(max_tokens=16, seed=7),
        )
        for i in range(4)
    ]
    out.append(
        LLMRequest(
            request_id="free",
            stage="answer",
            prompt_version="t/1",
            messages=(Message("user", "hello"),),
        )
    )
    return out


def test_vllm_not_imported_by_package() -> None:
    import structmem_gpu.llm
    import structmem_gpu.llm.factory
    import structmem_gpu.llm.vllm_offline  # noqa: F401

    assert "vllm" not in sys.modules or "fake" in repr(sys.modules["vllm"])


def test_one_chat_call_plus_one_repair_round(fake_vllm: Any, tmp_path: Path) -> None:
    cfg = {
        "backend": "vllm_offline",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "served_name": "qwen",
        "max_model_len": 4096,
        "progress": False,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with open_llm(cfg, log_dir=tmp_path, cache_dir=tmp_path / "cache") as llm:
        out = llm.generate(reqs())
        again = llm.generate(reqs())
    [(model, kw)] = fake_vllm.ENGINES
    assert model == "Qwen/Qwen2.5-7B-Instruct"
    assert kw["max_model_len"] == 4096 and kw["generation_config"] == "vllm" and kw["seed"] == 0
    first, repair = fake_vllm.CHATS  # the whole list in one call, then the repairs together
    assert len(first[0]) == 5 and len(repair[0]) == 2
    assert first[2] == {"enable_thinking": False}
    sps = first[1]
    assert sps[0].structured_outputs.json == SCHEMA and sps[4].structured_outputs is None
    assert (sps[0].max_tokens, sps[0].seed, sps[0].temperature) == (16, 7, 0.0)
    assert [r.request_id for r in out] == ["r0", "r1", "r2", "r3", "free"]
    assert [r.attempts for r in out] == [2, 1, 2, 1, 1]
    assert all(r.parse_ok for r in out)
    assert out[1].data == {"n": 1} and out[0].data == {"n": 3}  # repaired: 3 messages
    assert (out[1].prompt_tokens, out[1].completion_tokens, out[1].cached_tokens) == (10, 3, 6)
    assert out[4].text == "free hello"
    assert all(r.cache_hit for r in again) and len(fake_vllm.CHATS) == 2


def _vllm_gpu_ready() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed"
    if not os.environ.get("STRUCTMEM_VLLM_TEST_MODEL"):
        return "set STRUCTMEM_VLLM_TEST_MODEL to a small local HF model folder"
    import torch

    return None if torch.cuda.is_available() else "no CUDA device"


@pytest.mark.gpu
def test_real_engine_structured_output(tmp_path: Path) -> None:
    reason = _vllm_gpu_ready()
    if reason:
        pytest.skip(reason)
    cfg = {
        "backend": "vllm_offline",
        "model": os.environ["STRUCTMEM_VLLM_TEST_MODEL"],
        "served_name": "test",
        "max_model_len": 2048,
        "gpu_memory_utilization": 0.5,
        "progress": False,
    }
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    rs = [
        LLMRequest(
            request_id=f"r{i}",
            stage="t",
            prompt_version="t/1",
            schema=schema,
            messages=(Message("user", f"Name city number {i} as JSON."),),
            sampling=Sampling(max_tokens=32),
        )
        for i in range(8)
    ]
    with open_llm(cfg, log_dir=tmp_path, cache_dir=None) as llm:
        out = llm.generate(rs)
    assert [r.request_id for r in out] == [r.request_id for r in rs]
    assert sum(r.parse_ok for r in out) >= 6
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in out)
    assert all(json.loads(r.text) for r in out if r.parse_ok)
