"""Writing where other users can write too: gpuenv keeps a directory of its own there and
trusts nothing else in that place.

A shared filesystem (`slurm run --shared DIR`) and the temporary directory (the wheel store
of a uid with no HOME) are places gpuenv does not own. Anything in them may have been put
there by another user: a file under the name gpuenv would reuse, a symlink where it would
write, a directory under the name gpuenv would make. So gpuenv writes there only through
this module:

- `own_directory(parent, name)`: parent/name, made 0700 if absent. Used only when it is a
  real directory (not a symlink), owned by this uid, with no group or other permission, and
  when no other user can swap it for one of theirs: the parent and every directory above it
  belong to this uid or root and no one else may write in them, unless they are sticky (as
  /tmp is: others may add entries there, never rename or remove ours). Anything else is
  refused with one line, never repaired: gpuenv cannot tell what another user put there.
- `write_file(directory, name, data)` and `new_file(directory, name)`: a file created under a
  random name with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, then renamed into place.
- `sha256_of(path)`: the digest of a regular file of ours, opened O_NOFOLLOW, for the content
  checks of what is reused by name.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError

_SWAPPABLE = stat.S_IWGRP | stat.S_IWOTH


class NotPrivate(GpuenvError):
    """A place that another user could change (or that is theirs): one line, with the fix."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _why_swappable(directory: Path) -> str | None:
    """Why another user could rename or replace entries of `directory`; None if no one can."""
    st = directory.lstat()
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid not in (0, os.getuid()):
        return f"belongs to {_owner(st.st_uid)}"
    if st.st_mode & _SWAPPABLE and not st.st_mode & stat.S_ISVTX:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o}) and not sticky"
    return None


def check_unswappable(path: Path, what: str) -> None:
    """`path` and every directory above it: owned by this uid or root, writable by no one
    else unless sticky. Another user who may rename entries of one of them could put a
    directory of theirs where gpuenv's was, between gpuenv's check and its use (a Slurm job
    pending for hours reads its image by name when it starts)."""
    for directory in (path, *path.parents):
        why = _why_swappable(directory)
        if why:
            raise NotPrivate(
                f"{what} {path}: {directory} {why}, so another user could replace what gpuenv "
                "keeps there; use a directory that only you (and root) can change, e.g. "
                "mkdir -m 700 /scratch/$USER, or make it sticky (chmod +t) as /tmp is"
            )


def own_directory(parent: Path, name: str, what: str) -> Path:
    """parent/name: a directory of this uid alone, made 0700 if absent (see the module). The
    path returned has no symbolic link in it: the one checked is the one used."""
    try:
        parent = parent.resolve(strict=True)
    except OSError as exc:
        raise NotPrivate(f"{what} {parent}: {exc.strerror}; give an existing directory") from None
    check_unswappable(parent, what)
    path = parent / name
    try:
        with suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
    except OSError as exc:
        raise NotPrivate(
            f"{what} {parent}: cannot make {path} ({exc.strerror}); give a directory you can "
            "write in"
        ) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        why = "is a symbolic link" if stat.S_ISLNK(st.st_mode) else "is not a directory"
    elif st.st_uid != os.getuid():
        why = f"belongs to {_owner(st.st_uid)}, not you"
    elif st.st_mode & 0o077:
        why = f"has mode {stat.S_IMODE(st.st_mode):o}, not 700"
    else:
        return path
    raise NotPrivate(
        f"{what}: {path} {why}; gpuenv uses only a directory of its own there (owned by you, "
        "mode 700) and trusts nothing another user may have put in its place: remove it, or "
        "use another directory"
    )


@contextmanager
def new_file(directory: Path, name: str) -> Iterator[tuple[int, Path]]:
    """(descriptor, path) of a new file, 0600, under a random name in `directory` (a
    directory of ours); renamed to `name` when the block ends without an error, removed
    otherwise. The descriptor stays the caller's to close (os.fdopen takes it over)."""
    tmp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600)
    try:
        yield fd, tmp
        os.replace(tmp, directory / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_file(directory: Path, name: str, data: bytes) -> None:
    """directory/name holds `data`, written whole under a new name and renamed into place."""
    with new_file(directory, name) as (fd, _), os.fdopen(fd, "wb") as out:
        out.write(data)


def sha256_of(path: Path) -> str | None:
    """sha256 hex of a regular file owned by this uid (opened without following a symlink);
    None when there is none such."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        return hashlib.file_digest(fh, "sha256").hexdigest()


__all__ = ["NotPrivate", "check_unswappable", "new_file", "own_directory", "sha256_of",
           "write_file"]  # fmt: skip
