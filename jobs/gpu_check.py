"""GPU smoke check, the first thing to run on a GPU node, in under 5 minutes
(docs/performance.md "On a GPU node").

    python jobs/gpu_check.py                         # encoder, plan, faiss, vllm parts
    python jobs/gpu_check.py --model /models/Qwen2.5-0.5B-Instruct embedder=qwen3_embedding_0_6b
    make gpu-check

Each part prints one line, or `skipped (why)` when its package or device is absent; key=value
arguments are Hydra overrides of conf/ (the embedder the encoder part loads, gpu.memory_gb ...).
Exit code 1 when a part that ran failed. Logic: structmem_gpu/bench/gpu_check.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python jobs/gpu_check.py` from a clean clone
    sys.path.insert(0, str(ROOT))

from structmem_gpu.bench.gpu_check import SMALL_MODEL, run_checks  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=SMALL_MODEL, help="small model for the vLLM part (HF id or folder)")
    p.add_argument("--texts", type=int, default=20_000, help="texts the encoder part embeds")
    p.add_argument("overrides", nargs="*", help="Hydra overrides (key=value) of conf/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_checks(model=args.model, texts=args.texts, overrides=args.overrides)


if __name__ == "__main__":
    sys.exit(main())
