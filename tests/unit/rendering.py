"""Rendering a cell in a unit test: the wheelhouse key `render` takes, from the matrix's
index settings (PyPI alone by default) and the cell's own indexes, as `plan.prepare` does."""

from __future__ import annotations

from gpuenv.matrix.cell import Cell
from gpuenv.project.snapshot import Settings
from gpuenv.store.wheelhouse import index_key


def key_of(cell: Cell, settings: Settings | None = None) -> str:
    return index_key((settings or Settings("t")).indexes(cell))
