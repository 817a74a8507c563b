"""The run directory: atomic Parquet tables, the manifest, resume bookkeeping.

Layout (docs/design.md "Run directory contract"; notebooks and jobs/report.py rely on it):

    <run_dir>/manifest.json            written last by each stage
    <run_dir>/tables/<name>.parquet    one file per table, replaced atomically
    <run_dir>/report/                  report.json, report.md, *.png
    <run_dir>/logs/                    server logs

Every write goes to `<file>.tmp-<pid>` and is moved into place with `os.replace`, so a reader
(or a killed job) never sees half a file. A stage is complete only once its manifest entry says
so; tables without a matching entry are recomputed.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from structmem_gpu.core.errors import MissingTableError, StructMemError
from structmem_gpu.core.hashing import file_sha256
from structmem_gpu.core.schemas import REQUESTS, TABLES, conform, empty

if TYPE_CHECKING:
    from structmem_gpu.core.turns_store import CompactTurns

MANIFEST = "manifest.json"
_PACKAGES = ("structmem-gpu", "polars", "pyarrow", "hydra-core", "torch", "transformers",
             "sentence-transformers", "faiss-cpu", "faiss-gpu", "vllm", "llama-cpp-python")


class WriteError(StructMemError):
    """A table or manifest could not be written (disk full, quota, permissions)."""


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write to a temp file beside `path`, then rename: readers see the old file or the whole
    new one, never a part. On any failure (ENOSPC mid-write, Ctrl-C) the temp file is removed
    and `path` is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        # polars reports its own I/O errors as ComputeError with the OS message inside
        if isinstance(e, OSError) or "no space left" in str(e).lower():
            why = getattr(e, "strerror", None) or str(e).splitlines()[0]
            raise WriteError(f"{path}: could not write ({why}); nothing was "
                             f"replaced — free space (df -h {path.parent}) and rerun") from e
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    _atomic(path, write)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_parquet(path: Path, df: pl.DataFrame) -> None:
    _atomic(path, lambda tmp: df.write_parquet(tmp, compression="zstd"))


class RunDir:
    """One run (one Hydra job). Cheap to construct; creates folders on first write."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.tables_dir = self.root / "tables"
        self.report_dir = self.root / "report"
        self.logs_dir = self.root / "logs"

    # ---- tables -------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        return self.tables_dir / f"{name}.parquet"

    def has_table(self, name: str) -> bool:
        return self.table_path(name).exists() or self._compact(name)

    def _compact(self, name: str) -> bool:
        """True when `name` is stored in the compact layout (turns_store.py: `turns` of a
        LongMemEval run, as turn_sessions + turn_haystacks)."""
        from structmem_gpu.core import turns_store

        return name == turns_store.LOGICAL and turns_store.has_compact(self)

    def table_sha256(self, name: str) -> str | None:
        """The table's content hash (stage fingerprints, intact outputs); None when absent.
        A plain table: its file's sha256; the compact turns: a hash of its parts' sha256s."""
        path = self.table_path(name)
        if path.exists():
            return file_sha256(path)
        if self._compact(name):
            from structmem_gpu.core import turns_store
            from structmem_gpu.core.hashing import stable_hash

            parts = [file_sha256(self.table_path(p)) for p in turns_store.PARTS]
            return stable_hash("compact", parts, length=64)
        return None

    def read_table(self, name: str, *, needed_by: str | None = None,
                   columns: Sequence[str] | None = None) -> pl.DataFrame:
        """The table (`columns` only, when given: readers of big tables, e.g. the report's
        plots over a LongMemEval-M run, skip the texts and vectors they do not use)."""
        path = self.table_path(name)
        if not path.exists() and self._compact(name):
            # The one accessor for the compact turns layout: every reader gets the plain frame.
            from structmem_gpu.core import turns_store

            return turns_store.read_compact(self).expand(columns)
        if not path.exists():
            who = f"stage '{needed_by}' needs" if needed_by else "missing"
            raise MissingTableError(
                f"{who} table '{name}' ({path}), which no finished stage of this run directory "
                f"wrote; run the stage that writes it first (or list it in stages=[...])"
            )
        # glob=False: run directories of sweeps carry override values in their names
        # (".../benchmark.conversations=[conv-26],..."), and [..] is a glob character class.
        return pl.read_parquet(path, glob=False, columns=None if columns is None else list(columns))

    def write_table(self, name: str, df: "pl.DataFrame | CompactTurns") -> Path:
        """Conform to the table's schema constant (when it has one) and write atomically.

        `turns` may come as turns_store.CompactTurns (written as its two part files); writing
        one layout removes the other's files, so a reader never sees a stale layout."""
        from structmem_gpu.core import turns_store

        if name == turns_store.LOGICAL:
            if isinstance(df, turns_store.CompactTurns):
                for part, frame in zip(turns_store.PARTS, (df.sessions, df.haystacks), strict=True):
                    self.write_table(part, frame)
                self.table_path(name).unlink(missing_ok=True)
                return self.table_path(turns_store.PARTS[1])
            for part in turns_store.PARTS:
                self.table_path(part).unlink(missing_ok=True)
        if name in TABLES:
            df = conform(df, TABLES[name])
        path = self.table_path(name)
        atomic_write_parquet(path, df)
        return path

    def replace_requests(self, stage: str, rows: pl.DataFrame) -> None:
        """Replace `stage`'s rows of requests.parquet (DESIGN: rewritten after each LLM stage)."""
        rows = conform(rows, REQUESTS)
        old = self.read_table("requests") if self.has_table("requests") else empty(REQUESTS)
        # A run directory written before a column was added: the old rows get nulls there.
        old = old.with_columns(
            [pl.lit(None, dtype=t).alias(c) for c, t in REQUESTS.items() if c not in old.columns]
        )
        old = conform(old, REQUESTS).select(list(REQUESTS))
        merged = pl.concat([old.filter(pl.col("stage") != stage), rows.select(list(REQUESTS))])
        self.write_table("requests", merged)

    # ---- manifest -----------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    def load_manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"stages": {}}
        return json.loads(self.manifest_path.read_text())

    def save_manifest(self, manifest: Mapping[str, Any]) -> None:
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=str))

    def stage_entry(self, stage: str) -> dict[str, Any] | None:
        return self.load_manifest().get("stages", {}).get(stage)

    def record_stage(self, stage: str, entry: Mapping[str, Any], header: Mapping[str, Any]) -> None:
        """Write the stage's manifest entry (last step of a stage)."""
        manifest = self.load_manifest()
        manifest.update(header)
        manifest.setdefault("stages", {})[stage] = dict(entry)
        self.save_manifest(manifest)

    def outputs_intact(self, entry: Mapping[str, Any]) -> bool:
        """True when every output table recorded in `entry` exists with its recorded hash."""
        for name, info in entry.get("outputs", {}).items():
            if self.table_sha256(name) != info.get("sha256"):
                return False
        return True

    def output_info(self, names: list[str] | tuple[str, ...]) -> dict[str, dict[str, Any]]:
        info = {}
        for name in names:
            if not self.table_path(name).exists() and self._compact(name):
                from structmem_gpu.core import turns_store

                compact = turns_store.read_compact(self)
                info[name] = {"sha256": self.table_sha256(name), "rows": compact.turn_count,
                              "layout": "compact", "distinct_session_rows": compact.sessions.height}
                continue
            path = self.table_path(name)
            info[name] = {"sha256": file_sha256(path), "rows": pl.scan_parquet(path, glob=False).select(pl.len()).collect().item()}
        return info


def git_commit(cwd: Path | None = None) -> str | None:
    """The project's git commit (with '-dirty' when the tree has changes), or None."""
    here = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
