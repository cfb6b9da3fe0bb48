"""Pins from a lock the project already has (`packages: {lock: uv.lock}` or a PEP 751
`pylock.toml`): the versions and hashes it holds constrain every cell's resolution.

Each locked package from an index becomes a constraint `name==version` carrying the
package's markers (a uv fork's `resolution-markers`, a pylock package's `marker`) and the
sha256 of every file the lock lists: the resolution then picks that version wherever the
cell needs the package, and the lock's pick must be one of those files (the `--hash` rule
of requirements files). What the lock says of the project itself (uv's editable or
virtual source, a pylock directory) is skipped: `gpuenv run` mounts the project. A package
from git, a URL or a path is refused (gpuenv builds no sources yet), and so is a local
build (`torch 2.9.1+cpu`: see `_public`). Python and platform
are checked per cell (`requires-python`, pylock's `environments`); the framework is checked
as any constraint is (catalog/compat.py).
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from gpuenv.matrix.requirements import (
    Line,
    RequirementsFile,
    RequirementsProblem,
    inside,
    pip_requirement,
)

UV_LOCK = "uv.lock"


def is_lock(written: str) -> bool:
    from packaging.pylock import is_valid_pylock_path

    return Path(written).name == UV_LOCK or is_valid_pylock_path(Path(written))


def read(written: str, matrix_dir: Path) -> RequirementsFile:
    if not is_lock(written):
        raise RequirementsProblem(
            f"{written!r} is neither uv.lock nor a PEP 751 pylock.toml / pylock.<name>.toml",
            written,
        )
    named, path, raw = inside(written, matrix_dir)
    files = ((named, path, hashlib.sha256(raw).hexdigest()),)
    try:
        text = raw.decode("utf-8")
        doc = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RequirementsProblem(f"{written!r} is not TOML: {exc}", written) from None
    physical = text.splitlines()
    if Path(written).name == UV_LOCK:
        pins, requires, environments = _uv(doc, path, physical)
    else:
        pins, requires, environments = _pylock(doc, path, physical)
    digest = hashlib.sha256(repr([p.text for p in pins]).encode()).hexdigest()
    return RequirementsFile(
        written, path, (), tuple(pins), digest, files=files,
        requires_python=requires, environments=environments,
    )  # fmt: skip


def _uv(
    doc: dict[str, Any], path: Path, physical: list[str]
) -> tuple[list[Line], str, tuple[str, ...]]:
    if doc.get("version") != 1:
        raise RequirementsProblem(
            f"uv.lock version {doc.get('version')!r}; gpuenv reads version 1", path, 1
        )
    requires = _requires_python(doc.get("requires-python"), path, physical)
    pins: list[Line] = []
    seen: dict[str, int] = {}
    for package in doc.get("package") or []:
        name, version = str(package.get("name", "")), package.get("version")
        number = _line_of(physical, name, seen)
        source = package.get("source") or {}
        if {"editable", "virtual", "directory"} & set(source):
            continue  # the project itself (or a workspace member): run mounts it
        if not {"registry"} & set(source) or version is None:
            kind = next(iter(source), "no source")
            raise RequirementsProblem(
                f"{name} comes from {kind} ({source.get(kind, '')}); pip would build it from "
                "there; gpuenv installs locked wheels from indexes and builds no sources "
                "yet: publish its wheel to an index and re-lock",
                path,
                number,
            )
        marker = _resolution_markers(
            name, package.get("resolution-markers"), path, physical, number
        )
        hashes = [w.get("hash", "") for w in package.get("wheels") or []]
        if package.get("sdist"):
            hashes.append(package["sdist"].get("hash", ""))
        _public(name, str(version), str(source["registry"]), path, number)
        pins.append(_pin(name, str(version), marker, hashes, path, number))
    return pins, requires, ()


_RELOCK = "correct it, or write the lock again with `uv lock`"


def _requires_python(value: object, path: Path, physical: list[str]) -> str:
    """uv.lock's `requires-python`, checked as a version specifier here: it is read again
    for every cell, and a bad one is the user's file, not gpuenv's fault."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if value is None or value == "":
        return ""
    try:
        if not isinstance(value, str):
            raise InvalidSpecifier(repr(value))
        SpecifierSet(value)
    except InvalidSpecifier:
        raise RequirementsProblem(
            f"requires-python {_shown(value)} is not a version specifier: {_RELOCK}",
            path,
            _line_after(physical, 0, "requires-python"),
        ) from None
    return value


