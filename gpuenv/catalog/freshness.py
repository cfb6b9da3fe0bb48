"""Which generated catalog files gpuenv reads, and how old they are.

The generated files (torch.yaml, jax.yaml, tensorflow.yaml, cuda-wheels.yaml) ship in the
package, as of its release's last refresh. `gpuenv catalog --refresh` writes the index's
newer view into the user's cache instead (`$XDG_CACHE_HOME/gpuenv/catalog.json`: the four
documents in one file, replaced atomically, so a reader never sees half a set). That copy is
read in preference to the packaged files only when it is newer (the catalog's own recorded
`refreshed` date, strictly later) and valid: a regular file owned by this user, no larger
than the loaders accept, holding the four documents with one refresh date, each of which
the catalog's own loader accepts (`check`: every row parses, every GPU row's wheels pin).
Anything else is ignored with one warning, never trusted by its name or place. The hand-kept
facts (cuda.yaml, debian.yaml, sass*.yaml) always come from the package.

A catalog whose refresh date is more than `STALE_DAYS` old is stale: `stale_note` says so
in one line (the verbs that choose releases from it print it: catalog, matrix, lock, init).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuenv.store.cache import cache_file

GENERATED = ("torch.yaml", "jax.yaml", "tensorflow.yaml", "cuda-wheels.yaml")
CACHE_NAME = "catalog.json"
FORMAT = 1
STALE_DAYS = 30
MAX_BYTES = 4 << 20  # the four packaged files are ~45 kB

Documents = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Choice:
    documents: Documents
    origin: str  # "packaged", or the cache file's path
    refreshed: datetime.date | None
    warning: str | None = None  # why the cache file was ignored


def refreshed_of(documents: Documents) -> datetime.date | None:
    """The one refresh date every generated document records, else None."""
    dates = {doc.get("refreshed") if isinstance(doc, dict) else None for doc in documents.values()}
    if len(dates) != 1 or set(documents) != set(GENERATED):
        return None
    (text,) = dates
    try:
        return datetime.date.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def problem(cached: Any, check: Callable[[Documents], None]) -> str | None:
    """Why a cache file's content cannot stand for the catalog, or None."""
    if not isinstance(cached, dict) or cached.get("format") != FORMAT:
        return f"not a gpuenv catalog (format {FORMAT})"
    documents = cached.get("documents")
    if not isinstance(documents, dict) or set(documents) != set(GENERATED):
        return f"it must hold exactly {', '.join(GENERATED)}"
    for name in GENERATED[:3]:
        if not isinstance(documents[name], dict) or documents[name].get("framework") != name[:-5]:
            return f"its {name} is not the {name[:-5]} catalog"
    if refreshed_of(documents) is None:
        return "its documents do not record one refresh date (YYYY-MM-DD)"
    try:
        check(documents)
    except Exception as exc:  # untrusted data: any failure of the loader means "not valid"
        return f"the catalog's loader refuses it ({type(exc).__name__}: {exc})"
    return None


def choose(
    packaged: Documents,
    cached: Any,
    unreadable: str | None,
    origin: str,
    check: Callable[[Documents], None],
) -> Choice:
    """The documents to read: the cache file's (``cached``, read from ``origin``) when it is
    valid and newer than the packaged ones, else the packaged ones, with a warning when the
    cache file was there and not valid (``unreadable``: why it could not even be read)."""
    ours = Choice(packaged, "packaged", refreshed_of(packaged))
    if cached is None and unreadable is None:
        return ours
    why = unreadable or problem(cached, check)
    if why is not None:
        warning = f"ignoring {origin}: {why}; `gpuenv catalog --refresh` rewrites it"
        return Choice(ours.documents, ours.origin, ours.refreshed, warning)
    documents: Documents = cached["documents"]
    when = refreshed_of(documents)
    if ours.refreshed is not None and when is not None and when <= ours.refreshed:
        return ours  # an older refresh than this gpuenv's (an upgrade since): the package's
    return Choice(documents, origin, when)


MAX_AGE_ENV = "GPUENV_CATALOG_MAX_AGE"  # days before the note (default STALE_DAYS), or "off"


def stale_note(choice: Choice, today: datetime.date, max_age: str | None = None) -> str | None:
    """One line when the catalog in use was refreshed more than `max_age` days ago
    ($GPUENV_CATALOG_MAX_AGE: STALE_DAYS unless set; "off" never says it: a pinned gpuenv
    in CI, a test suite that must pass on any day)."""
    if choice.refreshed is None or (max_age or "").strip().lower() == "off":
        return None
    limit = int(max_age) if max_age and max_age.strip().isdigit() else STALE_DAYS
    age = (today - choice.refreshed).days
    if age <= limit:
        return None
    return (
        f"the catalog was refreshed {choice.refreshed.isoformat()} ({age} days ago); newer "
        "framework releases may be missing: `gpuenv catalog --refresh` updates your copy"
    )


# ------------------------------------------------------------------------------ I/O


def cache_path() -> Path | None:
    return cache_file(CACHE_NAME)


def read_cached(path: Path, uid: int) -> tuple[Any, str | None]:
    """(the parsed cache file, None), (None, None) when there is none, or (None, why it is
    not read): only a regular file owned by ``uid``, never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None, "not a regular file"
    with os.fdopen(fd, "rb") as fh:
        if st.st_uid != uid:
            return None, f"owned by uid {st.st_uid}, not by you (uid {uid})"
        if st.st_size > MAX_BYTES:
            return None, f"larger than {MAX_BYTES >> 20} MB"
        data = fh.read(MAX_BYTES + 1)
    try:
        return json.loads(data), None
    except ValueError as exc:
        return None, f"not JSON ({exc})"


def packaged() -> Documents:
    import yaml

    folder = resources.files("gpuenv.data")
    return {name: yaml.safe_load(folder.joinpath(name).read_text("utf-8")) for name in GENERATED}


@functools.cache
def current(check: Callable[[Documents], None]) -> Choice:
    """The catalog in use, decided once per process; a warning about the cache file is
    printed once."""
    path = cache_path()
    cached, unreadable = read_cached(path, os.geteuid()) if path else (None, None)
    choice = choose(packaged(), cached, unreadable, str(path), check)
    if choice.warning:
        print(f"gpuenv: warning: {choice.warning}", file=sys.stderr)
    return choice


def signature() -> str:
    """What the choice depends on beyond the package: the cache file (by inode, size, mtime,
    ctime) and who reads it; a snapshot of a resolution keys on it."""
    path = cache_path()
    try:
        st = os.lstat(path) if path else None
    except OSError:
        st = None
    seen = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}" if st else "-"
    return f"{os.geteuid()}:{path}:{seen}"


def write_cache(documents: Documents) -> Path:
    """The refreshed documents into the user's cache, atomically; its path."""
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.store.cache import write_record

    path = cache_path()
    if path is None or not write_record(CACHE_NAME, {"format": FORMAT, "documents": documents}):
        raise GpuenvError(
            f"cannot write the refreshed catalog into {path or 'a cache directory'}: "
            "set XDG_CACHE_HOME to a writable directory"
        )
    return path
