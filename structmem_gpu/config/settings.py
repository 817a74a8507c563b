"""Typed settings: one frozen dataclass per config node, whose fields carry their rule.

    @dataclass(frozen=True)
    class ConsolidateSettings(Settings):
        node: ClassVar[str] = "consolidate"
        seed_k: int = knob(COUNT)                         # type + range = the validation
        reference_dir: str | None = knob(STR_OR_NULL, external="prompts.reference_dir")

    ConsolidateSettings.from_cfg(cfg)   # validated instance; ConfigError naming the key if not

A settings class is the schema (its fields' rules are what `config_schema.check_config`
checks before any stage runs), the stage's view of its config (stage code reads the instance,
not `cfg`), and its fingerprint (`fingerprint_dict`: every field except `hashed=False` ones).
Fields may be nested settings (`sub`), lists of settings (`items`), or read from outside the
node (`external`: a dotted key from the config root, checked by the root model). Keys of a
node that no field declares are not checked at run time; tests/unit/test_config_schema.py
fails when a packaged config has such a key.

Ranges follow one convention: counts and k's are >= 0 where 0 switches the thing off, windows
and budgets are >= 1 (or > 0 for seconds), rates and thresholds are in [0, 1].
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from structmem_gpu.core.errors import ConfigError

_MISSING = object()


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

    def convert(self, value: Any) -> Any:
        """The checked value as the stage uses it (lists become tuples: settings are frozen)."""
        if value is None:
            return None
        if self.kind == "int":
            return int(value)
        if self.kind == "float":
            return float(value)
        if self.kind == "list":
            return tuple(self.item.convert(v) if self.item else v for v in value)
        if self.kind == "dict":
            return dict(value)
        return value


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
DICT = Rule("dict", null=True)  # free-form mapping passed through (extra_body, server_env ...)
COUNT = Int(ge=0, note="0 = off")  # k's and optional counts
SIZE = Int(ge=1)  # budgets, windows, batch sizes
TOKENS = Int(ge=1, note="reply budget in tokens")
RATE = Float(ge=0, le=1)
TEMPERATURE = Float(ge=0, le=2)
TOP_P = Float(gt=0, le=1)  # nucleus sampling mass (1 = off)
_MAPPING = Rule("dict")


def knob(rule: Rule, default: Any = _MISSING, *, hashed: bool = True, external: str | None = None) -> Any:
    """A leaf field checked by `rule`. hashed=False: never part of a fingerprint or the config
    hash (where/how a job runs, not what it computes). external: read from this dotted key of
    the config root instead of the node (that key's own model checks it)."""
    meta = {"rule": rule, "hashed": hashed, "external": external}
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict, set)):
        raise TypeError("knob defaults must be immutable")
    return dataclasses.field(default=default, metadata=meta)


def sub(model: type["Settings"], *, null: bool = False, default: Any = _MISSING, hashed: bool = True,
        external: str | None = None) -> Any:
    """A nested node of settings `model` (null=True: the node may be null); external: the
    node at this dotted key of the config root instead (e.g. seem.ablation)."""
    meta = {"model": model, "null": null, "hashed": hashed, "external": external}
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def items(model: type["Settings"], *, null: bool = False, default: Any = _MISSING) -> Any:
    """A list whose items are nodes of settings `model`."""
    meta = {"each": model, "null": null, "hashed": True, "external": None}
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Settings:
    """Base of every settings dataclass (subclasses are @dataclass(frozen=True))."""

    # Dotted config node the settings are built from ("" = the config root).
    node: ClassVar[str] = ""
    # Keys matched by pattern (fnmatch) rather than named: pattern -> Rule or Settings class.
    open_keys: ClassVar[Mapping[str, Any]] = {}

    def check(self) -> list[str]:
        """Rules across fields (`key=value: expected ...`), run after each field passed its own."""
        return []

    @classmethod
    def from_cfg(cls, cfg: Any) -> Any:
        """The validated settings of `cfg` (the whole job config) at `cls.node`."""
        root = to_plain(cfg)
        data = select(root, cls.node) if cls.node else root
        if data is None:
            data = {}  # an absent node: defaults, or each required field named as missing
        found = problems(cls, data, cls.node, root)
        if found:
            raise ConfigError(error_line(found))
        return build(cls, data, root)


