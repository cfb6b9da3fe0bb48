"""gpuenv's host-side cache: $XDG_CACHE_HOME/gpuenv (else ~/.cache/gpuenv).

It holds small JSON records that spare work or carry a verdict between commands: the
drivers learnt per engine (`run`'s preflight) and the validation outcomes `push`
consults. Losing them is safe (they are re-learnt, or push treats an image as not
validated), so every read tolerates a missing or corrupt file; writes are atomic so that
two gpuenv processes never leave a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Records written with held=True while a command runs, by name: written when it ends, and
# dropped when it fails (gpuenv/cli/common.py: user_errors), so that a failed command (a bad
# CA bundle, a failed build) leaves the cache as it was. A stack: commands may nest.
_held: list[dict[str, dict[str, Any]]] = []


@contextmanager
def held_records() -> Iterator[dict[str, dict[str, Any]]]:
    """Hold back held=True writes until the block ends; the caller clears what it yields
    to drop them."""
    pending: dict[str, dict[str, Any]] = {}
    _held.append(pending)
    try:
        yield pending
    finally:
        _held.remove(pending)
        for name, data in pending.items():
            write_record(name, data)


def cache_dir() -> Path | None:
    """The cache directory, or None for a uid with neither HOME nor a passwd entry
    (expanduser would then give "~" back, a directory created in the current one)."""
    root = os.environ.get("XDG_CACHE_HOME")
    if not root:
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        root = os.path.join(home, ".cache")
    return Path(root) / "gpuenv"


def cache_file(name: str) -> Path | None:
    root = cache_dir()
    return None if root is None else root / name


def read_record(name: str) -> dict[str, Any]:
    """The JSON object in the cache file `name`; {} when missing, unreadable or not an object."""
    path = cache_file(name)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(name: str, data: dict[str, Any], *, held: bool = False) -> bool:
    """Replace the cache file `name` atomically; False when it cannot be written (a
    read-only home), which callers treat as "not remembered". `held`: a record that only
    spares work (a snapshot), written once the command has succeeded (held_records)."""
    path = cache_file(name)
    if path is None:
        return False
    if held and _held:
        _held[-1][name] = data
        return True
    import tempfile  # ~3 ms (shutil, compressors): only when something is written

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException as exc:  # a full disk, a signal: no half record, no stray file
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            return False
        raise
    return True


def update_record(name: str, changes: dict[str, Any]) -> bool:
    return write_record(name, {**read_record(name), **changes})


def prune_records(prefixes: tuple[str, ...], keep_days: float) -> tuple[int, int]:
    """Remove the records named PREFIX*.json not written for keep_days (each matrix path
    and selection gets one, and a temporary matrix never comes back): (count, bytes)."""
    import time

    root = cache_dir()
    if root is None or not root.is_dir():
        return 0, 0
    cutoff = time.time() - keep_days * 86400
    count = size = 0
    for path in root.iterdir():
        if not (path.name.startswith(prefixes) and path.name.endswith(".json")):
            continue
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                path.unlink()
                count, size = count + 1, size + st.st_size
        except OSError:
            continue  # gone meanwhile, or not ours to remove: a cache, so no error
    return count, size


MAX_INPUT_BYTES = 64 << 20  # beyond what the loaders accept (matrix 1 MB, lock 50 MB)


def file_digest(path: Path) -> str:
    """sha256 of a regular file's bytes. Anything else is a value of its own, never read
    (/dev/zero or a FIFO given as the matrix must not hang or fill memory here; loading
    then refuses it): "absent", "special", "unreadable", "large" with size and mtime."""
    from gpuenv.matrix.files import read_regular

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return f"special:{st.st_mode:o}"
        if st.st_size > MAX_INPUT_BYTES:
            return f"large:{st.st_size}:{st.st_mtime_ns}"
        data = read_regular(path, MAX_INPUT_BYTES)
    except FileNotFoundError:
        return "absent"
    except IsADirectoryError:  # replaced by something else since the stat
        return "special"
    except OSError:
        return "unreadable"
    if len(data) > MAX_INPUT_BYTES:  # grew since the stat
        return f"large:{len(data)}:{st.st_mtime_ns}"
    return hashlib.sha256(data).hexdigest()
