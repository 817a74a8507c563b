"""One self-contained HTML page per run, comparison and sweep: `index.html`.

The page is the markdown the report writers already produce (report.md, comparison.md,
sweep_summary.md: one home for every number) turned into HTML, with the figures inlined as
base64 PNG and relative links to the tables and files beside it, so it opens from a copied
folder or an archive with no server and no network (docs/evaluation.md "The HTML page"):

    <run_dir>/report/index.html     the report stage (report.md, report/*.png, ../tables/*.parquet)
    OUT/index.html                  python jobs/report.py compare OUT DIRS...
    <sweep dir>/report/index.html   the sweep summary at the end of a multirun

Pure text and the standard library: no markdown package, no plotting, nothing fetched.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from structmem_gpu.core.artifacts import atomic_write_text

PAGE = "index.html"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1200px;padding:1.5rem;color:#1b1f24;background:#fff;line-height:1.45}
h1{font-size:1.6rem;border-bottom:2px solid #2c5d8f;padding-bottom:.3rem}
h2{font-size:1.25rem;margin-top:2rem;color:#2c5d8f}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.85rem;display:block;overflow-x:auto}
th,td{border:1px solid #c8ced6;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#e8eef5}
tr:nth-child(even) td{background:#f6f8fa}
code{background:#eef1f4;padding:0 .2rem;border-radius:3px;font-size:.9em}
pre{background:#eef1f4;padding:.6rem;overflow-x:auto}
.headline{display:flex;flex-wrap:wrap;gap:1rem;margin:1rem 0}
.card{border:1px solid #c8ced6;border-left:6px solid #2c5d8f;padding:.6rem 1rem;min-width:14rem}
.card .value{font-size:1.7rem;font-weight:600}
.card.published{border-left-color:#b5651d}
figure{margin:1rem 0}figure img{max-width:100%;border:1px solid #e1e4e8}
figcaption{font-size:.85rem;color:#57606a}
"""

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")


def inline(text: str) -> str:
    """One line of markdown's inline marks (code, bold, links) as escaped HTML."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()], quote=False))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{html.escape(code, quote=False)}</code>")
        elif bold is not None:
            out.append(f"<strong>{inline(bold)}</strong>")
        else:
            out.append(f'<a href="{html.escape(href)}">{inline(label)}</a>')
        pos = m.end()
    out.append(html.escape(text[pos:], quote=False))
    return "".join(out)


def _cells(line: str) -> list[str]:
    """A pipe-table row's cells; `\\|` is a pipe inside a cell."""
    inner = re.sub(r"^\||(?<!\\)\|$", "", line.strip())
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _table(lines: Sequence[str]) -> str:
    head, body = _cells(lines[0]), [_cells(ln) for ln in lines[2:]]
    rows = ["<tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*\|?", line.strip()))


def markdown_to_html(text: str) -> str:
    """The markdown our report writers emit (headings, pipe tables, `- ` lists, fenced
    blocks, paragraphs; inline code, bold, links) as HTML; everything else is escaped text."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j]), quote=False) + "</pre>")
            i = j + 1
        elif m := re.match(r"(#{1,6})\s+(.*)", line):
            level = len(m.group(1))
            out.append(f"<h{level}>{inline(m.group(2).strip())}</h{level}>")
            i += 1
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
        elif re.match(r"\s*[-*] ", line):
            items = []
            while i < len(lines) and re.match(r"\s*[-*] ", lines[i]):
                items.append(re.sub(r"^\s*[-*] ", "", lines[i]))
                i += 1
                while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                    items[-1] += " " + lines[i].strip()
                    i += 1
            out.append("<ul>" + "".join(f"<li>{inline(t)}</li>" for t in items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(
                r"(#{1,6}\s|```|\s*\||\s*[-*] )", lines[i]
            ):
                para.append(lines[i].strip())
                i += 1
            if not para:  # a table line without its rule: shown as text
                para, i = [lines[i].strip()], i + 1
            out.append(f"<p>{inline(' '.join(para))}</p>")
    return "\n".join(out)


def figure(path: Path) -> str:
    """A PNG inlined as base64, its file name as the caption."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    name = html.escape(Path(path).name)
    return (f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
            f"<figcaption>{name}</figcaption></figure>")


def links(page_dir: Path, files: Iterable[tuple[str, Path]]) -> str:
    """A list of relative links from the page's folder to each existing file."""
    items = [
        f'<li><a href="{html.escape(Path(os.path.relpath(p, page_dir)).as_posix())}">'
        f"{html.escape(label)}</a></li>"
        for label, p in files if Path(p).exists()
    ]
    return "<ul>" + "".join(items) + "</ul>" if items else "<p>none</p>"


def page(title: str, sections: Sequence[str]) -> str:
    """The whole document: inline style, no script, no external resource."""
    body = "\n".join(s for s in sections if s)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}"


