"""The LLM layer against a real llama.cpp server with SmolLM2-135M (CPU).

Budget: about 34 uncached chat requests in total, all with tiny max_tokens. Asserts structure,
order, counts, caching and process lifecycle, never the quality of a 135M model's answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from structmem_gpu.llm.factory import open_llm
from structmem_gpu.llm.request_log import to_frame
from structmem_gpu.llm.server import ServerError, launch_server, llamacpp_command
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message, Sampling
from structmem_gpu.core.schemas import REQUESTS
from tests.fixtures.llm import LlamaServer, llamacpp_cfg, llamacpp_missing, register_server_log

pytestmark = [
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(300),
]

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}},
    "required": ["city"],
    "additionalProperties": False,
}


def free_text(i: int, max_tokens: int = 4) -> LLMRequest:
    return LLMRequest(
        request_id=f"itest:{i}",
        stage="itest",
        prompt_version="itest/1",
        messages=(Message("user", f"Count: {i}."),),
        sampling=Sampling(max_tokens=max_tokens),
    )


def gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split()[2] == "Z":
            return True
        time.sleep(0.05)
    return False


# --- lifecycle (no chat requests) ---------------------------------------------------------


def test_start_and_stop(tmp_path: Path) -> None:
    cmd = llamacpp_command(None, served_name="smollm2", n_ctx=2048, n_threads=1)
    t = time.monotonic()
    with launch_server(
        cmd, ready_path="/v1/models", log_dir=tmp_path, name="start_stop", startup_timeout_s=60
    ) as srv:
        ready_s = time.monotonic() - t
        models = httpx.get(srv.base_url + "/models", trust_env=False).json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        pid = srv.pid
    assert gone(pid)
    assert ready_s < 60
    print(f"llama.cpp + SmolLM2 ready in {ready_s:.1f} s")


def test_missing_model_fails_fast_with_log_tail(tmp_path: Path) -> None:
    cmd = llamacpp_command(tmp_path / "nonexistent.gguf", served_name="x", n_threads=1)
    t = time.monotonic()
    with (
        pytest.raises(ServerError) as e,
        launch_server(
            cmd, ready_path="/v1/models", log_dir=tmp_path, name="bad", startup_timeout_s=60
        ),
    ):
        pass
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert "exited with code" in msg and "bad.server.log" in msg
    assert "nonexistent.gguf" in msg  # the tail shows the server's own complaint


def test_server_stopped_after_exception_in_context(tmp_path: Path) -> None:
    pid = None
    cfg = llamacpp_cfg(n_ctx=2048, n_threads=1)
    with (
        pytest.raises(RuntimeError, match="stage crashed"),
        open_llm(cfg, log_dir=tmp_path, cache_dir=None, name="crash") as llm,
    ):
        srv: Any = llm.server  # type: ignore[attr-defined]
        pid = srv.pid
        assert httpx.get(srv.base_url + "/models", trust_env=False).status_code == 200
        raise RuntimeError("stage crashed")
    assert pid is not None and gone(pid)


def test_server_dies_with_sigkilled_job(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(f"""
        import time
        from pathlib import Path
        from structmem_gpu.llm.factory import open_llm
        cfg = {{"backend": "llamacpp", "n_ctx": 2048, "n_threads": 1, "progress": False}}
        with open_llm(cfg, log_dir=Path({str(tmp_path)!r}), cache_dir=None) as llm:
            Path({str(pidfile)!r}).write_text(str(llm.server.pid))
            time.sleep(300)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(job)], env=env)
    try:
        deadline = time.monotonic() + 90
        while not pidfile.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert pidfile.exists(), "the job never got its server up"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert gone(int(pidfile.read_text())), "llama.cpp server outlived its SIGKILLed job"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pidfile.exists() and not gone(int(pidfile.read_text()), 0.1):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


# --- requests against the session server --------------------------------------------------


