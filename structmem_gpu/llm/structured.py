"""Structured output: the JSON-schema constraint per server flavor, reply validation, repair.

Every backend (HTTP, in-process vLLM, scripted) funnels its raw replies through this module,
so "parse_ok" means the same thing everywhere: the reply parsed as JSON, validated against
the request's schema with `jsonschema`. A reply cut off at `max_tokens` keeps what it holds:
complete JSON as it is, cut JSON its complete list items (`salvaged`).

    >>> response_format({"type": "object"}, "llamacpp")
    {'type': 'json_object', 'schema': {'type': 'object'}}

A request whose reply fails is sent once more (``repair_attempts``) with the bad reply appended
as an assistant message and a user message naming the problem; if that fails too, the result
comes back with ``parse_ok=False`` and ``error`` set. It is never dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from structmem_gpu.config.schema import ApiFlavor
from structmem_gpu.core.hashing import IdentityMemo, stable_hash
from structmem_gpu.llm.types import LLMRequest, LLMResult, Message

logger = logging.getLogger(__name__)

# How the server expects a JSON schema. "vllm" is the OpenAI-standard json_schema form (vLLM,
# OpenAI, most hosted endpoints); "llamacpp" is llama-cpp-python's json_object + schema form
# (its server answers json_schema with HTTP 500, docs/design.md "Backend notes"); "json_mode"
# is OpenAI's JSON mode, {"type": "json_object"} without a schema: what the references' judges
# send to gpt-4o-mini (mem0's and LightMem's llm_judge.py), and what DeepSeek's API offers.
# Under json_mode decoding is not held to the schema (the reply is still validated against it),
# so its replies differ: it enters the response-cache key (flavor_cache_params).
Flavor = ApiFlavor  # its one home: config/schema.py, which llm.api_flavor is checked against
FLAVORS: tuple[str, ...] = get_args(ApiFlavor)


def flavor_cache_params(flavor: str) -> dict[str, Any]:
    """What a flavor adds to the response-cache key: nothing for the two that hold decoding to
    the schema (every cache written before json_mode existed stays valid)."""
    return {"response_format": "json_object"} if flavor == "json_mode" else {}

_MAX_ERROR_CHARS = 300  # a jsonschema message can quote a huge instance; keep repairs short


_FORMATS = IdentityMemo()


def response_format(schema: Mapping[str, Any], flavor: str, name: str = "reply") -> dict[str, Any]:
    """The `response_format` request field that constrains decoding to `schema`.

    vLLM gets `vllm_schema(schema)` (integer bounds instead of the enum that spells them out);
    llama.cpp gets the schema as is. Validation always uses the request's own schema.
    Memoised per schema object (a batch shares a few): the result is only serialised, never
    changed.
    """
    return _FORMATS.get(schema, lambda: _response_format(schema, flavor, name), flavor, name)


def _response_format(schema: Mapping[str, Any], flavor: str, name: str) -> dict[str, Any]:
    if flavor == "vllm":
        return {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": vllm_schema(schema), "strict": True},
        }
    if flavor == "llamacpp":
        return {"type": "json_object", "schema": dict(schema)}
    if flavor == "json_mode":
        return {"type": "json_object"}
    raise ValueError(f"unknown structured-output flavor {flavor!r}; expected one of {FLAVORS}")


def _is_bounds_enum(node: Mapping[str, Any]) -> bool:
    lo, hi, enum = node.get("minimum"), node.get("maximum"), node.get("enum")
    return (
        node.get("type") == "integer"
        and isinstance(lo, int)
        and isinstance(hi, int)
        and isinstance(enum, list)
        and enum == list(range(lo, hi + 1))
    )


def vllm_schema(schema: Any) -> Any:
    """The schema as vLLM's decoder gets it: an integer `enum` that only spells out
    `minimum..maximum` is dropped, the bounds stay (xgrammar enforces integer bounds;
    llama.cpp's grammar ignores them, which is why prompts/ add the enum).

        >>> vllm_schema({"type": "integer", "minimum": 1, "maximum": 3, "enum": [1, 2, 3]})
        {'type': 'integer', 'minimum': 1, 'maximum': 3}
    """
    if isinstance(schema, Mapping):
        out = {k: vllm_schema(v) for k, v in schema.items()}
        if _is_bounds_enum(schema):
            del out["enum"]
        return out
    if isinstance(schema, list):
        return [vllm_schema(v) for v in schema]
    return schema


@dataclass(frozen=True)
class RawReply:
    """What one server round trip produced, before validation (one per attempt)."""

    text: str
    finish_reason: str  # "stop" | "length" | "error" | ...
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    latency_s: float = 0.0
    http_attempts: int = 1  # round trips spent on this reply, HTTP retries included
    error: str | None = None  # set when no reply arrived (all retries failed, 4xx, ...)
    # No reply at all (transport failure, server gone, 5xx after retries, not sent): the
    # request is unanswered, not failed. False for a refusal (4xx) and for every real reply.
    transport: bool = False


@dataclass(frozen=True)
class Check:
    ok: bool
    data: Any | None = None
    error: str | None = None
    # The reply was cut by max_tokens and `data` is its longest prefix of complete list items
    # (closed and validated); nothing the model wrote completely is lost.
    salvaged: bool = False


_VALIDATORS: dict[str, Any] = {}


_BY_ID = IdentityMemo()
_ACCEPT_BY_ID = IdentityMemo()


def _fast_accept(schema: Mapping[str, Any]) -> Any:
    """llm/fast_accept.py's accept-only check of `schema` (None: jsonschema alone), memoised
    per schema object like the validator."""
    from structmem_gpu.llm.fast_accept import compile_accept

    return _ACCEPT_BY_ID.get(schema, lambda: compile_accept(schema))


def _valid(schema: Mapping[str, Any], data: Any) -> Any:
    """jsonschema's first error for `data`, or None when it is valid; the fast accept-only
    check answers most valid replies (a few us against jsonschema's ~55 us)."""
    fast = _fast_accept(schema)
    if fast is not None and fast(data):
        return None
    return next(iter(_validator(schema).iter_errors(data)), None)


def _validator(schema: Mapping[str, Any]) -> Any:
    """A compiled jsonschema validator, memoised per schema (batches share a few schemas):
    first by identity (hashing the schema for every reply cost more than validating it),
    then by content."""
    return _BY_ID.get(schema, lambda: _compiled(schema))


def _compiled(schema: Mapping[str, Any]) -> Any:
    key = stable_hash(schema)
    v = _VALIDATORS.get(key)
    if v is None:
        import jsonschema

        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        v = cls(schema)
        _VALIDATORS[key] = v
    return v


def strip_fences(text: str) -> str:
    """Remove a ```json ... ``` wrapper that unconstrained models like to add."""
    s = text.strip()
    if s.startswith("```"):
        first_nl = s.find("\n")
        s = s[first_nl + 1 :] if first_nl >= 0 else s[3:]
        if s.rstrip().endswith("```"):
            s = s.rstrip()[:-3]
    return s.strip()


def _closers(stack: Sequence[str]) -> str:
    return "".join("]" if c == "[" else "}" for c in reversed(stack))


def salvage_prefixes(text: str) -> list[str]:
    """Closed JSON candidates made from a cut reply, longest first: each ends right after a
    complete element of a list (an object or value followed by "," or "]") and closes every
    bracket still open there.

    >>> salvage_prefixes('{"entries": [{"turn": 1, "text": "a"}, {"turn": 2, "te')
    ['{"entries": [{"turn": 1, "text": "a"}]}', '{"entries": []}']
    """
    stack: list[str] = []
    cuts: list[str] = []
    in_str = esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            stack.append(ch)
            if ch == "[":
                cuts.append(text[: i + 1] + _closers(stack))  # the empty list
        elif ch in "]}":
            if not stack:
                break
            stack.pop()
            if stack and stack[-1] == "[":
                cuts.append(text[: i + 1] + _closers(stack))  # a list element just closed
    return cuts[::-1]


def _salvage(text: str, schema: Mapping[str, Any]) -> Any | None:
    """The longest closed prefix of a cut reply that validates against the schema, or None."""
    for cand in salvage_prefixes(strip_fences(text)):
        try:
            data = json.loads(cand, strict=False)
        except json.JSONDecodeError:
            continue
        if _valid(schema, data) is None:
            return data
    return None


def check_reply(text: str, schema: Mapping[str, Any] | None, finish_reason: str) -> Check:
    """Validate one reply: free text always passes; JSON must parse and validate.

    A reply cut by max_tokens (finish_reason "length") keeps what it received: valid JSON is
    accepted as it is, and cut JSON keeps its complete list items (`salvaged=True`).

    >>> check_reply('{"city": "Paris"}', {"type": "object", "required": ["city"]}, "stop").ok
    True
    """
    if schema is None:
        return Check(ok=True)
    try:
        # strict=False: llama.cpp's JSON grammar lets raw control characters (a literal newline)
        # into strings; the content is still the model's text, so accept it instead of
        # failing the reply on a formality.
        data = json.loads(strip_fences(text), strict=False)
    except json.JSONDecodeError as e:
        if finish_reason == "length":
            kept = _salvage(text, schema)
            if kept is not None:
                return Check(True, data=kept, salvaged=True)
            return Check(False, error="the reply was cut off at the token limit (incomplete JSON)")
        return Check(False, error=f"the reply is not valid JSON ({e.msg} at char {e.pos})")
    err = _valid(schema, data)
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(root)"
        return Check(
            False, data=data, error=f"schema violation at {path}: {err.message}"[:_MAX_ERROR_CHARS]
        )
    return Check(True, data=data)


def repair_messages(messages: Sequence[Message], bad_reply: str, error: str) -> tuple[Message, ...]:
    """The conversation for a repair attempt: the bad reply, then what was wrong with it."""
    ask = (
        f"Your previous reply was invalid: {error}. Reply again with only a valid JSON object "
        "that satisfies the required schema, with everything it should contain. No "
        "explanations, no code fences."
    )
    return (*messages, Message("assistant", bad_reply), Message("user", ask))


@dataclass
class RepairState:
    """Attempt bookkeeping for one request; shared by the async and the batch drivers.

    `feed` takes the raw reply of the current attempt and returns the next request to send (a
    repair) or None when the request is finished; `result` then builds the `LLMResult`.
    """

    request: LLMRequest
    repair_attempts: int
    current: LLMRequest = field(init=False)
    raws: list[RawReply] = field(default_factory=list)
    check: Check = field(default_factory=lambda: Check(False, error="no attempt made"))

    def __post_init__(self) -> None:
        self.current = self.request

    def feed(self, raw: RawReply) -> LLMRequest | None:
        self.raws.append(raw)
        if raw.error is not None:
            self.check = Check(False, error=raw.error)
            return None  # the server is unreachable or refused: a repair would not help
        self.check = check_reply(raw.text, self.request.schema, raw.finish_reason)
        repairs_done = len(self.raws) - 1
        if self.check.ok or repairs_done >= self.repair_attempts:
            return None
        logger.debug("repairing %s: %s", self.request.request_id, self.check.error)
        msgs = repair_messages(self.current.messages, raw.text, self.check.error or "invalid")
        self.current = replace(self.current, messages=msgs)
        return self.current

    def result(self, model: str) -> LLMResult:
        last = self.raws[-1] if self.raws else RawReply("", "error", error="no attempt made")
        failed = last.error is not None
        return LLMResult(
            request_id=self.request.request_id,
            text=last.text,
            data=self.check.data if self.check.ok else None,
            parse_ok=self.check.ok,
            # Cost accounting: tokens and time of every attempt, repairs included.
            prompt_tokens=sum(r.prompt_tokens for r in self.raws),
            completion_tokens=sum(r.completion_tokens for r in self.raws),
            cached_tokens=_sum_optional(r.cached_tokens for r in self.raws),
            latency_s=sum(r.latency_s for r in self.raws),
            finish_reason="error" if failed else last.finish_reason,
            cache_hit=False,
            attempts=sum(r.http_attempts for r in self.raws),
            messages_hash=self.request.messages_hash(),
            model=model,
            error=None if self.check.ok else self.check.error,
            unanswered=failed and last.transport,
            salvaged=self.check.salvaged,
        )


def _sum_optional(values: Any) -> int | None:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


OnResult = Callable[[int, LLMResult], None]


def run_in_rounds(
    requests: Sequence[LLMRequest],
    send: Callable[[list[LLMRequest]], list[RawReply]],
    *,
    model: str,
    repair_attempts: int,
    on_result: OnResult | None = None,
) -> list[LLMResult]:
    """Batch driver: send every request at once, then every needed repair at once, and so on.

    `send` maps a list of requests to one `RawReply` each, in order (the in-process vLLM engine
    and the scripted backend). `on_result(i, result)` fires as soon as request i is final.
    """
    states = [RepairState(r, repair_attempts) for r in requests]
    results: list[LLMResult | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    while pending:
        raws = send([states[i].current for i in pending])
        if len(raws) != len(pending):
            raise RuntimeError(f"backend returned {len(raws)} replies for {len(pending)} requests")
        nxt: list[int] = []
        for i, raw in zip(pending, raws, strict=True):
            if states[i].feed(raw) is not None:
                nxt.append(i)
                continue
            results[i] = states[i].result(model)
            if on_result is not None:
                on_result(i, results[i])  # type: ignore[arg-type]
        pending = nxt
    return [r for r in results if r is not None]
