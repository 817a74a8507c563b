"""Stream the records of a top-level JSON list without holding the file in memory.

    for i, record in enumerate(iter_json_list("data/longmemeval_m_cleaned.json")):
        ...                                    # one record in memory at a time

LongMemEval-M is one 2.7 GB JSON list; `json.loads` of it holds the whole text plus every
Python object at once (~15 GB peak). This reader keeps one buffer of text and decodes one
element at a time with the standard library's C decoder (`JSONDecoder.raw_decode`), so the
peak is the buffer (`chunk_chars`, grown to the largest record) plus one decoded record, and
the project needs no streaming-parser dependency (measurements: docs/performance.md
"LongMemEval-M load").

A decode that fails before the end of the file is retried with more text (the element was cut
by the buffer end); at the end of the file the failure is the file's: an InputError naming the
file, the character offset and the record number.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from structmem_gpu.core.errors import InputError

__all__ = ["iter_json_list"]

_WS = " \t\n\r"
_END = _WS + ",]"  # what may follow a complete list element
# Text read per refill: large enough that a LongMemEval-M record (~5 MB) needs one or two
# reads, small against the file. Trades peak memory (one buffer) for decode retries.
CHUNK_CHARS = 16 << 20


class _Reader:
    def __init__(self, path: Path, chunk_chars: int) -> None:
        self.path = path
        self.chunk = chunk_chars
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the front of buf so far
        self.eof = False
        try:
            self.f = open(path, "rb")  # noqa: SIM115 - closed by iter_json_list
        except FileNotFoundError:
            raise InputError(path, "file not found") from None
        except OSError as exc:
            raise InputError(path, f"cannot read file: {exc.strerror or exc}") from None

    def fill(self, at_least: int = 0) -> bool:
        """Append more text (at least `at_least` characters if the file has them); False at EOF."""
        if self.eof:
            return False
        want = max(self.chunk, at_least)
        try:
            raw = self.f.read(want)
            text = self.decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise InputError(self.path, f"invalid JSON: not UTF-8 ({exc.reason})") from None
        except OSError as exc:
            raise InputError(self.path, f"cannot read file: {exc.strerror or exc}") from None
        if not raw:
            self.eof = True
            if not text:
                return False  # nothing new: positions into buf stay valid
        if self.pos:
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += text
        return True

    def skip_ws(self) -> str:
        """The next non-blank character ('' at EOF), leaving pos on it."""
        while True:
            buf, n = self.buf, len(self.buf)
            while self.pos < n and buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
            if not self.fill():
                return ""

    def offset(self) -> int:
        return self.consumed + self.pos


def iter_json_list(path: str | Path, chunk_chars: int = CHUNK_CHARS) -> Iterator[Any]:
    """Yield the elements of the file's top-level JSON list, in order.

    InputError (file, offset, record number) for a missing file, invalid JSON, or a top level
    that is not a list. Elements already yielded stay valid when a later one fails, so a caller
    that must write nothing on bad input collects before writing.
    """
    p = Path(path)
    r = _Reader(p, chunk_chars)
    dec = json.JSONDecoder()
    try:
        first = r.skip_ws()
        if first != "[":
            if first == "":
                raise InputError(p, "invalid JSON: empty file")
            kinds = {"{": "dict", '"': "str", "t": "bool", "f": "bool", "n": "NoneType"}
            if first in "{\"-0123456789tfn":
                kind = kinds.get(first, "number")
                raise InputError(p, f"top level must be a JSON list of records, got {kind}")
            raise InputError(
                p, f"invalid JSON: unexpected {first!r} (character offset {r.offset()})")
        r.pos += 1
        index = 0
        if r.skip_ws() == "]":
            r.pos += 1
        else:
            while True:
                yield _decode_one(r, dec, p, index)
                index += 1
                sep = r.skip_ws()
                if sep == ",":
                    r.pos += 1
                    continue
                if sep == "]":
                    r.pos += 1
                    break
                what = "end of file" if sep == "" else repr(sep)
                raise InputError(
                    p, f"invalid JSON: expected ',' or ']' after record {index - 1}, got {what} "
                    f"(character offset {r.offset()})")
        tail = r.skip_ws()
        if tail:
            raise InputError(
                p, f"invalid JSON: extra data after the list (character offset {r.offset()})")
    finally:
        r.f.close()


def _decode_one(r: _Reader, dec: json.JSONDecoder, p: Path, index: int) -> Any:
    if r.skip_ws() == "":
        raise InputError(p, f"invalid JSON: file ends inside the list (record {index})")
    while True:
        try:
            obj, end = dec.raw_decode(r.buf, r.pos)
        except json.JSONDecodeError as exc:
            # Cut by the buffer's end, or broken: more text decides. Grow by at least the
            # buffer's size so a record of many chunks costs O(size), not O(size^2).
            if r.fill(at_least=len(r.buf)):
                continue
            raise InputError(
                p, f"invalid JSON: {exc.msg} (character offset {r.consumed + exc.pos})",
                f"record {index}",
            ) from None
        # A number (or true/false/null) cut by the buffer's end decodes as a shorter value
        # ("-2" of "-2.5"): it is complete only when a separator or blank follows it.
        if (not isinstance(obj, dict | list | str) and not r.eof
                and (end == len(r.buf) or r.buf[end] not in _END) and r.fill()):
            continue
        r.pos = end
        return obj
