"""Expected errors: bad input files and bad configuration.

`jobs/run.py` catches `StructMemError` and prints its message without a traceback, so every
raise site must say which file and which record (conversation id, session, dia_id) is wrong.
"""

from __future__ import annotations


class StructMemError(Exception):
    """An error the user can fix; printed as one line, no traceback."""


class InputError(StructMemError):
    """A benchmark file or record is missing, malformed or inconsistent."""

    def __init__(self, path: object, message: str, record: str | None = None) -> None:
        where = f"{path}" + (f" [{record}]" if record else "")
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.record = record


class ConfigError(StructMemError):
    """A configuration value is missing or inconsistent."""


class MissingTableError(StructMemError):
    """A stage needs a table that no earlier stage of this run directory wrote."""


class StageIncompleteError(StructMemError):
    """Some of a stage's requests got no reply; the stage is recorded incomplete (rerun resumes)."""


class GpuPlanError(StructMemError):
    """The job's GPU memory plan cannot fit (structmem_gpu/node/gpu_plan.py): refused before any
    server starts, naming the stage, the sum, the device size and the knob that fixes it."""
