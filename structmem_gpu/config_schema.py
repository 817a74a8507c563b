"""Typed, range-checked configuration, checked before any stage runs.

    python jobs/run.py consolidate.seed_k=abc
    error: config consolidate.seed_k='abc': expected an integer >= 0 (0 = off)   # exit 2

Why not Hydra structured configs: method configs are `@package _global_` and each method adds
its own top-level groups (`extract`, `seem`, `graph_memory` ...), experiments and debug
profiles override across them, and judges embed whole llm configs; one dataclass tree would
have to know every combination, and Hydra reports a type error with a traceback-like block and
exit code 1. So the schema is a list of (dotted-key pattern, rule) pairs, first match wins,
`*` matching any run of characters (dots included). Every leaf of every file in conf/ must match
a rule (tests/unit/test_config_schema.py composes every group option), so a new knob without a
rule fails CI; at run time a key without a rule is left alone.

Ranges follow one convention: counts and k's are >= 0 where 0 switches the thing off, windows
and budgets are >= 1 (or > 0 for seconds), rates and thresholds are in [0, 1].
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from structmem_gpu.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """One value's type and range. `kind`: int | float | bool | str | list | dict | any."""

    kind: str
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    choices: tuple[Any, ...] | None = None
    null: bool = False
    item: "Rule | None" = None  # lists: every item's rule
    note: str = ""

    def problem(self, value: Any) -> str | None:
        """None when `value` is allowed, else what is allowed (for the error line)."""
        if value is None:
            return None if self.null else f"a value is required: {self.describe()}"
        ok = _type_ok(self.kind, value)
        if ok and self.choices is not None and value not in self.choices:
            ok = False
        if ok and self.kind in ("int", "float"):
            ok = ((self.ge is None or value >= self.ge) and (self.le is None or value <= self.le)
                  and (self.gt is None or value > self.gt))
        if ok and self.kind == "list" and self.item is not None:
            bad = [v for v in value if self.item.problem(v) is not None]
            ok = not bad
        return None if ok else f"expected {self.describe()}"

    def describe(self) -> str:
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "list":
            text = "a list" + (f" of {self.item.describe()}" if self.item else "")
        else:
            text = {"int": "an integer", "float": "a number", "bool": "true or false",
                    "str": "a string", "dict": "a mapping", "any": "any value"}[self.kind]
            bounds = [f">= {_num(self.ge)}" if self.ge is not None else "",
                      f"> {_num(self.gt)}" if self.gt is not None else "",
                      f"<= {_num(self.le)}" if self.le is not None else ""]
            text += " " + " and ".join(b for b in bounds if b) if any(bounds) else ""
        if self.null:
            text += " or null"
        return text.strip() + (f" ({self.note})" if self.note else "")


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, (list, tuple))
    if kind == "dict":
        return isinstance(value, Mapping)
    return True


def Int(ge: float | None = None, le: float | None = None, *, null: bool = False, note: str = "") -> Rule:
    return Rule("int", ge=ge, le=le, null=null, note=note)


def Float(ge: float | None = None, le: float | None = None, *, gt: float | None = None,
          null: bool = False, note: str = "") -> Rule:
    return Rule("float", ge=ge, le=le, gt=gt, null=null, note=note)


def Enum(*choices: Any, null: bool = False) -> Rule:
    kind = "bool" if all(isinstance(c, bool) for c in choices) else "any"
    return Rule(kind, choices=tuple(choices), null=null)


def List(item: Rule | None = None, *, null: bool = False) -> Rule:
    return Rule("list", item=item, null=null)


BOOL = Rule("bool")
STR = Rule("str")
STR_OR_NULL = Rule("str", null=True)
ANY = Rule("any", null=True)
DICT = Rule("dict", null=True)
COUNT = Int(ge=0, note="0 = off")  # k's and optional counts
SIZE = Int(ge=1)  # budgets, windows, batch sizes
TOKENS = Int(ge=1, note="reply budget in tokens")
RATE = Float(ge=0, le=1)
TEMPERATURE = Float(ge=0, le=2)

