"""The one exception type user-facing failures travel in.

The CLI turns a GpuenvError into a single ``error: ...`` line and its exit code; anything
else escaping is a bug in gpuenv and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path


class GpuenvError(Exception):
    """A failure the user can fix: bad input, an engine that is down, a failed build."""

    def __init__(self, message: str, *, exit_code: int = 1, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        # Lines the CLI prints above the error line: where two images part (the layer, the
        # files), which one line cannot hold.
        self.details = details


class MatrixError(GpuenvError):
    """Something wrong in a matrix file; the message names the file and, when known, the line."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
