"""SEEM's configuration (conf/method/seem.yaml `seem:` block) as typed settings.

    python jobs/run.py method=seem seem.retrieve.p_ret_k=10 seem.ablation.rpe=false

One class per block; each stage's settings are one of them (frames: FrameSettings, fusion:
FusionSettings, graph: GraphSettings, retrieve: RetrieveSettings), and what a stage reads
from a sibling block is an external field (fusion: the frame schema bounds of seem.frames;
retrieve: seem.ablation; frames and graph: seem.passages_per_request). Ablation switches
therefore never invalidate the build stages.
"""

from __future__ import annotations

from typing import ClassVar

from structmem_gpu.methods.seem.prompts.frame import FrameBounds
from structmem_gpu.config.settings import (
    BOOL,
    COUNT,
    RATE,
    SIZE,
    TEMPERATURE,
    TOKENS,
    Float,
    Int,
    Settings,
    knob,
    sub,
)

# Passages per F_ext / quadruple request (seem.passages_per_request; 1 = the spec).
_PER_REQUEST = knob(SIZE, 1, external="seem.passages_per_request")


class FrameSettings(Settings):
    """seem.frames: Stage A, F_ext (schema bounds, event splitting, fallback); the block in
    conf/method/seem.yaml is generated from these fields."""

    node: ClassVar[str] = "seem.frames"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    max_tokens: int = knob(TOKENS, 768, description=(
        "Output budget per passage request; a capped reply is repaired once, then falls back."))
    temperature: float = knob(TEMPERATURE, 0.0, description=(
        'Greedy decoding (docs/methods.md "SEEM: choices the paper leaves open").'))
    max_events: int = knob(SIZE, 10, description="Schema maxItems of events per frame (skill cap).")
    max_participants: int = knob(SIZE, 8, description="Schema maxItems of participants per event.")
    max_actions_schema: int = knob(SIZE, 10, description=(
        "Schema maxItems of actions per event (before splitting)."))
    max_actions: int = knob(SIZE, 5, description=(
        'Events with more actions are split into several (skill cap; '
        'docs/methods.md "SEEM: frames").'))
    max_chars: int = knob(SIZE, 200, description="Schema maxLength of every role string.")
    summary_chars: int = knob(SIZE, 600, description="Schema maxLength of the 1-3 sentence summary.")
    fallback_chars: int = knob(SIZE, 200, description=(
        "Failed extraction: summary = this many characters of the text, no events."))
    passages_per_request: int = _PER_REQUEST

    @property
    def bounds(self) -> FrameBounds:
        return FrameBounds(self.max_events, self.max_participants, self.max_actions_schema,
                           self.max_chars, self.summary_chars)


class FusionSettings(Settings):
    """seem.fusion: Stage B, F_judge + F_fuse; `frames` is seem.frames (the event schema). The
    block in conf/method/seem.yaml is generated from these fields."""

    node: ClassVar[str] = "seem.fusion"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    window: int = knob(SIZE, 1, description=(
        "1 = the paper: each new frame judged against its top-1 earlier frame (one LLM batch per "
        "passage step). w > 1 = windowed groups (author's Strategy C): depth / w, a deviation."))
    strict_two_call: bool = knob(BOOL, False, description=(
        "false = one judge+fuse request per pair (default); true = a judge batch, then a merge "
        "batch for the positives (two round trips per step, shorter replies). window 1 only."))
    skip_judge_below: float | None = knob(Float(ge=0, le=1, null=True), None, description=(
        'Cosine below which "different" is declared without a request (null = always ask, the '
        "paper)."))
    max_provenance: int = knob(SIZE, 10, description=(
        "Passages per frame; a full frame is never offered for fusion (skill cap)."))
    max_events: int = knob(SIZE, 10, description="Events kept in a fused frame (skill cap).")
    evidence_chars: int = knob(SIZE, 300, description=(
        "Characters of each provenance message shown to the judge."))
    max_tokens: int = knob(TOKENS, 768, description="Output budget of a fusion request.")
    temperature: float = knob(TEMPERATURE, 0.0, description="Sampling temperature (0 = greedy decoding).")
    frames: FrameSettings | None = sub(FrameSettings, external="seem.frames", default=None)

    def check(self) -> list[str]:
        if self.strict_two_call and self.window > 1:
            return ["seem.fusion.strict_two_call=True: expected false with seem.fusion.window > 1 "
                    "(two calls apply to per-frame fusion only)"]
        return []


