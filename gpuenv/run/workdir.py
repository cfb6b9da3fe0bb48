"""The working directory as the files that travel to where a workload runs: to a remote
engine that cannot see it (`sync.py`) and into the Kubernetes code layer (`kube/layer.py`).

What travels out is matrix/treepolicy.py's decision, the one every walker of a user's tree
takes: no caches, version control or secrets at any depth (and what the directory's
`.gpuenvignore` adds), nor what `.dockerignore` leaves out, read as Docker reads it; names
compared folded. Past MAX_FILES or MAX_BYTES the directory is refused: data belongs in a
volume (or a PVC). On the way back (stays_home), names are compared as a case-insensitive
filesystem would take them (fold()), always.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gpuenv.matrix import treepolicy
from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.treepolicy import fold

MAX_BYTES = treepolicy.MAX_BYTES
MAX_FILES = treepolicy.MAX_FILES
DEFAULT_IGNORE = treepolicy.CACHES
SECRETS = treepolicy.SECRETS


@dataclass(frozen=True)
class Entry:
    """One path as both sides list it: kind `f` (file), `d` (directory) or `l` (symlink),
    size and whole-second mtime (the quick check rsync makes by default), and for a symlink
    its target."""

    kind: str
    size: int = 0
    mtime: int = 0
    mode: int = 0o644
    link: str = ""

    def same(self, other: Entry | None) -> bool:
        if other is None or other.kind != self.kind:
            return False
        if self.kind == "f":
            return (self.size, self.mtime) == (other.size, other.mtime)
        return self.kind != "l" or self.link == other.link


def ignored(rel: str, patterns: tuple[str, ...] | list[str], *, folded: bool = False) -> bool:
    """Whether `rel` (a relative POSIX path) or a directory above it matches a pattern: a
    pattern without `/` matches any one component, one with `/` the path from the root.
    `folded`: both compared as fold() spells them (what must not reach the user's directory
    under any spelling); else as written (`.dockerignore`, as Docker reads it)."""
    if folded:
        rel, patterns = fold(rel), [fold(p) for p in patterns]
    parts = rel.split("/")
    for pattern in patterns:
        if "/" in pattern:
            if fnmatchcase(rel, pattern) or any(
                fnmatchcase("/".join(parts[:i]), pattern) for i in range(1, len(parts))
            ):
                return True
        elif any(fnmatchcase(p, pattern) for p in parts):
            return True
    return False


def stays_home(rel: str) -> bool:
    """What never comes back from a workload either: caches, version control, secrets,
    under any spelling the user's filesystem may take as theirs (issue 44, N2: a workload's
    `.GIT/hooks/pre-commit` is `.git/hooks/pre-commit` on a Mac). Compared folded always:
    the client's filesystem is not asked, and the same directory may be shared to one that
    folds (a Linux VM's mount of a Mac's directory)."""
    return ignored(rel, (*DEFAULT_IGNORE, *SECRETS), folded=True)


def collect(root: Path) -> list[str]:
    """Relative POSIX paths of what travels (directories too), sorted."""
    return treepolicy.walk(root).sent


def entry_of(st: os.stat_result, path: Path) -> Entry | None:
    """The entry of a path already lstat-ed; None for what never travels (sockets, FIFOs,
    devices)."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return Entry("l", link=os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", mtime=int(st.st_mtime), mode=mode)
    if stat.S_ISREG(st.st_mode):
        return Entry("f", st.st_size, int(st.st_mtime), mode)
    return None


def listing(root: Path, where: str) -> dict[str, Entry]:
    """What of `root` travels, by relative path; GpuenvError (125) past the limits, whose
    fix names `where` data belongs instead (a volume, a PVC)."""
    paths = collect(root)
    if len(paths) > MAX_FILES:
        raise GpuenvError(
            f"{root} holds {len(paths)} files, more than gpuenv sends ({MAX_FILES}); leave "
            f"data out (.dockerignore) and {where}",
            exit_code=125,
        )
    entries: dict[str, Entry] = {}
    total = 0
    for rel in paths:
        path = root / rel
        entry = entry_of(os.lstat(path), path)
        if entry is None:
            continue
        total += entry.size
        if total > MAX_BYTES:
            raise GpuenvError(
                f"{root} holds more than {MAX_BYTES // (1024 * 1024)} MiB, more than gpuenv "
                f"sends; leave data out (.dockerignore) and {where}",
                exit_code=125,
            )
        entries[rel] = entry
    return entries
