"""Typed settings: one frozen pydantic model per config node, each knob one typed field.

    class ConsolidateSettings(Settings):
        node: ClassVar[str] = "consolidate"
        seed_k: int = knob(COUNT, 3)                      # type + range = the validation
        reference_dir: str | None = knob(STR_OR_NULL, None, external="prompts.reference_dir")

    ConsolidateSettings.from_cfg(cfg)   # validated instance; ConfigError naming the key if not

A settings class is the schema (pydantic v2 validates every field before any stage runs:
`config.schema.check_config`), the stage's view of its config (stage code reads the instance,
not `cfg`) and its fingerprint (`fingerprint_dict`). `knob(TYPE, default, role=...)` is a
pydantic `Field`: TYPE is a pydantic type (`COUNT = Annotated[int, Field(ge=0), Note("0 =
off")]`, `Enum("a", "b")` = a Literal, `List(STR)` = a tuple) and becomes the field's
annotation, so the written annotation is documentation only; the field's metadata carries

  role      "result" (changes results; the default), "model" (identifies a model: part of the
            LLM/encoder identity that stage fingerprints and caches key on), or "run" (only how
            or where a job runs: never in a fingerprint, the config hash or a run-directory key).
            Every derived key list (stage.LLM_IDENTITY, result_keys.SERVING_KEYS ...) reads it.
  external  read from this dotted key of the config root instead of the node (its owner's model
            checks it there), e.g. seem.passages_per_request.
  yaml      the default as the generated YAML writes it when that is an interpolation (a
            profile's budget: "${llm_or:budgets.extract_max_tokens,4096}"); the Python
            default is what it resolves to when no profile sets it.

A model with `yaml_home = "method/structmem.yaml"` (a ClassVar) has its node's block in that
file generated from its fields: description as comments, then `key: default`
(config/yaml_defaults.py finds such models itself; `in_yaml=False` leaves a knob out).

Fields may be nested settings (`sub`) or lists of settings (`items`). Keys of a node that no
field declares are not checked at run time; tests/unit/test_config_schema.py fails when a
packaged config has such a key. Open keys (`open_keys`: fnmatch pattern -> type or settings
class, e.g. judge.*_llm) are checked and kept (`open_values`).

Errors are one line, `config KEY=value: expected <what is allowed>` (jobs exit 2): pydantic's
errors are mapped back to the dotted key and described from the field's type (`describe`).

Ranges follow one convention: counts and k's are >= 0 where 0 switches the thing off, windows
and budgets are >= 1 (or > 0 for seconds), rates and thresholds are in [0, 1].
"""

from __future__ import annotations

import fnmatch
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

import annotated_types as at
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, TypeAdapter, ValidationError, model_validator
from pydantic.fields import FieldInfo

from structmem_gpu.core.errors import ConfigError

_MISSING = object()

ROLES = ("result", "model", "reply", "run")
RESULT, MODEL, REPLY, RUN = ROLES


@dataclass(frozen=True)
class Note:
    """Annotated metadata: a remark the error line and the docs add to the type's text."""

    text: str


# ---- types: what a knob may hold (pydantic validates; `describe` words them) ---------------


def Int(ge: float | None = None, le: float | None = None, *, null: bool = False, note: str = "") -> Any:
    return _typed(int, null, note, ge=ge, le=le)


def Float(ge: float | None = None, le: float | None = None, *, gt: float | None = None,
          null: bool = False, note: str = "") -> Any:
    return _typed(float, null, note, ge=ge, le=le, gt=gt)


def Str(*, null: bool = False, note: str = "") -> Any:
    return _typed(str, null, note)


def Enum(*choices: Any, null: bool = False) -> Any:
    tp: Any = Literal[choices]  # type: ignore[valid-type]
    return tp | None if null else tp


def List(item: Any = None, *, null: bool = False) -> Any:
    tp: Any = tuple[Any if item is None else item, ...]  # settings are frozen: lists become tuples
    return tp | None if null else tp


