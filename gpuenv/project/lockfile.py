"""matrix.lock, the file: its format, reading and writing it, and whether it still matches.

Per cell the lock keeps the complete hashed resolution (the framework and packages, the CUDA
wheels), what a requirements file's markers left out, and an `inputs` digest of what was
resolved; a matrix edited after locking no longer matches it (`drift`), which
`gpuenv lock --check` and `gpuenv build` report. Per base it keeps the image's identity, so
a base re-bootstrapped later is refused (`base_drift`). Resolving and re-locking are in
gpuenv/building/lock.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.umask import current_umask

if TYPE_CHECKING:
    import yaml

    from gpuenv.engine.client import ImageInfo

PLATFORM = "x86_64-manylinux_2_28"


def platform_of(cell: Cell) -> str:
    """uv's --python-platform for the cell's architecture (aarch64-manylinux_2_28 for an
    arm64 cell, whatever machine locks it). manylinux_2_28 is the floor PyTorch's and
    NVIDIA's wheels are built for; uv's target also takes older manylinux tags (cuDNN's
    2_27), which pip's --platform would refuse."""
    return f"{cell.machine}-manylinux_2_28"


VERSION = 1


@dataclass(frozen=True)
class Recipe:
    """What a gpuenv renders and runs in a build: its version and the digest of its templates
    and build steps (computed by gpuenv/building/recipe.py). The same lock built by another
    recipe gives other images, so the lock records the one that wrote it."""

    gpuenv: str
    digest: str  # sha256:<64 hex>

    def __str__(self) -> str:
        return f"gpuenv {self.gpuenv} (recipe {self.digest[:19]})"


@dataclass(frozen=True)
class CellLock:
    inputs: str
    python_env: str  # requirements.txt text with hashes: the framework + matrix packages
    cuda: str  # the nvidia-* wheels, with hashes ("" for CPU cells)
    # Requirements files' lines whose markers are false for the cell ("FILE:LINE: line"):
    # the lock says what it left out, so a reader of the lock is not left guessing.
    left_out: tuple[str, ...] = ()


@dataclass
class Lock:
    path: Path
    exclude_newer: str
    cells: dict[str, CellLock]
    # Per base image: {"id": image ID, "rootfs": sha256 of a bootstrapped base's tar (or
    # null), "packages": ["name=version", ...]}. Debian replaces versions at point
    # releases, so a base re-bootstrapped later differs; builds refuse it until re-locked
    # (or until the saved base is loaded: gpuenv base --load).
    bases: dict[str, dict[str, Any]] = field(default_factory=dict)
    # None: written before gpuenv 0.2.0, which recorded no recipe.
    recipe: Recipe | None = None


def framework_requirements(cell: Cell) -> list[str]:
    """The framework, and for PyTorch GPU cells the CUDA wheels it requires: the roots of
    the environment's first install step (gpuenv/building/layers.py)."""
    pins = _pins(cell) if cell.cuda_with_framework else []
    return [cell.framework_requirement, *pins]


def env_requirements(cell: Cell) -> list[str]:
    """What the environment's one resolution is made from: the framework, then the
    matrix's and the cell's own packages."""
    return [*framework_requirements(cell), *cell.pip]


def cuda_requirements(cell: Cell) -> list[str]:
    """The CUDA layer's pins ([] where they come with the framework, as PyTorch's do)."""
    return [] if cell.cuda_with_framework else _pins(cell)


def _pins(cell: Cell) -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(cell.wheels.items())]


def inputs_digest(cell: Cell, exclude_newer: str | None) -> str:
    doc: dict[str, Any] = {
        "python": cell.python,
        "platform": platform_of(cell),
        "env": env_requirements(cell),
        "cuda": cuda_requirements(cell),
        "exclude_newer": exclude_newer,
    }
    # Only when present, so a lock written before these existed still matches.
    if cell.constraints:
        doc["constraints"] = list(cell.constraints)
    if cell.left_out:
        doc["left_out"] = list(cell.left_out)
    if cell.hashes:  # a user's lock re-hashed (same versions) is re-checked at the next lock
        doc["hashes"] = [[name, list(digests), where] for name, digests, where in cell.hashes]
    return "sha256:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT00:00:00Z")