# Keys of one llm config (conf/llm/*.yaml); also applied to judge llms (judge.llm, panel members).
LLM_RULES: list[tuple[str, Rule]] = [
    ("backend", Enum("llamacpp", "vllm_server", "vllm_offline", "external", "scripted")),
    ("model", STR_OR_NULL), ("served_name", STR_OR_NULL), ("revision", STR_OR_NULL),
    ("base_url", STR_OR_NULL), ("api_key_env", STR_OR_NULL),
    ("api_flavor", Enum("vllm", "llamacpp", null=True)),
    ("max_in_flight", SIZE), ("request_timeout_s", Float(gt=0)), ("max_retries", COUNT),
    ("retry_backoff_s", Float(ge=0)), ("startup_timeout_s", Float(gt=0)),
    ("max_restarts", Int(ge=0, note="0 = never replace a dead server")),
    ("repair_attempts", COUNT), ("seed", Int(ge=0, null=True)), ("progress", BOOL),
    ("n_ctx", Int(ge=256)), ("n_threads", SIZE), ("tensor_parallel_size", SIZE),
    ("data_parallel_size", SIZE), ("max_model_len", Int(ge=256, null=True)),
    ("gpu_memory_utilization", Float(gt=0, le=1)), ("max_num_seqs", Int(ge=1, null=True)),
    ("extra_args", List(STR)), ("extra_body", DICT), ("extra_body.*", ANY),
    ("chat_template_kwargs", DICT), ("chat_template_kwargs.*", ANY),
    # budgets of the profile (read by extract/consolidate/retrieve/answer via ${llm.budgets.*})
    ("budgets", DICT), ("budgets.*_max_tokens", TOKENS),
    ("budgets.extract_max_items", Int(ge=1, null=True)), ("budgets.worked_example", BOOL),
    ("budgets.extract_max_item_chars", SIZE), ("budgets.reader_*_k", Int(ge=0)),
    ("server_python", STR_OR_NULL), ("vllm_entrypoint", Enum("serve", "module")),
    ("convert_from_gguf", STR_OR_NULL), ("server_env", DICT), ("server_env.*", ANY),
    ("engine_kwargs", DICT), ("engine_kwargs.*", ANY),
]

RULES: list[tuple[str, Rule]] = [
    # root
    ("stages", List(STR, null=True)), ("force", BOOL), ("dry_run", BOOL),
    ("shard_index", Int(ge=0)), ("num_shards", SIZE),
    ("cache.llm", BOOL), ("cache.embeddings", BOOL),
    ("preempt.grace_s", Float(ge=0)), ("preempt.exit_code", Int(ge=1, le=255)),
    ("report.bootstrap_resamples", COUNT), ("report.bootstrap_seed", Int(ge=0)),
    ("report.max_parse_failure_rate", RATE), ("report.plots", BOOL),
    ("paths.*", STR),
    # benchmark
    ("benchmark.name", Enum("locomo", "longmemeval", "sample")),
    ("benchmark.path", STR_OR_NULL), ("benchmark.conversations", List(null=True)),
    ("benchmark.max_sessions", Int(ge=1, null=True)),
    ("benchmark.categories", List(Int(ge=1), null=True)),
    # method
    ("method.name", STR), ("method.stages", List(STR)), ("method.implementations.*", STR_OR_NULL),
    ("prompts.reference_dir", STR_OR_NULL),
    ("extract.turns_per_request", SIZE), ("extract.context_turns", COUNT),
    ("extract.window_tokens", Int(ge=1, null=True, note="null = fixed turn windows")),
    ("extract.prompt_variant", Enum("default", "grounded")), ("extract.worked_example", BOOL),
    ("extract.perspectives", List(Enum("fact", "relation"))),
    ("extract.max_items", Int(ge=1, null=True)), ("extract.max_item_chars", SIZE),
    ("consolidate.enabled", BOOL), ("consolidate.window_seconds", Float(gt=0)),
    ("consolidate.seed_k", COUNT), ("consolidate.seed_exclude_buffer", BOOL), ("consolidate.seed_scope", Enum("historical", "global")),
    ("consolidate.query_mode", Enum("concat", "mean")),
    ("consolidate.prompt_variant", Enum("constrained", "unconstrained")),
    ("retrieve.*_k", COUNT),
    ("answer.prompt", STR), ("answer.context_tokens", SIZE),
    ("answer.protocol", Enum("paper", "reasoned")), ("judge.protocol", Enum("paper", "reasoned")),
    ("answer.entry_layout", Enum("speakers", "rank")), ("answer.speaker_groups", SIZE),
    ("debug_profile", Enum("ci", "scripted", null=True)),
    ("graph_memory.entity_types", List(STR)), ("graph_memory.turns_per_request", SIZE),
    ("graph_memory.*threshold", RATE), ("graph_memory.*_k", COUNT),
    ("graph_memory.max_*", SIZE),
    ("seem.ablation.*", BOOL), ("seem.passages_per_request", SIZE),
    ("seem.fusion.window", SIZE), ("seem.fusion.skip_judge_below", Float(ge=0, le=1, null=True)),
    ("seem.fusion.strict_two_call", BOOL), ("seem.graph.edge_doubling", BOOL),
    ("seem.graph.fact_dedup_threshold", Float(ge=0, le=1, null=True)),
    ("seem.graph.synonymy_k", SIZE), ("seem.graph.synonymy_max_per_entity", SIZE),
    ("seem.graph.synonymy_min_alnum", COUNT), ("seem.*threshold", RATE),
    ("seem.retrieve.damping", Float(gt=0, le=1)),
    ("seem.retrieve.fact_filter", BOOL), ("seem.retrieve.passage_weight", Float(ge=0)),
    ("seem.retrieve.rpe_factor", Float(ge=0)), ("seem.retrieve.*_k", COUNT),
    ("seem.retrieve.filter_max", SIZE),
    ("seem.*chars", SIZE), ("seem.*max_*", SIZE),
    # embedder / index
    ("embedder.model", STR_OR_NULL), ("embedder.device", STR), ("embedder.fp16", BOOL),
    ("embedder.batch_size", SIZE), ("embedder.trust_remote_code", BOOL),
    ("embedder.instructions", DICT), ("embedder.instructions.*", STR_OR_NULL), ("embedder.long_texts", Enum("chunk", "truncate")), ("embedder.max_seq_length", Int(ge=1, null=True)),
    ("index.use_gpu", Enum("auto", True, False)), ("index.gpu_max_k", SIZE),
    # judge (its llm configs are checked with LLM_RULES, see _llm_prefixes)
    ("judge.name", STR), ("judge.llm", DICT), ("judge.panel", List(DICT, null=True)),
    ("judge.*_llm", DICT),
    # audits
    ("audit.seed", Int(ge=0)), ("audit.extraction.sample_size", Int(ge=1, null=True)),
    ("audit.*chars", SIZE), ("audit.*.max_links", SIZE),
    # generic knobs shared by many stages (after the specific ones above)
    ("*.max_tokens", TOKENS), ("*.max_tokens.*", TOKENS), ("*.temperature", TEMPERATURE),
    ("*_chars", SIZE),
]


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def _llm_prefixes(cfg: Mapping[str, Any]) -> list[str]:
    """Dotted paths of every llm config in the tree (the job's, judges', panel members')."""
    out = ["llm"]
    judge = cfg.get("judge") or {}
    if isinstance(judge, Mapping):
        out += [f"judge.{k}" for k, v in judge.items()
                if (k == "llm" or k.endswith("_llm")) and isinstance(v, Mapping)]
        for i, member in enumerate(judge.get("panel") or []):
            if isinstance(member, Mapping) and isinstance(member.get("llm"), Mapping):
                out.append(f"judge.panel.{i}.llm")
    return out


