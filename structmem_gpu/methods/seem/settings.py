"""SEEM's configuration (conf/method/seem.yaml `seem:` block) as validated frozen dataclasses.

    python jobs/run.py method=seem seem.retrieve.p_ret_k=10 seem.ablation.rpe=false

Each stage declares the config keys it reads (its fingerprint): frames and graph read
`seem.passages_per_request` + their block, fusion reads `seem.fusion` + `seem.frames` (the
event schema bounds), retrieve reads `seem.retrieve` + `seem.ablation`. Ablation switches
therefore never invalidate the build stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from structmem_gpu.errors import ConfigError
from structmem_gpu.prompts.seem_frame import FrameBounds

# The model that wrote a stage's rows: a different model must recompute the stage.
LLM_KEYS = ("llm.backend", "llm.model", "llm.served_name", "llm.revision")
EMBED_KEYS = ("embedder.model", "embedder.max_seq_length", "embedder.instructions", "embedder.trust_remote_code", "embedder.long_texts")


def _block(cfg: DictConfig, key: str) -> dict[str, Any]:
    node = OmegaConf.select(cfg, key, default=None)
    if node is None:
        raise ConfigError(f"config has no '{key}' block; run with method=seem (conf/method/seem.yaml)")
    data = OmegaConf.to_container(node, resolve=True)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def _check(ok: bool, key: str, value: Any, want: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {want}")


def passages_per_request(cfg: DictConfig) -> int:
    n = int(OmegaConf.select(cfg, "seem.passages_per_request", default=1))
    _check(n >= 1, "seem.passages_per_request", n, "must be >= 1")
    return n


@dataclass(frozen=True)
class FrameSettings:
    bounds: FrameBounds
    max_actions: int  # events with more actions are split (docs/methods.md "SEEM: frames")
    fallback_chars: int
    max_tokens: int
    temperature: float

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> FrameSettings:
        f = _block(cfg, "seem.frames")
        b = FrameBounds(int(f["max_events"]), int(f["max_participants"]), int(f["max_actions_schema"]),
                        int(f["max_chars"]), int(f["summary_chars"]))
        for name in ("max_events", "max_participants", "max_actions_schema", "max_chars", "summary_chars",
                     "max_actions", "max_tokens"):
            _check(int(f[name]) >= 1, f"seem.frames.{name}", f[name], "must be >= 1")
        return cls(b, int(f["max_actions"]), int(f["fallback_chars"]), int(f["max_tokens"]), float(f["temperature"]))


@dataclass(frozen=True)
class FusionSettings:
    window: int  # 1 = the paper's per-frame fusion; w > 1 = windowed groups (author's Strategy C)
    strict_two_call: bool  # judge request, then a fuse request for the positives (window 1 only)
    skip_judge_below: float | None  # cosine floor below which "different" is declared without a request
    max_provenance: int
    max_events: int
    evidence_chars: int
    max_tokens: int
    temperature: float

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> FusionSettings:
        f = _block(cfg, "seem.fusion")
        floor = f.get("skip_judge_below")
        s = cls(int(f["window"]), bool(f["strict_two_call"]), None if floor is None else float(floor),
                int(f["max_provenance"]), int(f["max_events"]), int(f["evidence_chars"]), int(f["max_tokens"]),
                float(f["temperature"]))
        _check(s.window >= 1, "seem.fusion.window", s.window, "must be >= 1")
        _check(s.max_provenance >= 1, "seem.fusion.max_provenance", s.max_provenance, "must be >= 1")
        _check(not (s.strict_two_call and s.window > 1), "seem.fusion.strict_two_call", True,
               "applies to per-frame fusion only (seem.fusion.window=1)")
        return s


@dataclass(frozen=True)
class GraphSettings:
    max_quadruples: int
    max_chars: int
    max_tokens: int
    temperature: float
    node_merge_threshold: float | None  # None = HippoRAG 2 (exact strings only)
    synonymy_threshold: float
    synonymy_k: int
    synonymy_max_per_entity: int
    synonymy_min_alnum: int  # query entities with fewer alphanumeric characters get no synonymy edges
    edge_doubling: bool
    fact_dedup_threshold: float | None

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> GraphSettings:
        g = _block(cfg, "seem.graph")
        merge, dedup = g.get("node_merge_threshold"), g.get("fact_dedup_threshold")
        s = cls(int(g["max_quadruples"]), int(g["max_chars"]), int(g["max_tokens"]), float(g["temperature"]),
                None if merge is None else float(merge), float(g["synonymy_threshold"]), int(g["synonymy_k"]),
                int(g["synonymy_max_per_entity"]), int(g["synonymy_min_alnum"]), bool(g["edge_doubling"]),
                None if dedup is None else float(dedup))
        _check(s.max_quadruples >= 1, "seem.graph.max_quadruples", s.max_quadruples, "must be >= 1")
        _check(s.synonymy_k >= 1, "seem.graph.synonymy_k", s.synonymy_k, "must be >= 1")
        return s


@dataclass(frozen=True)
class Ablation:
    """Paper Table 3 switches (docs/methods.md "SEEM: ablations"); all true = the full model."""

    fact_context: bool  # false: K_top still seeds PPR but is left out of the context
    ppr: bool  # false: P_ret = BM25 top-k passages (paper §5.3: direct lexical retrieval)
    rpe: bool  # false: P_final = P_ret
    eef: bool  # false: no frames in the context (and, by default, no RPE)
    # With eef=false: keep RPE (frames still give the provenance that expands P_ret, only their
    # text leaves the context). The paper's "w/o EEF" is ambiguous; both readings are runnable.
    rpe_without_eef: bool = False

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> Ablation:
        a = _block(cfg, "seem.ablation")
        return cls(bool(a["fact_context"]), bool(a["ppr"]), bool(a["rpe"]), bool(a["eef"]),
                   bool(a.get("rpe_without_eef", False)))

    @property
    def expands(self) -> bool:
        """Whether RPE adds passages: rpe on, and frames on or kept for provenance only."""
        return self.rpe and (self.eef or self.rpe_without_eef)


@dataclass(frozen=True)
class RetrieveSettings:
    p_ret_k: int
    rpe_factor: int
    facts_k: int
    fact_filter: bool
    filter_max: int
    entity_seeds_k: int
    passage_weight: float
    damping: float
    query_max_quadruples: int
    query_max_chars: int
    query_max_tokens: int
    filter_max_tokens: int
    temperature: float
    ablation: Ablation

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> RetrieveSettings:
        r = _block(cfg, "seem.retrieve")
        s = cls(int(r["p_ret_k"]), int(r["rpe_factor"]), int(r["facts_k"]), bool(r["fact_filter"]),
                int(r["filter_max"]), int(r["entity_seeds_k"]), float(r["passage_weight"]), float(r["damping"]),
                int(r["query_max_quadruples"]), int(r["query_max_chars"]), int(r["query_max_tokens"]),
                int(r["filter_max_tokens"]), float(r["temperature"]), Ablation.from_cfg(cfg))
        _check(s.p_ret_k >= 1, "seem.retrieve.p_ret_k", s.p_ret_k, "must be >= 1")
        _check(s.rpe_factor >= 1, "seem.retrieve.rpe_factor", s.rpe_factor, "must be >= 1")
        _check(0.0 < s.damping < 1.0, "seem.retrieve.damping", s.damping, "must be in (0, 1)")
        _check(s.facts_k >= 0 and s.filter_max >= 0, "seem.retrieve.facts_k/filter_max", (s.facts_k, s.filter_max),
               "must be >= 0")
        return s

    @property
    def budget(self) -> int:
        """|P_final| cap: rpe_factor x |P_ret| (docs/methods.md "SEEM: reverse provenance
        expansion")."""
        return self.rpe_factor * self.p_ret_k
