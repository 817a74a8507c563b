"""The HTML page of a run, a comparison and a sweep (structmem_gpu/eval/html.py), in-process:
the markdown our writers emit becomes escaped HTML, figures are inlined, links are relative
and resolve, nothing is fetched from anywhere (docs/evaluation.md "The HTML page")."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from pathlib import Path
from urllib.parse import unquote

import polars as pl

from structmem_gpu.eval.html import (
    link_tracking,
    markdown_to_html,
    write_folder_page,
    write_page,
    write_run_page,
)
from structmem_gpu.eval.published import load_published, shown_label
from structmem_gpu.eval.report_md import render_markdown
from tests.fixtures.reports import a_report as report_dict


def tiny_png(path: Path, rgb: tuple[int, int, int] = (200, 30, 30)) -> Path:
    """A valid 4x4 PNG of one colour, written without any imaging library."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + bytes(rgb) * 4 for _ in range(4))
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(raw))
                     + chunk(b"IEND", b""))
    return path


def a_report() -> dict[str, object]:
    """A report.json dict as the report stage writes it (the keys render_markdown reads)."""
    return report_dict(77, 0.6234, [0.5123, 0.7351],
                       {"calls": 4321, "cache_hits": 12, "prompt_tokens": 987654,
                        "completion_tokens": 55555, "wall_s": 321.5})


def a_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "locomo" / "structmem"
    (run / "report").mkdir(parents=True)
    (run / "tables").mkdir()
    pl.DataFrame({"question_id": ["q1"], "label": [True]}).write_parquet(
        run / "tables" / "judgments.parquet")
    (run / "manifest.json").write_text("{}\n")
    (run / "report" / "report.json").write_text("{}\n")
    tiny_png(run / "report" / "accuracy_by_category.png")
    return run


def hrefs(page: str) -> list[str]:
    return re.findall(r'href="([^"]+)"', page)


def test_markdown_subset_becomes_escaped_html() -> None:
    md = ("# Report: a <b> title\n\n"
          "Text with `code <x>`, **bold** and [a link](../tables/t.parquet).\n\n"
          "| col | other |\n|---|---|\n| a \\| b | <script>alert(1)</script> |\n\n"
          "- first item\n  continued\n- second\n\n```\nraw <pre>\n```\n")
    out = markdown_to_html(md)
    assert "<h1>Report: a &lt;b&gt; title</h1>" in out
    assert "<code>code &lt;x&gt;</code>" in out and "<strong>bold</strong>" in out
    assert '<a href="../tables/t.parquet">a link</a>' in out
    assert "<td>a | b</td>" in out and "<th>col</th>" in out  # an escaped pipe stays in its cell
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "<li>first item continued</li><li>second</li>" in out
    assert "<pre>raw &lt;pre&gt;</pre>" in out


def test_run_page_is_self_contained_with_scores_published_row_cost_and_links(
        tmp_path: Path) -> None:
    run = a_run(tmp_path)
    rep = a_report()
    row = next(r for r in load_published() if r.id == "structmem-table1")
    md = render_markdown(rep, [row])
    published = [{"label": shown_label(row, None), "source": row.source, "overall": row.overall}]
    path = write_run_page(run, rep, md, published)
    assert path == run / "report" / "index.html"
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # the headline: ours with its interval and n, the published row's figures beside it
    assert "62.3" in page and "[51.2, 73.5]" in page and "n=77" in page
    assert "76.82" in page and "StructMem paper, Table 1" in page
    # the report.md tables: published figure beside ours, build cost
    assert "<td>overall judge accuracy</td><td>62.3 (n=77)</td><td>76.82</td>" in page
    assert "<td>extract</td><td>4321</td><td>12</td><td>987,654</td>" in page
    # the figure inlined, byte for byte
    png = (run / "report" / "accuracy_by_category.png").read_bytes()
    assert f"data:image/png;base64,{base64.b64encode(png).decode()}" in page
    # relative links only, and each resolves from the page's folder
    links = hrefs(page)
    assert "../tables/judgments.parquet" in links and "../manifest.json" in links
    assert all(not re.match(r"[a-z]+:|/", h) for h in links), links
    assert all((path.parent / unquote(h)).exists() for h in links), links
    assert not re.search(r'(src|href)="(https?:|//)', page)  # nothing fetched: readable offline


def test_run_page_shows_only_the_figures_the_stage_drew(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    stale = tiny_png(run / "report" / "build_cost.png", (0, 0, 255))
    page = write_run_page(run, a_report(), "# r\n", images=[]).read_text(encoding="utf-8")
    assert "data:image/png" not in page and stale.name not in page


def test_folder_page_links_every_run_page_and_inlines_the_sweep_figures(tmp_path: Path) -> None:
    run = a_run(tmp_path)
    sweep = tmp_path / "sweep"
    (sweep / "report").mkdir(parents=True)
    (sweep / "sweep_summary.md").write_text("# Sweep summary\n")
    (sweep / "paired.csv").write_text("run,diff\n")
    tiny_png(sweep / "report" / "accuracy_vs_seed_k.png")
    md = "# Sweep summary: 2 points\n\n| # | status |\n|---|---|\n| 0 | ok |\n"
    path = write_folder_page(sweep / "report" / "index.html", "Sweep: s", md, sweep,
                             runs=[("#0 consolidate.seed_k=5", run)])
    page = path.read_text(encoding="utf-8")
    assert "<td>0</td><td>ok</td>" in page and "accuracy_vs_seed_k.png" in page
    assert "data:image/png;base64," in page
    links = hrefs(page)
    assert {"../paired.csv", "../sweep_summary.md"} <= set(links)
    assert "../../runs/locomo/structmem/report/index.html" not in links  # that run has no page yet
    write_run_page(run, a_report(), "# r\n")
    links = hrefs(write_folder_page(path, "Sweep: s", md, sweep, runs=[("#0", run)])
                  .read_text(encoding="utf-8"))
    assert "../../runs/locomo/structmem/report/index.html" in links
    assert all((path.parent / unquote(h)).exists() for h in links), links


def test_the_page_names_its_mlflow_run_once_and_links_a_served_store(tmp_path: Path) -> None:
    """analysis/tracking.py calls link_tracking after logging a run (tracking=mlflow); the e2e
    sweep test checks the pages of a real tracked sweep."""
    out = write_page(tmp_path / "index.html", "Report", "# Report\n\nbody")
    assert link_tracking(out, "file:/data/mlruns", "7", "abc123")
    text = out.read_text()
    assert "MLflow run <code>abc123</code> (experiment 7)" in text
    assert "mlflow ui --backend-store-uri file:/data/mlruns" in text
    assert link_tracking(out, "http://mlflow.lab:5000/", "7", "def456")  # logged again
    text = out.read_text()
    assert "abc123" not in text and text.count('class="tracking"') == 1
    assert 'href="http://mlflow.lab:5000/#/experiments/7/runs/def456"' in text
    assert text.index('class="tracking"') < text.index("<h1")  # at the top
    assert not link_tracking(tmp_path / "absent.html", "file:/x", "1", "r")
