"""Documentation references resolve inside the repository.

- No tracked file cites a design note users do not have (the project's private notes, e.g.
  specs/seem.md or DESIGN.md); comments cite README or docs/ sections instead.
- Every cited section (`README "Failure behaviour"`, `docs/design.md "Resume"`) is a heading of
  that file, and every docs/*.md a file names exists.
- Every relative link of README.md, docs/*.md and notebooks/README.md points to an existing file
  (and heading, when it has an anchor).
- Every `make` target, conf override (`method=seem`, `hydra/launcher=slurm`) and `jobs/*.py`
  script the README and docs show exists.
- Every `python jobs/X.py ...` command the README, docs and conf/ headers show (fenced and
  indented code, continuation lines joined; inline code up to its closing backtick) parses with
  that script's own argparse parser, in-process and without running anything: its subcommand
  exists and its options are the script's (`jobs/run.py`'s Hydra commands are composed instead,
  by tests/integration/test_shown_commands.py). Each script other than run.py exposes
  `parse(argv)` or `parser()` for this.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
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


def bad_links(md: Path, text: str) -> list[str]:
    """The relative links of `text` (the markdown file `md`) that point nowhere."""
    bad = []
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
    return bad


@pytest.mark.parametrize("md", markdown_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    bad = bad_links(md, md.read_text(encoding="utf-8"))
    assert not bad, f"{md.relative_to(ROOT)}:\n" + "\n".join(bad)


def code_spans(md: Path) -> str:
    """Inline code, fenced blocks and indented command lines of a markdown file."""
    text = md.read_text(encoding="utf-8")
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL)
    indented = re.findall(r"^(?: {4,}|\t)(.+)$", text, flags=re.MULTILINE)
    inline = re.findall(r"`([^`\n]+)`", text)
    return "\n".join([*fenced, *indented, *inline])


def test_advertised_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.MULTILINE))
    # `make test-TIER`: the Makefile's `test-%` rule runs each tier of tests/tiers.py
    assert re.search(r"^test-%:", makefile, flags=re.MULTILINE)
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


# ---- every `python jobs/X.py ...` command shown parses with that script's parser -------------

JOB_COMMAND = re.compile(r"(?<![\w/])python jobs/(\w+)\.py\b")
SHELL_OPS = {"&&", "||", ";", "|", ">", ">>"}


def code_texts(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, code, inline) of a markdown text: each fenced or indented code line,
    backslash continuations joined; each inline code span, across a line break."""
    lines = text.splitlines()
    prose, fenced, n = [], False, 0
    while n < len(lines):
        line = lines[n]
        if line.startswith("```"):
            fenced = not fenced
            prose.append("")
        elif fenced or re.match(r"(?: {4,}|\t)\S", line):
            code, start = line, n
            while code.rstrip().endswith("\\") and n + 1 < len(lines):
                n += 1
                code = code.rstrip()[:-1] + " " + lines[n].strip()
                prose.append("")
            prose.append("")
            yield start + 1, code, False
        else:
            prose.append(line)
        n += 1
    flat = "\n".join(prose)
    for m in re.finditer(r"`([^`]+)`", flat):
        if "\n\n" not in m.group(1):
            yield flat.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " "), True


def job_commands(text: str) -> Iterator[tuple[int, str, list[str], bool]]:
    """(line, script, arguments, inline) of every `python jobs/X.py ...` command in the code of
    a markdown text, as a shell passes them: comments dropped, a `<placeholder>` one word, `...`
    and the brackets of an optional `[--flag]` left out, up to a shell operator."""
    for line, code, inline in code_texts(text):
        for m in JOB_COMMAND.finditer(code):
            rest = re.sub(r"<[^<>]*>", "X", code[m.end():])
            nxt = JOB_COMMAND.search(rest)
            rest = rest[:nxt.start()] if nxt else rest
            try:
                words = shlex.split(rest, comments=True)
            except ValueError as err:
                yield line, m.group(1), [f"<unparsable: {err}>"], inline
                continue
            args = []
            for word in words:
                if word in SHELL_OPS or word == "python":
                    break
                word = word.strip("[]")
                if word and word != "..." and not word.endswith("=..."):
                    args.append(word)
            yield line, m.group(1), args, inline


def load_job(name: str):
    """jobs/<name>.py as a module, once per process (the key tests/fixtures/pipeline.py's
    load_job uses, so the two share it)."""
    key = f"structmem_jobs_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "jobs" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def job_parse(name: str) -> Callable[[list[str]], object] | None:
    """The script's parse-only entry: `parse(argv)`, else `parser().parse_args`; None for
    jobs/run.py (Hydra: its commands are composed by tests/integration/test_shown_commands.py)."""
    if name == "run":
        return None
    module = load_job(name)
    if hasattr(module, "parse"):
        return module.parse
    if hasattr(module, "parser"):
        return lambda argv: module.parser().parse_args(argv)
    raise AssertionError(f"jobs/{name}.py exposes neither parse(argv) nor parser()")


