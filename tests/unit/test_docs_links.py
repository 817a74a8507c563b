"""Documentation references resolve inside the repository.

- No tracked file cites a design note users do not have (the project's private notes, e.g.
  specs/seem.md or DESIGN.md); comments cite README or docs/ sections instead.
- Every cited section (`README "Failure behaviour"`, `docs/design.md "Resume"`) is a heading of
  that file, and every docs/*.md a file names exists.
- Every relative link of README.md, docs/*.md and notebooks/README.md points to an existing file
  (and heading, when it has an anchor).
- Every `make` target, conf override (`method=seem`, `hydra/launcher=slurm`) and `jobs/*.py`
  script the README and docs show exists.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest

from tests.tiers import TIERS

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()

# Notes that live outside the repository. `docs/design.md` (lower case, under docs/) is ours.
EXTERNAL = re.compile(
    r"(?<![\w/.-])(?:\.\./)?(?:shared/)?"
    r"(specs/[\w.-]+\.md|DESIGN\.md|structmem\.md|seem\.md|benchmarks\.md|stack\.md"
    r"|structmem-reference\.md)"
)
# `README "Section"`, `docs/x.md "Section"`, with either quote; line breaks (and comment
# markers) inside a citation are joined before matching.
SECTION_CITE = re.compile(
    r"(?<![\w/])(README(?:\.md)?|docs/[\w-]+\.md|notebooks/README\.md)\s+"
    r"(?:\"([^\"\n]{1,120})\"|'([^'\n]{1,120})')"
)
DOC_FILE = re.compile(r"(?<![\w/])docs/[\w-]+\.md")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIP_DIRS = {".git", ".venv", ".venv-vllm", "outputs", ".cache", "__pycache__", ".pytest_cache"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".json", ".txt", ".cfg", ".ipynb", ""}


@lru_cache(maxsize=1)
def tracked_files() -> tuple[Path, ...]:
    """Files git tracks (plus untracked, not ignored ones); a plain walk outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True,
        ).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [
            p for p in ROOT.rglob("*")
            if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
        ]
    return tuple(
        p for p in paths
        if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in {"Makefile", "run"})
    )


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def other_texts() -> Iterator[tuple[Path, str]]:
    """(path, text) of every tracked text file but this test (which names the notes it bans)."""
    for path in tracked_files():
        if path.resolve() == THIS:
            continue
        text = read_text(path)
        if text is not None:
            yield path, text


def joined(text: str) -> str:
    """Line breaks inside a comment or docstring paragraph become one space."""
    return re.sub(r"[ \t]*\n[ \t]*(?:#+[ \t]*)?", " ", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(md: Path) -> list[str]:
    out, fenced = [], False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def heading_matches(quote: str, heading: str) -> bool:
    """`"Scale-out"` cites `Scale-out: shards, ...`; `"SEEM"` cites `SEEM (structured ...)`."""
    plain = heading.replace("`", "")
    return any(
        h == quote or h.startswith(quote + sep)
        for h in (heading, plain)
        for sep in (" (", ": ", ":", ", ")
    )


def cited_file(name: str) -> Path:
    return ROOT / ("README.md" if name in {"README", "README.md"} else name)


def markdown_docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_folder_exists_and_readme_links_it() -> None:
    docs = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert {"design.md", "performance.md"} <= set(docs), docs
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in docs:
        assert f"docs/{name}" in readme, f"README does not link docs/{name}"


def test_no_file_cites_notes_outside_the_repository() -> None:
    bad = []
    for path, text in other_texts():
        for i, line in enumerate(text.splitlines(), 1):
            if m := EXTERNAL.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)}")
    assert not bad, "cite README or docs/ sections instead:\n" + "\n".join(bad)


def test_cited_sections_and_docs_exist() -> None:
    bad, seen = [], 0
    for path, text in other_texts():
        flat = joined(text)
        for m in DOC_FILE.finditer(flat):
            if not (ROOT / m.group(0)).is_file():
                bad.append(f"{path.relative_to(ROOT)}: {m.group(0)} does not exist")
        for m in SECTION_CITE.finditer(flat):
            target, quote = cited_file(m.group(1)), " ".join((m.group(2) or m.group(3)).split())
            seen += 1
            if not target.is_file():
                bad.append(f"{path.relative_to(ROOT)}: {m.group(1)} does not exist")
            elif not any(heading_matches(quote, h) for h in headings(target)):
                bad.append(f"{path.relative_to(ROOT)}: {m.group(1)} has no section {quote!r}")
    assert seen > 50, f"only {seen} section citations found: is the pattern still right?"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("md", markdown_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    bad = []
    text = md.read_text(encoding="utf-8")
    for m in MD_LINK.finditer(text):
        link = m.group(1)
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        path_part, _, anchor = link.partition("#")
        target = (md.parent / path_part).resolve() if path_part else md
        if not target.exists():
            bad.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in {slug(h) for h in headings(target)}:
            bad.append(f"{link}: no heading with anchor #{anchor} in {target.name}")
    assert not bad, f"{md.relative_to(ROOT)}:\n" + "\n".join(bad)


def code_spans(md: Path) -> str:
    """Inline code, fenced blocks and indented command lines of a markdown file."""
    text = md.read_text(encoding="utf-8")
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    indented = re.findall(r"^(?: {4,}|\t)(.+)$", text, flags=re.M)
    inline = re.findall(r"`([^`\n]+)`", text)
    return "\n".join([*fenced, *indented, *inline])


def test_advertised_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    # `make test-TIER`: the Makefile's `test-%` rule runs each tier of tests/tiers.py
    assert re.search(r"^test-%:", makefile, flags=re.M)
    targets |= {f"test-{tier}" for tier in TIERS}
    bad = []
    for md in markdown_docs():
        code = code_spans(md)
        for target in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", code):
            if target not in targets:
                bad.append(f"{md.name}: make {target} is not a Makefile target")
        for script in re.findall(r"(?<![\w/])jobs/(\w+\.py)", code):
            if not (ROOT / "jobs" / script).is_file():
                bad.append(f"{md.name}: jobs/{script} does not exist")
        for group, name in re.findall(
            r"(?<![\w./])(method|experiment|llm|judge|embedder|benchmark|debug|index|paths"
            r"|hydra/launcher)=([a-z][\w]*)",
            code,
        ):
            if not (ROOT / "conf" / group / f"{name}.yaml").is_file():
                bad.append(f"{md.name}: {group}={name} has no conf/{group}/{name}.yaml")
    assert {"quickstart", "test"} <= targets
    assert not bad, "\n".join(bad)
