"""Source distributions (sdists) built into wheels, once, in a sandbox on the engine.

Building a package runs its code (setup.py, a build backend), so it never happens on the
client, where the user's credentials and the CA live (issue 35: resolving runs `uv pip
compile --no-build`). It happens in a throwaway container with no network (`network none`)
of the cell's own base image, so the wheel is built against the Python and glibc it will
run on:

- What goes in: the sdist and the wheels its build needs (`[build-system] requires` read
  from its pyproject.toml, else setuptools and wheel, as PEP 517 says), both fetched on
  the client and checked against their index's sha256 like every wheel, and uv's
  executable, which builds offline from those files alone (`uv build --wheel --offline
  --no-index`). What comes out: one wheel, whose name and tags are checked before it enters
  the wheelhouse under its own sha256.
- Compiled code: an sdist holding C, C++, Cython, Fortran or Rust sources is built in an
  image made for the build from the cell's base plus Debian's gcc, g++ and python3-dev
  (with network host for that apt step only, as a cell's own apt packages are), removed
  afterwards: its compilers never reach the cell's image, which installs only the wheel.
  A pure-Python sdist is built in the base itself. One path for both (the container); the
  issue allowed pure Python on the client, which would run the package's setup.py beside
  the user's secrets.
- Once: the built wheel is remembered by the sdist's sha256 (what the lock holds), the
  base image's ID and the machine (a cache record, BUILT_RECORD); a later build, of this
  cell or another on the same base, takes it from the wheelhouse.

Resolving (`uv pip compile`) needs an sdist's dependencies. PEP 643 metadata (PKG-INFO of
Metadata-Version 2.2 or later, without `Dynamic: Requires-Dist`) is read from the archive,
which runs nothing; otherwise the wheel is built in the sandbox first and its METADATA read.
Either way uv is given the metadata (`dependency-metadata`), and allowed the sdist of that
package at that one version only (gpuenv/building/lock.py), so it builds nothing itself.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from email.parser import HeaderParser
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.cache import read_record, update_record
from gpuenv.store.wheelhouse import IndexFile, Requirement, normalize

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.store.fetch import Fetcher

# .tar: a local project directory's tree (gpuenv/matrix/localtree.py), built as a directory.
SOURCE_SUFFIXES = (".tar.gz", ".zip", ".tar")
# Sources that need a compiler: an sdist holding any is built with one.
NATIVE = re.compile(
    r"\.(c|cc|cpp|cxx|c\+\+|pyx|pxd|f|f90|f95|rs|cu)$|(^|/)(Cargo\.toml|CMakeLists\.txt|meson\.build)$",
    re.IGNORECASE,
)
COMPILERS = ("gcc", "g++", "libc6-dev", "python3-dev")
# PEP 517: a source tree without [build-system] is built by setuptools' legacy backend.
DEFAULT_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
BUILT_RECORD = "built-wheels.json"  # sdist sha256, base image ID, machine -> the wheel
MAX_MEMBER = 1 << 20  # PKG-INFO, pyproject.toml: read at most this much
MAX_WHEEL = 512 << 20  # what the sandbox may hand back
BUILD_TIMEOUT = 900  # seconds for one build in the sandbox
SANDBOX = "/gpuenv-build"  # where the sandbox's inputs and output live, in the container
SOURCE_DATE_EPOCH = "315532800"  # the zip epoch: the wheel's file times (gpuenv's FILE_MTIME)


def is_source(filename: str) -> bool:
    return filename.endswith(SOURCE_SUFFIXES) and not filename.endswith(".whl")


@dataclass(frozen=True)
class Metadata:
    """What a resolver needs of a distribution."""

    name: str
    version: str
    requires_dist: tuple[str, ...]
    requires_python: str = ""
    url: str = ""  # a direct reference's archive, and its sha256: what the lock holds
    sha256: str = ""


@dataclass(frozen=True)
class Source:
    """What a static read of an sdist tells (nothing extracted, nothing run)."""

    build_requires: tuple[str, ...]
    native: bool
    metadata: Metadata | None  # PEP 643 static metadata, when the sdist has it


def read_source(path: Path, filename: str) -> Source:
    """Read an sdist's member names, its PKG-INFO and pyproject.toml from the archive."""
    members: dict[str, bytes | None] = {}
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    members[info.filename] = (
                        zf.read(info) if _top(info.filename) and info.file_size <= MAX_MEMBER
                        else None
                    )  # fmt: skip
        else:
            with tarfile.open(path, "r:*") as tar:
                for member in tar:
                    data = None
                    if _top(member.name) and member.isfile() and member.size <= MAX_MEMBER:
                        stream = tar.extractfile(member)
                        data = stream.read() if stream is not None else None
                    members[member.name] = data
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise GpuenvError(f"{filename}: not a readable source distribution ({exc})") from None
    native = any(NATIVE.search(name) for name in members)
    pyproject = next((d for n, d in members.items() if n.endswith("/pyproject.toml") and d), None)
    pkg_info = next((d for n, d in members.items() if n.endswith("/PKG-INFO") and d), None)
    return Source(
        build_requires(pyproject, filename),
        native,
        static_metadata(pkg_info.decode("utf-8", "replace")) if pkg_info else None,
    )


