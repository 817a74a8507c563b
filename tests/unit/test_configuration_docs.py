"""docs/configuration.md's knob tables are the settings models' (structmem_gpu/config/knob_docs.py):
the checked-in file must equal what `python jobs/docs.py configuration` writes, so a knob
added, renamed or redescribed in its field reaches the docs by running the generator."""

from __future__ import annotations

from pathlib import Path

import pytest

from structmem_gpu.config import knob_docs


def test_the_checked_in_tables_are_the_generated_ones() -> None:
    text = knob_docs.DOC.read_text(encoding="utf-8")
    assert knob_docs.updated(text) == text, (
        "docs/configuration.md's knob tables differ from the settings models: run "
        "python jobs/docs.py configuration")


def test_every_typed_node_has_a_table() -> None:
    text = knob_docs.DOC.read_text(encoding="utf-8")
    for node in ("llm", "embedder", "judge", "extract", "consolidate", "seem.retrieve",
                 "benchmark", "index", "paths", "answer"):
        assert f"### `{node}`" in text, node
    assert "| `llm.budgets.extract_max_tokens` |" in text  # nested models flattened


def test_a_stale_file_is_found_and_rewritten(tmp_path: Path) -> None:
    good = knob_docs.DOC.read_text(encoding="utf-8")
    stale = tmp_path / "configuration.md"
    stale.write_text(good.replace("| `force` |", "| `forced` |", 1), encoding="utf-8")
    assert knob_docs.main(check=True, path=stale) == 1
    assert knob_docs.main(path=stale) == 0
    assert stale.read_text(encoding="utf-8") == good
    with pytest.raises(ValueError, match="marker"):
        knob_docs.updated("no markers here\n")