def headline(report: Mapping[str, Any], published: Sequence[Mapping[str, Any]] = ()) -> str:
    """Cards at the top: this run's overall judge accuracy with its 95% CI and n, then each
    matching published row's overall figures beside it."""
    overall = report.get("overall") or {}
    ci = overall.get("judge_accuracy_ci95") or []
    interval = f"95% CI [{_pct(ci[0])}, {_pct(ci[1])}]" if len(ci) == 2 else "no interval"
    cards = [(
        '<div class="card ours"><div>this run: judge accuracy (%)</div>'
        f'<div class="value">{_pct(overall.get("judge_accuracy"))}</div>'
        f"<div>{interval}, n={overall.get('n', '–')}, judge "
        f"<code>{html.escape(str(report.get('judge')))}</code></div></div>"
    )]
    for row in published:
        figures = ", ".join(f"{html.escape(str(k).replace('_', ' '))} {float(v):.2f}"
                            for k, v in (row.get("overall") or {}).items())
        cards.append(
            f'<div class="card published"><div>published: {html.escape(str(row["label"]))}</div>'
            f'<div class="value">{figures or "–"}</div>'
            f"<div>{html.escape(str(row.get('source', '')))}</div></div>"
        )
    return '<div class="headline">' + "".join(cards) + "</div>"


def write_page(out: Path, title: str, markdown: str, *, top: str = "",
               images: Sequence[Path] = (), files: Sequence[tuple[str, Path]] = ()) -> Path:
    """index.html at `out`: `top` (raw HTML), the markdown, the figures, the file links."""
    out = Path(out)
    sections = [top, markdown_to_html(markdown)]
    if images:
        sections += ["<h2>Figures</h2>", *(figure(p) for p in images)]
    if files:
        sections += ["<h2>Tables and files</h2>", links(out.parent, files)]
    atomic_write_text(out, page(title, sections))
    return out


def write_run_page(run_dir: Path, report: Mapping[str, Any], markdown: str,
                   published: Sequence[Mapping[str, Any]] = (),
                   images: Sequence[Path] | None = None) -> Path:
    """<run_dir>/report/index.html from the report stage's own report.json dict and report.md
    text, the figures it drew (`images`; None = every PNG in report/), relative links to
    tables/*.parquet and the report files. `published`: {label, source, overall} per
    matching published row, shown beside this run's headline."""
    root = Path(run_dir)
    report_dir, tables = root / "report", root / "tables"
    images = sorted(report_dir.glob("*.png")) if images is None else list(images)
    files = [(p.name, p) for p in sorted(tables.glob("*.parquet"))]
    files += [(p.name, p) for p in sorted(report_dir.iterdir())
              if p.is_file() and p.suffix in {".json", ".md", ".jsonl"}]
    files.append(("manifest.json", root / "manifest.json"))
    title = f"Report: {report.get('benchmark')} / {report.get('method')}"
    return write_page(report_dir / PAGE, title, markdown, top=headline(report, published),
                      images=images, files=files)


_TRACKING = re.compile(r"<!-- tracking -->.*?<!-- /tracking -->\n", re.DOTALL)


def link_tracking(page_path: Path, uri: str, experiment_id: str, run_id: str) -> bool:
    """Put the MLflow run a page's run (or sweep) was logged as at the top of its page, after
    the tracker logged it (analysis/tracking.py: tracking=mlflow): a link into the tracking
    UI for a served store (http/https), else the store and the `mlflow ui` command that serves
    it. A second logging replaces the first link. False when the page does not exist."""
    page_path = Path(page_path)
    if not page_path.is_file():
        return False
    if uri.startswith(("http://", "https://")):
        href = f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
        where = f'<a href="{html.escape(href)}">open it in MLflow</a>'
    else:
        where = (f"store <code>{html.escape(uri)}</code>; serve it with <code>mlflow ui "
                 f"--backend-store-uri {html.escape(uri)}</code>")
    note = (f'<!-- tracking --><p class="tracking">MLflow run <code>{html.escape(run_id)}</code> '
            f"(experiment {html.escape(str(experiment_id))}): {where}</p><!-- /tracking -->\n")
    text = _TRACKING.sub("", page_path.read_text(encoding="utf-8"))
    atomic_write_text(page_path, text.replace("<body>\n", "<body>\n" + note, 1))
    return True


def write_folder_page(out: Path, title: str, markdown: str, folder: Path,
                      runs: Sequence[tuple[str, Path]] = ()) -> Path:
    """The page of a comparison (out = OUT/index.html, folder = OUT) or a sweep (out =
    <sweep dir>/report/index.html, folder = the sweep dir): the markdown, every PNG of
    `folder` and of the page's own folder, links to the csv/json/md files of `folder` and to
    each run's own page."""
    folder, out = Path(folder), Path(out)
    images = sorted({*folder.glob("*.png"), *out.parent.glob("*.png")})
    files = [(p.name, p) for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix in {".csv", ".json", ".md"}]
    files += [(f"{label}: report", Path(d) / "report" / PAGE) for label, d in runs]
    return write_page(out, title, markdown, images=images, files=files)
