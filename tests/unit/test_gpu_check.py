"""jobs/gpu_check.py: every part prints one line; a part whose package or device is absent
says `skipped` and why (on a CPU machine: all of them, in seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from structmem_gpu.bench import gpu_check

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e  # e2e: job subprocesses
def test_cli_prints_one_line_per_part_and_skips_what_is_absent() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "jobs" / "gpu_check.py")],
                          capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    assert [ln.split()[0] for ln in lines[:4]] == ["encoder", "plan", "faiss", "vllm"], done.stdout
    status = {ln.split()[0]: ln.split()[1] for ln in lines[:4]}
    cuda = gpu_check.cuda_missing()
    if cuda is not None:
        assert lines[0] == f"encoder  skipped  {cuda}"
        assert lines[1] == f"plan     skipped  needs the encoder on CUDA ({cuda})"
        assert status["vllm"] == "skipped"
    faiss = gpu_check.faiss_missing()
    if faiss is not None:
        assert lines[2] == f"faiss    skipped  {faiss}"
    vllm = gpu_check.vllm_missing()
    if vllm is not None:
        assert lines[3] == f"vllm     skipped  {vllm}"
    ok = sum(s == "ok" for s in status.values())
    failed = sum(s == "failed" for s in status.values())
    assert lines[4] == f"gpu check: {ok} ok, {failed} failed, {4 - ok - failed} skipped"
    assert done.returncode == (1 if failed else 0) and "Traceback" not in done.stderr


def test_a_failing_part_is_its_line_and_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> gpu_check.Outcome:
        raise OSError("device lost")

    monkeypatch.setattr(gpu_check, "check_faiss", broken)
    lines: list[str] = []
    assert gpu_check.run_checks(out=lines.append) == 1
    assert "faiss    failed   OSError: device lost" in lines
    assert ", 1 failed, " in lines[-1]


@pytest.mark.gpu
@pytest.mark.skipif(gpu_check.cuda_missing() is not None, reason="needs CUDA torch")
def test_encoder_and_plan_parts_on_cuda() -> None:
    enc, plan = gpu_check.check_encoder([], texts=2000)
    assert enc.status == "ok" and "embeddings/s" in enc.line
    assert plan.status == "ok", plan.line
