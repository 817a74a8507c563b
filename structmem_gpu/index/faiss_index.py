"""Flat inner-product vector index (cosine on unit vectors): FAISS-GPU when present, else CPU.

    index = VectorIndex(["e1", "e2", "e3"], matrix, use_gpu="auto")     # matrix: (3, d) float32
    index.search(queries, k=2)    # [[("e2", 0.91), ("e1", 0.40)], ...] one list per query row

GPU is used when `use_gpu` allows it ("auto" or True), the installed faiss has
`StandardGpuResources` (faiss-cpu lacks it) and `faiss.get_num_gpus() > 0`. GPU flat indexes
have no `add_with_ids`, so hits are mapped through a position -> id array; GPU k is limited to
`gpu_max_k` (2048) and larger k is clamped with a warning. k > n returns n hits (FAISS pads
with -1, which is filtered). Vectors are expected unit-norm (the encoder normalises).
This is the only module that imports `faiss`, lazily.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from structmem_gpu.core.errors import ConfigError

log = logging.getLogger(__name__)

GPU_MAX_K = 2048  # faiss GPU_MAX_SELECTION_K

_GPU_RESOURCES: Any | None = None  # one StandardGpuResources per process, shared by all indexes


def _faiss() -> Any:
    # faiss's loader tries its AVX512/AVX2 builds first and logs each miss at INFO, e.g.
    # `Could not load library with AVX2 support due to: ModuleNotFoundError(...)`: expected on
    # most machines (the generic build is then used), but it reads as an error. Those lines go
    # to DEBUG only; a faiss that cannot load at all still raises ImportError here.
    loader_log = logging.getLogger("faiss.loader")
    if loader_log.level == logging.NOTSET:
        loader_log.setLevel(logging.WARNING)
    import faiss

    return faiss


def gpu_available() -> bool:
    faiss = _faiss()
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _want_gpu(use_gpu: bool | str) -> bool:
    if use_gpu in ("auto", None):
        return gpu_available()
    if isinstance(use_gpu, str):
        raise ConfigError(f"index.use_gpu={use_gpu!r}; expected auto, true or false")
    if use_gpu and not gpu_available():
        raise ConfigError(
            "index.use_gpu=true but this faiss has no GPU support or sees no GPU "
            "(install faiss-gpu on a CUDA machine, or use index.use_gpu=auto)"
        )
    return bool(use_gpu)


def _gpu_resources() -> Any:
    # Each StandardGpuResources reserves scratch memory; one shared instance serves every index.
    global _GPU_RESOURCES
    if _GPU_RESOURCES is None:
        _GPU_RESOURCES = _faiss().StandardGpuResources()
    return _GPU_RESOURCES


class VectorIndex:
    """Exact inner-product search over a fixed set of (id, vector) rows."""

    def __init__(
        self,
        ids: Sequence[str],
        matrix: np.ndarray,
        *,
        use_gpu: bool | str = "auto",
        gpu_max_k: int = GPU_MAX_K,
    ) -> None:
        xb = np.ascontiguousarray(matrix, dtype=np.float32)
        if xb.ndim != 2 or xb.shape[0] != len(ids):
            raise ValueError(f"VectorIndex: {len(ids)} ids for a matrix of shape {xb.shape}")
        faiss = _faiss()
        self.ids = np.asarray(list(ids), dtype=object)  # position -> id
        self.dim = int(xb.shape[1])
        self.gpu_max_k = int(gpu_max_k)
        index = faiss.IndexFlatIP(self.dim)
        self.on_gpu = _want_gpu(use_gpu) and xb.shape[0] > 0
        self._resources = None
        if self.on_gpu:
            self._resources = _gpu_resources()  # keep a reference for the index's lifetime
            co = faiss.GpuClonerOptions()
            co.useFloat16 = False
            index = faiss.index_cpu_to_gpu(self._resources, 0, index, co)
        if xb.shape[0]:
            index.add(xb)  # once: repeated adds on GPU reallocate
        self._index = index

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __repr__(self) -> str:
        return f"VectorIndex(n={len(self)}, dim={self.dim}, gpu={self.on_gpu})"

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """Top-k (id, score) per query row, best first; fewer than k when the index is small."""
        xq = np.ascontiguousarray(queries, dtype=np.float32)
        if xq.ndim != 2 or (xq.shape[0] and xq.shape[1] != self.dim):
            raise ValueError(f"queries of shape {xq.shape} for an index of dim {self.dim}")
        k = min(int(k), len(self))
        if k <= 0 or xq.shape[0] == 0:
            return [[] for _ in range(xq.shape[0])]
        if self.on_gpu and k > self.gpu_max_k:
            log.warning(
                "GPU FAISS supports k <= %d; clamping k=%d to %d", self.gpu_max_k, k, self.gpu_max_k
            )
            k = self.gpu_max_k
        scores, pos = self._index.search(xq, k)
        out = []
        for row_s, row_p in zip(scores, pos, strict=True):
            keep = row_p >= 0
            out.append(
                list(zip(self.ids[row_p[keep]].tolist(), row_s[keep].astype(float).tolist()))
            )
        return out
