"""The one exception type user-facing failures travel in.

The CLI turns a GpuenvError into a single ``error: ...`` line and its exit code; anything
else escaping is a bug in gpuenv and keeps its traceback. `printable` is how a name or value
from outside (a file name a workload chose, a label) is shown in such a line.
"""

from __future__ import annotations

from pathlib import Path


def printable(text: str) -> str:
    """`text` with what a terminal would act on (ESC, other control and format characters,
    bidi overrides) written as escapes: file names and values reach error and warning lines
    raw."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


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
