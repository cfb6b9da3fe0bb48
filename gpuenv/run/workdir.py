"""The working directory as the files that travel to where a workload runs: to a remote
engine that cannot see it (`sync.py`) and into the Kubernetes code layer (`kube/layer.py`).

Left out, on both ways: version-control and cache directories (DEFAULT_IGNORE) and secrets
a project directory often holds (SECRETS: `.env`, `.netrc`, cloud and registry credentials,
SSH keys), which would otherwise sit on another host's disk or in a pushed image. On the way
out, also what `.dockerignore` lists (shell patterns over the relative path; `!` exceptions
are refused rather than half-honoured). Past MAX_FILES or MAX_BYTES the directory is
refused: data belongs in a volume (or a PVC). On the way back (stays_home), names are
compared as a case-insensitive filesystem would take them (fold()), always.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError

MAX_BYTES = 200 * 1024 * 1024
MAX_FILES = 20_000
DEFAULT_IGNORE = (
    ".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "node_modules", ".DS_Store",
)  # fmt: skip
SECRETS = (
    ".env", ".env.*", ".netrc", ".pypirc", ".aws", ".azure", ".config/gcloud", ".docker",
    ".kube", ".ssh", ".gnupg", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519",
)  # fmt: skip


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


def read_ignore(root: Path) -> list[str]:
    """`.dockerignore`'s patterns; GpuenvError (125) on a `!` exception."""
    path = root / ".dockerignore"
    if not path.is_file():
        return []
    patterns = []
    for n, raw in enumerate(path.read_text("utf-8", errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise GpuenvError(
                f"{path}:{n}: '!' exceptions are not supported by gpuenv; list what to leave "
                "out instead",
                exit_code=125,
            )
        patterns.append(line.strip("/").removeprefix("./"))
    return patterns


# Code points HFS+ leaves out of a name (git's is_hfs_dotgit list): `.g\u200cit` is `.git`
# there. And the 8.3 short name Windows gives `.git` (git's is_ntfs_dotgit).
_IGNORABLE = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F),
                            *range(0x206A, 0x2070), 0xFEFF])  # fmt: skip
_SHORT_NAMES = {"git~1": ".git"}


def fold(rel: str) -> str:
    """One spelling for every way a case-insensitive filesystem (macOS, Windows, WSL's
    /mnt/c) may take as the same path: Unicode's canonical caseless form (NFD, case-folded,
    NFD again, so NFC and NFD spellings agree and KELVIN SIGN is k), without the code points
    HFS+ ignores, each component without the trailing dots and spaces Windows drops."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFD", rel).casefold())
    parts = (p.rstrip(". ") or p for p in text.translate(_IGNORABLE).split("/"))
    return "/".join(_SHORT_NAMES.get(p, p) for p in parts)


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


def left_out(root: Path) -> tuple[str, ...]:
    """Every pattern that keeps a path of `root` from travelling out."""
    return (*DEFAULT_IGNORE, *SECRETS, *read_ignore(root))


def stays_home(rel: str) -> bool:
    """What never comes back from a workload either: caches, version control, secrets,
    under any spelling the user's filesystem may take as theirs (issue 44, N2: a workload's
    `.GIT/hooks/pre-commit` is `.git/hooks/pre-commit` on a Mac). Compared folded always:
    the client's filesystem is not asked, and the same directory may be shared to one that
    folds (a Linux VM's mount of a Mac's directory)."""
    return ignored(rel, (*DEFAULT_IGNORE, *SECRETS), folded=True)


def collect(root: Path) -> list[str]:
    """Relative POSIX paths of what travels (directories too), sorted."""
    patterns = left_out(root)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if not ignored(rel, patterns):
                keep.append(d)
                found.append(rel)
        dirnames[:] = keep  # os.walk does not follow symlinked directories
        for f in filenames:
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            if not ignored(rel, patterns):
                found.append(rel)
    return sorted(found)


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
