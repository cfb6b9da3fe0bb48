"""What a cached answer was made from: digests of gpuenv itself, the matrix and its lock.

The resolved-matrix cache (gpuenv/project/snapshot.py) stands in for loading the matrix only while
everything it was computed from is unchanged; it recomputes these digests on every use.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import gpuenv
from gpuenv.store.cache import file_digest

PACKAGE = Path(gpuenv.__file__).parent


def tree_signature(root: Path, suffixes: tuple[str, ...] = ()) -> str:
    """sha256 over every file under root by relative name, inode, size, mtime and ctime,
    sorted: what git's index trusts to know a file is unchanged, at the cost of one stat
    per file rather than reading ~1 MB on every no-op build and run. Any write changes the
    ctime (which no tool can set back) and a replacing rename the inode, so an edited
    source never passes for the old one."""
    entries = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # bytecode: not an input
        for name in files:
            if suffixes and os.path.splitext(name)[1] not in suffixes:
                continue
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            rel = os.path.relpath(path, root)
            entries.append(f"{rel}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def templates_dir() -> Path:
    """images/ in a source checkout, or the copy the wheel carries inside the package."""
    packaged = PACKAGE / "images"
    return packaged if packaged.is_dir() else PACKAGE.parent / "images"


def code_digest() -> str:
    """gpuenv itself: version, sources, catalog data and templates. A code change (even
    without a version bump, as in a checkout) must never be answered by what an older
    gpuenv computed."""
    parts = [
        gpuenv.__version__,
        tree_signature(PACKAGE, (".py", ".yaml", ".json", ".j2", ".txt")),
        tree_signature(templates_dir()),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def key(matrix: Path, lock: Path) -> str:
    """gpuenv's code, the matrix and the lock (each by absolute path and bytes): relative
    paths in the matrix resolve from where it is, so a copy elsewhere is another input. And
    the user's refreshed catalog in the cache, which is read instead of the package's while
    it is newer and valid (gpuenv/catalog/freshness.py)."""
    from gpuenv.catalog import freshness

    doc = {
        "code": code_digest(),
        "catalog": freshness.signature(),
        "matrix": [str(matrix.resolve()), file_digest(matrix)],
        "lock": [str(lock.resolve()), file_digest(lock)],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def dependency_state(path: Path) -> str:
    """A file's bytes and where it leads: a symlink pointed elsewhere (perhaps outside the
    matrix's directory, which loading refuses) misses even with the same bytes."""
    return f"{file_digest(path)}|{path.resolve()}"
