"""What a build reports: one result per cell, the reporter the builder talks to while it
works, and the summary table. Kept apart from the builder: printing a result needs none
of the building."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from gpuenv.matrix.cell import Cell

# The summary's status colours on a terminal (ANSI SGR codes).
_COLOURS = {"built": "32", "cached": "36", "failed": "31", "skipped": "33"}


@dataclass
class CellResult:
    cell: Cell
    status: str = "pending"  # built | cached | pulled | failed | skipped
    image_id: str | None = None
    size: int | None = None
    seconds: float = 0.0
    error: str | None = None
    step: str | None = None
    log_tail: list[str] = field(default_factory=list)
    # Its build was cancelled (BuildCancelled), not failed by a step: gpuenv's interruption
    # if gpuenv is ending, else reported as a failure once the other cells are done.
    cancelled: bool = False
    # Where the build's time went, seconds by phase (gpuenv/building/phases.py); empty for
    # a cell not built.
    phases: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "cell": self.cell.name,
            "image": self.cell.image,
            "status": self.status,
            "image_id": self.image_id,
            "size": self.size,
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "failed_step": self.step,
            "log_tail": self.log_tail if self.status == "failed" else [],
            "phases": self.phases,
        }


class Reporter:
    """What the build tells its user; the CLI supplies a console implementation."""

    def info(self, message: str) -> None:
        pass

    def started(self, cell: Cell) -> None:
        pass

    def log(self, cell: Cell, line: str) -> None:
        pass

    def finished(self, result: CellResult) -> None:
        pass


def summary(results: list[CellResult]) -> None:
    """The results as a table on stdout; the status coloured on a terminal (not NO_COLOR)."""
    from gpuenv.building.terminal import colour_wanted

    sys.stdout.write(summary_text(results, colour=colour_wanted()))
    sys.stdout.flush()


def summary_text(results: list[CellResult], *, colour: bool) -> str:
    """The summary table, one line per cell under a header; `colour`: ANSI status colours."""
    rows = [("CELL", "IMAGE", "SIZE", "TIME", "STATUS")]
    rows += [
        (r.cell.name, r.cell.image, human_size(r.size), f"{r.seconds:.1f} s", r.status)
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            v.rjust(w) if i in (2, 3) else v.ljust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ]
        if colour and n and row[4] in _COLOURS:
            cells[4] = f"\x1b[{_COLOURS[row[4]]}m{row[4]}\x1b[0m"
        lines.append("  ".join(cells).rstrip() + "\n")
    return "".join(lines)


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{value:.1f} GB"
