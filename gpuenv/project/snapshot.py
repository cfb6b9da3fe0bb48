"""The resolved matrix, cached: what a no-op `build` or a `run` needs without pydantic,
the catalog or Jinja2.

A snapshot holds the matrix's cells, defaults and rejections, the few settings build and
run read (name, CA bundle, indexes), the parsed lock, and the cells' rendered build
contexts. It lives in gpuenv's cache (gpuenv/store/cache.py) under a name derived from the
matrix's absolute path, and is used only when its key is the digest of everything it was
made from, recomputed on every use:

- the matrix file's bytes and absolute path (relative paths in it resolve from there),
- the lock file's bytes (or its absence),
- every other file the matrix made gpuenv read (requirements files and those they include),
  by path and bytes, and the environment variables their lines expanded,
- gpuenv's own sources and data (catalog), its version, and the templates under images/,
  by each file's signature (inode, size, mtime, ctime: see fingerprint.tree_signature).

Any change misses; a missing, unreadable, corrupt or foreign entry is ignored (the matrix is
then loaded as before and the entry rewritten). A snapshot is written only when reading it
back gives exactly what was computed, so a field that does not survive JSON turns the cache
off rather than change an answer.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.cell import Base, Cell
from gpuenv.matrix.requirements import env_digest
from gpuenv.project.fingerprint import dependency_state, key
from gpuenv.store import cache as caches

if TYPE_CHECKING:
    from gpuenv.project.lockfile import Lock

FORMAT = 2  # 2: one rendered context per cell (the matrix's settings are fixed by the key)
PREFIX = "resolved-"  # the records' names (gpuenv cache prune)


def entry_name(matrix: Path) -> str:
    """One cache file per matrix (by absolute path); a new key replaces the old entry."""
    where = hashlib.sha256(str(matrix.resolve()).encode()).hexdigest()[:24]
    return f"{PREFIX}{where}.json"


# ------------------------------------------------------------------ the snapshot


@dataclass(frozen=True)
class Settings:
    """What build and run read of the matrix besides its cells."""

    name: str
    ca_bundle: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()

    def indexes(self, cell: Cell) -> tuple[str, ...]:
        """The package indexes a cell's wheels come from, in the order they are asked: the
        matrix's extra indexes and the cell's own (PyTorch's CPU index for torch CPU
        cells), then the index (gpuenv/store/wheelhouse.py: upstreams)."""
        from gpuenv.store.wheelhouse import upstreams

        return upstreams(self.index_url, (*self.extra_index_urls, *cell.indexes))

    def resolving(self, cell: Cell) -> tuple[str | None, tuple[str, ...]]:
        """The index and extra indexes a cell is resolved against (`uv pip compile`)."""
        return self.index_url, tuple(dict.fromkeys((*self.extra_index_urls, *cell.indexes)))


@dataclass
class Resolved:
    """The matrix resolved against the catalog: its cells, the combinations the catalog
    rejected and why, the default cells (compat.Resolution's fields, in the one shape a
    project has, whether loaded now or read from a snapshot)."""

    cells: list[Cell] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    default_cpu: Cell | None = None
    default_gpu: Cell | None = None


@dataclass
class Snapshot:
    key: str
    settings: Settings
    resolution: Resolved
    lock: dict[str, Any] | None  # lock_to_json's shape; None: no lock file
    depends: dict[str, str]  # other files read (requirements): path -> file_digest
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)  # cell -> files
    entry: str = ""  # the cache file's name (entry_name of the matrix)


def cell_to_json(cell: Cell) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(cell):
        value = getattr(cell, f.name)
        if isinstance(value, Base):
            value = {"kind": value.kind, "value": value.value, "python": value.python}
        elif isinstance(value, tuple):
            value = {"tuple": list(value)}
        out[f.name] = value
    return out


def cell_from_json(data: dict[str, Any]) -> Cell:
    values = {}
    for name, value in data.items():
        if name == "base":
            value = Base(**value)
        elif isinstance(value, dict) and set(value) == {"tuple"}:
            value = _tuples(value["tuple"])
        values[name] = value
    return Cell(**values)


def _tuples(value: Any) -> Any:
    """JSON's lists as the tuples they were (a cell's `hashes` nests them: without this,
    a cell with a hashed line never equalled itself read back, and no snapshot was kept)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def lock_to_json(lock: Lock) -> dict[str, Any]:
    recipe = lock.recipe
    return {
        "exclude_newer": lock.exclude_newer,
        "recipe": [recipe.gpuenv, recipe.digest] if recipe else None,
        "bases": lock.bases,
        "cells": {
            name: [c.inputs, c.python_env, c.cuda, list(c.left_out)]
            for name, c in sorted(lock.cells.items())
        },
    }