def _typed(base: type, null: bool, note: str, **bounds: float | None) -> Any:
    meta: list[Any] = [Field(**{k: v for k, v in bounds.items() if v is not None})]
    if note:
        meta.append(Note(note))
    tp: Any = Annotated[(base, *meta)] if any(v is not None for v in bounds.values()) or note else base
    return tp | None if null else tp


BOOL: Any = bool
STR: Any = str
STR_OR_NULL: Any = str | None
ANY: Any = Any
DICT: Any = dict[str, Any] | None  # free-form mapping passed through (extra_body, server_env ...)
COUNT = Int(ge=0, note="0 = off")  # k's and optional counts
SIZE = Int(ge=1)  # budgets, windows, batch sizes
TOKENS = Int(ge=1, note="reply budget in tokens")
RATE = Float(ge=0, le=1)
TEMPERATURE = Float(ge=0, le=2)
TOP_P = Float(gt=0, le=1)  # nucleus sampling mass (1 = off)


# ---- fields -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Knob:
    """A field declaration; the Settings metaclass turns it into a pydantic field of `type`."""

    type: Any
    default: Any
    meta: Mapping[str, Any]
    description: str | None

    def field(self) -> Any:
        extra = dict(self.meta)
        kwargs: dict[str, Any] = {"json_schema_extra": extra}
        if self.description:
            kwargs["description"] = self.description
        if self.default is _MISSING:
            return Field(**kwargs)
        return Field(self.default, **kwargs)


def _role(role: str | None, hashed: bool | None) -> str:
    if role is None:
        role = RESULT if hashed is None or hashed else RUN
    if role not in ROLES:
        raise ValueError(f"role {role!r}; roles are {ROLES}")
    return role


def knob(type_: Any, default: Any = _MISSING, *, role: str | None = None, hashed: bool | None = None,
         external: str | None = None, description: str | None = None, tables: bool = True,
         yaml: str | None = None, in_yaml: bool = True) -> Any:
    """A leaf field of pydantic type `type_` (COUNT, Int(ge=1), Enum(...) ...). role: see the
    module text (hashed=False is role="run"). external: read from this dotted key of the config
    root instead of the node (that key's own model checks it). tables=False: a result knob
    that changes no table of a run directory, only what is kept beside them (report figures;
    result_keys.NO_TABLE_KEYS). yaml: the default as the generated YAML writes it when that is
    an expression rather than the value, e.g. "${llm_or:budgets.extract_max_tokens,4096}"
    (a profile's budget); `default` is then what the expression resolves to when the profile
    sets nothing (tests/unit/test_yaml_defaults.py checks the two agree). in_yaml=False: the
    generated block leaves the key out (a knob only some methods' hand-written files set, whose
    absence elsewhere keeps those methods' composed configs and config hashes as they were)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("knob defaults must be immutable")
    meta = {"role": _role(role, hashed), "external": external, "tables": tables}
    if yaml is not None:
        meta["yaml"] = yaml
    if not in_yaml:
        meta["in_yaml"] = False
    return _Knob(type_, default, meta, description)


def sub(model: type["Settings"], *, null: bool = False, default: Any = _MISSING, hashed: bool | None = None,
        role: str | None = None, external: str | None = None, description: str | None = None,
        tables: bool = True) -> Any:
    """A nested node of settings `model` (null=True: the node may be null); external: the
    node at this dotted key of the config root instead (e.g. seem.ablation)."""
    meta = {"role": _role(role, hashed), "external": external, "sub": model, "null": null,
            "tables": tables}
    return _Knob(model | None if null else model, default, meta, description)


def items(model: type["Settings"], *, null: bool = False, default: Any = _MISSING,
          description: str | None = None) -> Any:
    """A list whose items are nodes of settings `model`."""
    meta = {"role": RESULT, "external": None, "each": model, "null": null}
    tp: Any = tuple[model, ...]  # type: ignore[valid-type]
    return _Knob(tp | None if null else tp, default, meta, description)


class _SettingsMeta(type(BaseModel)):  # type: ignore[misc]  # pydantic's model metaclass
    """Turns each `knob()`/`sub()`/`items()` of a class body into a typed pydantic field: the
    knob's type becomes the field's annotation (so the rule is written once, in the knob)."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any], **kw: Any) -> Any:
        ann = dict(ns.get("__annotations__", {}))
        for key, value in list(ns.items()):
            if isinstance(value, _Knob):
                ann[key] = value.type
                ns[key] = value.field()
        ns["__annotations__"] = ann
        return super().__new__(mcs, name, bases, ns, **kw)