def command_problem(name: str, args: list[str], mention: bool = False) -> str | None:
    """Why `python jobs/<name>.py ARGS` does not parse (argparse's error line), or None. A
    mention in running text (`python jobs/report.py differential` then aligns ...) may leave
    out the required arguments; its subcommand and options must still be the script's."""
    if not (ROOT / "jobs" / f"{name}.py").is_file():
        return f"jobs/{name}.py does not exist"
    parse = job_parse(name)
    if parse is None:
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parse(args)
    except SystemExit as stop:
        if stop.code:
            lines = err.getvalue().strip().splitlines()
            last = lines[-1] if lines else f"exit {stop.code}"
            if mention and "the following arguments are required" in last:
                return None
            return last
    return None


def bad_job_commands(md: Path, text: str) -> list[str]:
    out = []
    for line, name, args, inline in job_commands(text):
        problem = command_problem(name, args, mention=inline)
        if problem:
            out.append(f"{md.name}:{line}: python jobs/{name}.py {' '.join(args)}: {problem}")
    return out


def test_every_job_script_exposes_its_parser() -> None:
    for script in sorted((ROOT / "jobs").glob("*.py")):
        job_parse(script.stem)  # raises for a script a shown command could not be checked with


@pytest.mark.parametrize("md", markdown_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_job_commands_parse(md: Path) -> None:
    bad = bad_job_commands(md, md.read_text(encoding="utf-8"))
    assert not bad, "\n".join(bad)


def yaml_comments(path: Path) -> str:
    """A conf/ file's comment lines as markdown: a line that starts with `python ` is code, the
    rest prose (its inline code spans read as in a markdown file); other lines blank."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.lstrip()
        body = text.lstrip("#").strip() if text.startswith("#") else ""
        out.append(f"    {body}" if body.startswith("python ") else body)
    return "\n".join(out)


def test_conf_header_job_commands_parse() -> None:
    """The commands conf/*.yaml headers show (`python jobs/data.py systems install mem0`, ...)."""
    bad, seen = [], 0
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        text = yaml_comments(path)
        seen += sum(1 for _ in job_commands(text))
        bad += [f"{path.relative_to(ROOT / 'conf')}: {b}" for b in bad_job_commands(path, text)]
    assert seen > 50, seen
    assert not bad, "\n".join(bad)


def test_shown_job_commands_are_found() -> None:
    found = {(name, args[0] if args else "")
             for md in markdown_docs()
             for _, name, args, _ in job_commands(md.read_text(encoding="utf-8"))}
    assert {("data", "systems"), ("report", "differential"), ("bench", "paced"),
            ("docs", "configuration"), ("data", "models")} <= found, found


BOGUS = """# Bogus

A [dead link](no/such/file.md), a [dead anchor](#no-such-heading) and [one that works](#bogus).

```bash
python jobs/report.py no-such-subcommand RUN       # not a subcommand
python jobs/data.py systems install mem0 \\
    --no-such-option                               # continuation joined
python jobs/nosuch.py build
python jobs/report.py compare OUT DIRS... [--reference structmem]
python jobs/report.py merge                        # required arguments left out
```

    python jobs/data.py no_such_dataset

Inline: `python jobs/bench.py no-such-part --profile cpu`, `python jobs/docs.py
configuration --check` and a mention, `python jobs/report.py differential`.
"""


def test_a_bogus_command_or_link_fails(tmp_path: Path) -> None:
    md = tmp_path / "bogus.md"
    md.write_text(BOGUS, encoding="utf-8")
    links = bad_links(md, BOGUS)
    assert links == ["no/such/file.md: no such file",
                     "#no-such-heading: no heading with anchor #no-such-heading in bogus.md"]
    bad = bad_job_commands(md, BOGUS)
    want = [("bogus.md:6:", "invalid choice: 'no-such-subcommand'"),
            ("bogus.md:7:", "unrecognized arguments: --no-such-option"),
            ("bogus.md:9:", "jobs/nosuch.py does not exist"),
            ("bogus.md:11:", "the following arguments are required: out, dirs"),
            ("bogus.md:14:", "unknown dataset(s) ['no_such_dataset']"),
            ("bogus.md:16:", "unknown part(s) ['no-such-part']")]
    assert len(bad) == len(want), "\n".join(bad)
    for line, (where, why) in zip(bad, want, strict=True):
        assert line.startswith(where) and why in line, (line, where, why)
