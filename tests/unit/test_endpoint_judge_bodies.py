"""The endpoint judge presets' request bodies against OpenAI's rules for structured output.

OpenAI refuses a `json_schema` response format with `"strict": true` unless every object of
the schema sets `additionalProperties: false` and lists every property in `required`; its
JSON mode (`{"type": "json_object"}`, what the references' judges send: mem0's and LightMem's
llm_judge.py) takes no schema and needs the word "json" in the messages. Every preset in
conf/judge whose llm is an external endpoint sends a body these rules accept, on both
benchmarks' paper-protocol judge requests (with the official texts where the checkouts are
configured, else ours).
"""

from __future__ import annotations

from typing import Any

import pytest

from structmem_gpu.config.job import JobConfig
from structmem_gpu.data.categories import LOCOMO_ADVERSARIAL
from structmem_gpu.eval.judge import JudgeItem, JudgeSettings, build_request, official_judges
from structmem_gpu.llm.backends import backend
from structmem_gpu.llm.client import request_body
from structmem_gpu.llm.factory import llm_settings
from structmem_gpu.llm.structured import response_format
from structmem_gpu.llm.types import Sampling
from tests.fixtures.pipeline import compose_cfg, options


def strict_problems(schema: Any, path: str = "$") -> list[str]:
    """What OpenAI's strict mode rejects in `schema` (objects only; nested schemas walked)."""
    out: list[str] = []
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            props = schema.get("properties", {})
            if schema.get("additionalProperties") is not False:
                out.append(f"{path}: additionalProperties must be false")
            if set(schema.get("required", [])) != set(props):
                out.append(f"{path}: every property must be required")
        for key, sub in schema.items():
            if key == "properties":
                for name, p in sub.items():
                    out += strict_problems(p, f"{path}.{name}")
            elif key in ("items", "anyOf", "$defs", "definitions"):
                subs = sub if isinstance(sub, list) else (
                    list(sub.values()) if key in ("$defs", "definitions") else [sub])
                for i, p in enumerate(subs):
                    out += strict_problems(p, f"{path}.{key}[{i}]")
    return out


def openai_problems(body: dict[str, Any]) -> list[str]:
    rf = body.get("response_format")
    if rf is None:
        return []
    if rf["type"] == "json_object":
        words = " ".join(str(m["content"]) for m in body["messages"]).lower()
        return ([f"json_object takes no other key: {sorted(set(rf) - {'type'})}"]
                if set(rf) != {"type"} else []) + ([] if "json" in words else
                                                   ["JSON mode needs 'json' in the messages"])
    if rf["type"] == "json_schema":
        js = rf["json_schema"]
        return strict_problems(js["schema"]) if js.get("strict") else []
    return [f"unknown response_format type {rf['type']!r}"]


def test_the_validator_refuses_what_openai_refuses() -> None:
    loose = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    assert openai_problems({"messages": [], "response_format": response_format(loose, "vllm")})
    tight = {**loose, "additionalProperties": False}
    assert not openai_problems({"messages": [], "response_format": response_format(tight, "vllm")})
    assert openai_problems({"messages": [{"role": "user", "content": "say hi"}],
                            "response_format": response_format(loose, "llamacpp")})
    assert not openai_problems({"messages": [{"role": "user", "content": "reply in JSON"}],
                                "response_format": response_format(loose, "json_mode")})


ENDPOINTS = [n for n in options("judge")
             if (compose_cfg([f"judge={n}"]).judge.llm or {}).get("backend") == "external"]


def test_the_endpoint_presets_are_found() -> None:
    assert {"gpt_4o_endpoint", "gpt_4o_mini_endpoint", "deepseek_v3_2_endpoint"} <= set(ENDPOINTS)


@pytest.mark.parametrize("name", ENDPOINTS)
def test_endpoint_judge_bodies_follow_openais_rules(name: str) -> None:
    job = JobConfig.from_cfg(compose_cfg([f"judge={name}"]))
    s = job.settings(JudgeSettings)
    llm = llm_settings(s.llm)
    flavor = backend(llm.backend).flavor(llm)
    texts = official_judges(job)
    samp = Sampling(temperature=s.temperature, max_tokens=s.max_tokens)
    items = [JudgeItem("q1", "conv-1", "When did she move?", "May 2023", 2, "temporal", False,
                       "in May 2023", "in May 2023"),
             JudgeItem("q2", "conv-1", "Where?", "Paris", LOCOMO_ADVERSARIAL, "adversarial",
                       False, "Paris", "Paris")]
    for item in items:
        req = build_request(item, name, samp, s.protocol, texts)
        body = request_body(req, served_name=str(llm.served_name), flavor=flavor)
        assert not openai_problems(body), (name, item.category, openai_problems(body))


def test_json_mode_replies_are_keyed_apart() -> None:
    """JSON mode does not hold decoding to the schema, so its replies are others: the flavor
    enters the response-cache key; the schema-holding flavors add nothing (old keys valid)."""
    from structmem_gpu.llm.client import HTTPBackend

    def params(flavor: str) -> dict[str, Any]:
        return HTTPBackend(base_url="http://x/v1", served_name="m", model_id="m|m|",
                           flavor=flavor).cache_params

    assert params("vllm") == params("llamacpp") == {}
    assert params("json_mode") == {"response_format": "json_object"}
