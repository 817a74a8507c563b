"""A run's report/index.html opened in headless Chromium, from disk, with no server and no
network (docs/evaluation.md "The HTML page"): the screenshot is not blank and the page's key
numbers (this run's score and interval, the published row beside it, the build cost) are in
the DOM Chromium builds, the figure an inlined image. Needs Debian's `chromium`
(`apt-get install -y chromium`; .ci/run installs it); skips naming that when it is absent.
About 3 s: three Chromium starts; the last reads the session's llama.cpp run (shared with the
other integration tests), no job subprocess."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import polars as pl
import pytest

from structmem_gpu.eval.html import write_run_page
from structmem_gpu.eval.published import load_published, shown_label
from structmem_gpu.eval.report_md import render_markdown
from tests.fixtures.reports import a_report as report_dict

CHROMIUM = Path("/usr/bin/chromium")
WIDTH, HEIGHT = 1200, 1400

pytestmark = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason="/usr/bin/chromium is absent: apt-get install -y chromium (.ci/run installs it)",
)


def _report() -> dict[str, object]:
    return report_dict(154, 0.7143, [0.6429, 0.7857],
                       {"calls": 2468, "cache_hits": 0, "prompt_tokens": 1357911,
                        "completion_tokens": 24680, "wall_s": 98.7})


def _chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'profile'}", f"--window-size={WIDTH},{HEIGHT}", *args,
         page.as_uri()],
        capture_output=True, text=True, timeout=60, check=True,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = tmp_path_factory.mktemp("html") / "run"
    (run / "report").mkdir(parents=True)
    (run / "tables").mkdir()
    pl.DataFrame({"question_id": ["q1"]}).write_parquet(run / "tables" / "answers.parquet")
    fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
    ax.bar(["multi-hop", "overall"], [71.4, 71.4], color="#2c5d8f")
    fig.savefig(run / "report" / "accuracy_by_category.png")
    plt.close(fig)
    row = next(r for r in load_published() if r.id == "structmem-table1")
    rep = _report()
    return write_run_page(run, rep, render_markdown(rep, [row]),
                          [{"label": shown_label(row, None), "source": row.source,
                            "overall": row.overall}])


def test_screenshot_is_not_blank(page: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    _chromium(page, tmp_path, f"--screenshot={shot}")
    img = Image.open(shot).convert("RGB")
    assert img.size == (WIDTH, HEIGHT)
    small = img.resize((WIDTH // 4, HEIGHT // 4))
    raw = small.tobytes()
    pixels = [raw[i:i + 3] for i in range(0, len(raw), 3)]
    inked = sum(1 for p in pixels if sum(p) < 600) / len(pixels)  # text, rules, the figure
    assert len(set(pixels)) > 50 and inked > 0.02, (len(set(pixels)), inked)


def test_key_numbers_are_in_the_dom(page: Path, tmp_path: Path) -> None:
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    assert "<title>Report: locomo / structmem</title>" in dom
    assert "71.4" in dom and "[64.3, 78.6]" in dom and "n=154" in dom  # ours, its interval
    assert "76.82" in dom and "StructMem paper, Table 1" in dom         # the published row
    assert "1,357,911" in dom and "2468" in dom                         # build cost
    imgs = re.findall(r'<img [^>]*src="([^"]{0,40})', dom)
    assert imgs and all(s.startswith("data:image/png;base64,") for s in imgs)
    assert 'href="../tables/answers.parquet"' in dom


def test_the_session_runs_own_page_renders(structmem_sample_run: Path, tmp_path: Path) -> None:
    """The page the report stage wrote for the session's real llama.cpp run (what `make
    quickstart` writes): Chromium builds it from disk, with the run's own score in it."""
    import json

    page_path = structmem_sample_run / "report" / "index.html"
    report = json.loads((structmem_sample_run / "report" / "report.json").read_text())
    dom = _chromium(page_path, tmp_path, "--dump-dom").stdout
    assert "<title>Report: sample / structmem</title>" in dom
    assert f"{100 * report['overall']['judge_accuracy']:.1f}" in dom
    assert f"n={report['overall']['n']}" in dom
    assert 'href="../tables/answers.parquet"' in dom
