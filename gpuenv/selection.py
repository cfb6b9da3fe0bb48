"""Choosing cells by shell-style glob (`gpuenv build 'tf2.21-*'`)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

from gpuenv.cell import Cell
from gpuenv.errors import GpuenvError


def select(cells: list[Cell], patterns: list[str] | None, source: Path | str = "") -> list[Cell]:
    """Cells matching any pattern, in matrix order; every pattern must match something."""
    if not patterns:
        return list(cells)
    for pattern in patterns:
        if not any(fnmatchcase(c.name, pattern) for c in cells):
            names = ", ".join(c.name for c in cells)
            where = f"{source}: " if source else ""
            raise GpuenvError(f"{where}pattern {pattern!r} matches no cell; the cells are: {names}")
    return [c for c in cells if any(fnmatchcase(c.name, p) for p in patterns)]