def lock_from_json(path: Path, data: dict[str, Any]) -> Lock:
    from gpuenv.project.lockfile import CellLock, Lock, Recipe

    cells = {
        name: CellLock(inputs, env, cuda, tuple(left_out))
        for name, (inputs, env, cuda, left_out) in data["cells"].items()
    }
    recipe = Recipe(*data["recipe"]) if data.get("recipe") else None
    return Lock(path, data["exclude_newer"], cells, data["bases"], recipe)


def to_json(snap: Snapshot) -> dict[str, Any]:
    res = snap.resolution
    return {
        "format": FORMAT,
        "key": snap.key,
        "settings": {
            "name": snap.settings.name,
            "ca_bundle": snap.settings.ca_bundle,
            "index_url": snap.settings.index_url,
            "extra_index_urls": list(snap.settings.extra_index_urls),
        },
        "cells": [cell_to_json(c) for c in res.cells],
        "rejected": res.rejected,
        "default_cpu": res.default_cpu.name if res.default_cpu else None,
        "default_gpu": res.default_gpu.name if res.default_gpu else None,
        "lock": snap.lock,
        "depends": snap.depends,
        "contexts": snap.contexts,
    }


def from_json(data: dict[str, Any], entry: str) -> Snapshot:
    s = data["settings"]
    cells = [cell_from_json(c) for c in data["cells"]]
    by_name = {c.name: c for c in cells}
    resolution = Resolved(
        cells=cells,
        rejected=list(data["rejected"]),
        default_cpu=by_name[data["default_cpu"]] if data["default_cpu"] else None,
        default_gpu=by_name[data["default_gpu"]] if data["default_gpu"] else None,
    )
    settings = Settings(
        name=str(s["name"]),
        ca_bundle=s["ca_bundle"],
        index_url=s["index_url"],
        extra_index_urls=tuple(s["extra_index_urls"]),
    )
    contexts = data.get("contexts") or {}
    for files in contexts.values():
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError("context files must be text")
    return Snapshot(
        str(data["key"]),
        settings,
        resolution,
        data["lock"],
        dict(data["depends"]),
        contexts,
        entry,
    )


def read(matrix: Path, lock: Path) -> Snapshot | None:
    """The snapshot for this matrix when every input is what it was made from; else None."""
    entry = entry_name(matrix)
    raw = caches.read_record(entry)
    if not raw or raw.get("format") != FORMAT or raw.get("key") != key(matrix, lock):
        return None
    try:
        snap = from_json(raw, entry)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # corrupt or written by a gpuenv that shaped it otherwise
    for path, state in snap.depends.items():
        if path.startswith("$"):  # an environment variable a requirements file expanded
            if env_digest(os.environ.get(path[1:])) != state:
                return None
        elif dependency_state(Path(path)) != state:
            return None
    return snap


def write(snap: Snapshot) -> bool:
    """Store a snapshot, only if reading it back gives exactly the same thing."""
    doc = to_json(snap)
    try:
        if from_json(json.loads(json.dumps(doc, sort_keys=True)), snap.entry) != snap:
            return False
    except (TypeError, ValueError, KeyError):
        return False
    return caches.write_record(snap.entry, doc, held=True)  # not when the command fails


def depends_of(matrix: Any) -> dict[str, str]:
    """The other files a loaded matrix made gpuenv read (requirements files), as written
    (joined to the matrix's directory, not resolved) -> dependency_state of the bytes
    loading actually read and where the path led then (not read again: an edit since then
    must miss, not be recorded as what was loaded)."""
    out: dict[str, str] = {}
    for r in matrix.requirements.values():
        out.update({named: f"{digest}|{path}" for named, path, digest in r.files})
        out.update({f"${name}": value for name, value in r.environment})
    return out
