"""YAML default blocks written from the models: a node's keys, defaults and comments in conf/.

Hydra refuses to override a key the YAML lacks, so a node whose defaults live in its model
(config/schema.py) must still appear in the YAML, key by key. Those blocks are generated, never
written by hand: each field becomes its description (wrapped, as comment lines) and `key:
default`. The comment lines above a block's `node:` line stay hand-written (what the node is for).

    python -m structmem_gpu.config.yaml_defaults           # rewrite the generated blocks
    python -m structmem_gpu.config.yaml_defaults --check   # exit 1 when a block differs

tests/unit/test_yaml_defaults.py fails on any difference, so a knob added to one of these models
(type, range, default, description, role: one field) reaches the YAML by running the generator.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.config.schema import (
    CacheSettings,
    GpuSettings,
    PreemptSettings,
    PreflightSettings,
    ReportSettings,
)
from structmem_gpu.config.settings import Settings, fields, meta

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
WIDTH = 95  # the conf/ files' line length
# (file under conf/, models whose `node` block in it is generated)
GENERATED: tuple[tuple[str, tuple[type[Settings], ...]], ...] = (
    ("config.yaml", (CacheSettings, GpuSettings, PreemptSettings, PreflightSettings, ReportSettings)),
)


def scalar(value: Any) -> str:
    """A default as YAML text (JSON scalars are YAML; tuples become flow lists)."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", value) and \
            value not in ("null", "true", "false", "yes", "no", "on", "off"):
        return value
    return json.dumps(value)


def render_block(model: type[Settings], indent: int = 0) -> list[str]:
    """The lines of `model`'s node: `node:`, then per field its description and `key: default`
    (nested settings as nested blocks). Every field needs a default and a description."""
    pad = " " * (indent + 2)
    out: list[str] = []
    for name, f in fields(model).items():
        if f.is_required():
            raise ValueError(f"{model.__name__}.{name}: a generated block needs a default")
        if not f.description:
            raise ValueError(f"{model.__name__}.{name}: a generated block needs a description")
        out += textwrap.wrap(f.description, WIDTH, initial_indent=f"{pad}# ",
                             subsequent_indent=f"{pad}# ", break_on_hyphens=False)
        sub = meta(f).get("sub")
        if sub is not None and f.default is not None:
            out.append(f"{pad}{name}:")
            out += render_block(sub, indent + 2)[1:]
        else:
            out.append(f"{pad}{name}: {scalar(f.default)}")
    return [f"{' ' * indent}{model.node}:", *out]


def regenerate(text: str, models: Sequence[type[Settings]]) -> str:
    """`text` (a YAML file) with each model's top-level `node:` block replaced by its rendering:
    the block is the `node:` line and every following indented, comment or blank line up to the
    next top-level key or comment (a blank line followed by one)."""
    lines = text.split("\n")
    for model in models:
        start = next((i for i, ln in enumerate(lines) if re.fullmatch(rf"{model.node}:\s*(#.*)?", ln)), None)
        if start is None:
            raise ValueError(f"no top-level '{model.node}:' block to generate")
        end = start + 1
        while end < len(lines) and (lines[end].startswith(" ") or
                                    (lines[end] == "" and end + 1 < len(lines) and lines[end + 1].startswith(" "))):
            end += 1
        lines[start:end] = render_block(model)
    return "\n".join(lines)


def differences(conf_dir: Path = CONF_DIR) -> list[str]:
    """Files under `conf_dir` whose generated blocks differ from the models."""
    out = []
    for name, models in GENERATED:
        path = conf_dir / name
        text = path.read_text(encoding="utf-8")
        if regenerate(text, models) != text:
            out.append(str(path))
    return out


def write(conf_dir: Path = CONF_DIR) -> list[str]:
    """Rewrite the generated blocks; the files changed."""
    changed = []
    for name, models in GENERATED:
        path = conf_dir / name
        text = path.read_text(encoding="utf-8")
        new = regenerate(text, models)
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