def test_batch_order_tokens_and_cache_rerun(llama_server: LlamaServer, tmp_path: Path) -> None:
    """20 requests (16 free text + 4 under a schema) come back in order with token counts; an
    identical rerun is answered from the cache with zero server calls."""
    rs = [free_text(i) for i in range(16)]
    rs += [
        LLMRequest(
            request_id=f"itest:city{i}",
            stage="itest",
            prompt_version="itest/1",
            messages=(Message("user", f"Name city {i} as JSON."),),
            schema=CITY,
            sampling=Sampling(max_tokens=16),
        )
        for i in range(4)
    ]
    before = llama_server.calls()
    t = time.monotonic()
    with open_llm(llama_server.cfg, log_dir=tmp_path, cache_dir=tmp_path / "cache") as llm:
        first = llm.generate(rs, desc="itest")
    wall = time.monotonic() - t
    sent = llama_server.calls() - before
    assert [r.request_id for r in first] == [r.request_id for r in rs]
    assert [r.messages_hash for r in first] == [r.messages_hash() for r in rs]
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in first)
    assert all(r.completion_tokens <= 4 for r in first[:16])
    assert all(r.parse_ok for r in first[:16]) and sum(r.parse_ok for r in first[16:]) >= 3
    assert sent == sum(r.attempts for r in first)
    print(f"20 requests in {wall:.1f} s ({sent} server calls)")

    with open_llm(llama_server.cfg, log_dir=tmp_path, cache_dir=tmp_path / "cache") as llm:
        again = llm.generate(rs, desc="itest-rerun")
    assert llama_server.calls() - before == sent  # zero new server calls
    ok = [(a, b) for a, b in zip(first, again, strict=True) if a.parse_ok]
    assert all(b.cache_hit and b.attempts == 0 for _, b in ok)
    assert all(
        (a.text, a.prompt_tokens, a.completion_tokens)
        == (b.text, b.prompt_tokens, b.completion_tokens)
        for a, b in ok
    )
    df = to_frame(rs, again)
    assert dict(df.schema) == REQUESTS and df.height == 20


def test_schema_valid_json(llama_server: LlamaServer, tmp_path: Path) -> None:
    rs = [
        LLMRequest(
            request_id=f"itest:json{i}",
            stage="itest",
            prompt_version="itest/1",
            messages=(Message("user", f"Where is landmark {i}? Reply as JSON."),),
            schema=CITY,
            sampling=Sampling(max_tokens=20),
        )
        for i in range(2)
    ]
    with open_llm(llama_server.cfg, log_dir=tmp_path, cache_dir=None) as llm:
        out = llm.generate(rs)
    for r in out:
        assert r.parse_ok, r.error
        jsonschema.validate(r.data, CITY)
        assert r.finish_reason == "stop"


def test_repair_then_recorded_failure(llama_server: LlamaServer, tmp_path: Path) -> None:
    """A schema that cannot be satisfied within max_tokens: truncated twice -> parse_ok False,
    attempts 2, recorded (not cached, not dropped)."""
    impossible = {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": 200}},
        "required": ["story"],
    }
    r = LLMRequest(
        request_id="itest:impossible",
        stage="itest",
        prompt_version="itest/1",
        messages=(Message("user", "Tell a story as JSON."),),
        schema=impossible,
        sampling=Sampling(max_tokens=6),
    )
    before = llama_server.calls()
    with open_llm(llama_server.cfg, log_dir=tmp_path, cache_dir=tmp_path / "cache") as llm:
        [res] = llm.generate([r])
        assert len(llm.cache) == 0  # type: ignore[attr-defined]
    assert llama_server.calls() - before == 2
    assert (res.parse_ok, res.attempts, res.finish_reason, res.data) == (False, 2, "length", None)
    assert "cut off" in (res.error or "")
    row = to_frame([r], [res]).row(0, named=True)
    assert (row["parse_ok"], row["attempts"], row["finish_reason"]) == (False, 2, "length")


def test_resume_after_server_killed_mid_batch(llama_server: LlamaServer, tmp_path: Path) -> None:
    """Kill a separate server after 2 results are cached; the rerun (same model, session server)
    re-sends exactly the requests that were lost."""
    rs = [free_text(100 + i) for i in range(6)]
    cache_dir = tmp_path / "cache"
    cfg = llamacpp_cfg(  # max_restarts=0: no replacement server (that is tested elsewhere)
        max_in_flight=1, max_retries=1, retry_backoff_s=0.05, n_ctx=2048, n_threads=1,
        max_restarts=0,
    )
    done: list[LLMResult] = []
    with open_llm(cfg, log_dir=tmp_path, cache_dir=cache_dir, name="doomed") as llm:
        srv: Any = llm.inner.server  # type: ignore[attr-defined]
        register_server_log(srv.log_path)

        def kill_after_two(i: int, res: LLMResult) -> None:
            done.append(res)
            if len(done) == 2:
                os.killpg(srv.pid, signal.SIGKILL)  # the server dies mid-batch
                srv.process.wait(10)

        first = llm.generate(rs, desc="doomed", on_result=kill_after_two)  # type: ignore[call-arg]
    lost = [r.request_id for r in first if not r.parse_ok]
    assert [r.parse_ok for r in first[:2]] == [True, True]
    assert len(lost) == 4 and all(r.finish_reason == "error" for r in first[2:])
    # The backend noticed its server died and failed fast instead of retrying.
    assert all("doomed server exited" in (r.error or "") for r in first[2:])

    before = llama_server.calls()
    with open_llm(llama_server.cfg, log_dir=tmp_path, cache_dir=cache_dir) as llm:
        second = llm.generate(rs, desc="resume")
    assert llama_server.calls() - before == 4  # only the lost ones were re-sent
    assert [r.cache_hit for r in second] == [True, True, False, False, False, False]
    assert all(r.parse_ok for r in second)
