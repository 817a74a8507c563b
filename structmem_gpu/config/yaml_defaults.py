"""YAML default blocks written from the models: a node's keys, defaults and comments in conf/.

Hydra refuses to override a key the YAML lacks, so a node whose defaults live in its model
must still appear in the YAML, key by key. Those blocks are generated, never written by hand:
each field becomes its description (wrapped, as comment lines) and `key: default` (the field's
`yaml=` expression where the YAML default is an interpolation such as a profile's budget). The
comment lines above a block's `node:` line stay hand-written (what the node is for); so do the
files that only override values (method variants, experiments, debug and llm profiles).

A model says where its block lives (`yaml_home = "method/structmem.yaml"`); the generator finds
the models itself: the root nodes of JobSettings and the settings of every stage named in a
conf/method/*.yaml's method.implementations. Several models may share one block (structmem's
`retrieve:` holds StructMem's entries_k/syntheses_k and turn_rag's turns_k): the model of a
stage its home file implements comes first, the others in discovery order.

    python -m structmem_gpu.config.yaml_defaults           # rewrite the generated blocks
    python -m structmem_gpu.config.yaml_defaults --check   # exit 1 when a block differs

tests/unit/test_yaml_defaults.py fails on any difference, so a knob added to one of these models
(type, range, default, description, role: one field) reaches the YAML by running the generator.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from structmem_gpu.config.schema import JobSettings
from structmem_gpu.config.settings import Settings, external, fields, in_yaml, sub_model, yaml_expr

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# conf/config.yaml's root keys (JobSettings' own leaves) are generated between these lines.
ROOT_BEGIN = "# ---- root keys: generated from config/schema.py JobSettings (config/yaml_defaults.py)"
ROOT_END = "# ---- end of the generated root keys"
WIDTH = 95  # the conf/ files' line length


def _stage_settings(target: str) -> type[Settings] | None:
    """The settings model of the Stage at "module:ATTR" (method.implementations' form)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr).settings


def discover(conf_dir: Path = CONF_DIR) -> dict[str, dict[str, list[type[Settings]]]]:
    """home file -> node -> the models generating that block, every model with a `yaml_home`."""
    found: list[tuple[str, type[Settings]]] = [("config.yaml", JobSettings)]  # (file, model)
    for f in fields(JobSettings).values():
        model = sub_model(f)
        if model is not None:
            found.append(("config.yaml", model))
    for path in sorted((conf_dir / "method").glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        impl = (data.get("method") or {}).get("implementations") or {}
        for target in impl.values():
            model = _stage_settings(target) if target else None
            if model is not None:
                found.append((f"method/{path.name}", model))
    # A node a stage reads through a nested field of its own (seem.retrieve's seem.ablation).
    i = 0
    while i < len(found):
        source, model = found[i]
        for f in fields(model).values():
            nested = sub_model(f)
            if nested is not None and all(nested is not m for _, m in found):
                found.append((source, nested))
        i += 1
    out: dict[str, dict[str, list[type[Settings]]]] = {}
    for source, model in sorted(found, key=lambda sm: sm[0] != sm[1].yaml_home):  # stable
        if model.yaml_home is None:
            continue
        group = out.setdefault(model.yaml_home, {}).setdefault(model.node, [])
        if model not in group:
            group.append(model)
    return out


def generated_models(conf_dir: Path = CONF_DIR) -> list[type[Settings]]:
    """Every model with a generated block (tests parametrize over it)."""
    return [m for nodes in discover(conf_dir).values() for ms in nodes.values() for m in ms]


def scalar(value: Any) -> str:
    """A default as YAML text (JSON scalars are YAML; tuples become flow lists)."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./:-]*[A-Za-z0-9_]", value) and \
            value not in ("null", "true", "false", "yes", "no", "on", "off"):
        return value
    return json.dumps(value)


def _field_lines(model: type[Settings], name: str, f: Any, indent: int) -> list[str]:
    pad = " " * (indent + 2)
    if f.is_required():
        raise ValueError(f"{model.__name__}.{name}: a generated block needs a default")
    if not f.description:
        raise ValueError(f"{model.__name__}.{name}: a generated block needs a description")
    out = textwrap.wrap(f.description, WIDTH, initial_indent=f"{pad}# ",
                        subsequent_indent=f"{pad}# ", break_on_hyphens=False)
    sub = sub_model(f)
    if sub is not None and f.default is not None:
        out.append(f"{pad}{name}:")
        out += render_block(sub, indent=indent + 2)[1:]
    else:
        expr = yaml_expr(f)
        out.append(f"{pad}{name}: {expr if expr is not None else scalar(f.default)}")
    return out


def yaml_fields(model: type[Settings]) -> dict[str, Any]:
    """The fields a generated block of `model` writes: not read from another node (external),
    not left out (NOT_IN_YAML), and at the root not a node of its own (a config group such as
    llm, or a block such as report: each generated where it lives)."""
    return {name: f for name, f in fields(model).items()
            if not external(f) and in_yaml(f)
            and not (not model.node and getattr(sub_model(f), "node", ""))}


def render_block(*models: type[Settings], indent: int = 0) -> list[str]:
    """The lines of the models' node: `node:`, then per field its description and `key:
    default` (nested settings as nested blocks; a field read from another node, `external`, is
    that node's; a name two models declare is written once, by the first). Every field needs a
    default and a description; NOT_IN_YAML fields are left out."""
    out: list[str] = []
    seen: set[str] = set()
    for model in models:
        for name, f in yaml_fields(model).items():
            if name in seen:
                continue
            seen.add(name)
            out += _field_lines(model, name, f, indent)
    return [f"{' ' * indent}{models[0].node.rsplit('.', 1)[-1]}:", *out]


def _block(lines: list[str], node: str) -> tuple[int, int]:
    """(index of the `key:` line of dotted `node`, end of its block): the block is every
    following line indented deeper, and a blank line followed by one."""
    lo, hi, indent = 0, len(lines), 0
    start = -1
    for part in node.split("."):
        pat = re.compile(rf"{' ' * indent}{re.escape(part)}:\s*(#.*)?")
        start = next((i for i in range(lo, hi) if pat.fullmatch(lines[i])), -1)
        if start < 0:
            raise ValueError(f"no '{node}:' block to generate")
        deeper = " " * (indent + 1)
        end = start + 1
        while end < hi and (lines[end].startswith(deeper) or
                            (lines[end] == "" and end + 1 < hi and lines[end + 1].startswith(deeper))):
            end += 1
        lo, hi, indent = start + 1, end, indent + 2
    return start, hi


def regenerate(text: str, models: Sequence[type[Settings]], home: str = "") -> str:
    """`text` (a YAML file) with each node's block replaced by the rendering of the models of
    that node (in order). The `node:` line itself (and an inline comment on it) and the comment
    lines above it stay as written: what the node is for. A file that is the node (home
    conf/<node>/*.yaml, Hydra's group package, e.g. audit/default.yaml) is generated below its
    header: the comment lines up to the first blank line."""
    groups: dict[str, list[type[Settings]]] = {}
    for model in models:
        groups.setdefault(model.node, []).append(model)
    lines = text.split("\n")
    for node, group in groups.items():
        if not node:  # the root keys: between the two marker lines
            start, end = lines.index(ROOT_BEGIN), lines.index(ROOT_END)
            lines[start + 1:end] = render_block(*group, indent=-2)[1:]
            continue
        if Path(home).parent.name == node:
            if "" not in lines[:-1]:
                raise ValueError(f"{home}: a blank line must end the header above the generated keys")
            start, end = lines.index(""), len(lines) - (lines[-1] == "")
            lines[start + 1:end] = render_block(*group, indent=-2)[1:]
            continue
        start, end = _block(lines, node)
        lines[start + 1:end] = render_block(*group, indent=2 * node.count("."))[1:]
    return "\n".join(lines)


def _files(conf_dir: Path) -> dict[str, list[type[Settings]]]:
    return {home: [m for ms in nodes.values() for m in ms] for home, nodes in discover(conf_dir).items()}


def differences(conf_dir: Path = CONF_DIR) -> list[str]:
    """Files under `conf_dir` whose generated blocks differ from the models."""
    out = []
    for name, models in _files(conf_dir).items():
        path = conf_dir / name
        text = path.read_text(encoding="utf-8")
        if regenerate(text, models, name) != text:
            out.append(str(path))
    return out


def write(conf_dir: Path = CONF_DIR) -> list[str]:
    """Rewrite the generated blocks; the files changed."""
    changed = []
    for name, models in _files(conf_dir).items():
        path = conf_dir / name
        text = path.read_text(encoding="utf-8")
        new = regenerate(text, models, name)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(str(path))
    return changed


def main(argv: Sequence[str] = ()) -> int:
    if "--check" in argv:
        diff = differences()
        for path in diff:
            print(f"{path}: generated blocks differ from the models; run "
                  "python -m structmem_gpu.config.yaml_defaults", file=sys.stderr)
        return 1 if diff else 0
    for path in write():
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