def to_plain(cfg: Any) -> dict[str, Any]:
    """A resolved plain dict of an OmegaConf config (or the mapping itself)."""
    if hasattr(cfg, "_metadata"):
        from omegaconf import OmegaConf

        try:
            data = OmegaConf.to_container(cfg, resolve=True)
        except Exception as e:  # an interpolation that cannot resolve (missing env var ...)
            raise ConfigError(f"config: {type(e).__name__}: {str(e).splitlines()[0]}") from None
        assert isinstance(data, dict)
        return data
    assert isinstance(cfg, Mapping)
    return dict(cfg)


def error_line(found: list[str]) -> str:
    """`config KEY=value: expected ...` for the first problem, and how many more."""
    more = f" (and {len(found) - 1} more: {'; '.join(found[1:4])})" if len(found) > 1 else ""
    return f"config {found[0]}{more}"


def select(root: Mapping[str, Any] | None, dotted: str, default: Any = None) -> Any:
    node: Any = root
    for part in dotted.split(".") if dotted else ():
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _fields(model: type[Settings]) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(model)  # type: ignore[arg-type]


def _open(model: type[Settings], key: str) -> Any:
    return next((spec for pat, spec in model.open_keys.items() if fnmatch.fnmatchcase(key, pat)), None)


def _spec_problems(spec: Any, value: Any, path: str, root: Mapping[str, Any], null: bool = False) -> list[str]:
    if isinstance(spec, Rule):
        why = spec.problem(value)
        return [f"{path}={value!r}: {why}"] if why else []
    if value is None and null:
        return []
    if not isinstance(value, Mapping):
        why = _MAPPING.problem(value)
        return [f"{path}={value!r}: {why}"]
    return problems(spec, value, path, root)


def problems(model: type[Settings], data: Any, prefix: str, root: Mapping[str, Any]) -> list[str]:
    """Every violation in node `data` (at dotted `prefix`) as `key=value: expected ...`."""
    if not isinstance(data, Mapping):
        return [f"{prefix or 'config'}={data!r}: expected a mapping"]
    out: list[str] = []
    names = set()
    for f in _fields(model):
        names.add(f.name)
        meta, path = f.metadata, _join(prefix, f.name)
        has_default = f.default is not dataclasses.MISSING
        if meta.get("external"):
            # Checked at its own key, with this field's rule (the same line as its owner's).
            path = meta["external"]
            value = select(root, path, _MISSING)
            if value is _MISSING:
                if not has_default:
                    out.append(f"{path}=None: a value is required: "
                               f"{meta['rule'].describe() if 'rule' in meta else 'a mapping'}")
                continue
            spec = meta.get("rule") or meta["model"]
            out += _spec_problems(spec, value, path, root, null=meta.get("null", False))
            continue
        if f.name not in data:
            if not has_default:
                out.append(f"{path}=None: a value is required: "
                           f"{meta['rule'].describe() if 'rule' in meta else 'a mapping'}")
            continue
        value = data[f.name]
        if "rule" in meta:
            out += _spec_problems(meta["rule"], value, path, root)
        elif "model" in meta:
            out += _spec_problems(meta["model"], value, path, root, null=meta["null"])
        else:
            if value is None and meta["null"]:
                continue
            if not isinstance(value, (list, tuple)):
                out.append(f"{path}={value!r}: expected a list")
                continue
            for i, item in enumerate(value):
                out += _spec_problems(meta["each"], item, f"{path}.{i}", root)
    for key, value in data.items():
        spec = None if key in names else _open(model, str(key))
        if spec is not None:
            out += _spec_problems(spec, value, _join(prefix, str(key)), root)
    if not out:
        out += build(model, data, root).check()
    return out