def _top(name: str) -> bool:
    """A file at the sdist's top directory (`name-version/PKG-INFO`)."""
    return name.strip("/").count("/") == 1


def build_requires(pyproject: bytes | None, filename: str) -> tuple[str, ...]:
    """`[build-system] requires` of an sdist's pyproject.toml, else PEP 517's default."""
    from gpuenv.matrix.requirements import RequirementsProblem, pyproject_document

    if pyproject is None:
        return DEFAULT_BUILD_REQUIRES
    try:
        doc = pyproject_document(pyproject, f"{filename}: its pyproject.toml", filename)
    except RequirementsProblem as exc:
        raise GpuenvError(exc.message) from None
    system = doc.get("build-system")
    if not isinstance(system, dict) or "requires" not in system:
        return DEFAULT_BUILD_REQUIRES
    requires = system["requires"]
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise GpuenvError(f"{filename}: [build-system] requires is not a list of strings")
    return tuple(requires)


def static_metadata(pkg_info: str) -> Metadata | None:
    """PEP 643: an sdist's PKG-INFO is the wheel's metadata when its Metadata-Version is
    2.2 or later and it does not mark Requires-Dist (or Requires-Python) Dynamic."""
    headers = HeaderParser().parsestr(pkg_info)
    try:
        version = tuple(int(x) for x in str(headers.get("Metadata-Version", "")).split("."))
    except ValueError:
        return None
    dynamic = {str(d).strip().lower() for d in headers.get_all("Dynamic") or []}
    if version < (2, 2) or dynamic & {"requires-dist", "requires-python"}:
        return None
    if not headers.get("Name") or not headers.get("Version"):
        return None
    return _metadata(headers)


def wheel_metadata(path: Path) -> Metadata:
    """A wheel's METADATA (read from the zip)."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))  # fmt: skip
        return _metadata(HeaderParser().parsestr(zf.read(name).decode("utf-8", "replace")))


def _metadata(headers: Message) -> Metadata:
    """A resolver's part of core metadata headers (an sdist's PKG-INFO, a wheel's METADATA)."""
    return Metadata(
        normalize(str(headers["Name"])), str(headers["Version"]),
        tuple(str(r) for r in headers.get_all("Requires-Dist") or []),
        str(headers.get("Requires-Python") or ""),
    )  # fmt: skip


def fits(filename: str, name: str, version: str, python: str, machine: str) -> bool:
    """A built wheel is the distribution asked for and installs on CPython `python` on
    linux/`machine` (a local build is tagged linux_<machine>, not manylinux)."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion, Version

    try:
        got_name, got_version, _, tags = parse_wheel_filename(filename)
        if normalize(got_name) != normalize(name):
            return False
        if version and got_version != Version(version):  # "": a URL's archive names none
            return False
    except (InvalidWheelFilename, InvalidVersion):
        return False
    nodot = python.replace(".", "")
    for tag in tags:
        interpreter = tag.interpreter in (f"cp{nodot}", "py3", f"py{nodot}") or (
            tag.abi == "abi3" and tag.interpreter.startswith("cp3")
        )
        abi = tag.abi in (f"cp{nodot}", "abi3", "none")
        platform = tag.platform == "any" or tag.platform.endswith(f"_{machine}")
        if interpreter and abi and platform and not tag.platform.startswith(("macosx", "win")):
            return True
    return False


def with_wheel(text: str, name: str, wheel: str, sha: str) -> str:
    """A resolution with `name`'s entry (its sdist's hashes, or a direct reference's URL)
    replaced by the wheel the install step takes from its part: `name==version` and that
    wheel's hash, which --require-hashes checks."""
    from packaging.utils import parse_wheel_filename

    from gpuenv.building.layers import blocks

    version = parse_wheel_filename(wheel)[1]
    out = []
    for block_name, block in blocks(text):
        if block_name == normalize(name):
            block = f"{block_name}=={version} \\\n    --hash=sha256:{sha}\n"
        out.append(block)
    return "".join(out)


