"""run_stages raises the collector's young-generation threshold while stages run and puts it
back afterwards, also when a stage fails (run/pipeline.py fewer_collections)."""

from __future__ import annotations

import gc

import pytest

from structmem_gpu.run.pipeline import GC_YOUNG_THRESHOLD, fewer_collections


def test_threshold_raised_inside_and_restored_after() -> None:
    before = gc.get_threshold()
    with fewer_collections():
        inside = gc.get_threshold()
        assert inside[0] >= GC_YOUNG_THRESHOLD and inside[1:] == before[1:]
    assert gc.get_threshold() == before


def test_restored_when_the_block_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a stage failed")
    assert gc.get_threshold() == before


def test_a_higher_threshold_is_kept() -> None:
    before = gc.get_threshold()
    gc.set_threshold(10 * GC_YOUNG_THRESHOLD, *before[1:])
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 10 * GC_YOUNG_THRESHOLD
    finally:
        gc.set_threshold(*before)
