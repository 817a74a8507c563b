"""requests.parquet rows: schema conformance, cache-hit rows, failures kept."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.request_log import to_frame
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.types import LLMRequest, Message
from structmem_gpu.core.schemas import REQUESTS

SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def reqs() -> list[LLMRequest]:
    return [
        LLMRequest(
            request_id=f"extract:{i}",
            stage="extract",
            conv_id="conv-26" if i else None,
            prompt_version="factual/1",
            messages=(Message("user", f"turn {i}"),),
            schema=SCHEMA,
        )
        for i in range(3)
    ]


def test_frame_conforms_and_keeps_failures(tmp_path: Path) -> None:
    llm = CachedBackend(
        ScriptedLLM(
            {"extract": lambda r: "bad" if "turn 2" in r.messages[0].content else '{"a": "x"}'}
        ),
        ResponseCache(tmp_path),
    )
    rs = reqs()
    df = to_frame(rs, llm.generate(rs))
    assert dict(df.schema) == REQUESTS
    assert df["request_id"].to_list() == ["extract:0", "extract:1", "extract:2"]
    assert df["parse_ok"].to_list() == [True, True, False]
    assert df["attempts"].to_list() == [1, 1, 2]
    assert df["conv_id"].to_list() == [None, "conv-26", "conv-26"]
    assert df["error"][2] and df["error"][0] is None
    assert df["model"].to_list() == ["scripted"] * 3
    assert df["cached_tokens"].null_count() == 3
    again = to_frame(rs, llm.generate(rs))
    assert again["cache_hit"].to_list() == [True, True, False]
    assert again["attempts"].to_list() == [0, 0, 2]
    assert again["prompt_tokens"].to_list()[:2] == df["prompt_tokens"].to_list()[:2]
    path = tmp_path / "requests.parquet"
    again.write_parquet(path)
    assert pl.read_parquet_schema(path) == REQUESTS


def test_empty_frame_has_schema() -> None:
    assert dict(to_frame([], []).schema) == REQUESTS


def test_mismatched_results_rejected() -> None:
    rs = reqs()
    out = ScriptedLLM().generate(rs)
    with pytest.raises(ValueError, match="does not belong"):
        to_frame(rs, [replace(out[0], request_id="other"), *out[1:]])
    with pytest.raises(ValueError, match="3 requests but 2"):
        to_frame(rs, out[:2])