def build(model: type[Settings], data: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    """An instance of `model` from checked node `data` (fields absent from data: defaults)."""
    kwargs: dict[str, Any] = {}
    for f in _fields(model):
        meta = f.metadata
        if meta.get("external"):
            value = select(root, meta["external"], _MISSING)
            if value is _MISSING:
                continue  # a partial config (a test's node alone): the field's default
            if "rule" in meta:
                kwargs[f.name] = meta["rule"].convert(value)
            else:
                kwargs[f.name] = None if value is None else build(meta["model"], value, root)
            continue
        if f.name not in data:
            continue
        value = data[f.name]
        if "rule" in meta:
            kwargs[f.name] = meta["rule"].convert(value)
        elif "model" in meta:
            kwargs[f.name] = None if value is None else build(meta["model"], value, root)
        else:
            kwargs[f.name] = None if value is None else tuple(build(meta["each"], v, root) for v in value)
    extra = {}
    for key, value in data.items():
        spec = None if key in kwargs or any(f.name == key for f in _fields(model)) else _open(model, str(key))
        if spec is not None:
            extra[str(key)] = spec.convert(value) if isinstance(spec, Rule) else build(spec, value, root)
    obj = model(**kwargs)
    if extra:
        object.__setattr__(obj, "_open_values", extra)
    return obj


def open_values(obj: Settings) -> dict[str, Any]:
    """Values of the keys matched by the model's `open_keys` (e.g. judge.qwen_llm)."""
    return dict(getattr(obj, "_open_values", {}))


def fingerprint_dict(obj: Any) -> Any:
    """The hashed fields of a settings instance as plain containers (what fingerprints hash)."""
    if isinstance(obj, Settings):
        out = {f.name: fingerprint_dict(getattr(obj, f.name))
               for f in _fields(type(obj)) if f.metadata.get("hashed", True)}
        out.update({k: fingerprint_dict(v) for k, v in open_values(obj).items()})
        return out
    if isinstance(obj, (list, tuple)):
        return [fingerprint_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): fingerprint_dict(v) for k, v in obj.items()}
    return obj


def externals(model: type[Settings]) -> dict[str, str]:
    """field name -> dotted root key of the fields read from outside the node."""
    return {f.name: f.metadata["external"] for f in _fields(model) if f.metadata.get("external")}


def without_unhashed(model: type[Settings], data: Any) -> Any:
    """`data` (a node of `model`) minus the hashed=False fields, other keys kept as they are."""
    if not isinstance(data, Mapping):
        return data
    out = dict(data)
    for f in _fields(model):
        if f.name not in out:
            continue
        meta = f.metadata
        if not meta.get("hashed", True):
            del out[f.name]
        elif "model" in meta:
            out[f.name] = without_unhashed(meta["model"], out[f.name])
        elif "each" in meta and isinstance(out[f.name], (list, tuple)):
            out[f.name] = [without_unhashed(meta["each"], v) for v in out[f.name]]
    for key, value in data.items():
        spec = _open(model, str(key)) if key in out and not any(f.name == key for f in _fields(model)) else None
        if spec is not None and not isinstance(spec, Rule):
            out[key] = without_unhashed(spec, value)
    return out


def leaf_items(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf (an empty mapping is a leaf; a list of mappings, such
    as judge.panel, is walked by index)."""
    if isinstance(node, Mapping) and node:
        for k, v in node.items():
            yield from leaf_items(v, _join(prefix, str(k)))
    elif isinstance(node, (list, tuple)) and node and all(isinstance(v, Mapping) for v in node):
        for i, v in enumerate(node):
            yield from leaf_items(v, f"{prefix}.{i}")
    else:
        yield prefix, node


def leaves(node: Any, prefix: str = "") -> Iterator[str]:
    """Dotted keys of every leaf (leaf_items without the values)."""
    return (key for key, _ in leaf_items(node, prefix))


def covered(model: type[Settings], data: Any, prefix: str, root: Mapping[str, Any]) -> set[str]:
    """Dotted keys that a field of `model` (at `prefix`, node `data`) declares: a leaf field
    covers its whole subtree (a list, a free-form mapping), an external field its own key."""
    out: set[str] = set()
    for f in _fields(model):
        ext = f.metadata.get("external")
        if ext is not None and select(root, ext, _MISSING) is not _MISSING:
            value = select(root, ext)
            out.add(ext)
            if "model" in f.metadata:
                out |= covered(f.metadata["model"], value, ext, root)
            else:
                out.update(leaves(value, ext))
    if not isinstance(data, Mapping):
        return out
    names = {f.name: f for f in _fields(model)}
    for key, value in data.items():
        path = _join(prefix, str(key))
        f = names.get(str(key))
        spec: Any
        if f is not None and not f.metadata.get("external"):
            meta = f.metadata
            spec = meta.get("rule") or meta.get("model") or ("each", meta.get("each"))
        else:
            spec = _open(model, str(key))
        if spec is None:
            continue
        if isinstance(spec, Rule):
            out.update(leaves(value, path))
            out.add(path)
        elif isinstance(spec, tuple):
            out.add(path)
            for i, v in enumerate(value or []):
                out.update(covered(spec[1], v, f"{path}.{i}", root))
        else:
            out.add(path)
            out.update(covered(spec, value, path, root))
    return out
