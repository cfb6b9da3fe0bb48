"""What a build sends to the engine: the rendered context plus, per install step, the part of
the build context it mounts, assembled on the client.

An install step's part (`python-env/`, `cuda/`) holds the resolution as `requirements.txt`
(hashes on every line: the lock's entry, or `uv pip compile` now for an unlocked cell), the
one wheel per line that fits the cell's machine (an arm64 cell's aarch64 wheels on any
engine) and the base's glibc, fetched into the
wheelhouse and checked (gpuenv/store/fetch.py), and uv's executable for that machine. The engine
receives it through its own build API (BuildKit's session, or podman's build endpoint), so a
remote, rootless, Desktop or podman engine builds from exactly the bytes a local one does,
with no network, no listener on anyone's loopback and no credential or CA of the client.

Each cell's context is a directory in gpuenv's cache, kept between builds (files are hard
links into the wheelhouse, so it costs no space): BuildKit sends only what changed since its
last build from that directory, which is what a remote engine over a slow link feels.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpuenv.building import layers, sdists
from gpuenv.building.render import (
    CA_FILE,
    FETCHED,
    SENT,
    UV_BIN,
    UV_SCRIPT,
    UV_SENT,
    UV_VERSION,
)
from gpuenv.engine.client import BuildInput
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import framework_requirements, platform_of
from gpuenv.store.cache import read_record, update_record, write_record
from gpuenv.store.wheelhouse import Requirement, index_key, locked_requirements

if TYPE_CHECKING:
    from gpuenv.building import lock as locks
    from gpuenv.building.near import Near
    from gpuenv.building.plan import CellPlan
    from gpuenv.building.render import BuildContext
    from gpuenv.engine.client import Engine
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.lockfile import CellLock
    from gpuenv.project.project import Project
    from gpuenv.project.snapshot import Settings
    from gpuenv.store.credentials import Credentials
    from gpuenv.store.fetch import Fetcher
    from gpuenv.store.wheelhouse import IndexFile, Store

T = TypeVar("T")
# Requires-Dist of the wheels the store holds, by sha256 (a gpuenv cache record).
REQUIRES_RECORD = "requires-dist.json"
# glibc of each Debian suite's libc6 (packages.debian.org/<suite>/libc6): the newest
# manylinux a wheel for that base may need. Bases that are other images: manylinux_2_28, the
# floor PyTorch's and NVIDIA's current wheels are built for.
GLIBC = {"bullseye": (2, 31), "bookworm": (2, 36), "trixie": (2, 41)}
DEFAULT_GLIBC = (2, 28)
# The engine's architecture as engines name it (Docker: uname's; podman: Go's).
MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class WheelTarget:
    """Where the wheels will run: the cell's Python on the cell's machine."""

    python: str
    machine: str  # x86_64 | aarch64
    glibc: tuple[int, int]


def target_of(cell: Cell, engine_arch: str) -> WheelTarget:
    """The wheels are the cell's architecture's (an arm64 cell gets aarch64 wheels on an
    x86_64 engine, which runs its steps under emulation); the engine must be one gpuenv
    knows how to build on at all."""
    if MACHINES.get(engine_arch) is None:
        raise GpuenvError(
            f"the engine runs on {engine_arch!r}; gpuenv builds on x86_64 and aarch64 "
            "engines only (aarch64 hosts have not been shown: docs/proven.md)"
        )
    machine = cell.machine
    glibc = GLIBC.get(cell.base.value, DEFAULT_GLIBC) if cell.base.kind == "debian" else None
    return WheelTarget(cell.python, machine, glibc or DEFAULT_GLIBC)


def parts(cell: Cell, resolution: CellLock) -> dict[str, str]:
    """The resolutions the install steps' parts are made from: the environment's (split in
    two by gpuenv/building/layers.py when the cell has packages of its own) and the CUDA wheels'."""
    out = {"python-env": resolution.python_env}
    if cell.is_gpu and not cell.cuda_with_framework:
        out["cuda"] = resolution.cuda
    return out


@dataclass(frozen=True)
class Supply:
    """Where one cell's parts come from: the fetcher and the wheelhouse key of its indexes,
    the machine its wheels are for, uv's executable, what builds a source package into a
    wheel (on the engine: gpuenv/building/sdists.py), and whether the engine's host fetches
    the primary index's wheels (`near`), with uv's wheel and the upstream offering it.
    `uv` and `near` may still be on their way (the download, the probe)."""

    fetcher: Fetcher
    key: str
    target: WheelTarget
    uv: Path | Future[Path]
    wheel: Callable[[Requirement, IndexFile], tuple[IndexFile, Path]] | None = None
    near: Near | Future[Near] | None = None
    primary: str = ""
    uv_offered: tuple[IndexFile, str] | None = None


@dataclass(frozen=True)
class _Wheels:
    """One part's wheels: its resolution as the install step reads it (a source package's
    or a URL's entry naming the wheel sent instead), the wheel taken per name, those sent
    (name -> file name, stored path), and the index the engine's host fetches the rest from."""

    text: str
    chosen: dict[str, IndexFile]
    stored: dict[str, tuple[str, Path]]
    index: str | None


