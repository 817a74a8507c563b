"""The store QA reads after the offline update (`update.read`; update.py).

    pre   the store before the update (the reference script's default QA directory,
          ./qdrant_pre_update, which also holds the syntheses): entry_updates is ignored
    post  the updated store (the reference README's QA command, ./qdrant_post_update):
          deleted entries leave retrieval, updated entries show their new text under their
          old vector (never re-embedded); syntheses only with update.post_syntheses=true
          (the reference's post store has none)

retrieve (which entries and syntheses can be found) and the StructMem / flat readers (which
text an entry shows) apply it; both fingerprint `view_fingerprint`, None for `pre`, so runs
that read the pre store keep their fingerprints.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from structmem_gpu.config.job import JobConfig
from structmem_gpu.core.errors import ConfigError
from structmem_gpu.methods.structmem.update import READS, UpdateSettings

__all__ = ["READS", "deleted_ids", "keeps_syntheses", "qa_entries", "reads_post", "view_fingerprint"]


def reads_post(job: JobConfig) -> bool:
    """update.read=post (UpdateSettings checks it). A job whose `update` node lacks `read`
    (methods without the update stage; debug=ci's budget-only node) reads the pre store."""
    if not job.has("update.read"):
        return False
    return job.settings(UpdateSettings).read == "post"


def keeps_syntheses(job: JobConfig) -> bool:
    """Whether QA may retrieve syntheses (always for pre; post: update.post_syntheses)."""
    if not reads_post(job):
        return True
    return job.settings(UpdateSettings).post_syntheses


def view_fingerprint(job: JobConfig) -> Any:
    """Fingerprint material of the QA view: None for pre (unchanged fingerprints)."""
    return None if not reads_post(job) else {"update.read": "post",
                                             "update.post_syntheses": keeps_syntheses(job)}


def _require(updates: pl.DataFrame | None) -> pl.DataFrame:
    if updates is None:
        raise ConfigError(
            "update.read=post reads the store after the offline update, but this run has no "
            "entry_updates table: list `update` in method.stages (experiment="
            "structmem_locomo_reference_code does) or set update.read=pre"
        )
    return updates


def deleted_ids(job: JobConfig, updates: pl.DataFrame | None) -> set[str]:
    """Entry ids QA must not retrieve (none for pre)."""
    if not reads_post(job):
        return set()
    u = _require(updates)
    return set(u.filter(pl.col("decision") == "delete")["entry_id"].to_list())


def qa_entries(job: JobConfig, entries: pl.DataFrame, updates: pl.DataFrame | None) -> pl.DataFrame:
    """`entries` as QA reads them: for post, deleted rows dropped and updated texts replaced
    (ids, times and every other column unchanged)."""
    if not reads_post(job):
        return entries
    u = _require(updates)
    gone = deleted_ids(job, u)
    new = (u.filter((pl.col("decision") == "update") & pl.col("new_text").is_not_null())
           .select("entry_id", pl.col("new_text").alias("_new")).unique("entry_id", keep="first"))
    out = entries.filter(~pl.col("entry_id").is_in(list(gone)))
    out = out.join(new, on="entry_id", how="left", maintain_order="left")
    return out.with_columns(pl.coalesce("_new", "text").alias("text")).drop("_new")
