"""The notebooks execute headless against the real sample run (llama.cpp + SmolLM2, debug=ci).

    python -m pytest tests/integration -q -k notebook

Uses the session run `structmem_sample_run` (tests/fixtures/pipeline.py), passed to each
notebook through STRUCTMEM_RUN_DIR; any failing cell fails the test. No LLM request of its
own: the notebooks only read the run directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.llm import llamacpp_missing
from tests.unit.test_notebooks import NOTEBOOKS, execute_notebook
from tests.unit.test_plots import RUN_FIGURES, assert_png

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(llamacpp_missing() is not None, reason=str(llamacpp_missing())),
    pytest.mark.timeout(1800),
]


def test_sample_run_report_has_figures(structmem_sample_run: Path) -> None:
    for name in RUN_FIGURES:
        assert_png(structmem_sample_run / "report" / name)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_on_sample_run(
    path: Path, structmem_sample_run: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nb = execute_notebook(path, structmem_sample_run, monkeypatch, tmp_path)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert outputs and not [o for o in outputs if o.output_type == "error"]