class GraphSettings(Settings):
    """seem.graph: Stage C, the graph memory layer; the block in conf/method/seem.yaml is
    generated from these fields."""

    node: ClassVar[str] = "seem.graph"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    max_quadruples: int = knob(SIZE, 12, description="Schema maxItems of quadruples per passage.")
    max_chars: int = knob(SIZE, 100, description="Schema maxLength of each quadruple slot.")
    max_tokens: int = knob(TOKENS, 512, description="Output budget per quadruple request.")
    temperature: float = knob(TEMPERATURE, 0.0, description="Sampling temperature (0 = greedy decoding).")
    node_merge_threshold: float | None = knob(Float(ge=0, le=1, null=True), 0.9, description=(
        "Hard-merge entities at this cosine (skill value): each name joins the most similar "
        "canonical name (most frequent surface forms first; similarity to the canonical only, so "
        "no chains); two speaker names never share a node. null = HippoRAG 2 exactly: only "
        "identical normalised strings are one node."))
    synonymy_threshold: float = knob(RATE, 0.8, description=(
        "Synonymy edge when cosine >= this (HippoRAG 2)."))
    synonymy_k: int = knob(SIZE, 2047, description="KNN size per entity (HippoRAG 2).")
    synonymy_max_per_entity: int = knob(SIZE, 100, description=(
        "Neighbours kept per entity (HippoRAG 2)."))
    synonymy_min_alnum: int = knob(COUNT, 3, description=(
        "Entities with fewer alphanumeric characters get no synonymy edges."))
    edge_doubling: bool = knob(BOOL, True, description=(
        "true = fact and synonymy pairs become two parallel undirected edges, as HippoRAG 2's "
        "graph ends up (score parity); false = one edge per pair."))
    fact_dedup_threshold: float | None = knob(Float(ge=0, le=1, null=True), None, description=(
        "Also merge facts with cosine >= this (skill: 0.93); null = exact only."))
    passages_per_request: int = _PER_REQUEST


class Ablation(Settings):
    """Paper Table 3 switches (docs/methods.md "SEEM: ablations"); all true = the full model.
    The block in conf/method/seem.yaml is generated from these fields; seem_no_*.yaml override."""

    node: ClassVar[str] = "seem.ablation"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    fact_context: bool = knob(BOOL, True, description=(
        "false: K_top seeds PPR but is left out of the QA context."))
    ppr: bool = knob(BOOL, True, description=(
        'false: P_ret = BM25 top-k passages (paper §5.3 "direct lexical retrieval").'))
    rpe: bool = knob(BOOL, True, description="false: P_final = P_ret (frames still in the context).")
    eef: bool = knob(BOOL, True, description=(
        "false: no frames in the context, and no RPE unless rpe_without_eef."))
    # The paper's "w/o EEF" is ambiguous; both readings are runnable.
    rpe_without_eef: bool = knob(BOOL, False, description=(
        'With eef=false: true keeps RPE (frames as provenance only); the other reading of "w/o '
        'EEF".'))

    @property
    def expands(self) -> bool:
        """Whether RPE adds passages: rpe on, and frames on or kept for provenance only."""
        return self.rpe and (self.eef or self.rpe_without_eef)


class RetrieveSettings(Settings):
    """seem.retrieve: Stages D-E; `ablation` is seem.ablation. The block in
    conf/method/seem.yaml is generated from these fields."""

    node: ClassVar[str] = "seem.retrieve"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    p_ret_k: int = knob(COUNT, 5, description=(  # must be >= 1 (check)
        "|P_ret|: passages from PPR (paper; Figure 3 sweeps 3..10)."))
    rpe_factor: int = knob(Int(ge=1), 2, description=(
        "|P_final| <= rpe_factor x p_ret_k (paper: twice the budget)."))
    facts_k: int = knob(COUNT, 5, description=(
        "|K_top| candidates before the filter (HippoRAG 2 linking_top_k)."))
    fact_filter: bool = knob(BOOL, True, description=(
        "LLM recognition filter on K_top; an empty pick -> dense passages."))
    filter_max: int = knob(SIZE, 4, description="Facts the filter may keep.")
    entity_seeds_k: int = knob(COUNT, 5, description=(
        "Entity seeds kept in the reset vector (HippoRAG 2)."))
    passage_weight: float = knob(Float(ge=0), 0.05, description=(
        "Weight of the min-max dense passage prior in the reset vector."))
    damping: float = knob(Float(gt=0, le=1), 0.5, description=(
        "igraph damping = probability of continuing the walk."))
    query_max_quadruples: int = knob(SIZE, 4, description="Schema maxItems of query quadruples.")
    query_max_chars: int = knob(SIZE, 100, description="Schema maxLength of a query slot.")
    query_max_tokens: int = knob(TOKENS, 256, description=(
        "Output budget of a query-quadruple request."))
    filter_max_tokens: int = knob(TOKENS, 64, description="Output budget of a filter request.")
    temperature: float = knob(TEMPERATURE, 0.0, description="Sampling temperature (0 = greedy decoding).")
    ablation: Ablation = sub(Ablation, external="seem.ablation")

    def check(self) -> list[str]:
        out = []
        if self.p_ret_k < 1:
            out.append(f"seem.retrieve.p_ret_k={self.p_ret_k!r}: expected an integer >= 1 (passages per question)")
        if self.damping >= 1:
            out.append(f"seem.retrieve.damping={self.damping!r}: expected a number > 0 and < 1")
        return out

    @property
    def budget(self) -> int:
        """|P_final| cap: rpe_factor x |P_ret| (docs/methods.md "SEEM: reverse provenance
        expansion")."""
        return self.rpe_factor * self.p_ret_k
