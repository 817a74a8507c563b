"""The pieces behind llm=vllm_cpu and the client ceiling, without a model: the vLLM schema
flavour, the module entry point, the GGUF conversion step, the cache's writer thread and the
zero-latency mock server the `client` bench part measures against."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from structmem_gpu.core.errors import ConfigError, StructMemError
from structmem_gpu.llm.cache import CachedBackend, ResponseCache
from structmem_gpu.llm.convert import ensure_hf_model
from structmem_gpu.llm.factory import resolve_config
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.server import vllm_command
from structmem_gpu.llm.structured import response_format, vllm_schema
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from structmem_gpu.prompts import extraction_schema


def test_vllm_schema_drops_only_the_enum_that_spells_out_the_bounds() -> None:
    schema = extraction_schema(4, max_items=2, max_item_chars=10)
    turn = vllm_schema(schema)["properties"]["entries"]["items"]["properties"]["turn"]
    assert turn == {"type": "integer", "minimum": 1, "maximum": 4}
    assert schema["properties"]["entries"]["items"]["properties"]["turn"]["enum"] == [1, 2, 3, 4]
    other = {"type": "integer", "minimum": 1, "maximum": 4, "enum": [1, 3]}  # a real choice
    assert vllm_schema(other) == other
    labels = {"type": "string", "enum": ["A", "B"]}
    assert vllm_schema({"properties": {"label": labels}}) == {"properties": {"label": labels}}
    assert response_format(schema, "llamacpp")["schema"] == schema
    assert response_format(schema, "vllm")["json_schema"]["schema"] == vllm_schema(schema)


def test_module_entry_point_with_another_interpreter() -> None:
    argv = vllm_command("/m", served_name="s", python="/env/bin/python", entrypoint="module")(8)
    assert argv[:5] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                        "--model", "/m"]
    assert argv[argv.index("--generation-config") + 1] == "vllm"
    assert argv[argv.index("--port") + 1] == "8"
    serve = vllm_command("/m", served_name="s", python="/env/bin/python")(8)
    assert serve[:3] == ["/env/bin/vllm", "serve", "/m"]
    with pytest.raises(ConfigError, match="vllm_entrypoint"):
        vllm_command("/m", served_name="s", entrypoint="cli")


def test_new_llm_keys_are_checked() -> None:
    c = resolve_config({"backend": "vllm_server", "model": "/m", "server_env": {"A": 2}})
    assert c["server_env"] == {"A": "2"} and c["server_python"] is None
    assert c["vllm_entrypoint"] == "serve" and c["convert_from_gguf"] is None
    with pytest.raises(ConfigError, match="vllm_entrypoint"):
        resolve_config({"backend": "vllm_server", "vllm_entrypoint": "bogus"})


def _fake_python(tmp_path: Path, code: int = 0) -> Path:
    """An 'interpreter' that plays the converter: argv = -m MODULE GGUF OUT."""
    script = tmp_path / "fake-python"
    script.write_text(
        "#!/bin/sh\n"
        f'echo run >> "{tmp_path}/runs"\n'
        f"[ {code} -ne 0 ] && {{ echo boom >&2; exit {code}; }}\n"
        'echo "{}" > "$4/config.json"; echo "$3" > "$4/conversion.done"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_conversion_runs_once_and_lands_atomically(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    target = tmp_path / "models" / "m-hf"
    py = str(_fake_python(tmp_path))
    assert ensure_hf_model(target, gguf, python=py) == target
    assert (target / "config.json").is_file() and oct(target.stat().st_mode)[-3:] == "755"
    ensure_hf_model(target, gguf, python=py)  # already converted: not run again
    assert (tmp_path / "runs").read_text().count("run") == 1
    assert [p.name for p in target.parent.iterdir()] == ["m-hf"]  # no temporary left


def test_failed_conversion_leaves_nothing(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    target = tmp_path / "models" / "m-hf"
    with pytest.raises(StructMemError, match="boom"):
        ensure_hf_model(target, gguf, python=str(_fake_python(tmp_path, code=3)))
    assert list(target.parent.iterdir()) == []
    with pytest.raises(ConfigError, match="not a file"):
        ensure_hf_model(target, tmp_path / "missing.gguf", python="/bin/false")


def _req(i: int) -> LLMRequest:
    return LLMRequest(request_id=f"r{i}", stage="t", prompt_version="t/1",
                      messages=(Message("user", f"message {i}"),), sampling=Sampling())


def test_cache_writer_commits_everything_before_generate_returns(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    CachedBackend(ScriptedLLM(), cache).generate([_req(i) for i in range(300)])
    # Another connection (another process) sees every row once generate has returned.
    assert len(ResponseCache(tmp_path)) == 300
    cache.close()
    with pytest.raises(RuntimeError, match="closed"):
        cache.put("k", _req(0), CachedBackend(ScriptedLLM(), ResponseCache(tmp_path / "b"))
                  .generate([_req(0)])[0])


def test_cache_writer_failure_surfaces_at_flush(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path)
    [res] = ScriptedLLM().generate([_req(0)])
    def refuse(records: object) -> None:
        raise OSError(28, "No space left on device")

    cache._store.publish = refuse  # type: ignore[method-assign]  # every later write fails
    cache.put("k", _req(0), res)
    with pytest.raises(RuntimeError, match="write failed"):
        cache.flush()
    cache.flush()  # reported once


def test_mock_server_answers_the_real_client(tmp_path: Path) -> None:
    from structmem_gpu.bench.client_bench import _point, mock_server, verdict
    from structmem_gpu.llm.scripted import fake_reply

    schema = extraction_schema(2, max_items=2, max_item_chars=20)
    reqs = [LLMRequest(request_id=f"m{i}", stage="extract", prompt_version="t/1",
                       messages=(Message("user", f"turn {i} text"),), schema=schema)
            for i in range(50)]
    with mock_server(fake_reply(reqs[0]), tmp_path / "logs") as srv:
        rows = [_point(srv.base_url, reqs, k, tmp_path / f"c{k}" if cache else None)
                for cache in (False, True) for k in (1, 8)]
    assert [(r["in_flight"], r["cache"]) for r in rows] == [(1, False), (8, False), (1, True),
                                                            (8, True)]
    assert all(r["requests"] == 50 and r["errors"] == 0 for r in rows)
    assert all(r["requests_per_s"] > 0 and r["client_cpu_ms_per_request"] > 0 for r in rows)
    assert len(ResponseCache(tmp_path / "c8")) == 50
    v = verdict(rows)
    assert v["meets_target"] is None  # no 256 point
    assert v["max_cpu_ratio_to_x8_no_cache"] >= 1.0


def test_verdict_on_hand_made_rows() -> None:
    from structmem_gpu.bench.client_bench import verdict

    def row(k: int, cache: bool, rps: float, cpu: float) -> dict:
        return {"in_flight": k, "cache": cache, "requests_per_s": rps,
                "client_cpu_ms_per_request": cpu}

    rows = [row(8, False, 2000, 0.4), row(256, False, 1500, 0.5), row(1024, False, 1200, 0.59),
            row(8, True, 1500, 0.5), row(256, True, 1200, 0.6)]
    v = verdict(rows)
    assert v["max_cpu_ratio_to_x8_no_cache"] == pytest.approx(1.475)
    assert v["requests_per_s_at_256_no_cache"] == 1500 and v["meets_target"] is True
    v = verdict([*rows[:2], row(1024, False, 900, 0.61), *rows[3:]])
    assert v["meets_target"] is False  # 0.61 / 0.4 > 1.5


def test_openai_is_no_longer_a_dependency() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"openai' not in text and '"aiohttp' in text
    assert os.path.exists(Path(__file__).resolve().parents[2] / "conf/llm/vllm_cpu.yaml")
