"""Scripted backend for tests, debugging and benches: deterministic, input-derived replies.

Not a model: with no responder for a request's stage it fabricates a reply that satisfies the
request's JSON schema, with strings cut from the user message, so downstream stages have
realistic-looking, provenance-carrying data. Replies go through the same validation/repair
code as real backends, so `parse_ok` is real.

    llm = ScriptedLLM({"judge": lambda req: '{"label": "CORRECT"}'})
    [r] = llm.generate([LLMRequest(request_id="q1", stage="answer", prompt_version="t/1",
                                   messages=(Message("user", "Where did Caroline go?"),))])
    r.text   # 'Where did Caroline go?' (free text: a deterministic snippet of the user message)

A responder may return malformed text to exercise failure paths; it may also raise
`ScriptedFailure` to simulate a request that failed at the HTTP level.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from structmem_gpu.llm.structured import OnResult, RawReply, run_in_rounds
from structmem_gpu.llm.types import LLMRequest, LLMResult

Responder = Callable[[LLMRequest], str]


class ScriptedFailure(Exception):
    """Raised by a responder to make a request fail. `transport=False` (default): the server
    refused it (like an HTTP 4xx): an answered, failed request. `transport=True`: no reply
    at all (like an unreachable server): the request is unanswered and its stage incomplete."""

    def __init__(self, message: str, *, transport: bool = False) -> None:
        super().__init__(message)
        self.transport = transport


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


@functools.lru_cache(maxsize=4096)
def _word_count(text: str) -> int:
    # Memoised: a batch's system prompt is the same text in every request.
    return len(text.split())


def _user_text(req: LLMRequest) -> str:
    users = [m.content for m in req.messages if m.role == "user"]
    return users[-1] if users else (req.messages[-1].content if req.messages else "")


def _snippet(source: str, seed: int, min_len: int, max_len: int | None,
             words: list[str] | None = None) -> str:
    """A window of words from `source` chosen by `seed`, padded/clipped to the length bounds
    (`words`: source.split(), when the caller has it already)."""
    words = (source.split() if words is None else words) or ["empty"]
    n = min(len(words), 12)
    start = seed % max(1, len(words) - n + 1)
    base = " ".join(words[start : start + n])
    text = base
    while len(text) < min_len:
        text += " " + base
    return text if max_len is None else text[: int(max_len)]


class SchemaFaker:
    """Deterministic instances of a JSON schema, derived from a source text.

    >>> SchemaFaker("Caroline went to a support group").make(
    ...     {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer",
    ...      "minimum": 1, "maximum": 3}}})
    {'n': 2}
    """

    def __init__(
        self, source: str, root: Mapping[str, Any] | None = None, salt: int | None = None
    ) -> None:
        self.source = source
        self.root = root or {}
        self.salt = salt  # None: the unsalted choices; an int: other choices per value
        self._words: list[str] | None = None
        # _h(source, path[, salt]) hashes repr((source, path[, salt])): the source's part of
        # that text is hashed once here and the state copied per value (the same digests;
        # hashing the whole prompt again for every value dominated long-prompt replies).
        self._prefix = hashlib.sha256(f"({source!r}, ".encode())

    def _hash(self, path: str) -> int:
        h = self._prefix.copy()
        tail = f"{path!r})" if self.salt is None else f"{path!r}, {self.salt!r})"
        h.update(tail.encode())
        return int.from_bytes(h.digest()[:8], "big")

    @property
    def words(self) -> list[str]:
        if self._words is None:
            self._words = self.source.split()
        return self._words

    def make(self, schema: Mapping[str, Any], path: str = "$") -> Any:
        if schema.get("$defs") or schema.get("definitions"):
            self.root = schema if not self.root else self.root
        if "$ref" in schema:
            return self.make(self._resolve(schema["$ref"]), path)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            options = list(schema["enum"])
            return options[self._hash(path) % len(options)]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                # The first non-null alternative keeps replies informative.
                alts = [a for a in schema[key] if a.get("type") != "null"] or list(schema[key])
                return self.make(alts[0], path)
        if "allOf" in schema:
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                merged.update(part)
            return self.make(merged, path)
        typ = schema.get("type", "object" if "properties" in schema else "string")
        if isinstance(typ, list):
            typ = next((t for t in typ if t != "null"), "null")
        return getattr(self, f"_{typ}")(schema, path)

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        node: Any = self.root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return node

    def _object(self, schema: Mapping[str, Any], path: str) -> dict[str, Any]:
        props: Mapping[str, Any] = schema.get("properties", {})
        required = list(schema.get("required", props.keys()))
        return {k: self.make(props.get(k, {"type": "string"}), f"{path}.{k}") for k in required}

    def _array(self, schema: Mapping[str, Any], path: str) -> list[Any]:
        lo = int(schema.get("minItems", 0))
        hi = schema.get("maxItems")
        n = max(lo, min(2, int(hi)) if hi is not None else 2)
        items = schema.get("items", {"type": "string"})
        return [self.make(items, f"{path}[{i}]") for i in range(n)]

    def _string(self, schema: Mapping[str, Any], path: str) -> str:
        return _snippet(
            self.source,
            self._hash(path),
            int(schema.get("minLength", 0)),
            schema.get("maxLength"),
            self.words,
        )

    def _integer(self, schema: Mapping[str, Any], path: str) -> int:
        lo = schema.get("minimum", 0 if "maximum" not in schema else min(0, schema["maximum"]))
        hi = schema.get("maximum", lo + 9)
        if "exclusiveMinimum" in schema:
            lo = max(lo, int(schema["exclusiveMinimum"]) + 1)
        if "exclusiveMaximum" in schema:
            hi = min(hi, int(schema["exclusiveMaximum"]) - 1)
        lo, hi = int(lo), int(hi)
        return lo + self._hash(path) % max(1, hi - lo + 1)

    def _number(self, schema: Mapping[str, Any], path: str) -> float:
        lo = float(schema.get("minimum", 0.0))
        hi = float(schema.get("maximum", lo + 1.0))
        return lo + (hi - lo) * ((self._hash(path) % 1000) / 1000.0)

    def _boolean(self, schema: Mapping[str, Any], path: str) -> bool:
        return self._hash(path) % 2 == 0

    def _null(self, schema: Mapping[str, Any], path: str) -> None:
        return None


def fake_reply(req: LLMRequest) -> str:
    """The default scripted reply: schema-valid JSON, or a snippet of the user message.

    A sampled request (temperature > 0) with a seed other than 0 gets another deterministic
    reply per seed, as a sampling model would (build-seed replicates, `llm.seed`); seed 0 and
    greedy requests get the replies every test was written against."""
    source = _user_text(req)
    seed = req.sampling.seed
    salt = seed if req.sampling.temperature > 0 and seed not in (None, 0) else None
    if req.schema is None:
        return _snippet(source, 0 if salt is None else _h(source, salt), 1, 200)
    faker = SchemaFaker(source, req.schema, salt=salt)
    return json.dumps(faker.make(req.schema), ensure_ascii=False)


class ScriptedLLM:
    """`LLMBackend` that answers from code. `calls` counts every reply produced (repairs too)."""

    def __init__(
        self,
        responders: Mapping[str, Responder] | None = None,
        model_id: str = "scripted",
        *,
        repair_attempts: int = 1,
    ) -> None:
        self.responders = dict(responders or {})
        self.model_id = model_id
        self.repair_attempts = repair_attempts
        self.calls = 0

    def __repr__(self) -> str:
        return f"ScriptedLLM(model_id={self.model_id!r}, stages={sorted(self.responders)})"

    def _reply(self, req: LLMRequest) -> RawReply:
        self.calls += 1
        responder = self.responders.get(req.stage, fake_reply)
        try:
            text = responder(req)
        except ScriptedFailure as e:
            return RawReply("", "error", error=f"scripted failure: {e}", transport=e.transport)
        # Whitespace "tokens": crude, but monotone in length, which is all reports need.
        p_tok = sum(_word_count(m.content) for m in req.messages)
        # Always "stop": fabricated replies are never cut, whatever max_tokens says.
        return RawReply(text, "stop", p_tok, len(text.split()), None, 0.0, 1)

    def generate(
        self, requests: Sequence[LLMRequest], *, desc: str = "", on_result: OnResult | None = None
    ) -> list[LLMResult]:
        return run_in_rounds(
            requests,
            lambda reqs: [self._reply(r) for r in reqs],
            model=self.model_id,
            repair_attempts=self.repair_attempts,
            on_result=on_result,
        )