def direct_reference(name: str, requirements: list[str]) -> str | None:
    """The URL `requirements` name `name` at (`name @ URL`), if they do."""
    from packaging.requirements import InvalidRequirement
    from packaging.requirements import Requirement as Parsed

    for line in requirements:
        try:
            req = Parsed(line)
        except InvalidRequirement:
            continue
        if normalize(req.name) == normalize(name) and req.url:
            return req.url
    return None


def choose_source(
    files: list[IndexFile], name: str, requirements: list[str], python: str,
    exclude_newer: str | None,
) -> IndexFile | None:  # fmt: skip
    """The sdist of `name` a resolution takes: of the version `requirements` pin, else of
    the newest release their specifiers allow (not yanked, not newer than the lock's date,
    for `python`); a .tar.gz before a .zip."""
    from packaging.requirements import InvalidRequirement
    from packaging.requirements import Requirement as Parsed
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import InvalidSdistFilename, parse_sdist_filename
    from packaging.version import Version

    allowed = SpecifierSet()
    for line in requirements:
        try:
            req = Parsed(line)
        except InvalidRequirement:
            continue
        if normalize(req.name) == normalize(name):
            allowed &= req.specifier
    candidates: list[tuple[Version, bool, IndexFile]] = []
    for f in files:
        if not is_source(f.filename) or f.yanked:
            continue
        if exclude_newer and f.upload_time and f.upload_time > exclude_newer:
            continue
        try:
            _, version = parse_sdist_filename(f.filename)
            if f.requires_python and not SpecifierSet(f.requires_python).contains(f"{python}.99"):
                continue
        except (InvalidSdistFilename, InvalidSpecifier):
            continue
        if allowed.contains(version, prereleases=bool(allowed) and "==" in str(allowed)):
            candidates.append((version, f.filename.endswith(".tar.gz"), f))
    return max(candidates, key=lambda c: (c[0], c[1]))[2] if candidates else None


@dataclass(frozen=True)
class Sandbox:
    """Where one cell's sdists are built: its base image, Python and machine, and the
    platform the engine runs a container of it under (another machine's: emulated)."""

    image: str
    python: str
    machine: str
    glibc: tuple[int, int]
    resolve_platform: str  # uv's --python-platform for the build's own requirements
    platform: str | None = None


