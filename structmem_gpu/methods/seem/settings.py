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
    """seem.frames: Stage A, F_ext (schema bounds, event splitting, fallback)."""

    node: ClassVar[str] = "seem.frames"

    max_events: int = knob(SIZE)
    max_participants: int = knob(SIZE)
    max_actions_schema: int = knob(SIZE)
    max_chars: int = knob(SIZE)
    summary_chars: int = knob(SIZE)
    max_actions: int = knob(SIZE)  # events with more actions are split (docs/methods.md "SEEM: frames")
    fallback_chars: int = knob(SIZE)
    max_tokens: int = knob(TOKENS)
    temperature: float = knob(TEMPERATURE)
    passages_per_request: int = _PER_REQUEST

    @property
    def bounds(self) -> FrameBounds:
        return FrameBounds(self.max_events, self.max_participants, self.max_actions_schema,
                           self.max_chars, self.summary_chars)


class FusionSettings(Settings):
    """seem.fusion: Stage B, F_judge + F_fuse; `frames` is seem.frames (the event schema)."""

    node: ClassVar[str] = "seem.fusion"

    window: int = knob(SIZE)  # 1 = the paper's per-frame fusion; w > 1 = windowed groups (author's Strategy C)
    strict_two_call: bool = knob(BOOL)  # judge request, then a fuse request for the positives (window 1 only)
    # cosine floor below which "different" is declared without a request
    skip_judge_below: float | None = knob(Float(ge=0, le=1, null=True))
    max_provenance: int = knob(SIZE)
    max_events: int = knob(SIZE)
    evidence_chars: int = knob(SIZE)
    max_tokens: int = knob(TOKENS)
    temperature: float = knob(TEMPERATURE)
    frames: FrameSettings | None = sub(FrameSettings, external="seem.frames", default=None)

    def check(self) -> list[str]:
        if self.strict_two_call and self.window > 1:
            return ["seem.fusion.strict_two_call=True: expected false with seem.fusion.window > 1 "
                    "(two calls apply to per-frame fusion only)"]
        return []


class GraphSettings(Settings):
    """seem.graph: Stage C, the graph memory layer."""

    node: ClassVar[str] = "seem.graph"

    max_quadruples: int = knob(SIZE)
    max_chars: int = knob(SIZE)
    max_tokens: int = knob(TOKENS)
    temperature: float = knob(TEMPERATURE)
    node_merge_threshold: float | None = knob(Float(ge=0, le=1, null=True))  # None = HippoRAG 2 (exact strings only)
    synonymy_threshold: float = knob(RATE)
    synonymy_k: int = knob(SIZE)
    synonymy_max_per_entity: int = knob(SIZE)
    synonymy_min_alnum: int = knob(COUNT)  # query entities with fewer alphanumeric characters get no synonymy edges
    edge_doubling: bool = knob(BOOL)
    fact_dedup_threshold: float | None = knob(Float(ge=0, le=1, null=True))
    passages_per_request: int = _PER_REQUEST


class Ablation(Settings):
    """Paper Table 3 switches (docs/methods.md "SEEM: ablations"); all true = the full model."""

    node: ClassVar[str] = "seem.ablation"

    fact_context: bool = knob(BOOL)  # false: K_top still seeds PPR but is left out of the context
    ppr: bool = knob(BOOL)  # false: P_ret = BM25 top-k passages (paper §5.3: direct lexical retrieval)
    rpe: bool = knob(BOOL)  # false: P_final = P_ret
    eef: bool = knob(BOOL)  # false: no frames in the context (and, by default, no RPE)
    # With eef=false: keep RPE (frames still give the provenance that expands P_ret, only their
    # text leaves the context). The paper's "w/o EEF" is ambiguous; both readings are runnable.
    rpe_without_eef: bool = knob(BOOL, False)

    @property
    def expands(self) -> bool:
        """Whether RPE adds passages: rpe on, and frames on or kept for provenance only."""
        return self.rpe and (self.eef or self.rpe_without_eef)


class RetrieveSettings(Settings):
    """seem.retrieve: Stages D-E; `ablation` is seem.ablation."""

    node: ClassVar[str] = "seem.retrieve"

    p_ret_k: int = knob(COUNT)  # |P_ret|; must be >= 1 (check)
    rpe_factor: int = knob(Int(ge=1))
    facts_k: int = knob(COUNT)
    fact_filter: bool = knob(BOOL)
    filter_max: int = knob(SIZE)
    entity_seeds_k: int = knob(COUNT)
    passage_weight: float = knob(Float(ge=0))
    damping: float = knob(Float(gt=0, le=1))
    query_max_quadruples: int = knob(SIZE)
    query_max_chars: int = knob(SIZE)
    query_max_tokens: int = knob(TOKENS)
    filter_max_tokens: int = knob(TOKENS)
    temperature: float = knob(TEMPERATURE)
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
