"""A fast accept-only check of a reply against a JSON schema, in front of `jsonschema`.

    check = compile_accept(schema)      # None when the schema uses a keyword not handled here
    if check is not None and check(data):
        ...                             # certainly valid: jsonschema would accept it too
    else:
        ...                             # ask jsonschema (it decides, and names the error)

Why: `jsonschema`'s validator walks the schema for every reply (~55 us for an extraction
reply of a few items on these cores, several times that for SEEM's frames), which is a
tenth of the framework's CPU per request at GPU batch rates. Most replies are valid, so a
check compiled once per schema into nested closures accepts them in a few microseconds, and
anything it is not sure of goes to jsonschema, which stays the only judge of a rejection and
the only source of error messages.

Sound by construction: a closure returns True only where the JSON Schema rule certainly holds
(tests/unit/test_fast_accept.py compares with jsonschema on generated instances). Handled:
type, properties, required, additionalProperties (false or a schema), items (one schema),
minItems/maxItems, minLength/maxLength, minimum/maximum, enum, const, anyOf, and the
annotations that do not validate (title, description, default, examples, $comment, $schema,
format: jsonschema checks formats only with a format checker, and ours has none). Any other
keyword, or a value this module does not model exactly (a float where an integer is asked,
booleans against numbers in an enum), means "not sure".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Accept = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "$schema", "format"}
)
_HANDLED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems",
     "maxItems", "minLength", "maxLength", "minimum", "maximum", "enum", "const", "anyOf"}
) | _ANNOTATIONS


class _Unsupported(Exception):
    pass


def _is_number(x: Any) -> bool:
    return type(x) is int or type(x) is float


# JSON type name -> an exact test on the decoded value (json.loads gives these Python types).
# "integer" takes Python ints only: jsonschema's later drafts also accept 1.0, which this
# module leaves to jsonschema.
_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda x: type(x) is str,
    "integer": lambda x: type(x) is int,
    "number": _is_number,
    "boolean": lambda x: type(x) is bool,
    "null": lambda x: x is None,
    "object": lambda x: type(x) is dict,
    "array": lambda x: type(x) is list,
}
_EXACT = (str, int, bool, type(None))  # enum/const members compared by type and value


def _member(options: list[Any]) -> Accept:
    if not all(type(o) in _EXACT for o in options):
        raise _Unsupported("enum/const member of another type")
    keyed = {(type(o), o) for o in options}
    return lambda x: type(x) in _EXACT and (type(x), x) in keyed


def _compile(schema: Any) -> Accept:
    if schema is True or (isinstance(schema, Mapping) and not schema):
        return lambda x: True
    if not isinstance(schema, Mapping):
        raise _Unsupported(f"schema of type {type(schema).__name__}")
    unknown = set(schema) - _HANDLED
    if unknown:
        raise _Unsupported(f"keywords {sorted(unknown)}")
    checks: list[Accept] = []
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not all(n in _TYPES for n in names):
            raise _Unsupported(f"type {names}")
        tests = [_TYPES[n] for n in names]
        checks.append(tests[0] if len(tests) == 1 else (lambda x: any(t(x) for t in tests)))
    if "enum" in schema:
        checks.append(_member(list(schema["enum"])))
    if "const" in schema:
        checks.append(_member([schema["const"]]))
    checks += _string_checks(schema) + _number_checks(schema)
    checks += _array_checks(schema) + _object_checks(schema)
    if "anyOf" in schema:
        subs = [_compile(s) for s in schema["anyOf"]]
        checks.append(lambda x: any(c(x) for c in subs))
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(c(x) for c in checks)


def _size_checks(schema: Mapping[str, Any], low: str, high: str, kind: type) -> list[Accept]:
    """The len() bounds `low`/`high` of a `kind` value (others pass): minLength/maxLength of a
    str (jsonschema counts code points with len(), as Python does), minItems/maxItems of a
    list."""
    lo, hi = schema.get(low), schema.get(high)
    if lo is None and hi is None:
        return []
    lo_, hi_ = int(lo or 0), float("inf") if hi is None else int(hi)
    return [lambda x: type(x) is not kind or lo_ <= len(x) <= hi_]


def _string_checks(schema: Mapping[str, Any]) -> list[Accept]:
    return _size_checks(schema, "minLength", "maxLength", str)


def _number_checks(schema: Mapping[str, Any]) -> list[Accept]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is None and hi is None:
        return []
    if not all(v is None or _is_number(v) for v in (lo, hi)):
        raise _Unsupported("minimum/maximum not a number")
    lo_ = float("-inf") if lo is None else lo
    hi_ = float("inf") if hi is None else hi
    return [lambda x: not _is_number(x) or lo_ <= x <= hi_]


def _array_checks(schema: Mapping[str, Any]) -> list[Accept]:
    out = _size_checks(schema, "minItems", "maxItems", list)
    if "items" in schema:
        if not isinstance(schema["items"], (Mapping, bool)):
            raise _Unsupported("items as a list (tuple validation)")
        item = _compile(schema["items"])
        out.append(lambda x: type(x) is not list or all(item(v) for v in x))
    return out


def _object_checks(schema: Mapping[str, Any]) -> list[Accept]:
    out: list[Accept] = []
    props = {k: _compile(v) for k, v in (schema.get("properties") or {}).items()}
    required = tuple(schema.get("required") or ())
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is True else (lambda x: False) if extra is False else _compile(extra)
    if not (props or required or extra_check):
        return out

    def obj(x: Any) -> bool:
        if type(x) is not dict:
            return True
        for k in required:
            if k not in x:
                return False
        for k, v in x.items():
            c = props.get(k)
            if c is not None:
                if not c(v):
                    return False
            elif extra_check is not None and not extra_check(v):
                return False
        return True

    out.append(obj)
    return out


def compile_accept(schema: Mapping[str, Any]) -> Accept | None:
    """The accept-only check of `schema`, or None when the schema uses anything not handled
    here (then every reply goes to jsonschema)."""
    try:
        return _compile(schema)
    except _Unsupported:
        return None
