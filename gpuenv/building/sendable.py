"""What a project's builds send: each cell's resolution (its lock entry, or `uv pip compile`
now), its wheels fetched into the wheelhouse meanwhile, uv, whether the engine's host fetches
the public wheels (gpuenv/building/near.py), and, per build, one `BuildInput` whose directory
is the cell's context, assembled (gpuenv/building/context.py); the offline check and the
builders of source packages' wheels.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.building import sdists
from gpuenv.building.context import MACHINES, Supply, assembled, contexts_root, target_of
from gpuenv.building.render import UV_VERSION
from gpuenv.engine.client import BuildInput
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import platform_of
from gpuenv.store.wheelhouse import Requirement, index_key

if TYPE_CHECKING:
    from gpuenv.building import lock as locks
    from gpuenv.building.near import Near
    from gpuenv.building.plan import CellPlan
    from gpuenv.engine.client import Engine
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.lockfile import CellLock
    from gpuenv.project.project import Project
    from gpuenv.project.snapshot import Settings
    from gpuenv.store.credentials import Credentials
    from gpuenv.store.fetch import Fetcher
    from gpuenv.store.wheelhouse import IndexFile


class Sender:
    """What a project's builds send: each cell's resolution (its lock entry, or resolved now
    with `uv pip compile`), its wheels fetched into the wheelhouse, and the context directory
    the engine builds from (`assembled`)."""

    def __init__(
        self, engine: Engine, project: Project, plans: list[CellPlan], ca_bundle: Path | None,
        offline: bool, say: Callable[[str], None] = lambda _: None,
    ) -> None:  # fmt: skip
        from gpuenv.building import near
        from gpuenv.store import credentials, fetch, wheelhouse

        if offline:
            check_offline(engine, project, plans)
        self.engine, self.project, self.ca_bundle, self.say = engine, project, ca_bundle, say
        # The primary index (the matrix's index_url, or PyPI): the only one whose wheels may
        # be fetched by the engine's host (gpuenv/building/near.py).
        self.primary = wheelhouse.upstreams(project.settings.index_url)[-1]
        self.store = wheelhouse.Store.default()
        # Bound to the origins the user named, whatever indexes the matrix lists.
        self.credentials = credentials.load()
        if not offline:
            for p in plans:
                self.store.save_index(p.wheelhouse_key, p.indexes)
        self.fetcher: Fetcher = fetch.Fetcher(
            self.store, credentials=self.credentials, ca_bundle=ca_bundle, offline=offline,
            project_dir=project.dir.resolve(), matrix_name=project.path.name,
        )  # fmt: skip
        self.architecture = engine.architecture()
        if MACHINES.get(self.architecture) is not None:  # uv, while the resolution is made
            for p in plans:
                self.fetcher.uv_soon(p.wheelhouse_key, UV_VERSION, p.cell.machine)
        # Decided while the resolution is made (the probe is a container: about a second).
        self.probe_seconds = 0.0  # how long deciding took (gpuenv/building/phases.py)

        def decide() -> Near:
            begun = time.monotonic()
            try:
                return near.decide(engine, self.primary, image=plans[0].cell.base.image,
                                   ca_bundle=ca_bundle, credentials=self.credentials,
                                   offline=offline)  # fmt: skip
            finally:
                self.probe_seconds = time.monotonic() - begun

        self._near: Future[Near] = ThreadPoolExecutor(1).submit(decide)
        self._resolved: dict[str, str] = {}  # requirements, Python, indexes -> resolution
        self._builders: dict[str, tuple[sdists.WheelBuilder, sdists.Sandbox]] = {}
        self._lock = threading.Lock()

    def stop(self) -> None:
        """gpuenv is ending (Ctrl-C, SIGTERM): no download goes on (Fetcher.stop)."""
        self.fetcher.stop()

    def resolution(self, p: CellPlan) -> CellLock:
        """The lock's entry, or (an unlocked cell) a resolution made now, each part once per
        set of requirements: a GPU cell's environment step then gets exactly its CPU
        sibling's, and shares its layer."""
        if p.lock is not None:
            return p.lock
        from gpuenv.building import lock as locks
        from gpuenv.project import lockfile

        cell = p.cell
        indexes = self.project.settings.resolving(cell)
        platform = lockfile.platform_of(cell)
        env = self._resolve(lockfile.env_requirements(cell), cell.python, indexes, platform,
                            cell.constraints, sources=metadata_of(*self._builder(cell), None),
                            trees=locks.tree_hashes(cell))  # fmt: skip
        locks.check_hashes(cell, env)
        cuda = ""
        if cell.is_gpu and not cell.cuda_with_framework:
            cuda = self._resolve(lockfile.cuda_requirements(cell), cell.python, indexes, platform)
        return lockfile.CellLock(lockfile.inputs_digest(cell, None), env, cuda, cell.left_out)

    def _resolve(
        self, requirements: list[str], python: str, indexes: tuple[str | None, tuple[str, ...]],
        platform: str, constraints: tuple[str, ...] = (), sources: locks.Sources | None = None,
        trees: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        from gpuenv.building import lock as locks

        memo = json.dumps([python, requirements, indexes, platform, constraints, trees])
        with self._lock:
            if memo not in self._resolved:
                # No exclude-newer date: what the indexes offer now, and an index that gives
                # no upload times (PEP 503 HTML alone, as many private ones) still resolves.
                self._resolved[memo] = locks.compile_requirements(
                    requirements, python, None, *indexes,
                    credentials=self.credentials, ca_bundle=self.ca_bundle, platform=platform,
                    constraints=constraints, sources=sources,
                    root=self.project.dir.resolve(), trees=trees,
                )  # fmt: skip
            return self._resolved[memo]

    def _builder(self, cell: Cell) -> tuple[sdists.WheelBuilder, sdists.Sandbox]:
        """The one builder of the cell's sdists, for its resolution and its context alike."""
        with self._lock:
            if cell.name not in self._builders:
                self._builders[cell.name] = wheel_builder(
                    self.engine, self.fetcher, self.project.settings, cell, self.architecture,
                    self.say,
                )  # fmt: skip
            return self._builders[cell.name]

    @contextlib.contextmanager
    def context(self, p: CellPlan, labels: dict[str, str]) -> Iterator[BuildInput]:
        """What the cell's build hands the engine, as one value: its context directory,
        assembled (while the context manager is open), the image's `labels`; the network
        host when a step reaches an index (the engine's host fetching wheels: near.py, or
        apt reaching Debian's archive), else none; the platform when it is not the engine's
        own (an arm64 cell on an x86_64 engine: its steps run under QEMU); the CA bundle as
        the install steps' secret `ca` when the engine's host fetches and is this machine."""
        cell = p.cell
        with self._directory(p) as directory:
            near = self._near.result()  # decided by now: the context waited for it
            network = "host" if cell.apt or near.index is not None else "none"
            platform = None if MACHINES.get(self.architecture) == cell.machine else cell.platform
            secrets = {"ca": near.ca} if near.index is not None and near.ca else {}
            yield BuildInput(directory, labels, network, platform, secrets)

    def _directory(self, p: CellPlan) -> AbstractContextManager[Path]:
        """The cell's context directory, assembled (a context manager)."""
        key = p.wheelhouse_key
        target = target_of(p.cell, self.architecture)
        uv = self.fetcher.uv_soon(key, UV_VERSION, target.machine)  # on its way, perhaps
        # One directory per matrix and cell: builds of one cell name from two matrices
        # neither wait for each other nor undo each other's incremental transfers.
        project = hashlib.sha256(str(self.project.path.resolve()).encode()).hexdigest()[:16]
        root = contexts_root(self.store.root) / project
        builder, sandbox = self._builder(p.cell)

        def wheel(req: Requirement, sdist: IndexFile) -> tuple[IndexFile, Path]:
            return builder.wheel(req, sdist, sandbox)

        # uv is fetched near a remote engine only: to one of this machine, sending it is a
        # copy on this disk, of the file uv_soon is fetching here anyway.
        offered = (None if self.engine.is_local
                   else self.fetcher.uv_offered(key, UV_VERSION, target.machine))  # fmt: skip
        supply = Supply(self.fetcher, key, target, uv, wheel, self._near, self.primary, offered)
        return assembled(root, p.context, self.resolution(p), supply)


def sandbox_of(cell: Cell, engine_arch: str) -> sdists.Sandbox:
    """Where the cell's sdists are built: its base, for its Python and machine."""
    target = target_of(cell, engine_arch)
    other = MACHINES.get(engine_arch) != cell.machine
    return sdists.Sandbox(cell.base.image, cell.python, target.machine, target.glibc,
                          platform_of(cell), cell.platform if other else None)  # fmt: skip


def wheel_builder(
    engine: Engine, fetcher: Fetcher, settings: Settings, cell: Cell, engine_arch: str,
    say: Callable[[str], None],
) -> tuple[sdists.WheelBuilder, sdists.Sandbox]:  # fmt: skip
    """What builds the cell's sdists into wheels, and where (sandbox_of): a WheelBuilder
    whose build requirements resolve against the cell's indexes (as wheels: `uv pip compile
    --no-build`) and whose uv is the one the install steps run."""
    from gpuenv.building import lock as locks

    key = index_key(settings.indexes(cell))
    index_url, extra_index_urls = settings.resolving(cell)

    def resolve(requirements: list[str], python: str, platform: str) -> str:
        return locks.compile_requirements(
            requirements, python, None, index_url, extra_index_urls,
            credentials=fetcher.credentials, ca_bundle=fetcher.ca_bundle, platform=platform,
        )  # fmt: skip

    def uv(machine: str) -> Path:
        return fetcher.uv_file(key, UV_VERSION, machine)

    builder = sdists.WheelBuilder(engine, fetcher, key, resolve, uv, say)
    return builder, sandbox_of(cell, engine_arch)


def metadata_of(
    builder: sdists.WheelBuilder, sandbox: sdists.Sandbox, exclude_newer: str | None
) -> locks.Sources:
    """The metadata of the sdists a resolution takes, read (or built) by `builder`."""

    def metadata(name: str, requirements: list[str]) -> sdists.Metadata:
        return builder.metadata(name, requirements, sandbox, exclude_newer)

    return metadata


def sources_for(
    engine: Engine, settings: Settings, ca_bundle: Path | None, credentials: Credentials,
    say: Callable[[str], None], matrix: Path | None = None,
) -> Callable[[Cell, str], locks.Sources]:  # fmt: skip
    """For `gpuenv lock`: per cell and lock date, the metadata of the sdists its resolution
    takes (read from them, or from the wheel built on the engine, which a build reuses);
    `matrix`: the matrix file, whose directory local projects are read from."""
    from gpuenv.store import fetch, wheelhouse

    store = wheelhouse.Store.default()
    fetcher = fetch.Fetcher(
        store, credentials=credentials, ca_bundle=ca_bundle,
        project_dir=matrix.parent.resolve() if matrix else None,
        matrix_name=matrix.name if matrix else None,
    )  # fmt: skip
    architecture = engine.architecture()
    builders: dict[str, tuple[sdists.WheelBuilder, sdists.Sandbox]] = {}  # one per cell

    def for_cell(cell: Cell, exclude_newer: str) -> locks.Sources:
        if cell.name not in builders:
            urls = settings.indexes(cell)
            store.save_index(wheelhouse.index_key(urls), urls)
            builders[cell.name] = wheel_builder(engine, fetcher, settings, cell, architecture, say)
        return metadata_of(*builders[cell.name], exclude_newer)

    return for_cell


OFFLINE_SHOWN = 8  # missing distributions named in the error


def check_offline(engine: Engine, project: Project, plans: list[CellPlan]) -> None:
    """What --offline cannot do for the cells it builds, as one error before anything is
    built (the plan says what the engine holds): a cell that is not locked, apt packages
    (Debian's archive), a base not in the engine (it would have to be bootstrapped), or
    locked distributions (or uv itself) the wheelhouse does not hold. A cell already up to
    date needs none of it."""
    from gpuenv.store import wheelhouse

    cells = [p.cell for p in plans]
    with_apt = [c.name for c in cells if c.apt]
    if with_apt:
        raise GpuenvError(
            f"--offline cannot install apt packages (they come from Debian's archive): "
            f"{', '.join(with_apt)}; build these cells online"
        )
    lock = project.lock
    unlocked = [c.name for c in cells if lock is None or c.name not in lock.cells]
    if unlocked:
        raise GpuenvError(
            f"--offline builds locked cells only; not in {project.lock_path.name}: "
            f"{', '.join(unlocked)}; lock them online first: gpuenv lock"
        )
    assert lock is not None
    missing_bases = sorted({p.cell.base.image for p in plans if p.base_id is None})
    if missing_bases:
        raise GpuenvError(
            f"--offline: base {missing_bases[0]} is not in the engine and cannot be "
            "bootstrapped offline; load it: gpuenv base --load FILE (or gpuenv cache import FILE)"
        )
    store = wheelhouse.Store.default()
    for p in plans:
        cell, key = p.cell, p.wheelhouse_key
        entry = lock.cells[cell.name]
        needed = wheelhouse.locked_requirements(entry.python_env + "\n" + entry.cuda)
        missing = wheelhouse.offline_misses(store, key, needed)
        machine = target_of(cell, engine.architecture()).machine
        uv = wheelhouse.uv_wheel(store.page(key, "uv") or [], UV_VERSION, machine)
        if uv is None or not store.has(uv.sha256):
            missing.append(f"uv=={UV_VERSION} (the installer the build bootstraps)")
        if missing:
            more = (
                f" and {len(missing) - OFFLINE_SHOWN} more" if len(missing) > OFFLINE_SHOWN else ""
            )
            raise GpuenvError(
                f"--offline: the wheelhouse lacks {len(missing)} distribution(s) of cell "
                f"{cell.name}: {', '.join(missing[:OFFLINE_SHOWN])}{more}; build it once online "
                "with every wheel sent, GPUENV_NEAR_FETCH=client (or gpuenv cache import FILE)"
            )