@contextlib.contextmanager
def assembled(
    root: Path, ctx: BuildContext, resolution: CellLock, supply: Supply
) -> Iterator[Path]:
    """The cell's build context as a directory under `root`, held while the build reads it:
    the rendered files, then for each part its wheels picked, the source packages among
    them built into wheels, those the engine's host fetches named, the rest sent, split
    into layers and written. `uv` and `near` are waited for once the first part's wheels
    are picked."""
    with _emptied(root, ctx.cell.name) as here:
        ctx.write(root)
        for part, text in parts(ctx.cell, resolution).items():
            picked = supply.fetcher.picks(supply.key, text, supply.target.python,
                                          supply.target.machine, supply.target.glibc)  # fmt: skip
            near = None if supply.near is None else _ready(supply.near)
            uv = _uv_for(supply, near)
            wheels = _sent(text, picked, _from_sources(picked, supply.wheel), near, supply)
            for name, piece in _layers(part, ctx.cell, wheels, supply):
                _write_part(here / name, piece, wheels, uv())
            if part == layers.FRAMEWORK and ctx.cell.pip:
                (here / layers.PACKAGES / layers.COMPILE).write_text(layers.COMPILE_SCRIPT)
        yield here


@contextlib.contextmanager
def _emptied(root: Path, name: str) -> Iterator[Path]:
    """The cell's directory under `root`, emptied, and held (a lock per cell): another
    gpuenv building this cell waits."""
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # contexts/: no one else's
    root.mkdir(exist_ok=True, mode=0o700)
    here = root / name
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(here, ignore_errors=True)
        here.mkdir(mode=0o700)
        yield here


def _from_sources(
    picked: list[tuple[Requirement, IndexFile, str]],
    wheel: Callable[[Requirement, IndexFile], tuple[IndexFile, Path]] | None,
) -> dict[str, tuple[IndexFile, Path]]:
    """The wheels built from the source packages among a part's picks, by name."""
    out = {}
    for req, file, _ in picked:
        if sdists.is_source(file.filename):
            if wheel is None:
                raise GpuenvError(f"{req.name}=={req.version}: the lock holds its sdist "
                                  f"({file.filename}), and nothing here builds one")  # fmt: skip
            out[req.name] = wheel(req, file)
    return out


def _sent(
    text: str, picked: list[tuple[Requirement, IndexFile, str]],
    built: dict[str, tuple[IndexFile, Path]], near: Near | None, supply: Supply,
) -> _Wheels:  # fmt: skip
    """What of a part is sent: every wheel but those the engine's host fetches (the primary
    index's, when `near` says it fetches), fetched into the wheelhouse, and the wheels
    built from source packages; the resolution names each built or URL-named wheel."""
    for name, (wheel, _) in built.items():
        text = sdists.with_wheel(text, name, wheel.filename, wheel.sha256)
    for r, w, _ in picked:
        if r.url and r.name not in built:  # a wheel named by its URL
            text = sdists.with_wheel(text, r.name, w.filename, w.sha256)
    chosen = {r.name: built[r.name][0] if r.name in built else w for r, w, _ in picked}
    fetched = _fetched_near(picked, built, near, supply.primary)
    sent = [(r, w) for r, w, _ in picked if r.name not in fetched | set(built)]
    stored = {r.name: f for (r, _), f in zip(sent, supply.fetcher.fetch_all(supply.key, sent),
                                              strict=True)}  # fmt: skip
    stored.update({name: (w.filename, path) for name, (w, path) in built.items()})
    return _Wheels(text, chosen, stored, near.index if near is not None else None)


def _fetched_near(
    picked: list[tuple[Requirement, IndexFile, str]], built: dict[str, tuple[IndexFile, Path]],
    near: Near | None, primary: str,
) -> set[str]:  # fmt: skip
    """The wheels the engine's host fetches, by name: the primary index's, where `near`
    says it fetches them; never one built from source or named by its URL."""
    if near is None:
        return set()
    return {r.name for r, _, up in picked
            if r.name not in built and not r.url and near.fetches(up, primary)}  # fmt: skip


def _layers(part: str, cell: Cell, wheels: _Wheels, supply: Supply) -> list[tuple[str, str]]:
    """A part's resolution by install step: the environment's split in two when the cell
    has packages of its own (gpuenv/building/layers.py), else the part whole."""
    if part != layers.FRAMEWORK or not cell.pip:
        return [(part, wheels.text)]
    known = read_record(REQUIRES_RECORD)
    requires = _RequiresDist(wheels.chosen, wheels.stored, supply.fetcher, supply.key, known)
    split = layers.split(wheels.text, framework_requirements(cell), requires,
                         supply.target.python, supply.target.machine)  # fmt: skip
    if requires.read:
        update_record(REQUIRES_RECORD, requires.read)
    return [(layers.FRAMEWORK, split.framework), (layers.PACKAGES, split.packages)]


