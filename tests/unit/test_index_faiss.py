"""VectorIndex: exact inner-product search on hand-built vectors, k > n, empty, GPU gating."""

from __future__ import annotations

import numpy as np
import pytest

from structmem_gpu.core.errors import ConfigError
from structmem_gpu.index.faiss_index import VectorIndex, gpu_available

# Four unit vectors in 3-d: e1, e2, e3 and the normalised diagonal of e1/e2.
IDS = ["x", "y", "z", "xy"]
MAT = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.6, 0.8, 0]], dtype=np.float32)


def test_search_many_queries() -> None:
    index = VectorIndex(IDS, MAT, use_gpu=False)
    q = np.array([[1, 0, 0], [0, 0.6, 0.8]], dtype=np.float32)
    hits = index.search(q, 2)
    assert [h[0] for h in hits[0]] == ["x", "xy"]
    assert hits[0][0][1] == pytest.approx(1.0) and hits[0][1][1] == pytest.approx(0.6)
    assert [h[0] for h in hits[1]] == ["z", "y"]
    assert hits[1][0][1] == pytest.approx(0.8) and hits[1][1][1] == pytest.approx(0.6)


def test_k_larger_than_n_returns_all_sorted() -> None:
    index = VectorIndex(IDS, MAT, use_gpu=False)
    [hits] = index.search(np.array([[0.0, 1.0, 0.0]], dtype=np.float32), 100)
    assert len(hits) == 4 and hits[0][0] == "y"
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True)


def test_empty_index_and_zero_k() -> None:
    empty = VectorIndex([], np.zeros((0, 3), dtype=np.float32), use_gpu="auto")
    assert empty.search(np.ones((2, 3), dtype=np.float32), 5) == [[], []]
    assert VectorIndex(IDS, MAT, use_gpu=False).search(MAT, 0) == [[], [], [], []]


def test_shape_errors() -> None:
    with pytest.raises(ValueError):
        VectorIndex(["a"], MAT)
    with pytest.raises(ValueError):
        VectorIndex(IDS, MAT, use_gpu=False).search(np.ones((1, 4), dtype=np.float32), 1)


def test_explicit_gpu_without_gpu_is_a_config_error() -> None:
    if gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError):
        VectorIndex(IDS, MAT, use_gpu=True)
    assert not VectorIndex(IDS, MAT, use_gpu="auto").on_gpu


@pytest.mark.gpu
def test_gpu_matches_cpu_and_clamps_k() -> None:
    if not gpu_available():
        pytest.skip("needs faiss-gpu and a CUDA device")
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((3000, 64)).astype(np.float32)
    xb /= np.linalg.norm(xb, axis=1, keepdims=True)
    ids = [f"i{n}" for n in range(len(xb))]
    cpu, gpu = VectorIndex(ids, xb, use_gpu=False), VectorIndex(ids, xb, use_gpu=True)
    assert gpu.on_gpu
    assert [h[0] for h in gpu.search(xb[:5], 10)[0]] == [h[0] for h in cpu.search(xb[:5], 10)[0]]
    assert len(gpu.search(xb[:1], 2500)[0]) == 2048


def test_faiss_loader_fallback_lines_stay_below_info() -> None:
    """faiss logs its AVX512/AVX2 misses at INFO on import ("Could not load library with AVX2
    support due to: ModuleNotFoundError..."); a run's INFO log must not show them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "from structmem_gpu.index.faiss_index import _faiss; f = _faiss(); "
            "print('ok', hasattr(f, 'IndexFlatIP'))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0 and out.stdout.strip() == "ok True", out.stderr
    assert "faiss.loader" not in out.stderr and "Could not load library" not in out.stderr
