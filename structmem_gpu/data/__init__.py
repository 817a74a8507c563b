"""Benchmark loaders: every benchmark becomes the same two frames, `turns` and `questions`,
and one row of speakers per conversation (`load_speakers`).

    from structmem_gpu.data import load_benchmark, load_speakers
    turns, questions = load_benchmark("sample", path=None, conversations=None, max_sessions=None)
    speakers = load_speakers("sample", None, turns["conv_id"].unique().to_list())

Names: `locomo` (the real LoCoMo file, CC BY-NC, never vendored: `python jobs/data.py locomo`
downloads and checks it), `longmemeval` (a LongMemEval file; conversations = question ids) and
`sample` (the bundled, invented LoCoMo-format sample; `path` may override it).
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Final

import polars as pl

from structmem_gpu.data.categories import CATEGORY_NAMES, LOCOMO_CATEGORIES, LONGMEMEVAL_TYPES
from structmem_gpu.data.common import display_text
from structmem_gpu.data.locomo import load_locomo, load_locomo_speakers
from structmem_gpu.data.longmemeval import load_longmemeval, longmemeval_speakers
from structmem_gpu.core.errors import ConfigError

__all__ = [
    "BENCHMARKS",
    "CATEGORY_NAMES",
    "LOCOMO_CATEGORIES",
    "LONGMEMEVAL_TYPES",
    "display_text",
    "load_benchmark",
    "load_locomo",
    "load_longmemeval",
    "load_speakers",
    "sample_path",
]

BENCHMARKS: Final = ("locomo", "longmemeval", "sample")
SAMPLE_FILE: Final = "sample_locomo.json"


def sample_path() -> Path:
    """Path of the bundled sample (package data, installed with the wheel)."""
    res = resources.files(__name__).joinpath("sample", SAMPLE_FILE)
    # A regular (non-zip) install gives a real path; loaders and the run manifest need one.
    path = Path(str(res))
    if not path.is_file():
        raise FileNotFoundError(f"bundled sample missing at {path}: reinstall structmem-gpu")
    return path


def load_benchmark(
    name: str,
    path: str | Path | None,
    conversations: Sequence[str] | None,
    max_sessions: int | None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(turns, questions) for benchmark `name`; see `load_locomo` / `load_longmemeval`."""
    if name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {name!r}; expected one of {list(BENCHMARKS)}")
    if name == "sample":
        return load_locomo(path if path is not None else sample_path(), conversations, max_sessions)
    if path is None:
        how = (
            "`python jobs/data.py locomo` (or set STRUCTMEM_LOCOMO_PATH)"
            if name == "locomo"
            else "`python jobs/data.py longmemeval_s`"
        )
        raise ConfigError(
            f"benchmark.path is required for benchmark={name}; download it with {how}"
        )
    if name == "locomo":
        return load_locomo(path, conversations, max_sessions)
    return load_longmemeval(path, conversations, max_sessions)


def load_speakers(
    name: str, path: str | Path | None, conversations: Sequence[str]
) -> pl.DataFrame:
    """schemas.CONVERSATIONS of `conversations` (ids `load_benchmark` gave) of benchmark `name`:
    LoCoMo and the sample: each record's speaker_a / speaker_b; LongMemEval: its roles."""
    if name not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark {name!r}; expected one of {list(BENCHMARKS)}")
    if name == "longmemeval":
        return longmemeval_speakers(conversations)
    if path is None and name == "sample":
        path = sample_path()
    if path is None:
        raise ConfigError(f"benchmark.path is required for benchmark={name}")
    return load_locomo_speakers(path, conversations)