def _uv_for(supply: Supply, near: Near | None) -> Callable[[], Path | str]:
    """What a part holds of uv: the script fetching its wheel near the engine (its text),
    where the engine's host fetches from the index offering it, else its executable (waited
    for only then)."""
    if near is not None and near.index is not None and supply.uv_offered is not None:
        wheel, upstream = supply.uv_offered
        if near.fetches(upstream, supply.primary):
            from gpuenv.building.near import uv_script

            text = uv_script(near.index, wheel.filename, wheel.sha256, UV_VERSION)
            return lambda: text
    return lambda: _ready(supply.uv)


def _ready(value: T | Future[T]) -> T:
    return value.result() if isinstance(value, Future) else value


class _RequiresDist:
    """Requires-Dist of a resolution's wheels by name, remembered per wheel by its sha256
    (the answer never changes), read from the stored wheel, or for a wheel the engine's
    host fetches, from the index's PEP 658 metadata file (the wheel itself when the index
    offers none). Reading a wheel costs a pass over the zip's directory (27,000 entries in
    TensorFlow's: 0.1-0.3 s a wheel)."""

    def __init__(
        self, chosen: dict[str, IndexFile], stored: dict[str, tuple[str, Path]],
        fetcher: Fetcher, key: str, known: dict[str, object],
    ) -> None:  # fmt: skip
        self.chosen, self.stored, self.fetcher, self.key = chosen, stored, fetcher, key
        self.known = known
        self.read: dict[str, list[str]] = {}  # what was read from wheels this time

    def __call__(self, name: str) -> list[str]:
        wheel = self.chosen[name]
        remembered = self.known.get(wheel.sha256)
        if isinstance(remembered, list) and all(isinstance(x, str) for x in remembered):
            return remembered
        if name in self.stored:
            path: Path | None = self.stored[name][1]
        else:
            path = self.fetcher.file(self.key, name, wheel.sha256, wheel.filename + ".metadata")
            if path is None:
                wanted = Requirement(name, "", frozenset({wheel.sha256}))
                path = self.fetcher.fetch_all(self.key, [(wanted, wheel)])[0][1]
        assert path is not None
        self.read[wheel.sha256] = self.known[wheel.sha256] = layers.requires_dist(path)
        return self.read[wheel.sha256]


def _write_part(directory: Path, text: str, wheels: _Wheels, uv: Path | str) -> None:
    """One install step's part, `text` its resolution: what was sent (requirements.txt,
    the resolution's lines of those wheels, and the wheels), what the engine's host fetches
    (index.txt: the index, then each of its requirements with the one hash of the wheel the
    client-side path would send), the CA's empty mount point, and uv: its executable (a
    path), or the script fetching it near the engine (its text), with bin/, where the step
    runs it from."""
    directory.mkdir(mode=0o700)
    stored, index = wheels.stored, wheels.index
    sent = "".join(block for name, block in layers.blocks(text) if name in stored)
    (directory / SENT).write_text(sent, encoding="utf-8")
    fetched = [r for r in locked_requirements(text) if r.name not in stored]
    lines = [f"--index-url {index}"] if index is not None and fetched else ["--no-index"]
    lines += [f"{r.name}=={r.version} --hash=sha256:{wheels.chosen[r.name].sha256}"
              for r in fetched]  # fmt: skip
    (directory / FETCHED).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (directory / CA_FILE).write_bytes(b"")
    (directory / UV_BIN).mkdir(mode=0o755)
    if isinstance(uv, str):
        (directory / UV_SCRIPT).write_text(uv, encoding="utf-8")
    else:
        _link(uv, directory / UV_SENT)
    for req in locked_requirements(sent):
        filename, path = stored[req.name]
        _link(path, directory / filename)


def contexts_root(wheelhouse_root: Path) -> Path:
    """Where the context directories live: beside the wheelhouse (hard links need one
    filesystem), `<cache>/contexts/<matrix>/<cell>/`."""
    return wheelhouse_root.parent / "contexts"


def prune(root: Path) -> int:
    """Remove the context directories no build holds (they are made again by the next build
    of their cell; kept, their hard links would keep pruned wheels on disk). Returns how
    many went."""
    removed = 0
    for lock_path in sorted(root.glob("*/.*.lock")):
        with lock_path.open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a build is reading it
            directory = lock_path.parent / lock_path.name[1:].removesuffix(".lock")
            if directory.is_dir():
                shutil.rmtree(directory)
                removed += 1
    return removed


def forget_requires(store: Store) -> int:
    """Drop the remembered Requires-Dist of wheels the store no longer holds (after
    `wheelhouse.prune`); returns how many went."""
    known = read_record(REQUIRES_RECORD)
    kept = {sha: lines for sha, lines in known.items() if store.has(sha)}
    if len(kept) < len(known):
        write_record(REQUIRES_RECORD, kept, held=True)  # spares work: kept on success only
    return len(known) - len(kept)


def _link(source: Path, target: Path) -> None:
    """A hard link where the filesystem allows (no copy of a 600 MB wheel), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)  # with its mtime, which uv records (FILE_MTIME)


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
