"""Which questions a run answers: `benchmark.categories` (null = all categories)."""

from __future__ import annotations

import polars as pl

from structmem_gpu.config.job import JobConfig


def selected_questions(job: JobConfig, questions: pl.DataFrame) -> pl.DataFrame:
    """Questions of the configured categories, in their table order."""
    cats = job.root.benchmark.categories
    if cats is None:
        return questions
    return questions.filter(pl.col("category").is_in([int(c) for c in cats]))