def _resolution_markers(
    name: str, value: object, path: Path, physical: list[str], number: int
) -> str:
    """A uv fork's `resolution-markers`, a list of PEP 508 markers: each parsed on its own
    (so none can regroup another's parentheses), then joined as written."""
    from packaging.markers import InvalidMarker, Marker

    if value is None or value == []:
        return ""
    where = _line_after(physical, number, "resolution-markers")
    if not isinstance(value, list):
        raise RequirementsProblem(
            f"{name}'s resolution-markers is {_shown(value)}, not a list of markers: {_RELOCK}",
            path,
            where,
        )
    for entry in value:
        try:
            if not isinstance(entry, str):
                raise InvalidMarker(repr(entry))
            Marker(entry)
        except InvalidMarker:
            line = _line_after(physical, where, entry) if isinstance(entry, str) else where
            raise RequirementsProblem(
                f"{name}'s resolution-markers entry {_shown(entry)} is not a PEP 508 marker: "
                f"{_RELOCK}",
                path,
                line,
            ) from None
    return " or ".join(f"({m})" for m in value)


def _shown(value: object) -> str:
    """A value of the user's file in a message: quoted, escaped, and cut."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= 120 else text[:117] + "...'"


def _line_after(physical: list[str], start: int, needle: str) -> int:
    """The first line at or after `start` (1-based) holding `needle`, else `start`."""
    for number in range(max(start - 1, 0), len(physical)):
        if needle in physical[number]:
            return number + 1
    return max(start, 1)


def _pylock(
    doc: dict[str, Any],
    path: Path,
    physical: list[str],
) -> tuple[list[Line], str, tuple[str, ...]]:
    from packaging.pylock import Pylock, PylockUnsupportedVersionError, PylockValidationError

    try:
        lock = Pylock.from_dict(doc)
    except (PylockValidationError, PylockUnsupportedVersionError) as exc:
        raise RequirementsProblem(f"not a PEP 751 lock: {exc}", path, 1) from None
    pins: list[Line] = []
    seen: dict[str, int] = {}
    for package in lock.packages:
        number = _line_of(physical, str(package.name), seen)
        if package.directory is not None:
            continue  # the project itself: run mounts it
        if package.vcs or package.archive or package.version is None:
            raise RequirementsProblem(
                f"{package.name} comes from a VCS, an archive or a path; pip would build or "
                "unpack it; gpuenv installs locked wheels from indexes and builds no "
                "sources yet: publish its wheel to an index and re-lock",
                path,
                number,
            )
        _public(package.name, str(package.version), str(package.index or "its index"), path, number)
        hashes = [w.hashes.get("sha256", "") for w in package.wheels or ()]
        if package.sdist is not None:
            hashes.append(package.sdist.hashes.get("sha256", ""))
        marker = str(package.marker) if package.marker else ""
        pins.append(_pin(package.name, str(package.version), marker, hashes, path, number))
    requires = str(lock.requires_python) if lock.requires_python else ""
    environments = tuple(str(m) for m in lock.environments or ())
    return pins, requires, environments


def _public(name: str, version: str, index: str, path: Path, number: int) -> None:
    """A local version (`2.9.1+cpu`) is one index's build, not a release: a lock holds it
    when the project picks a framework's build by an extra (uv forks on it, several builds
    of one release at once), which gpuenv does per cell from the cell's variant."""
    _, plus, label = version.partition("+")
    if plus:
        raise RequirementsProblem(
            f"{name} {version} is a local build ('+{label}', from {index}), not a release: "
            "gpuenv takes only released versions from a lock, and a framework's CPU or CUDA "
            "build from the cell's variant: lock without the index that serves it "
            "([tool.uv.sources]), or leave packages.lock out",
            path,
            number,
        )


def _pin(name: str, version: str, marker: str, hashes: list[str], path: Path, number: int) -> Line:
    from packaging.utils import canonicalize_name

    try:
        requirement = pip_requirement(f"{name}=={version}")
    except ValueError as exc:
        raise RequirementsProblem(str(exc), path, number) from None
    digests = tuple(
        sorted({h.removeprefix("sha256:").lower() for h in hashes if h.startswith("sha256:")
                or re.fullmatch(r"[0-9a-fA-F]{64}", h)})
    )  # fmt: skip
    return Line(path, number, canonicalize_name(name), requirement, marker, digests)


def _line_of(physical: list[str], name: str, seen: dict[str, int]) -> int:
    """The line of the next `name = "<name>"` not yet claimed (a uv fork repeats a name)."""
    start = seen.get(name, 0)
    for number in range(start, len(physical)):
        if re.fullmatch(rf'\s*name\s*=\s*"{re.escape(name)}"\s*', physical[number]):
            seen[name] = number + 1
            return number + 1
    return 1