def rule_for(key: str, llm_prefixes: Sequence[str] = ("llm",)) -> Rule | None:
    for prefix in llm_prefixes:
        if key.startswith(prefix + "."):
            sub = key[len(prefix) + 1:]
            return next((r for p, r in LLM_RULES if fnmatch.fnmatchcase(sub, p)), None)
    return next((r for p, r in RULES if fnmatch.fnmatchcase(key, p)), None)


def flatten(cfg: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(dotted key, value) of every checked leaf; panel members' llm dicts are walked too."""
    out: list[tuple[str, Any]] = []
    for key, value in _leaves(cfg):
        if key == "hydra" or key.startswith("hydra."):
            continue
        out.append((key, value))
    judge = cfg.get("judge") or {}
    panel = judge.get("panel") if isinstance(judge, Mapping) else None
    for i, member in enumerate(panel or []):
        if isinstance(member, Mapping):
            out += [(f"judge.panel.{i}.{k}", v) for k, v in _leaves(member)
                    if k.startswith("llm.")]
            if not isinstance(member.get("name"), str):
                out.append((f"judge.panel.{i}.name", member.get("name")))
    return out


def problems(cfg: Mapping[str, Any]) -> list[str]:
    """Every violation as one line `key=value: expected ...` (empty when the config is fine)."""
    prefixes = _llm_prefixes(cfg)
    out = []
    for key, value in flatten(cfg):
        if key.startswith("judge.panel.") and key.endswith(".name"):
            out.append(f"{key}={value!r}: expected a string (each panel member needs a name)")
            continue
        rule = rule_for(key, prefixes)
        if rule is None:
            log.debug("config key %s has no schema rule; not checked", key)
            continue
        why = rule.problem(value)
        if why:
            out.append(f"{key}={value!r}: {why}")
    shard, n = cfg.get("shard_index"), cfg.get("num_shards")
    if isinstance(shard, int) and isinstance(n, int) and n >= 1 and not 0 <= shard < n:
        out.append(f"shard_index={shard!r}: expected 0 <= shard_index < num_shards ({n})")
    return out


def check_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad key (and how many more) before any stage runs."""
    if hasattr(cfg, "_metadata"):
        from omegaconf import OmegaConf

        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except Exception as e:  # an interpolation that cannot resolve (missing env var ...)
            raise ConfigError(f"config: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    else:
        data = cfg
    assert isinstance(data, Mapping)
    found = problems(data)
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:4])})" if len(found) > 1 else ""
        raise ConfigError(f"config {found[0]}{more}")
