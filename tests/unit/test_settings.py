"""The typed-settings mechanism: fields carry their rule, nested and external nodes, open keys,
cross-field checks, and which fields a fingerprint hashes."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.config.identity import identity
from structmem_gpu.config.settings import (
    COUNT,
    Role,
    External,
    RUN_ROLE,
    SIZE,
    Settings,
    covered,
    problems,
)


class Inner(Settings):
    k: COUNT
    url: Annotated[str, RUN_ROLE] = None


class Outer(Settings):
    node: ClassVar[str] = "toy"
    open_keys: ClassVar[dict[str, Any]] = {"*_inner": Inner}

    size: SIZE
    inner: Inner
    flag: Annotated[bool, External("other.flag")] = False
    items: tuple[COUNT, ...] = ()

    def check(self) -> list[str]:
        return ["toy.size=3: expected anything but 3"] if self.size == 3 else []


def cfg(**toy: Any) -> dict[str, Any]:
    return {"toy": {"size": 2, "inner": {"k": 1, "url": "http://a"}, **toy}, "other": {"flag": True}}


def test_built_settings_are_typed_and_read_external_keys() -> None:
    s = Outer.from_cfg(cfg(items=[1, 2], extra_inner={"k": 4}))
    assert (s.size, s.inner.k, s.flag, s.items) == (2, 1, True, (1, 2))
    # RUN_ROLE fields (connection settings) never reach a fingerprint; open keys do.
    assert identity(s) == {"size": 2, "inner": {"k": 1}, "flag": True, "items": [1, 2],
                                   "extra_inner": {"k": 4}}


@pytest.mark.parametrize(("toy", "line"), [
    ({"size": 0}, "toy.size=0: expected an integer >= 1"),
    ({"inner": {"k": -1}}, "toy.inner.k=-1: expected an integer >= 0 (0 = off)"),
    ({"inner": 5}, "toy.inner=5: expected a mapping"),
    ({"items": [1, -2]}, "toy.items=[1, -2]: expected a list of an integer >= 0 (0 = off)"),
    ({"extra_inner": {"k": "x"}}, "toy.extra_inner.k='x': expected an integer >= 0 (0 = off)"),
    ({"size": 3}, "toy.size=3: expected anything but 3"),
])
def test_each_problem_is_one_line_naming_the_key(toy: dict[str, Any], line: str) -> None:
    data = cfg(**toy)
    assert problems(Outer, data["toy"], "toy", data) == [line]
    with pytest.raises(ConfigError) as err:
        Outer.from_cfg(data)
    assert str(err.value) == f"config {line}"


def test_external_key_is_checked_where_it_lives_and_missing_fields_are_named() -> None:
    data = {"toy": {"inner": {"k": 1}}, "other": {"flag": "yes"}}
    assert problems(Outer, data["toy"], "toy", data) == [
        "toy.size=None: a value is required: an integer >= 1",
        "other.flag='yes': expected true or false",
    ]


def test_coverage_names_every_declared_key_and_only_those() -> None:
    data = cfg(items=[1], extra_inner={"k": 4}, stray=1)
    keys = covered(Outer, data["toy"], "toy", data)
    assert {"toy.size", "toy.inner.k", "toy.inner.url", "toy.items", "toy.extra_inner.k", "other.flag"} <= keys
    assert "toy.stray" not in keys


def test_types_are_strict_and_settings_frozen() -> None:
    # pydantic validates, strictly: a string is not an integer, a bool is not a count.
    for bad, line in (({"size": "2"}, "toy.size='2': expected an integer >= 1"),
                      ({"size": True}, "toy.size=True: expected an integer >= 1"),
                      ({"inner": {"k": 1.5}}, "toy.inner.k=1.5: expected an integer >= 0 (0 = off)")):
        assert problems(Outer, cfg(**bad)["toy"], "toy", cfg(**bad)) == [line]
    s = Outer.from_cfg(cfg())
    with pytest.raises(Exception):
        s.size = 5  # type: ignore[misc]
    assert Inner(3) == Inner(k=3)  # positional fields, in declaration order


def test_roles_are_field_metadata_and_derive_the_key_lists() -> None:
    from structmem_gpu import stage
    from structmem_gpu.config import result_keys
    from structmem_gpu.config.schema import LLMSettings
    from structmem_gpu.config.settings import REPLY, RUN, fields_with_role, role

    assert role(Inner.model_fields["url"]) == RUN and role(Inner.model_fields["k"]) == "result"
    assert stage.LLM_IDENTITY == ("llm",)  # the fingerprint holds the node's identity
    assert set(result_keys.SERVING_KEYS) == set(fields_with_role(LLMSettings, RUN))
    # Knobs that change the reply a request gets: the response-cache key's reply_params.
    assert set(fields_with_role(LLMSettings, REPLY)) == {"request_seed", "repair_attempts"}
    with pytest.raises(ValueError, match="role"):
        Role("sometimes")


def test_a_closed_model_names_an_unknown_key() -> None:
    from structmem_gpu.config.schema import EmbedderInstructions

    assert problems(EmbedderInstructions, {"querry": "x"}, "embedder.instructions", {}) == [
        "embedder.instructions.querry='x': expected one of the keys entry, query, fact, passage"]
