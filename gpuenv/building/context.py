"""The build context a cell's build sends, assembled on the client: the rendered context plus,
per install step, the part of it that step mounts.

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
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future
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
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import framework_requirements
from gpuenv.store.cache import read_record, update_record, write_record
from gpuenv.store.wheelhouse import Requirement, locked_requirements

if TYPE_CHECKING:
    from gpuenv.building.near import Near
    from gpuenv.building.render import BuildContext
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.lockfile import CellLock
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