class WheelBuilder:
    """Builds sdists into wheels in the sandbox (module docstring), remembering each.

    `resolve` turns requirements into a hashed resolution of wheels for a Python and
    platform (`uv pip compile --no-build`: the build's own requirements); `uv` gives uv's
    executable for a machine."""

    def __init__(
        self, engine: Engine, fetcher: Fetcher, key: str,
        resolve: Callable[[list[str], str, str], str], uv: Callable[[str], Path],
        say: Callable[[str], None] = lambda _: None,
    ) -> None:  # fmt: skip
        self.engine, self.fetcher, self.key = engine, fetcher, key
        self.resolve, self.uv, self.say = resolve, uv, say
        self.built = 0  # built in the sandbox by this process (reuses are not counted)

    def source_path(self, req: Requirement, sdist: IndexFile) -> Path:
        if req.url:
            return self.fetcher.url_file(req.url, sdist.sha256)
        path = self.fetcher.file(self.key, req.name, sdist.sha256, sdist.filename)
        if path is None:
            problems = self.fetcher.problems
            raise GpuenvError(problems[-1] if problems else f"{sdist.filename}: not fetched")
        return path

    def metadata(
        self, name: str, requirements: list[str], sandbox: Sandbox, exclude_newer: str | None
    ) -> Metadata:
        """The metadata of the sdist of `name` a resolution of `requirements` takes
        (choose_source), or of the archive they name it at (`name @ URL`): static when
        PEP 643 allows, else from the wheel built now."""
        url = direct_reference(name, requirements)
        if url is not None:
            from dataclasses import replace

            from gpuenv.store.wheelhouse import archive_name

            path = self.fetcher.url_file(url, None)
            req = Requirement(normalize(name), "", frozenset({path.name}), url)
            archive = IndexFile(archive_name(url), url, path.name)
            got = read_source(path, archive.filename).metadata
            if got is None:
                got = wheel_metadata(self.wheel(req, archive, sandbox)[1])
            return replace(got, url=url, sha256=path.name)
        files = self.fetcher.page(self.key, name) or []
        sdist = choose_source(files, name, requirements, sandbox.python, exclude_newer)
        if sdist is None:
            raise GpuenvError(
                f"{name}: no wheel for CPython {sandbox.python} on linux/{sandbox.machine}, and "
                "no source distribution that the requirements allow either; pin a release "
                f"of {name} that ships one (pip would fail the same way)"
            )
        path = self.source_path(Requirement(normalize(name), "", frozenset()), sdist)
        source = read_source(path, sdist.filename)
        if source.metadata is not None:
            return source.metadata
        _, wheel = self.wheel(Requirement(normalize(name), "", frozenset({sdist.sha256})),
                              sdist, sandbox)  # fmt: skip
        return wheel_metadata(wheel)

    def wheel(self, req: Requirement, sdist: IndexFile, sandbox: Sandbox) -> tuple[IndexFile, Path]:
        """The wheel built from `sdist` for the sandbox's target: the one built before when
        the wheelhouse still holds it, else built now (offline: an error)."""
        store = self.fetcher.store
        key = f"{sdist.sha256}:{self._base_id(sandbox)}:{sandbox.machine}"
        known = read_record(BUILT_RECORD).get(key)
        if isinstance(known, dict) and isinstance(known.get("sha256"), str):
            path = store.verified(known["sha256"])
            if path is not None:
                self.say(f"{sdist.filename}: its wheel, built before, is reused")
                return IndexFile(str(known["filename"]), "", known["sha256"]), path
        if self.fetcher.offline:
            raise GpuenvError(
                f"--offline: {sdist.filename} has not been built into a wheel for this base; "
                "build once online (it fetches the build's own requirements)"
            )
        source_path = self.source_path(req, sdist)
        source = read_source(source_path, sdist.filename)
        started = time.monotonic()
        version = req.version if req.url else req.version or _sdist_version(sdist.filename)
        filename, data = self._build(req.name, version, sdist, source_path, source, sandbox)
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        path = store.put(sha, io.BytesIO(data), f"{filename} (built from {sdist.filename})")
        update_record(BUILT_RECORD, {key: {"filename": filename, "sha256": sha,
                                           "source": sdist.filename}})  # fmt: skip
        self.built += 1
        how = "with compilers" if source.native else "pure Python"
        self.say(f"{sdist.filename}: built into {filename} ({how}, network none, "
                 f"{time.monotonic() - started:.1f} s)")  # fmt: skip
        return IndexFile(filename, "", sha), path

    def _base_id(self, sandbox: Sandbox) -> str:
        info = self.engine.image(sandbox.image)
        if info is None:
            raise GpuenvError(f"base {sandbox.image} is not in the engine (to build sdists on)")
        return info.id

    def _build(
        self, req_name: str, version: str, sdist: IndexFile, path: Path, source: Source,
        sandbox: Sandbox,
    ) -> tuple[str, bytes]:  # fmt: skip
        from gpuenv.store.wheelhouse import locked_requirements

        # The name it has in the sandbox: its own when it is a plain file name (a URL's
        # last segment, unquoted, could be anything).
        suffix = ".zip" if sdist.filename.endswith(".zip") else ".tar.gz"
        plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", sdist.filename)
        name = sdist.filename if plain else f"source{suffix}"
        try:
            resolution = self.resolve(
                list(source.build_requires), sandbox.python, sandbox.resolve_platform
            )
        except GpuenvError as exc:
            wanted = ", ".join(source.build_requires)
            raise GpuenvError(f"{name}: its build requirements ({wanted}): {exc.message}") from None
        picked = self.fetcher.picks(self.key, resolution, sandbox.python, sandbox.machine,
                                    sandbox.glibc)  # fmt: skip
        deps = self.fetcher.fetch_all(self.key, [(r, w) for r, w, _ in picked])
        assert len(deps) == len(locked_requirements(resolution))
        files = {f"{SANDBOX}/uv": self.uv(sandbox.machine).read_bytes()}
        if sdist.filename.endswith(".tar"):  # a local directory: built as the tree itself
            tree = _tree_files(path)
            files.update({f"{SANDBOX}/src/{member}": data for member, data in tree.items()})
            name = next(iter(tree)).split("/", 1)[0] if tree else "project"
        else:
            files[f"{SANDBOX}/src/{name}"] = path.read_bytes()
        files.update({f"{SANDBOX}/deps/{filename}": p.read_bytes() for filename, p in deps})
        command = [
            "/bin/sh", "-c",
            # Not root (Engine.run_collecting): uv, put in as root's 0644, copied to run it.
            f"cp {SANDBOX}/uv {SANDBOX}/uv.run && chmod 0755 {SANDBOX}/uv.run && "
            f"HOME={SANDBOX} SOURCE_DATE_EPOCH={SOURCE_DATE_EPOCH} "
            f"UV_CACHE_DIR={SANDBOX}/uv-cache {SANDBOX}/uv.run build --wheel --offline --no-index "
            f"--find-links {SANDBOX}/deps --python python3 --out-dir {SANDBOX}/out "
            f"{SANDBOX}/src/{name}",
        ]  # fmt: skip
        image = sandbox.image
        compilers = None
        if source.native:
            compilers = self._with_compilers(sandbox)
            image = compilers
        try:
            code, log, out = self.engine.run_collecting(
                image, command, files=files, collect=f"{SANDBOX}/out", timeout=BUILD_TIMEOUT,
                platform=sandbox.platform, max_bytes=MAX_WHEEL,
            )  # fmt: skip
        finally:
            if compilers is not None:
                self.engine.remove_image(compilers, force=True)
        if code != 0:
            tail = " | ".join(line.strip() for line in log.strip().splitlines()[-4:])
            raise GpuenvError(
                f"{sdist.filename} did not build into a wheel (exit {code}, in a network-less "
                f"container of {sandbox.image}): {tail[-600:]}"
            )
        wheels = _wheels_in(out)
        good = [(f, d) for f, d in wheels if fits(f, req_name, version, sandbox.python,
                                                  sandbox.machine)]  # fmt: skip
        if len(good) != 1:
            raise GpuenvError(
                f"{sdist.filename}: the build gave {[f for f, _ in wheels] or 'no wheel'}, not "
                f"one wheel of {req_name} {version or '(any version)'} for CPython "
                f"{sandbox.python} on linux/{sandbox.machine}"
            )
        return good[0]

    def _with_compilers(self, sandbox: Sandbox) -> str:
        """An image of the base with Debian's compilers and Python headers (network host
        for apt alone), untagged; the caller removes it."""
        dockerfile = (
            f"FROM {sandbox.image}\n"
            "RUN apt-get update && apt-get install --yes --no-install-recommends "
            f"{' '.join(COMPILERS)} && rm -rf /var/lib/apt/lists/*\n"
        )
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(dockerfile.encode())
            tar.addfile(info, io.BytesIO(dockerfile.encode()))
        buffer.seek(0)
        self.say(f"installing {', '.join(COMPILERS)} on {sandbox.image} for the build only")
        from gpuenv.engine.client import BuildFailed

        try:
            return self.engine.build(
                buffer, labels={"io.gpuenv.sdist-build": "1"}, nocache=False,
                on_log=lambda _: None, network="host", platform=sandbox.platform,
            )  # fmt: skip
        except BuildFailed as exc:
            raise GpuenvError(f"cannot install compilers on {sandbox.image} to build an sdist "
                              f"with: {exc}") from None  # fmt: skip


def _sdist_version(sdist_filename: str) -> str:
    from packaging.utils import parse_sdist_filename

    return str(parse_sdist_filename(sdist_filename)[1])


def _tree_files(path: Path) -> dict[str, bytes]:
    """A local directory's tar (gpuenv/matrix/localtree.py: regular files under one top
    directory) as member name -> bytes; any other member, or one leaving the top, refused."""
    out: dict[str, bytes] = {}
    with tarfile.open(path, "r:") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or ".." in parts or member.name.startswith("/"):
                raise GpuenvError(f"{path.name}: {member.name!r} is not a file of a project tree")
            stream = tar.extractfile(member)
            out[member.name] = stream.read() if stream is not None else b""
    return out


def _wheels_in(tar_bytes: bytes) -> list[tuple[str, bytes]]:
    """The .whl files of a tar the engine gave back (get_archive of the output directory)."""
    out = []
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base.endswith(".whl"):
                    stream = tar.extractfile(member)
                    if stream is not None:
                        out.append((base, stream.read()))
    except tarfile.TarError:
        return []
    return out
