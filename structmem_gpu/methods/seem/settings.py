"""SEEM's configuration (conf/method/seem.yaml `seem:` block) as typed settings.

    python jobs/run.py method=seem seem.retrieve.p_ret_k=10 seem.ablation.rpe=false

One class per block; each stage's settings are one of them (frames: FrameSettings, fusion:
FusionSettings, graph: GraphSettings, retrieve: RetrieveSettings), and what a stage reads
from a sibling block is an external field (fusion: the frame schema bounds of seem.frames;
retrieve: seem.ablation; frames and graph: seem.passages_per_request). Ablation switches
therefore never invalidate the build stages.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from structmem_gpu.methods.seem.prompts.frame import FrameBounds
from structmem_gpu.config.settings import COUNT, External, RATE, SIZE, Settings, TEMPERATURE, TOKENS

# Passages per F_ext / quadruple request (seem.passages_per_request; 1 = the spec).
PerRequest = Annotated[SIZE, External("seem.passages_per_request")]


class FrameSettings(Settings):
    """seem.frames: Stage A, F_ext (schema bounds, event splitting, fallback); the block in
    conf/method/seem.yaml is generated from these fields."""

    node: ClassVar[str] = "seem.frames"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    max_tokens: TOKENS = Field(768, description=(
        "Output budget per passage request; a capped reply is repaired once, then falls back."))
    temperature: TEMPERATURE = Field(0.0, description=(
        'Greedy decoding (docs/methods.md "SEEM: choices the paper leaves open").'))
    max_events: SIZE = Field(10, description=(
        "Schema maxItems of events per frame (skill cap)."))
    max_participants: SIZE = Field(8, description="Schema maxItems of participants per event.")
    max_actions_schema: SIZE = Field(10, description=(
        "Schema maxItems of actions per event (before splitting)."))
    max_actions: SIZE = Field(5, description=(
        'Events with more actions are split into several (skill cap; '
        'docs/methods.md "SEEM: frames").'))
    max_chars: SIZE = Field(200, description="Schema maxLength of every role string.")
    summary_chars: SIZE = Field(600, description=(
        "Schema maxLength of the 1-3 sentence summary."))
    fallback_chars: SIZE = Field(200, description=(
        "Failed extraction: summary = this many characters of the text, no events."))
    passages_per_request: PerRequest = 1

    @property
    def bounds(self) -> FrameBounds:
        return FrameBounds(self.max_events, self.max_participants, self.max_actions_schema,
                           self.max_chars, self.summary_chars)


class FusionSettings(Settings):
    """seem.fusion: Stage B, F_judge + F_fuse; `frames` is seem.frames (the event schema). The
    block in conf/method/seem.yaml is generated from these fields."""

    node: ClassVar[str] = "seem.fusion"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    window: SIZE = Field(1, description=(
        "1 = the paper: each new frame judged against its top-1 earlier frame (one LLM batch per "
        "passage step). w > 1 = windowed groups (author's Strategy C): depth / w, a deviation."))
    strict_two_call: bool = Field(False, description=(
        "false = one judge+fuse request per pair (default); true = a judge batch, then a merge "
        "batch for the positives (two round trips per step, shorter replies). window 1 only."))
    skip_judge_below: Annotated[float, Field(ge=0, le=1)] | None = Field(None, description=(
        'Cosine below which "different" is declared without a request (null = always ask, the '
        "paper)."))
    max_provenance: SIZE = Field(10, description=(
        "Passages per frame; a full frame is never offered for fusion (skill cap)."))
    max_events: SIZE = Field(10, description="Events kept in a fused frame (skill cap).")
    evidence_chars: SIZE = Field(300, description=(
        "Characters of each provenance message shown to the judge."))
    max_tokens: TOKENS = Field(768, description="Output budget of a fusion request.")
    temperature: TEMPERATURE = Field(0.0, description="Sampling temperature (0 = greedy decoding).")
    frames: Annotated[FrameSettings, External("seem.frames")] = None

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

    max_quadruples: SIZE = Field(12, description="Schema maxItems of quadruples per passage.")
    max_chars: SIZE = Field(100, description="Schema maxLength of each quadruple slot.")
    max_tokens: TOKENS = Field(512, description="Output budget per quadruple request.")
    temperature: TEMPERATURE = Field(0.0, description="Sampling temperature (0 = greedy decoding).")
    node_merge_threshold: Annotated[float, Field(ge=0, le=1)] | None = Field(0.9, description=(
        "Hard-merge entities at this cosine (skill value): each name joins the most similar "
        "canonical name (most frequent surface forms first; similarity to the canonical only, so "
        "no chains); two speaker names never share a node. null = HippoRAG 2 exactly: only "
        "identical normalised strings are one node."))
    synonymy_threshold: RATE = Field(0.8, description=(
        "Synonymy edge when cosine >= this (HippoRAG 2)."))
    synonymy_k: SIZE = Field(2047, description="KNN size per entity (HippoRAG 2).")
    synonymy_max_per_entity: SIZE = Field(100, description="Neighbours kept per entity (HippoRAG 2).")
    synonymy_min_alnum: COUNT = Field(3, description=(
        "Entities with fewer alphanumeric characters get no synonymy edges."))
    edge_doubling: bool = Field(True, description=(
        "true = fact and synonymy pairs become two parallel undirected edges, as HippoRAG 2's "
        "graph ends up (score parity); false = one edge per pair."))
    fact_dedup_threshold: Annotated[float, Field(ge=0, le=1)] | None = Field(None, description=(
        "Also merge facts with cosine >= this (skill: 0.93); null = exact only."))
    passages_per_request: PerRequest = 1


class Ablation(Settings):
    """Paper Table 3 switches (docs/methods.md "SEEM: ablations"); all true = the full model.
    The block in conf/method/seem.yaml is generated from these fields; seem_no_*.yaml override."""

    node: ClassVar[str] = "seem.ablation"
    yaml_home: ClassVar[str | None] = "method/seem.yaml"

    fact_context: bool = Field(True, description=(
        "false: K_top seeds PPR but is left out of the QA context."))
    ppr: bool = Field(True, description=(
        'false: P_ret = BM25 top-k passages (paper §5.3 "direct lexical retrieval").'))
    rpe: bool = Field(True, description=(
        "false: P_final = P_ret (frames still in the context)."))
    eef: bool = Field(True, description=(
        "false: no frames in the context, and no RPE unless rpe_without_eef."))
    # The paper's "w/o EEF" is ambiguous; both readings are runnable.
    rpe_without_eef: bool = Field(False, description=(
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

    p_ret_k: COUNT = Field(5, description=(
        "|P_ret|: passages from PPR (paper; Figure 3 sweeps 3..10)."))
    rpe_factor: Annotated[int, Field(ge=1)] = Field(2, description=(
        "|P_final| <= rpe_factor x p_ret_k (paper: twice the budget)."))
    facts_k: COUNT = Field(5, description=(
        "|K_top| candidates before the filter (HippoRAG 2 linking_top_k)."))
    fact_filter: bool = Field(True, description=(
        "LLM recognition filter on K_top; an empty pick -> dense passages."))
    filter_max: SIZE = Field(4, description="Facts the filter may keep.")
    entity_seeds_k: COUNT = Field(5, description=(
        "Entity seeds kept in the reset vector (HippoRAG 2)."))
    passage_weight: Annotated[float, Field(ge=0)] = Field(0.05, description=(
        "Weight of the min-max dense passage prior in the reset vector."))
    damping: Annotated[float, Field(le=1, gt=0)] = Field(0.5, description=(
        "igraph damping = probability of continuing the walk."))
    query_max_quadruples: SIZE = Field(4, description="Schema maxItems of query quadruples.")
    query_max_chars: SIZE = Field(100, description="Schema maxLength of a query slot.")
    query_max_tokens: TOKENS = Field(256, description="Output budget of a query-quadruple request.")
    filter_max_tokens: TOKENS = Field(64, description="Output budget of a filter request.")
    temperature: TEMPERATURE = Field(0.0, description="Sampling temperature (0 = greedy decoding).")
    ablation: Annotated[Ablation, External("seem.ablation")]

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
