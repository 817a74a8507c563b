"""The differential's memory side (analysis/differential.py): memory sizes per conversation and
the overlap of what the two runs retrieve for the same question.

Ids differ across systems (a system's memory ids, our entry / synthesis hashes), so retrieved
items are compared by TEXT: each retrievals row's item_id is joined, within its conversation,
to the text of the memory table holding it (memories.memory_id, entries.entry_id,
syntheses.synth_id, else turns.event_id), whitespace-stripped. Entries read as stored (before
any offline update). For one question and one pair of circuits (official circuit, port
circuit), with A and B the sets of texts of each run's items ranked below k:

    overlap@k = |A ∩ B| / max(|A|, |B|)     (= |A ∩ B| / k when both return k distinct texts)

null when neither returned anything. An item whose text is not found is counted
(`*_unresolved`) and kept under its id, so it matches nothing from the other system.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from structmem_gpu.core.artifacts import RunDir

MEMORY_TABLES = {"memories": "memory_id", "entries": "entry_id", "syntheses": "synth_id"}


def _count(run: RunDir, table: str, prefix: str) -> pl.DataFrame | None:
    if not run.has_table(table):
        return None
    df = run.read_table(table, columns=["conv_id"])
    return df.group_by("conv_id").agg(pl.len().cast(pl.Int64).alias(f"{prefix}_{table}"))


def _deleted(run: RunDir, prefix: str) -> pl.DataFrame | None:
    """Entries the offline update deleted (entry_updates decision "delete"), per conversation."""
    if not run.has_table("entry_updates"):
        return None
    df = run.read_table("entry_updates", columns=["conv_id", "decision"])
    deleted = (pl.col("decision") == "delete").sum().cast(pl.Int64)
    return df.group_by("conv_id").agg(deleted.alias(f"{prefix}_entries_deleted"))


def memory_sizes(official: Path, port: Path) -> pl.DataFrame:
    """One row per conversation: each run's rows of every memory table it has
    (official_memories, port_entries, port_syntheses, ...) and the entries its update deleted
    (a table the run lacks has no column)."""
    parts = []
    for prefix, root in (("official", official), ("port", port)):
        run = RunDir(root)
        parts += [_count(run, t, prefix) for t in MEMORY_TABLES] + [_deleted(run, prefix)]
    found = [p for p in parts if p is not None]
    if not found:
        return pl.DataFrame(schema={"conv_id": pl.String()})
    out = found[0]
    for p in found[1:]:
        out = out.join(p, on="conv_id", how="full", coalesce=True)
    # a column exists only where its table does: a conversation missing from it holds none
    return out.fill_null(0).sort("conv_id")


def _texts(run: RunDir, keys: pl.DataFrame) -> pl.DataFrame:
    """`keys` (conv_id, item_id) with the text of each item (null where not found); turns are
    read only for items no memory table holds (a turns circuit)."""
    texts = pl.DataFrame(schema=dict.fromkeys(("conv_id", "item_id", "text"), pl.String()))
    for table, id_col in {**MEMORY_TABLES, "turns": "event_id"}.items():
        if table == "turns" and texts.select("conv_id", "item_id").n_unique() >= keys.height:
            break
        if run.has_table(table):
            df = run.read_table(table, columns=["conv_id", id_col, "text"])
            texts = pl.concat([texts, df.select("conv_id", pl.col(id_col).alias("item_id"), "text")
                               .join(keys, on=["conv_id", "item_id"], how="semi")])
    texts = texts.unique(["conv_id", "item_id"], keep="first", maintain_order=True)
    return keys.join(texts, on=["conv_id", "item_id"], how="left")


def _top_k(root: Path, k: int) -> pl.DataFrame | None:
    """question_id, conv_id, circuit, texts (list), unresolved: each circuit's top k."""
    run = RunDir(root)
    if not run.has_table("retrievals"):
        return None
    ret = run.read_table("retrievals").filter(pl.col("rank") < k)
    keyed = _texts(run, ret.select("conv_id", "item_id").unique())
    ret = ret.join(keyed, on=["conv_id", "item_id"], how="left")
    return (ret.sort("question_id", "circuit", "rank")
            .group_by("question_id", "conv_id", "circuit", maintain_order=True)
            .agg(pl.coalesce(pl.col("text").str.strip_chars(), pl.lit("id:") + pl.col("item_id"))
                 .alias("texts"),
                 pl.col("text").is_null().sum().cast(pl.Int64).alias("unresolved")))


QUESTION_COLUMNS = {
    "question_id": pl.String(), "conv_id": pl.String(), "official_circuit": pl.String(),
    "port_circuit": pl.String(), "k": pl.Int64(), "official_texts": pl.Int64(),
    "port_texts": pl.Int64(), "shared": pl.Int64(), "overlap": pl.Float64(),
    "official_unresolved": pl.Int64(), "port_unresolved": pl.Int64(),
}


def retrieval_overlap(official: Path, port: Path, k: int) -> pl.DataFrame:
    """One row per (question both runs retrieved for, official circuit, port circuit)."""
    a, b = _top_k(official, k), _top_k(port, k)
    if a is None or b is None:
        return pl.DataFrame(schema=QUESTION_COLUMNS)
    rows = []
    b_by_q: dict[str, list[dict]] = {}
    for r in b.iter_rows(named=True):
        b_by_q.setdefault(r["question_id"], []).append(r)
    for ra in a.iter_rows(named=True):
        for rb in b_by_q.get(ra["question_id"], []):
            sa, sb = set(ra["texts"]), set(rb["texts"])
            n = max(len(sa), len(sb))
            rows.append({"question_id": ra["question_id"], "conv_id": ra["conv_id"],
                         "official_circuit": ra["circuit"], "port_circuit": rb["circuit"], "k": k,
                         "official_texts": len(sa), "port_texts": len(sb), "shared": len(sa & sb),
                         "overlap": len(sa & sb) / n if n else None,
                         "official_unresolved": ra["unresolved"],
                         "port_unresolved": rb["unresolved"]})
    return pl.DataFrame(rows, schema=QUESTION_COLUMNS)


def overlap_means(questions: pl.DataFrame) -> pl.DataFrame:
    """Mean overlap@k per circuit pair, with the number of questions it averages."""
    return (questions.group_by("official_circuit", "port_circuit", maintain_order=True)
            .agg(pl.len().alias("questions"), pl.col("overlap").mean().alias("mean_overlap"))
            .sort("official_circuit", "port_circuit"))
