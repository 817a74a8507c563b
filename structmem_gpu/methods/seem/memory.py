"""One conversation's finished SEEM memory, loaded for retrieval (frames, facts, graph, vectors).

Built from the run directory's tables by `load_memories`, with every text embedded in one
encoder call per kind (passages, facts; the embedding cache makes this a lookup after the
build stages). The igraph graph is built lazily on first PPR. Example:

    mems = load_memories(tables, {"sample-1"}, ctx.encode)
    mems["sample-1"].passage_vecs.shape     # (35, 384)
    mems["sample-1"].graph().vcount()       # entities + 35 passages
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from structmem_gpu.methods.seem.model import events_from_rows, render_frame
from structmem_gpu.methods.seem.passages import Passage, by_conversation, passage_list
from structmem_gpu.methods.seem.quadruples import fact_line

Encode = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class FrameInfo:
    frame_id: str
    provenance: tuple[str, ...]
    rendering: str
    time_start: datetime | None


@dataclass(frozen=True)
class FactInfo:
    fact_id: str
    subject_node: str
    object_node: str
    line: str  # "s | r | o | tau"
    provenance: tuple[str, ...]


@dataclass
class ConvMemory:
    conv_id: str
    passages: list[Passage]
    passage_vecs: np.ndarray
    facts: list[FactInfo]
    fact_vecs: np.ndarray
    n_passages: dict[str, int]  # entity node -> passages mentioning it
    node_ids: list[str]
    edges: list[tuple[str, str, float]]
    frame_of: dict[str, str]  # pid -> frame_id (Phi)
    frames: dict[str, FrameInfo]
    _graph: Any = field(default=None, repr=False)
    _lexical: Any = field(default=None, repr=False)

    @property
    def position(self) -> dict[str, int]:
        return {p.pid: p.position for p in self.passages}

    @property
    def passage_nodes(self) -> list[str]:
        return [f"p:{p.pid}" for p in self.passages]

    def graph(self) -> Any:
        if self._graph is None:
            from structmem_gpu.methods.seem.graph import igraph_graph

            self._graph = igraph_graph(self.node_ids, self.edges)
        return self._graph

    def lexical(self) -> Any:
        """BM25 over the passages' texts (built on first use; `seem.ablation.ppr=false`)."""
        if self._lexical is None:
            from structmem_gpu.methods.seem.lexical import LexicalIndex

            self._lexical = LexicalIndex([p.embedding_text for p in self.passages])
        return self._lexical


def _group(df: pl.DataFrame, convs: set[str]) -> dict[str, pl.DataFrame]:
    part = df.filter(pl.col("conv_id").is_in(sorted(convs)))
    return {str(c): g for (c,), g in part.group_by("conv_id", maintain_order=True)}


def _frames(frames: pl.DataFrame) -> dict[str, FrameInfo]:
    out = {}
    for r in frames.iter_rows(named=True):
        text = render_frame(r["summary"], events_from_rows(r["events"]))
        out[r["frame_id"]] = FrameInfo(r["frame_id"], tuple(r["provenance"]), text, r["time_start"])
    return out


def load_memories(tables: Mapping[str, pl.DataFrame], convs: set[str], encode: Encode) -> dict[str, ConvMemory]:
    """ConvMemory per conversation in `convs`; tables: passages, facts, entities, graph_nodes,
    graph_edges, frames, frame_of."""
    plist = [p for ps in by_conversation(passage_list(tables["passages"])).values() for p in ps if p.conv_id in convs]
    pvecs = encode([p.embedding_text for p in plist])
    facts = tables["facts"].filter(pl.col("conv_id").is_in(sorted(convs)))
    fvecs = encode(facts["text"].to_list()) if facts.height else np.zeros((0, pvecs.shape[1]), dtype=np.float32)
    grouped = {k: _group(tables[k], convs) for k in ("entities", "graph_nodes", "graph_edges", "frames", "frame_of")}
    out: dict[str, ConvMemory] = {}
    start = 0
    fpos = facts.with_row_index("_i")
    for conv, ps in by_conversation(plist).items():
        mine = fpos.filter(pl.col("conv_id") == conv)
        # Shown in the model's original words (case, punctuation); the normalised s/r/o only
        # key deduplication and the graph.
        finfo = [FactInfo(r["fact_id"], r["subject_node"], r["object_node"],
                          r.get("shown") or fact_line(r["s"], r["r"], r["o"], r["tau"]),
                          tuple(r["provenance"])) for r in mine.iter_rows(named=True)]
        empty = pl.DataFrame()
        ents, nodes, edges = (grouped[k].get(conv, empty) for k in ("entities", "graph_nodes", "graph_edges"))
        frames, frame_of = grouped["frames"].get(conv, empty), grouped["frame_of"].get(conv, empty)
        out[conv] = ConvMemory(
            conv, ps, pvecs[start : start + len(ps)], finfo, fvecs[mine["_i"].to_numpy()] if mine.height else fvecs[:0],
            dict(zip(ents["entity_id"], ents["n_passages"], strict=True)) if ents.height else {},
            nodes["node_id"].to_list() if nodes.height else [f"p:{p.pid}" for p in ps],
            list(edges.select("src", "dst", "weight").iter_rows()) if edges.height else [],
            dict(zip(frame_of["pid"], frame_of["frame_id"], strict=True)) if frame_of.height else {},
            _frames(frames) if frames.height else {})
        start += len(ps)
    return out