class Settings(BaseModel, metaclass=_SettingsMeta):
    """Base of every settings model (frozen; strict types: "3" is not an integer)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore", arbitrary_types_allowed=True,
                              protected_namespaces=())

    # Dotted config node the settings are built from ("" = the config root).
    node: ClassVar[str] = ""
    # Keys matched by pattern (fnmatch) rather than named: pattern -> a type or Settings class.
    open_keys: ClassVar[Mapping[str, Any]] = {}
    # True: a key the model does not declare is an error (a closed table such as
    # embedder.instructions, whose typo would otherwise silently drop an instruction).
    closed: ClassVar[bool] = False
    # The conf/ file (relative to conf/) whose top-level `node:` block is generated from this
    # model's fields (config/yaml_defaults.py); None = the node's YAML is hand-written.
    yaml_home: ClassVar[str | None] = None

    _open_values: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Positional arguments in field order, as the dataclasses these models replace took.
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__} takes {len(names)} fields, got {len(args)}")
        kwargs.update(zip(names, args))
        super().__init__(**kwargs)

    @model_validator(mode="before")
    @classmethod
    def _lists_to_tuples(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        for name, f in cls.model_fields.items():
            if isinstance(out.get(name), list) and _origin(_strip(f.annotation)[0]) is tuple:
                out[name] = tuple(out[name])
        return out

    def check(self) -> list[str]:
        """Rules across fields (`key=value: expected ...`), run after each field passed its own."""
        return []

    @classmethod
    def from_cfg(cls, cfg: Any) -> Any:
        """The validated settings of `cls.node` of `cfg` (the whole job config)."""
        root = to_plain(cfg)
        data = select(root, cls.node) if cls.node else root
        if data is None:
            data = {}  # an absent node: defaults, or each required field named as missing
        obj, found = _check_build(cls, data, cls.node, root)
        if found:
            raise ConfigError(error_line(found))
        return obj


# ---- reading a field's declaration --------------------------------------------------------------


def meta(f: FieldInfo) -> Mapping[str, Any]:
    """role / external / sub / each / null of a field (knob, sub, items)."""
    extra = f.json_schema_extra
    return extra if isinstance(extra, Mapping) else {"role": RESULT, "external": None}


def role(f: FieldInfo) -> str:
    return str(meta(f).get("role", RESULT))


def hashed(f: FieldInfo) -> bool:
    return role(f) != RUN


def fields(model: type[Settings]) -> Mapping[str, FieldInfo]:
    return model.model_fields


def no_table_keys(model: type[Settings], prefix: str = "") -> tuple[str, ...]:
    """Dotted keys under `model` (at `prefix`) marked tables=False; a node so marked is one key."""
    out: list[str] = []
    for name, f in fields(model).items():
        m, path = meta(f), _join(prefix, name)
        if m.get("external"):
            continue
        if m.get("tables", True) is False:
            out.append(path)
        elif "sub" in m:
            out += no_table_keys(m["sub"], path)
    return tuple(out)


def fields_with_role(model: type[Settings], wanted: str) -> tuple[str, ...]:
    """Names of `model`'s fields with role `wanted`, in declaration order."""
    return tuple(name for name, f in fields(model).items() if role(f) == wanted)


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def _strip(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if _origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        null = len(args) < len(typing.get_args(tp))
        inner = args[0] if len(args) == 1 else Union[tuple(args)]  # type: ignore[valid-type]
        return inner, null
    return tp, False


def _num(x: Any) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def describe(tp: Any) -> str:
    """What a value of type `tp` may be, in the error line's words ("an integer >= 0 (0 = off)")."""
    base, null = _strip(tp)
    note = ""
    bounds: dict[str, Any] = {}
    if _origin(base) is Annotated:
        base, *extras = typing.get_args(base)
        for m in extras:
            if isinstance(m, Note):
                note = m.text
            for c in getattr(m, "metadata", [m]):
                for attr in ("ge", "gt", "le"):
                    if isinstance(c, getattr(at, attr.capitalize())):
                        bounds[attr] = getattr(c, attr)
    if _origin(base) is Literal:
        text = "one of " + ", ".join(repr(c) for c in typing.get_args(base))
    elif _origin(base) is tuple:
        item = typing.get_args(base)[0] if typing.get_args(base) else Any
        text = "a list" + ("" if item is Any else f" of {describe(item)}")
    elif isinstance(base, type) and issubclass(base, Settings):
        text = "a mapping"
    else:
        text = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
                dict: "a mapping"}.get(_origin(base) or base, "any value")
        words = [f"{op} {_num(bounds[k])}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="))
                 if k in bounds]
        if words:
            text += " " + " and ".join(words)
    if null:
        text += " or null"
    return text.strip() + (f" ({note})" if note else "")


