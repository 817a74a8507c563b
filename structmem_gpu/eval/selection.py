"""Which questions a run answers: `benchmark.categories` (null = all categories)."""

from __future__ import annotations

import polars as pl
from omegaconf import DictConfig, OmegaConf


def selected_questions(cfg: DictConfig, questions: pl.DataFrame) -> pl.DataFrame:
    """Questions of the configured categories, in their table order."""
    cats = OmegaConf.select(cfg, "benchmark.categories", default=None)
    if cats is None:
        return questions
    return questions.filter(pl.col("category").is_in([int(c) for c in cats]))
