"""A local project directory named in a requirements file (`./mypkg`), as one deterministic
tar: what gpuenv locks it by (the tar's sha256, its content digest), keeps in the
wheelhouse, and builds into a wheel in the sdist sandbox (gpuenv/building/sdists.py).

The same tree always gives the same bytes, on any machine: members sorted, under one top
directory named after the directory, regular files only (a symlink inside the project is
taken as the file it leads to; one leading outside, or to a directory, is refused), owner
0, mtime 0, mode 0644 or 0755 (the owner's execute bit). What of the tree goes in is
matrix/treepolicy.py's decision, as for every tree gpuenv sends: no caches or version
control (a `git commit` must not change the digest), no secrets at any depth (the tar is
kept in the wheelhouse, `cache export` carries it, and it reaches the engine's build
sandbox), nor what the directory's `.dockerignore` and `.gpuenvignore` leave out; a symlink
to a secret is left out too. Uncompressed: gzip's bytes could differ between zlib builds,
a tar's do not.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path
from typing import IO

from gpuenv.matrix import treepolicy
from gpuenv.matrix.errors import GpuenvError

MAX_FILES = treepolicy.MAX_FILES
MAX_BYTES = treepolicy.MAX_BYTES  # the files' sizes together


class TreeProblem(Exception):
    """Why a directory cannot be taken (said to the user with the line that names it)."""


def members(directory: Path, root: Path, exclude: tuple[str, ...] = ()) -> list[tuple[str, Path]]:
    """The tree's files, sorted: (path relative to `directory`, posix; the file to read).
    `root` is the project directory no symlink may lead out of; `exclude`: fnmatch patterns
    of top-level files left out (for the project itself: its matrix and the locks gpuenv
    writes, which must not change the digest they record)."""
    from fnmatch import fnmatchcase

    try:
        policy = treepolicy.Policy.of(directory)
        walked = treepolicy.walk(directory, policy)
    except GpuenvError as exc:
        raise TreeProblem(exc.message) from None
    out: list[tuple[str, Path]] = []
    total = 0
    for relative in walked.sent:
        if "/" not in relative and any(fnmatchcase(relative, x) for x in exclude):
            continue
        path = directory / relative
        if path.is_dir():
            if path.is_symlink():
                raise TreeProblem(f"{relative} is a symlinked directory (pip would copy what it "
                                  "leads to): copy it in")  # fmt: skip
            continue
        target = path.resolve()
        if not target.is_relative_to(root):
            raise TreeProblem(f"{relative} is a symlink out of the project directory")
        if target != path.absolute() and policy.deny(target.relative_to(root).as_posix()):
            continue  # a symlink to a secret: the secret's bytes under another name
        try:
            st = target.stat()
        except OSError as exc:
            raise TreeProblem(f"{relative} cannot be read: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise TreeProblem(f"{relative} is not a regular file (a device, a FIFO)")
        total += st.st_size
        out.append((relative, target))
        if len(out) > MAX_FILES or total > MAX_BYTES:
            raise TreeProblem(
                f"more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB (without caches, "
                "version control, secrets, and what .dockerignore leaves out)"
            )
    out.sort()
    return out


def write_tar(
    directory: Path, root: Path, out: IO[bytes] | None, exclude: tuple[str, ...] = ()
) -> str:
    """Write the tree's tar to `out` (None: nowhere); its sha256 (the content digest)."""
    top = directory.name or "project"
    digest = hashlib.sha256()

    class _Hashing(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: bytes) -> int:  # type: ignore[override]
            digest.update(b)
            if out is not None:
                out.write(b)
            return len(b)

    with tarfile.open(fileobj=_Hashing(), mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for relative, path in members(directory, root, exclude):
            info = tarfile.TarInfo(f"{top}/{relative}")  # mtime 0, owner 0 with no names
            try:
                with path.open("rb") as f:
                    data = f.read(MAX_BYTES + 1)
                executable = os.stat(path).st_mode & stat.S_IXUSR
            except OSError as exc:
                raise TreeProblem(f"{relative} cannot be read: {exc.strerror}") from None
            info.size = len(data)
            info.mode = 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()


def content_digest(directory: Path, root: Path, exclude: tuple[str, ...] = ()) -> str:
    """The sha256 of the tree's tar, without keeping it."""
    return write_tar(directory, root, None, exclude)


def project_excludes(matrix_name: str) -> tuple[str, ...]:
    """What the project itself is tarred without: the matrix, its lock (contract.py's
    name for it) and the PEP 751 locks `gpuenv lock --pylock` writes beside it."""
    stem = matrix_name.rsplit(".", 1)[0]
    return (matrix_name, f"{stem}.lock", "pylock.*.toml")
