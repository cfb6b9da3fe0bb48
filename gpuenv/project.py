"""A project: one matrix file, resolved against the catalog, with its lock read once.

Every verb that works from a matrix starts here, so the decisions every verb needs are made
in one place: which file (`-f`, $GPUENV_MATRIX, ./matrix.yaml), which cells a pattern
selects, which single cell a name means (`run -i`, `diff`), the default cells, and the
lock (read once per command, however many steps consult it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.cell import Cell
    from gpuenv.compat import Resolution
    from gpuenv.lock import Lock
    from gpuenv.matrix import LoadedMatrix


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


@dataclass
class Project:
    matrix: LoadedMatrix
    resolution: Resolution
    _lock: tuple[Lock | None] | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.matrix.path

    @property
    def cells(self) -> list[Cell]:
        return self.resolution.cells

    @property
    def lock_path(self) -> Path:
        from gpuenv import lock as locks

        return locks.lock_path(self.path)

    @property
    def lock(self) -> Lock | None:
        """matrix.lock next to the matrix, read on first use and then kept."""
        if self._lock is None:
            from gpuenv import lock as locks

            self._lock = (locks.load(self.lock_path),)
        return self._lock[0]

    def ca_bundle(self, explicit: Path | None = None) -> Path | None:
        """The CA bundle installs trust: --ca-bundle, the matrix's build.ca_bundle,
        $GPUENV_CA_BUNDLE, $PIP_CERT (first found); None when there is none."""
        from gpuenv.ca import find_bundle

        m = self.matrix
        try:
            return find_bundle(explicit, m.model.build.ca_bundle, m.dir)
        except GpuenvError as exc:
            if explicit is None and m.model.build.ca_bundle:
                raise m.error(exc.message, ("build", "ca_bundle")) from None
            raise

    def select(self, patterns: list[str] | None) -> list[Cell]:
        return select(self.cells, patterns, self.path)

    def one_cell(self, name: str, option: str) -> Cell:
        """The one cell a name (or a glob) means; `option` names where it came from."""
        matches = self.select([name])
        if len(matches) > 1:
            names = ", ".join(c.name for c in matches)
            raise GpuenvError(f"{option} {name!r} matches {len(matches)} cells ({names}); pick one")
        return matches[0]

    def default_cell(self, gpu: bool) -> Cell:
        cell = self.resolution.default_gpu if gpu else self.resolution.default_cpu
        if cell is None:
            kind = "GPU" if gpu else "CPU"
            raise GpuenvError(f"{self.path}: the matrix has no default {kind} cell; pass -i CELL")
        return cell


def matrix_file(explicit: Path | None) -> Path:
    from gpuenv import matrix

    return matrix.matrix_path(explicit)


def open_project(file: Path | None) -> Project:
    """Load, validate and resolve the matrix (`-f FILE`, $GPUENV_MATRIX, ./matrix.yaml)."""
    from gpuenv import compat, matrix

    m = matrix.load(matrix.matrix_path(file))
    return Project(m, compat.resolve(m))


def looks_like_image(ref: str) -> bool:
    """Cell names never hold ':', '/' or '@'; image references usually do."""
    return any(c in ref for c in ":/@") and not any(c in ref for c in "*?[")