def field_type(f: FieldInfo) -> Any:
    """The field's full type (pydantic moves a top-level Annotated's metadata into f.metadata)."""
    return Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation


def describe_field(f: FieldInfo) -> str:
    return describe(field_type(f))


# ---- checking and building ------------------------------------------------------------------------


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


def _open(model: type[Settings], key: str) -> Any:
    return next((spec for pat, spec in model.open_keys.items() if fnmatch.fnmatchcase(key, pat)), None)


def _is_model(spec: Any) -> bool:
    return isinstance(spec, type) and issubclass(spec, Settings)


def _leaf(tp: Any, value: Any, path: str) -> tuple[Any, list[str]]:
    """(value as validated, problems) of a leaf value of type `tp` at `path`."""
    if value is None and not _strip(tp)[1]:
        return None, [f"{path}=None: a value is required: {describe(tp)}"]
    try:
        return _adapter(tp).validate_python(tuple(value) if isinstance(value, list) else value), []
    except ValidationError:
        return None, [f"{path}={value!r}: expected {describe(tp)}"]


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(tp: Any) -> TypeAdapter[Any]:
    key = repr(tp)
    if key not in _ADAPTERS:
        _ADAPTERS[key] = TypeAdapter(tp, config=ConfigDict(strict=True))
    return _ADAPTERS[key]


def _node(spec: type[Settings], value: Any, path: str, root: Mapping[str, Any], null: bool) -> tuple[Any, list[str]]:
    if value is None:
        return None, ([] if null else [f"{path}=None: a value is required: a mapping"])
    if not isinstance(value, Mapping):
        return None, [f"{path}={value!r}: expected a mapping"]
    return _check_build(spec, value, path, root)