def load(path: Path) -> Lock | None:
    """matrix.lock, checked: plain YAML (no tags, alias bombs or duplicate keys), this
    version, a sha256 per cell, an exclude-newer timestamp. Anything else is one error that
    names the file and says how to recover."""
    from gpuenv.matrix.errors import MatrixError
    from gpuenv.matrix.files import read_regular
    from gpuenv.matrix.yamlfile import MAX_BYTES, parse

    if not path.exists() and not path.is_symlink():
        return None

    def bad(why: str) -> GpuenvError:
        return GpuenvError(f"{path}: not a gpuenv lock ({why}); rewrite it: gpuenv lock")

    try:
        raw = read_regular(path, MAX_BYTES * 50)
    except OSError as exc:
        raise bad(f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_BYTES * 50:
        raise bad("too large")
    try:
        data: Any = parse(raw.decode("utf-8"), path).data
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text (byte {exc.start})") from None
    except MatrixError as exc:
        raise GpuenvError(f"{exc.message}; rewrite it: gpuenv lock") from None
    if not isinstance(data, dict):
        raise bad("expected a mapping")
    if data.get("version") != VERSION:
        raise bad(f"version {data.get('version')!r}, this gpuenv reads version {VERSION}")
    exclude_newer = data.get("exclude_newer")
    if not isinstance(exclude_newer, str) or not _TIMESTAMP.fullmatch(exclude_newer):
        raise bad(f"exclude_newer {exclude_newer!r}: expected YYYY-MM-DDT00:00:00Z")
    cells_doc, bases_doc = data.get("cells") or {}, data.get("bases") or {}
    if not isinstance(cells_doc, dict) or not isinstance(bases_doc, dict):
        raise bad("cells and bases must be mappings")
    cells = {}
    for name, c in cells_doc.items():
        if not isinstance(c, dict) or not all(
            isinstance(c.get(k, ""), str) for k in ("inputs", "python_env", "cuda")
        ):
            raise bad(f"cell {str(name)[:80]!r}: expected inputs, python_env, cuda as text")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", c.get("inputs", "")):
            raise bad(f"cell {str(name)[:80]!r}: inputs is not sha256:<64 hex digits>")
        left_out = c.get("left_out") or []
        if not isinstance(left_out, list) or not all(isinstance(x, str) for x in left_out):
            raise bad(f"cell {str(name)[:80]!r}: left_out is not a list of lines")
        cells[str(name)] = CellLock(
            c["inputs"], str(c.get("python_env") or ""), str(c.get("cuda") or ""),
            tuple(left_out),
        )  # fmt: skip
    bases = {}
    for image, entry in bases_doc.items():
        if not isinstance(entry, dict):
            raise bad(f"base {str(image)[:80]!r}: expected a mapping")
        bases[str(image)] = dict(entry)
    return Lock(path, exclude_newer, cells, bases, _recipe(data.get("recipe"), bad))


def _recipe(doc: Any, bad: Callable[[str], GpuenvError]) -> Recipe | None:
    if doc is None:
        return None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("gpuenv"), str)
        or not re.fullmatch(r"sha256:[0-9a-f]{64}", str(doc.get("digest", "")))
    ):
        raise bad("recipe: expected gpuenv (a version) and digest (sha256:<64 hex digits>)")
    return Recipe(doc["gpuenv"], doc["digest"])


_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


def write(lock: Lock) -> None:
    import yaml  # here: a build that only reads a cached lock never imports it

    class LockDumper(yaml.SafeDumper):  # its own class: SafeDumper's representers stay
        pass

    LockDumper.add_representer(_Literal, _literal)
    cells = {}
    for name in sorted(lock.cells):
        c = lock.cells[name]
        entry: dict[str, Any] = {"inputs": c.inputs, "python_env": _Literal(c.python_env)}
        if c.cuda:
            entry["cuda"] = _Literal(c.cuda)
        if c.left_out:
            entry["left_out"] = list(c.left_out)
        cells[name] = entry
    doc: dict[str, Any] = {"version": VERSION}
    if lock.recipe is not None:
        doc["recipe"] = {"gpuenv": lock.recipe.gpuenv, "digest": lock.recipe.digest}
    doc |= {
        "exclude_newer": lock.exclude_newer,
        "bases": {k: lock.bases[k] for k in sorted(lock.bases)},
        "cells": cells,
    }
    header = (
        "# matrix.lock: written by `gpuenv lock`; commit it. Builds install exactly these\n"
        "# packages (--require-hashes --no-deps). Re-lock after editing the matrix.\n"
    )
    text = yaml.dump(doc, Dumper=LockDumper, sort_keys=False, width=120)
    write_atomically(lock.path, header + text)


def write_atomically(path: Path, text: str) -> None:
    """An interrupted or concurrent `gpuenv lock` leaves one whole file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())  # a committed file: not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def drift(lock: Lock, cells: list[Cell]) -> dict[str, str]:
    """Cells whose lock entry is missing or no longer matches the matrix, with why."""
    out = {}
    for cell in cells:
        entry = lock.cells.get(cell.name)
        if entry is None:
            out[cell.name] = "not in the lock"
        elif entry.inputs != inputs_digest(cell, lock.exclude_newer):
            out[cell.name] = "the matrix changed since it was locked"
    return out


def root_filesystem(image: ImageInfo) -> str | None:
    """A bootstrapped base's root filesystem, by content: its one layer's diff_id, which the
    engine computed from the layer's bytes when the tar mmdebstrap wrote was imported (the
    io.gpuenv.rootfs label states the same digest, but a label is only a claim: issue 35,
    M2). None for an image of more layers (a registry base, pinned by its ID)."""
    return image.layers[0] if len(image.layers) == 1 else None


def base_identity(image: ImageInfo, packages: list[str]) -> dict[str, Any]:
    rootfs = root_filesystem(image) if image.claims.rootfs else None
    return {"id": image.id, "rootfs": rootfs, "packages": packages}


def base_drift(lock: Lock, base_image: str, image: ImageInfo) -> str | None:
    """Why the engine's base differs from the locked one, or None."""
    locked = lock.bases.get(base_image)
    if locked is None:
        # The matrix moved a cell to a base it was not locked on (a lock from before bases
        # were recorded has none at all: nothing to compare with).
        return "not in the lock (the matrix changed its base)" if lock.bases else None
    rootfs = root_filesystem(image)
    if locked.get("rootfs"):
        if rootfs != locked["rootfs"]:
            return f"root filesystem {rootfs} is not the locked {locked['rootfs']}"
        return None
    if image.id != locked.get("id"):
        return f"image {image.id[:19]} is not the locked {str(locked.get('id'))[:19]}"
    return None
