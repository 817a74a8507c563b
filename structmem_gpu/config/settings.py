"""Typed settings: one frozen pydantic model per config node, each knob one annotated field.

    class ConsolidateSettings(Settings):
        node: ClassVar[str] = "consolidate"
        seed_k: COUNT = Field(3, description="Seed entries per window; 0 = off.")
        workers: Annotated[SIZE, RUN_ROLE] = 4                  # how it runs, never hashed
        reference_dir: Annotated[str | None, External("prompts.reference_dir")] = None

    ConsolidateSettings.from_cfg(cfg)   # validated instance; ConfigError naming the key if not

A settings class is the schema (pydantic v2 validates every field before any stage runs:
`config.schema.check_config`), the stage's view of its config (stage code reads the instance,
not `cfg`) and, through its roles, its identity (config/identity.py). A field is plain
pydantic: its annotation is the validated type (`COUNT = Annotated[int, Field(ge=0),
Note("0 = off")]`, `Literal["a", "b"]`, `tuple[str, ...]` for lists: settings are frozen), its
default and `description` a `Field`. What pydantic has no word for is one marker each in the
annotation's metadata:

  role      RESULT (no marker: changes results), MODEL_ROLE (identifies a model: the LLM or
            encoder identity), REPLY_ROLE (changes the reply one request gets: part of the
            response-cache key when not at its default) or RUN_ROLE (only how or where a job
            runs: never in a fingerprint, the config hash or a run-directory key). Every
            derived key (config/identity.py, config/result_keys.py) reads it.
  External(KEY)    read from this dotted key of the config root instead of the node (its
            owner's model checks it there), e.g. seem.passages_per_request.
  YamlExpr(TEXT)   the default as the generated YAML writes it when that is an interpolation
            (a profile's budget: "${llm_or:budgets.extract_max_tokens,4096}"); the Python
            default is what it resolves to when no profile sets it.
  NO_TABLES        a result knob that changes no table of a run directory, only what is kept
            beside them (report figures; result_keys.NO_TABLE_KEYS).
  NOT_IN_YAML      the generated block leaves the key out.

Nested settings are fields annotated with a Settings model (`llm: LLMSettings`, `budgets:
LLMBudgets | None`), lists of settings `tuple[PanelMember, ...]`: the walker below finds them
from the annotation. A model with `yaml_home = "method/structmem.yaml"` (a ClassVar) has its
node's block in that file generated from its fields (config/yaml_defaults.py).

What pydantic does not do is done here: one line per problem, `config KEY=value: expected
<what is allowed>` (jobs exit 2), each named by its dotted key and described from the field's
type (`describe`); fields read from another node (External); keys matched by pattern
(`open_keys`: fnmatch pattern -> type or settings class, e.g. judge.*_llm, kept in
`open_values`); closed tables (`closed`). Keys of a node that no field declares are not
checked at run time; tests/unit/test_config_schema.py fails when a packaged config has one.

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


# ---- markers: what a field's annotation says beyond its type ------------------------------


@dataclass(frozen=True)
class Note:
    """A remark the error line and the docs add to the type's text ("0 = off")."""

    text: str


