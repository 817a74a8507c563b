"""Every field of every config group's model is settable on every profile, and each profile
states only what differs from its base (issue 40).

The bases are generated from the models (config/yaml_defaults.py: conf/llm/_base.yaml,
conf/embedder/_base.yaml, conf/judge/_base.yaml, conf/tracking/_base.yaml, conf/method/_answer.yaml
and config.yaml's root keys), so a profile that lists its base first has every key, and Hydra
takes `group.key=value` for each of them without `+`. One compose per profile sets every field
at once (a value other than the profile's own) and checks the typed model reads it back.
"""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types as at
import pytest
import yaml
from omegaconf import OmegaConf

from structmem_gpu.config import yaml_defaults
from structmem_gpu.config.judge import JudgeSettings
from structmem_gpu.config.schema import EmbedderSettings, JobSettings, LLMSettings, TrackingSettings
from structmem_gpu.config.settings import Settings, field_type, fields, item_model, sub_model
from structmem_gpu.eval.answer import AnswerSettings
from tests.fixtures.pipeline import CONF_DIR, compose_cfg, options

ROOT = Path(__file__).resolve().parents[2]
GROUPS: dict[str, type[Settings]] = {
    "llm": LLMSettings, "embedder": EmbedderSettings, "judge": JudgeSettings,
    "tracking": TrackingSettings,
}


# ---- a valid value other than the current one, for any field -------------------------------


