"""Polars schema constants of SEEM's own tables (docs/methods.md "SEEM: frames",
"SEEM: graph memory layer"), one per table.

`RunDir.write_table` conforms only the tables of `structmem_gpu.core.schemas.TABLES`; SEEM's
stages build their frames with `frame(rows, SCHEMA)` from here, so every run writes identical
dtypes. One `frames` row (sample-1, a question and its answer fused into one frame):

    {"frame_id": "frame:sample-1:D1:1", "conv_id": "sample-1",
     "summary": "Lena signed up for the Riverside Half Marathon on 18 May 2024.",
     "events": [{"participants": ["Lena", "Tomas"], "action": ["Lena signed up for the half marathon"],
                 "time": "2024-05-18", "location": null, "reason": null, "method": null}],
     "provenance": ["sample-1:D1:1", "sample-1:D1:2"], "time_start": 2024-03-03 14:15,
     "time_end": 2024-03-03 14:15, "n_merges": 1,
     "history": [{"step": 1, "pids": ["sample-1:D1:2"], "request_id": "seem_fusion:…",
                  "similarity": 0.61, "kind": "judge_fuse"}]}
"""

from __future__ import annotations

import polars as pl

from structmem_gpu.core.schemas import RETRIEVALS, Schema

_STR = pl.String()
_I32 = pl.Int32()
_F64 = pl.Float64()
_BOOL = pl.Boolean()
_TIME = pl.Datetime("us")
_STRLIST = pl.List(pl.String())

# One role tuple of a frame (docs/methods.md "SEEM: frames").
EVENT = pl.Struct({
    "participants": _STRLIST,
    "action": _STRLIST,
    "time": _STR,
    "location": _STR,
    "reason": _STR,
    "method": _STR,
})
EVENTS = pl.List(EVENT)

# One fusion that changed a frame: which passages joined it, in which wavefront step, why.
HISTORY = pl.List(pl.Struct({
    "step": _I32,  # wavefront step (0-based) that applied the merge
    "pids": _STRLIST,  # passages added by this merge
    "request_id": _STR,
    "similarity": _F64,  # cosine of the new frame to this frame when it was retrieved; null: same window
    "kind": _STR,  # "judge_fuse" | "two_call" | "window"
}))

PASSAGES: Schema = {
    "pid": _STR,  # = turns.event_id, "<conv_id>:<dia_id>"
    "conv_id": _STR,
    "position": _I32,  # 0-based chronological position inside the conversation
    "session_index": _I32,
    "turn_index": _I32,
    "session_time": _TIME,
    "speaker": _STR,
    "text": _STR,
    "image_caption": _STR,
}

FRAMES_EXTRACTED: Schema = {  # EEF_0: one frame per passage, before fusion
    "pid": _STR,
    "conv_id": _STR,
    "summary": _STR,
    "events": EVENTS,
    "request_id": _STR,
    "prompt_version": _STR,
    "parse_ok": _BOOL,
    "fallback": _BOOL,  # extraction failed: summary = the first characters of the text, no events
}

FRAMES: Schema = {  # the episodic memory layer after fusion (EML)
    "frame_id": _STR,  # "frame:<pid of the passage that founded it>"
    "conv_id": _STR,
    "summary": _STR,
    "events": EVENTS,
    "provenance": _STRLIST,  # pids, chronological, unique (rho_eml)
    "time_start": _TIME,
    "time_end": _TIME,
    "n_merges": _I32,
    "history": HISTORY,
}

FRAME_OF: Schema = {"pid": _STR, "conv_id": _STR, "frame_id": _STR}  # Phi

FACTS: Schema = {  # the graph memory layer's quadruples (GML)
    "fact_id": _STR,
    "conv_id": _STR,
    "s": _STR,  # normalised subject
    "r": _STR,
    "o": _STR,
    "tau": _STR,  # temporal validity as the model wrote it (ISO date or period); null = timeless
    "provenance": _STRLIST,  # pids (rho_gml), chronological
    "text": _STR,  # what is embedded: "s r o (time: tau)"
    "subject_node": _STR,  # entity node ids after node merging
    "object_node": _STR,
    "request_ids": _STRLIST,
    "shown": _STR,  # the fact in the model's original words, as the filter and reader see it
}

ENTITIES: Schema = {
    "entity_id": _STR,  # = graph node id "e:<canonical>"
    "conv_id": _STR,
    "canonical": _STR,
    "aliases": _STRLIST,  # other normalised surface forms merged into this node
    "passages": _STRLIST,  # pids whose facts mention it
    "n_passages": _I32,
}

GRAPH_NODES: Schema = {
    "conv_id": _STR,
    "node_id": _STR,  # "e:<canonical>" | "p:<pid>"
    "kind": _STR,  # "entity" | "passage"
    "name": _STR,  # canonical entity name | pid
}

GRAPH_EDGES: Schema = {
    "conv_id": _STR,
    "src": _STR,
    "dst": _STR,
    "kind": _STR,  # "fact" | "passage" | "synonymy"
    "weight": _F64,
}

# retrievals.parquet as SEEM writes it: the shared contract columns plus what the context
# builder needs, so that the answer stage reads nothing but retrievals and turns.
SEEM_RETRIEVALS: Schema = {
    **RETRIEVALS,  # circuit: "facts" | "frames" | "turns" (item_id of "turns" = pid = event_id)
    "source": _STR,  # turns: "ppr" | "dense" | "dense_fallback" | "rpe"; facts: "filter" | "top_k"
    "in_context": _BOOL,  # false: retrieved but left out of the QA context by an ablation
    "context_order": _I32,  # position in the QA context inside its block
    "text": _STR,  # fact line / frame rendering / passage display text
    "time": _TIME,  # passage session time; frame time_start; null for facts
    "event_ids": _STRLIST,  # passages behind the item (facts/frames: provenance; turns: itself)
}

TABLES: dict[str, Schema] = {
    "passages": PASSAGES,
    "frames_extracted": FRAMES_EXTRACTED,
    "frames": FRAMES,
    "frame_of": FRAME_OF,
    "facts": FACTS,
    "entities": ENTITIES,
    "graph_nodes": GRAPH_NODES,
    "graph_edges": GRAPH_EDGES,
}