@dataclass(frozen=True)
class Role:
    """The field's role (see the module text); a field without one has role RESULT."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in ROLES:
            raise ValueError(f"role {self.name!r}; roles are {ROLES}")


MODEL_ROLE, REPLY_ROLE, RUN_ROLE = Role(MODEL), Role(REPLY), Role(RUN)


@dataclass(frozen=True)
class External:
    """Read from this dotted key of the config root instead of the node."""

    key: str


@dataclass(frozen=True)
class YamlExpr:
    """The default as the generated YAML writes it (an interpolation)."""

    text: str


@dataclass(frozen=True)
class _Flag:
    name: str


NO_TABLES = _Flag("no_tables")  # changes no table, only what is kept beside them
NOT_IN_YAML = _Flag("not_in_yaml")  # left out of the generated block

# The common ranges (module text: the convention).
COUNT = Annotated[int, Field(ge=0), Note("0 = off")]  # k's and optional counts
SIZE = Annotated[int, Field(ge=1)]  # budgets, windows, batch sizes
TOKENS = Annotated[int, Field(ge=1), Note("reply budget in tokens")]
RATE = Annotated[float, Field(ge=0, le=1)]
TEMPERATURE = Annotated[float, Field(ge=0, le=2)]
TOP_P = Annotated[float, Field(gt=0, le=1)]  # nucleus sampling mass (1 = off)


class Settings(BaseModel):
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
        # Positional arguments in field order, as the dataclasses these models replaced took.
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


def _marker(f: FieldInfo, kind: type) -> Any:
    return next((m for m in f.metadata if isinstance(m, kind)), None)


def role(f: FieldInfo) -> str:
    found = _marker(f, Role)
    return RESULT if found is None else str(found.name)


def hashed(f: FieldInfo) -> bool:
    return role(f) != RUN


def external(f: FieldInfo) -> str | None:
    found = _marker(f, External)
    return None if found is None else str(found.key)


def yaml_expr(f: FieldInfo) -> str | None:
    found = _marker(f, YamlExpr)
    return None if found is None else str(found.text)


def in_yaml(f: FieldInfo) -> bool:
    return NOT_IN_YAML not in f.metadata


def tables(f: FieldInfo) -> bool:
    """False for a knob that changes no table of a run directory (NO_TABLES)."""
    return NO_TABLES not in f.metadata


def sub_model(f: FieldInfo) -> type[Settings] | None:
    """The settings model of a nested node (`llm: LLMSettings`, `budgets: LLMBudgets | None`)."""
    tp = _strip(f.annotation)[0]
    return tp if _is_model(tp) else None


def item_model(f: FieldInfo) -> type[Settings] | None:
    """The settings model of a list of nodes (`panel: tuple[PanelMember, ...] | None`)."""
    tp = _strip(f.annotation)[0]
    args = typing.get_args(tp) if _origin(tp) is tuple else ()
    return args[0] if args and _is_model(args[0]) else None


def nullable(f: FieldInfo) -> bool:
    return _strip(f.annotation)[1]


def fields(model: type[Settings]) -> Mapping[str, FieldInfo]:
    return model.model_fields


def no_table_keys(model: type[Settings], prefix: str = "") -> tuple[str, ...]:
    """Dotted keys under `model` (at `prefix`) marked NO_TABLES; a node so marked is one key."""
    out: list[str] = []
    for name, f in fields(model).items():
        path = _join(prefix, name)
        if external(f):
            continue
        if not tables(f):
            out.append(path)
        elif sub_model(f) is not None:
            out += no_table_keys(sub_model(f), path)  # type: ignore[arg-type]
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


_MARKERS = (Role, External, YamlExpr, _Flag)


def field_type(f: FieldInfo) -> Any:
    """The field's validated type: pydantic moves a top-level Annotated's metadata into
    f.metadata, whose constraints and notes belong to the type (our markers do not)."""
    kept = [m for m in f.metadata if not isinstance(m, _MARKERS)]
    return Annotated[(f.annotation, *kept)] if kept else f.annotation


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


def open_key_spec(model: type[Settings], key: str) -> Any:
    """The type or settings class `model.open_keys` gives `key` (None: no pattern matches)."""
    return next((spec for pat, spec in model.open_keys.items() if fnmatch.fnmatchcase(key, pat)), None)


def _is_model(spec: Any) -> bool:
    return isinstance(spec, type) and issubclass(spec, Settings)


def _leaf(tp: Any, value: Any, path: str) -> tuple[Any, list[str]]:
    """(value as validated, problems) of a leaf value of type `tp` at `path`."""
    if value is None and not _strip(tp)[1]:
        return None, [f"{path}=None: a value is required: {describe(tp)}"]
    try:
        return _adapter(tp).validate_python(tuple(value) if isinstance(value, list) else value), []
    except ValidationError as e:
        err = e.errors()[0]
        if err.get("type") == "value_error":  # a validator's own words (llm.backend: the registry's)
            return None, [f"{path}={value!r}: {(err.get('ctx') or {}).get('error', err['msg'])}"]
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
        ext, node, each = external(f), sub_model(f), item_model(f)
        path = ext or _join(prefix, name)
        value = select(root, ext, _MISSING) if ext else data.get(name, _MISSING)
        if value is _MISSING:
            if f.is_required():
                what = "a mapping" if node is not None else describe_field(f)
                lines[name] = [f"{path}=None: a value is required: {what}"]
            continue
        if node is not None:
            obj, lines[name] = _node(node, value, path, root, nullable(f))
        elif each is not None:
            if value is None and nullable(f):
                obj, lines[name] = None, []
            elif not isinstance(value, (list, tuple)):
                obj, lines[name] = None, [f"{path}={value!r}: expected a list"]
            else:
                built = [_node(each, v, f"{path}.{i}", root, False) for i, v in enumerate(value)]
                lines[name] = [line for _, p in built for line in p]
                obj = tuple(b for b, _ in built)
        else:
            obj, lines[name] = _leaf(field_type(f), value, path)
        if not lines[name]:
            kwargs[name] = obj
    extra: dict[str, Any] = {}
    open_lines: list[str] = []
    for key, value in data.items():
        spec = None if str(key) in fields(model) else open_key_spec(model, str(key))
        if spec is None:
            continue
        path = _join(prefix, str(key))
        obj, found = _node(spec, value, path, root, False) if _is_model(spec) else _leaf(spec, value, path)
        open_lines += found
        extra[str(key)] = obj
    if model.closed:
        known = ", ".join(fields(model))
        open_lines += [f"{_join(prefix, str(k))}={v!r}: expected one of the keys {known}"
                       for k, v in data.items() if str(k) not in fields(model) and open_key_spec(model, str(k)) is None]
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
    return {name: ext for name, f in fields(model).items() if (ext := external(f))}


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
        ext = external(f)
        if ext is not None and select(root, ext, _MISSING) is not _MISSING:
            value = select(root, ext)
            out.add(ext)
            if sub_model(f) is not None:
                out |= covered(sub_model(f), value, ext, root)  # type: ignore[arg-type]
            else:
                out.update(leaves(value, ext))
    if not isinstance(data, Mapping):
        return out
    for key, value in data.items():
        path = _join(prefix, str(key))
        f = fields(model).get(str(key))
        spec: Any
        if f is not None and not external(f):
            each = item_model(f)
            spec = sub_model(f) or (("each", each) if each is not None else "leaf")
        else:
            spec = open_key_spec(model, str(key))
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