def _check_build(model: type[Settings], data: Any, prefix: str,
                 root: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """(instance of `model` from node `data` at dotted `prefix`, every problem as `key=value:
    expected ...`); the instance is None when there is a problem. Nested nodes are built first
    (their problems named at their own keys), then pydantic validates this node's fields."""
    if not isinstance(data, Mapping):
        return None, [f"{prefix or 'config'}={data!r}: expected a mapping"]
    lines: dict[str, list[str]] = {}
    kwargs: dict[str, Any] = {}
    for name, f in fields(model).items():
        m = meta(f)
        path = m.get("external") or _join(prefix, name)
        value = select(root, m["external"], _MISSING) if m.get("external") else data.get(name, _MISSING)
        if value is _MISSING:
            if f.is_required():
                what = "a mapping" if "sub" in m else describe_field(f)
                lines[name] = [f"{path}=None: a value is required: {what}"]
            continue
        if "sub" in m:
            obj, lines[name] = _node(m["sub"], value, path, root, m["null"])
        elif "each" in m:
            if value is None and m["null"]:
                obj, lines[name] = None, []
            elif not isinstance(value, (list, tuple)):
                obj, lines[name] = None, [f"{path}={value!r}: expected a list"]
            else:
                built = [_node(m["each"], v, f"{path}.{i}", root, False) for i, v in enumerate(value)]
                lines[name] = [line for _, p in built for line in p]
                obj = tuple(b for b, _ in built)
        else:
            obj, lines[name] = _leaf(field_type(f), value, path)
        if not lines[name]:
            kwargs[name] = obj
    extra: dict[str, Any] = {}
    open_lines: list[str] = []
    for key, value in data.items():
        spec = None if str(key) in fields(model) else _open(model, str(key))
        if spec is None:
            continue
        path = _join(prefix, str(key))
        obj, found = _node(spec, value, path, root, False) if _is_model(spec) else _leaf(spec, value, path)
        open_lines += found
        extra[str(key)] = obj
    if model.closed:
        known = ", ".join(fields(model))
        open_lines += [f"{_join(prefix, str(k))}={v!r}: expected one of the keys {known}"
                       for k, v in data.items() if str(k) not in fields(model) and _open(model, str(k)) is None]
    found = [line for name in fields(model) for line in lines.get(name, [])] + open_lines
    if found:
        return None, found
    try:
        obj = model(**kwargs)
    except ValidationError as e:  # a field the per-field check let through (never expected)
        err = e.errors()[0]
        return None, [f"{_join(prefix, '.'.join(map(str, err['loc'])))}={err.get('input')!r}: {err['msg']}"]
    if extra:
        obj._open_values.update(extra)
    return obj, obj.check()


def problems(model: type[Settings], data: Any, prefix: str, root: Mapping[str, Any]) -> list[str]:
    """Every violation in node `data` (at dotted `prefix`) as `key=value: expected ...`."""
    return _check_build(model, data, prefix, root)[1]


def build(model: type[Settings], data: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    """An instance of `model` from node `data` (ConfigError on a problem)."""
    obj, found = _check_build(model, data, "", root)
    if found:
        raise ConfigError(error_line(found))
    return obj


def open_values(obj: Settings) -> dict[str, Any]:
    """Values of the keys matched by the model's `open_keys` (e.g. judge.qwen_llm)."""
    return dict(obj._open_values)


def externals(model: type[Settings]) -> dict[str, str]:
    """field name -> dotted root key of the fields read from outside the node."""
    return {name: meta(f)["external"] for name, f in fields(model).items() if meta(f).get("external")}


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
    for f in fields(model).values():
        m = meta(f)
        ext = m.get("external")
        if ext is not None and select(root, ext, _MISSING) is not _MISSING:
            value = select(root, ext)
            out.add(ext)
            if "sub" in m:
                out |= covered(m["sub"], value, ext, root)
            else:
                out.update(leaves(value, ext))
    if not isinstance(data, Mapping):
        return out
    for key, value in data.items():
        path = _join(prefix, str(key))
        f = fields(model).get(str(key))
        spec: Any
        if f is not None and not meta(f).get("external"):
            m = meta(f)
            spec = m.get("sub") or (("each", m["each"]) if "each" in m else "leaf")
        else:
            spec = _open(model, str(key))
        if spec is None:
            continue
        if isinstance(spec, tuple):
            out.add(path)
            for i, v in enumerate(value or []):
                out.update(covered(spec[1], v, f"{path}.{i}", root))
        elif _is_model(spec):
            out.add(path)
            out.update(covered(spec, value, path, root))
        else:
            out.update(leaves(value, path))
            out.add(path)
    return out