def _parts(tp: Any) -> tuple[Any, dict[str, float]]:
    """(the base type without None and Annotated, its numeric bounds)."""
    bounds: dict[str, float] = {}
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp, *extras = typing.get_args(tp)
            for m in extras:
                for c in getattr(m, "metadata", [m]):
                    for name in ("ge", "gt", "le"):
                        if isinstance(c, getattr(at, name.capitalize())):
                            bounds[name] = getattr(c, name)
        elif origin in (Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        else:
            return tp, bounds


def other_value(f: Any, current: Any) -> Any:
    registry = [m for m in f.metadata if hasattr(m, "choices")]  # llm.backend: registered names
    if registry:
        return next(c for c in registry[0].choices() if c != current)
    tp, b = _parts(field_type(f))
    if typing.get_origin(tp) is Literal:
        choices = [c for c in typing.get_args(tp) if c != current and not isinstance(c, bool)]
        return choices[0] if choices else current
    if tp is bool:
        return not current
    if tp is int:
        low = b.get("ge", b.get("gt", 0))
        value = (current if isinstance(current, int) else int(low)) + 1
        return value if value <= b.get("le", value) else int(low)
    if tp is float:
        low = b.get("ge", b.get("gt", 0.0))
        return (low + b["le"]) / 2 if "le" in b else float(current or low) + 1.5
    if tp is str:
        return "x-value" if current != "x-value" else "y-value"
    if typing.get_origin(tp) is tuple:
        return ["a", "b"]
    # A free-form mapping (extra_body, server_env ...): Hydra merges a mapping into a stated
    # one, so a key the profile states takes a new value; a null or empty one takes any key.
    return {next(iter(current)): "x-value"} if current else {"k": 1}


def _text(value: Any) -> str:
    """A value as Hydra's override grammar writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def every_field(model: type[Settings], node: Any, prefix: str) -> dict[str, Any]:
    """dotted key -> new value for every field `model` writes at `prefix` of the composed node
    (nested settings field by field; a null nested node or list as one value)."""
    out: dict[str, Any] = {}
    for name, f in yaml_defaults.yaml_fields(model).items():
        key, current = f"{prefix}.{name}" if prefix else name, (node or {}).get(name)
        sub, each = sub_model(f), item_model(f)
        if sub is not None and current is not None:
            out.update(every_field(sub, current, key))
        elif each is not None and current:
            out.update(every_field(each, current[0], f"{key}.0"))
        elif sub is not None or each is not None:
            out[key] = None  # a null node: the field is the node itself
        else:
            out[key] = other_value(f, current)
    return out


def _check_all_set(overrides: list[str], want: dict[str, Any], read: Any) -> None:
    cfg = compose_cfg(overrides + [f"{k}={_text(v)}" for k, v in want.items()])
    assert not any(o.startswith("+") for o in overrides)
    for key, value in want.items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        if isinstance(value, dict) and isinstance(got, dict):  # merged into the stated keys
            got = {k: got[k] for k in value if k in got}
        assert got == value, key
    read(cfg)  # the typed model takes every value (one line naming the key if not)


PROFILES = [(g, name) for g in GROUPS for name in options(g)]


@pytest.mark.parametrize(("group", "name"), PROFILES, ids=[f"{g}={n}" for g, n in PROFILES])
def test_every_field_is_settable_on_every_profile(group: str, name: str) -> None:
    model = GROUPS[group]
    node = OmegaConf.to_container(compose_cfg([f"{group}={name}"])[group])
    want = every_field(model, node, group)
    assert len(want) >= len(yaml_defaults.yaml_fields(model))
    _check_all_set([f"{group}={name}"], want, model.from_cfg)


def test_every_root_key_and_block_is_settable() -> None:
    cfg = OmegaConf.to_container(compose_cfg([]))
    want = every_field(JobSettings, cfg, "")
    for f in fields(JobSettings).values():  # the blocks of config.yaml (gpu, cache, report ...)
        sub = sub_model(f)
        if sub is not None and sub.yaml_home == "config.yaml":
            want.update(every_field(sub, cfg[sub.node], sub.node))
    want["shard_index"], want["num_shards"] = 1, 2  # a consistent pair
    groups = want.pop("question_groups")  # groups are shards: set apart from a sharded job
    _check_all_set([], want, JobSettings.from_cfg)
    _check_all_set([], {"question_groups": groups}, JobSettings.from_cfg)


@pytest.mark.parametrize("method", options("method"))
def test_every_answer_field_is_settable_on_every_method(method: str) -> None:
    node = OmegaConf.to_container(compose_cfg([f"method={method}"])["answer"])
    _check_all_set([f"method={method}"], every_field(AnswerSettings, node, "answer"),
                   AnswerSettings.from_cfg)


# ---- a profile states only what differs from its base --------------------------------------


def _raw(group: str, name: str) -> dict[str, Any]:
    return yaml.safe_load((CONF_DIR / group / f"{name}.yaml").read_text(encoding="utf-8")) or {}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _composed(group: str, name: str, *, own: bool = True) -> dict[str, Any]:
    """A group option's raw values (interpolations unresolved) over its defaults list: what
    the profile inherits (own=False) or ends with (own=True)."""
    data = _raw(group, name)
    out: dict[str, Any] = {}
    for entry in data.get("defaults") or []:
        if isinstance(entry, str) and entry != "_self_":
            out = _merge(out, _composed(group, entry))
        elif isinstance(entry, dict):  # /llm@llm: external -> that llm profile at judge.llm
            (where, option), = entry.items()
            other, _, package = where.lstrip("/").partition("@")
            out = _merge(out, {package: _composed(other, option)})
    return _merge(out, {k: v for k, v in data.items() if k != "defaults"}) if own else out


def restated(own: dict[str, Any], inherited: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in own.items():
        if key == "defaults" or key not in inherited:
            continue
        base = inherited[key]
        if isinstance(value, dict) and isinstance(base, dict) and value:
            out += restated(value, base, f"{prefix}{key}.")
        elif value == base or (value in ({}, []) and base in (None, [], {})):
            out.append(prefix + key)
    return out


@pytest.mark.parametrize(("group", "name"), PROFILES, ids=[f"{g}={n}" for g, n in PROFILES])
def test_a_profile_states_only_what_differs_from_its_base(group: str, name: str) -> None:
    entries = _raw(group, name).get("defaults") or []
    assert entries and entries[0] in ("_base", *options(group)), "the base (or a profile) first"
    assert restated(_raw(group, name), _composed(group, name, own=False)) == []


def test_a_restated_default_is_found() -> None:
    assert restated({"seed": 0, "n_ctx": 4096, "budgets": {"extract_max_items": None}},
                    _composed("llm", "_base")) == ["seed", "budgets.extract_max_items"]


# ---- the documented knobs run on every llm profile -----------------------------------------


@pytest.mark.e2e  # e2e: a 12-profile dry-run multirun
def test_reply_and_structure_knobs_dry_run_on_every_llm_profile(tmp_path: Path) -> None:
    """`llm.request_seed=false` and `llm.structure_only=true` with dry_run=true, on every llm
    profile: one Hydra multirun (one process, one dry run per profile), no `+` anywhere."""
    profiles = ",".join(options("llm"))
    out = subprocess.run(
        [sys.executable, "jobs/run.py", "-m", f"llm={profiles}", "llm.request_seed=false",
         "llm.structure_only=true", "dry_run=true", f"paths.output_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    n = len(options("llm"))
    assert f"# Sweep summary: {n} points, {n} ok, 0 not ok" in out.stdout, out.stdout[-2000:]
