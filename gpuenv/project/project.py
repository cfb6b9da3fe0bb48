"""A project: one matrix file, resolved against the catalog, with its lock read once.

Every verb that works from a matrix starts here, so the decisions every verb needs are made
in one place: which file (`-f`, $GPUENV_MATRIX, ./matrix.yaml), which cells a pattern
selects, which single cell a name means (`run -i`, `diff`), the default cells, and the
lock (read once per command, however many steps consult it).
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.matrix.cell import Cell
    from gpuenv.matrix.schema import LoadedMatrix
    from gpuenv.project.lockfile import Lock
    from gpuenv.project.snapshot import Resolved, Settings, Snapshot


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


class Project:
    """A matrix and its resolution. Opened from a snapshot (gpuenv/project/snapshot.py), the
    validated matrix itself is loaded only if something asks for it (`matrix`)."""

    def __init__(
        self,
        matrix: LoadedMatrix | None,
        resolution: Resolved,
        settings: Settings,
        *,
        path: Path | None = None,
        snapshot: Snapshot | None = None,
    ) -> None:
        self._matrix = matrix
        self.resolution = resolution
        self.settings = settings  # what build and run read of the matrix besides its cells
        self._path = path if path is not None else matrix.path if matrix else Path()
        self.snapshot = snapshot
        self._lock: tuple[Lock | None] | None = None
        self._drift: dict[str, str] | None = None
        if snapshot is not None and snapshot.lock is not None:
            from gpuenv.project.snapshot import lock_from_json

            self._lock = (lock_from_json(self.lock_path, snapshot.lock),)
        elif snapshot is not None:
            self._lock = (None,)

    @property
    def matrix(self) -> LoadedMatrix:
        """The validated matrix (loaded now when the project came from a snapshot)."""
        if self._matrix is None:
            from gpuenv.matrix import schema as matrix

            self._matrix = matrix.load(self._path)
        return self._matrix

    @property
    def path(self) -> Path:
        return self._path

    @property
    def dir(self) -> Path:
        return self._path.parent

    @property
    def cells(self) -> list[Cell]:
        return self.resolution.cells

    @property
    def lock_path(self) -> Path:
        return lock_path(self.path)

    @property
    def lock(self) -> Lock | None:
        """matrix.lock next to the matrix, read on first use and then kept."""
        if self._lock is None:
            from gpuenv.project import lockfile

            self._lock = (lockfile.load(self.lock_path),)
        return self._lock[0]

    @property
    def lock_drift(self) -> dict[str, str]:
        """The cells whose lock entry is missing or no longer matches the matrix, with why
        (gpuenv/project/lockfile.py: drift); {} without a lock. Decided once, for every
        cell: `build` refuses a lock that no longer holds a cell it builds, `validate` fails
        that cell's lock check naming why."""
        if self._drift is None:
            from gpuenv.project import lockfile

            lock = self.lock
            self._drift = lockfile.drift(lock, self.cells) if lock is not None else {}
        return self._drift

    def cached_contexts(self) -> dict[str, dict[str, str]]:
        """Rendered contexts (cell -> files) the snapshot holds."""
        return dict(self.snapshot.contexts) if self.snapshot else {}

    def remember_contexts(self, contexts: dict[str, dict[str, str]]) -> None:
        """Add rendered contexts to the snapshot, so the next command need not render."""
        from gpuenv.project import snapshot

        snap = self.snapshot
        if snap is None:
            return
        merged = {**snap.contexts, **contexts}
        if merged != snap.contexts:
            snap.contexts = merged
            snapshot.write(snap)

    def ca_bundle(self, explicit: Path | None = None) -> Path | None:
        """The CA bundle installs trust: --ca-bundle, the matrix's build.ca_bundle,
        $GPUENV_CA_BUNDLE, $PIP_CERT (first found); None when there is none."""
        from gpuenv.store.ca import find_bundle

        setting = self.settings.ca_bundle
        try:
            return find_bundle(explicit, setting, self.dir)
        except GpuenvError as exc:
            if explicit is None and setting:
                raise self.matrix.error(exc.message, ("build", "ca_bundle")) from None
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
    """`-f FILE`, $GPUENV_MATRIX, ./matrix.yaml: the one place that decides (it imports no
    schema)."""
    if explicit is not None:
        return explicit
    return Path(os.environ.get("GPUENV_MATRIX") or "matrix.yaml")


def lock_path(matrix: Path) -> Path:
    from gpuenv.matrix.contract import lock_path as beside

    return beside(matrix)


def settings_of(m: LoadedMatrix) -> Settings:
    from gpuenv.project.snapshot import Settings

    b = m.model.build
    return Settings(m.model.name, b.ca_bundle, b.index_url, tuple(b.extra_index_urls))


def open_project(file: Path | None, *, cached: bool = False) -> Project:
    """Load, validate and resolve the matrix (`-f FILE`, $GPUENV_MATRIX, ./matrix.yaml).

    With `cached`, a snapshot whose inputs are unchanged stands in for the loading and
    resolving (gpuenv/project/snapshot.py); a miss loads as before and writes one. Verbs that
    report on the matrix itself (matrix, lock, validate) leave it off."""
    path = matrix_file(file)
    if not cached:
        return _load(path)
    from gpuenv.project import snapshot

    lock_file = lock_path(path)
    snap = snapshot.read(path, lock_file)
    if snap is not None:
        return Project(None, snap.resolution, snap.settings, path=path, snapshot=snap)
    key = snapshot.key(path, lock_file)
    project = _load(path)
    # Only when the matrix and the lock were the same before and after loading (and the
    # lock was read in between, by _snapshot_of): an edit meanwhile writes no snapshot.
    snap = _snapshot_of(project, key)
    if snap is not None and snapshot.key(path, lock_file) == key and snapshot.write(snap):
        project.snapshot = snap
    return project


def _load(path: Path) -> Project:
    from gpuenv.catalog import compat
    from gpuenv.matrix import schema as matrix
    from gpuenv.project.snapshot import Resolved

    m = matrix.load(path)
    res = compat.resolve(m)
    resolution = Resolved(list(res.cells), list(res.rejected), res.default_cpu, res.default_gpu)
    return Project(m, resolution, settings_of(m))


def _snapshot_of(project: Project, key: str) -> Snapshot | None:
    """A snapshot of a freshly loaded project; None when the lock cannot be read (its
    error must come from the lock itself, every time)."""
    from gpuenv.project import snapshot

    try:
        lock = project.lock
    except GpuenvError:
        return None
    snap = snapshot.Snapshot(
        key=key,
        settings=project.settings,
        resolution=project.resolution,
        lock=snapshot.lock_to_json(lock) if lock is not None else None,
        depends=snapshot.depends_of(project.matrix),
        entry=snapshot.entry_name(project.path),
    )
    return snap


def looks_like_image(ref: str) -> bool:
    """Cell names never hold ':', '/' or '@'; image references usually do."""
    return any(c in ref for c in ":/@") and not any(c in ref for c in "*?[")
