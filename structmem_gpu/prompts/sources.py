"""Reading files of the user's official checkouts (`prompts.sources.*`: `PATH` or `PATH@COMMIT`).

A source is a directory or a git repository. With a commit, or when PATH is a git repository
without a work tree (a bare mirror, `git clone --bare`), files are read with
`git -C PATH show <commit>:<file>` (HEAD when no commit is given; always with
`-c safe.directory=PATH`, so a checkout owned by another user is read); otherwise from the work tree,
the commit being the work tree's HEAD when it is a git checkout (None for a plain directory).
Nothing read here is executed: callers parse the text with `ast` (docs/evaluation.md "Official texts").
"""

from __future__ import annotations

import ast
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from structmem_gpu.core.errors import ConfigError


@dataclass(frozen=True)
class Source:
    key: str  # the config key, e.g. "prompts.sources.mem0" (for error lines)
    spec: str  # as configured
    path: Path
    commit: str | None  # as configured (None = the work tree, or HEAD of a bare repository)

    def where(self) -> str:
        return f"{self.key}={self.spec!r}"


def parse(key: str, spec: str, missing: str | None = None) -> Source:
    """`PATH` or `PATH@COMMIT`. A spec that names an existing path is a path even when it
    contains '@' (a directory called `a@b`). `missing`: what the one line of a path that does
    not exist tells the user to do (default: fetch the pinned official checkouts)."""
    text = str(spec).strip()
    path, sep, commit = text.rpartition("@")
    if not sep or not path or not commit or Path(text).expanduser().exists():
        path, commit = text, ""
    src = Source(key, text, Path(path).expanduser(), commit or None)
    if not src.path.exists():
        from structmem_gpu.prompts.pinned import missing_line

        raise ConfigError(missing_line(src.where(), src.path, key) if missing is None
                          else f"{key}: no checkout at {src.path}; {missing}")
    if not src.path.is_dir():
        raise ConfigError(f"{src.where()}: {src.path} is not a directory (expected a checkout)")
    return src


def git_command(path: Path, *args: str) -> list[str]:
    """`git -c safe.directory=<path> -C <path> ARGS`: a checkout owned by another user (a lab's
    shared read-only copy, CI's copy of ../shared) is trusted for this one command, as its
    configured path; the user's git config is never written. safe.directory compares the
    repository's own path (a work tree's top level, a bare repository's folder), so the
    absolute path is given as configured and as resolved (symlinks)."""
    safe = {str(path.absolute()), str(path.resolve())}
    return ["git", *(a for p in sorted(safe) for a in ("-c", f"safe.directory={p}")),
            "-C", str(path), *args]


def _git(src: Source, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(git_command(src.path, *args), capture_output=True, text=True,
                              check=False)
    except FileNotFoundError as e:
        raise ConfigError(f"{src.where()}: git is not installed, cannot read {src.path}") from e


def _refused(src: Source, out: subprocess.CompletedProcess[str]) -> None:
    """A ConfigError when git refused the folder for another reason than "not a repository"
    (dubious ownership that safe.directory did not lift, unreadable objects): its own words."""
    err = " ".join(out.stderr.split())
    if out.returncode != 0 and err and "not a git repository" not in err.lower():
        raise ConfigError(f"{src.where()}: git cannot read {src.path}: {err}")


@functools.cache
def _is_repo(src: Source) -> bool:
    out = _git(src, "rev-parse", "--git-dir")
    _refused(src, out)
    return out.returncode == 0


@functools.cache
def _is_bare(src: Source) -> bool:
    out = _git(src, "rev-parse", "--is-bare-repository")
    return out.returncode == 0 and out.stdout.strip() == "true"


@functools.cache
def resolved_commit(src: Source) -> str | None:
    """The full commit the files are read at (None: a plain directory, not a git checkout)."""
    if src.commit is None and not _is_repo(src):
        return None
    rev = src.commit or "HEAD"
    if src.commit is not None and not _is_repo(src):
        raise ConfigError(f"{src.where()}: {src.path} is not a git repository, so commit "
                          f"{src.commit!r} cannot be read")
    out = _git(src, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if out.returncode != 0:
        raise ConfigError(f"{src.where()}: commit {rev!r} not found in {src.path}")
    return out.stdout.strip()


def reads_git(src: Source) -> bool:
    """Whether files come from git objects (a commit given, or a bare repository)."""
    return src.commit is not None or _is_bare(src)


def read_file(src: Source, file: str) -> str:
    """The text of `file` (a path inside the checkout); a ConfigError naming the key, the
    path, the commit and the file when it is absent. Work-tree files are read afresh each
    time; git objects, immutable, once per process."""
    if reads_git(src):
        commit = resolved_commit(src)
        assert commit is not None
        return _show(src, commit, file)
    path = src.path / file
    if not path.is_file():
        raise ConfigError(f"{src.where()}: {path} not found (the work tree has no {file})")
    return path.read_text(encoding="utf-8")


@functools.cache
def _show(src: Source, commit: str, file: str) -> str:
    out = _git(src, "show", f"{commit}:{file}")
    if out.returncode != 0:
        raise ConfigError(f"{src.where()}: {file} does not exist at commit {commit} of {src.path}")
    return out.stdout


def _tree(src: Source, file: str) -> ast.Module:
    try:
        return ast.parse(read_file(src, file), filename=file)
    except SyntaxError as e:
        raise ConfigError(f"{src.where()}: {file} does not parse ({e})") from e


def string_constants(src: Source, file: str) -> dict[str, str]:
    """Every top-level `NAME = "..."` string constant of a Python file, by name."""
    out: dict[str, str] = {}
    for node in _tree(src, file).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.value.value
    return out


def string_constant(src: Source, file: str, name: str, what: str) -> str:
    texts = string_constants(src, file)
    if name not in texts:
        raise ConfigError(f"{src.where()}: {file} defines no string {name!r} ({what}) at "
                          f"{describe_commit(src)}")
    return texts[name]


def function(src: Source, file: str, name: str, what: str) -> ast.FunctionDef:
    """The top-level function `name` of a Python file, as an AST (never executed)."""
    for node in _tree(src, file).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ConfigError(f"{src.where()}: {file} defines no function {name!r} ({what}) at "
                      f"{describe_commit(src)}")


def describe_commit(src: Source) -> str:
    commit = resolved_commit(src)
    if commit is None:
        return "the directory (not a git checkout)"
    return f"commit {commit[:12]}" + ("" if reads_git(src) else " (work tree)")
