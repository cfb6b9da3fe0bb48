"""Layers ordered by how often they change: which install step each distribution of a cell's
resolution goes to.

A cell's Python environment is one resolution (the lock's entry, or `uv pip compile` at
build time), installed in two steps so that editing the matrix's packages rebuilds a small
layer, not the framework:

- `python-env`: the framework and its own dependency closure (for PyTorch GPU cells, its
  CUDA wheels too) — what changes when the framework does, every few weeks;
- `packages`: every other distribution of the resolution — what the matrix's `packages`,
  a cell's `pip` and its requirements files add, which users edit daily.

The closure is walked over the wheels' own Requires-Dist (their METADATA), with the
markers evaluated for the cell's Python on Linux and the cell's machine, and extras
followed. Whatever the walk decides, the two parts together are exactly the resolution,
each line once: a distribution it fails to reach lands in `packages`, installed all the same
(a smaller shared layer, never a different environment). A pin that moves a version of
the framework's closure (a user's `numpy<2`) changes the framework's part: correct, and
that layer is rebuilt.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.markers import InvalidMarker, Marker, UndefinedComparison
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

FRAMEWORK = "python-env"
PACKAGES = "packages"

# The packages step compiles the bytecode of what it installed, and only that: uv's
# --compile-bytecode walks the whole environment and rewrites every .pyc (hash-based ones are
# never "up to date" for compileall), which would copy the framework's into this layer.
# Sent in the step's part of the context (never in a layer); SOURCE_DATE_EPOCH makes the
# .pyc files hash-based, as the first step's.
COMPILE = "compile.py"
COMPILE_SCRIPT = """\
import compileall, importlib.metadata, re, sys

text = "".join(open(path, encoding="utf-8").read() for path in sys.argv[1:])
for name in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", text, re.M):
    for file in importlib.metadata.files(name) or ():
        if file.suffix == ".py":
            compileall.compile_file(str(file.locate()), quiet=2)
"""

_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)")


@dataclass(frozen=True)
class Split:
    framework: str  # requirements text of the framework's closure
    packages: str  # requirements text of the rest ("" when there is none)


def blocks(text: str) -> list[tuple[str, str]]:
    """(canonical name, its lines) of each requirement in a resolution, in order: a block
    is a `name==version` line and its indented continuation lines (the hashes)."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines(keepends=True):
        if line[:1].isspace() and out:
            out[-1] = (out[-1][0], out[-1][1] + line)
            continue
        m = _NAME.match(line)
        if m and not line.startswith("#"):
            out.append((canonicalize_name(m.group(1)), line))
    return out


def environment(python: str, machine: str) -> dict[str, str]:
    """PEP 508 marker variables of a cell's interpreter: CPython `python` on Linux."""
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{python}.0",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": f"{python}.0",
        "python_version": python,
        "sys_platform": "linux",
    }


def _applies(marker: Marker | None, env: Mapping[str, str], extras: Iterable[str]) -> bool:
    if marker is None:
        return True
    try:
        return any(marker.evaluate({**env, "extra": e}) for e in ("", *extras))
    except (UndefinedComparison, InvalidMarker, ValueError):
        return True  # a marker we cannot judge: follow it (the part stays a subset anyway)


def closure(
    roots: Iterable[str],
    requires: Callable[[str], list[str]],
    env: Mapping[str, str],
    resolved: set[str],
) -> set[str]:
    """The names in `resolved` that `roots` need, following each distribution's
    Requires-Dist (`requires(name)`) with its extras."""
    wanted: dict[str, set[str]] = {}
    queue: list[tuple[str, frozenset[str]]] = []

    def want(line: str) -> None:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            return
        name = canonicalize_name(req.name)
        if name not in resolved:
            return
        have = wanted.get(name)
        if have is not None and set(req.extras) <= have:
            return  # walked already, with these extras
        wanted[name] = (have or set()) | set(req.extras)
        queue.append((name, frozenset(wanted[name])))

    for root in roots:
        want(root)
    while queue:
        name, extras = queue.pop()
        for line in requires(name):
            try:
                marker = Requirement(line).marker
            except InvalidRequirement:
                continue
            if _applies(marker, env, extras):
                want(line)
    return set(wanted)


def requires_dist(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA (read from the zip, not installed), or
    of a METADATA file itself (an index's PEP 658 copy of it)."""
    if not zipfile.is_zipfile(wheel):
        text = wheel.read_bytes().decode("utf-8", errors="replace")
        return list(HeaderParser().parsestr(text).get_all("Requires-Dist") or [])
    with zipfile.ZipFile(wheel) as zf:
        name = next(
            (n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")),
            None,
        )
        if name is None:
            return []
        headers = HeaderParser().parsestr(zf.read(name).decode("utf-8", errors="replace"))
    return list(headers.get_all("Requires-Dist") or [])


def split(
    text: str,
    roots: Iterable[str],
    requires: Callable[[str], list[str]],
    python: str,
    machine: str,
) -> Split:
    """The framework's part of a resolution and the rest, each in the resolution's order."""
    parsed = blocks(text)
    needed = closure(roots, requires, environment(python, machine), {n for n, _ in parsed})
    framework = "".join(b for n, b in parsed if n in needed)
    packages = "".join(b for n, b in parsed if n not in needed)
    return Split(framework, packages)
