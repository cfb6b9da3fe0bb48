"""One root filesystem from an image's layers, without an engine: what `docker export` of a
container gives, made from the layer tars themselves.

The rules are the OCI image spec's (v1.1.0 layer.md, https://github.com/opencontainers/
image-spec/blob/v1.1.0/layer.md, "Applying Changesets" and "Whiteouts"): layers apply bottom
to top; an entry `DIR/.wh.NAME` removes NAME (and all below it) of the lower layers, and
`DIR/.wh..wh..opq` every child of DIR of the lower layers, both before the layer's own
entries whatever their order in the tar, and neither is itself in the result; an entry over
an existing path replaces it (a directory over a directory only replaces its attributes; a
file over a directory removes the directory's contents too).

Two passes over the layers (stored on disk, already checked against their digests): `plan`
reads only the headers and decides which layer's entry wins for every path; `members` reads
them again and yields the winners, bottom layer first, so a directory comes before what is
in it and a hard link after the file it names. A hard link whose file a higher layer
replaced or removed (the spec's "hardlink to a file in a lower filesystem" case) is written
as a copy of the file it named when it was made, as an overlay mount would show it.
"""

from __future__ import annotations

import posixpath
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpuenv.matrix.errors import GpuenvError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SPOOL_BYTES = 16 << 20  # a hard link's copy is kept in memory up to this, then on disk

Member = tuple[tarfile.TarInfo, IO[bytes] | None]


class LayerError(GpuenvError):
    """A layer that cannot be applied: not a tar, a name outside the root, a dangling link."""


@dataclass(frozen=True)
class Winner:
    layer: int
    is_dir: bool
    # A hard link: the path it names and the layer that path's entry came from then.
    link: tuple[str, int] | None = None


def normalized(name: str, layer: str) -> str:
    """A tar entry's path relative to the root ("" for the root itself)."""
    if ".." in name.split("/"):
        raise LayerError(f"{layer}: the entry {name[:200]!r} leaves the root; the image's "
                         "layer is not one an engine would apply")  # fmt: skip
    return posixpath.normpath("/" + name).lstrip("/")


def _open(path: Path, what: str) -> tarfile.TarFile:
    with path.open("rb") as fh:
        if fh.read(4) == ZSTD_MAGIC:
            raise LayerError(f"{what} is zstd-compressed, which this Python cannot read; push "
                             "the image with gzip layers (docker push's default)")  # fmt: skip
    try:
        return tarfile.open(path, mode="r|*")
    except tarfile.TarError as exc:
        raise LayerError(f"{what} is not a tar archive ({exc})") from None


def _drop(final: dict[str, Winner], path: str, *, keep_self: bool = False) -> None:
    """Remove `path` (unless keep_self) and everything below it."""
    if not keep_self:
        final.pop(path, None)
    prefix = f"{path}/" if path else ""
    for key in [k for k in final if k.startswith(prefix) and k != path]:
        del final[key]


def plan(layers: list[Path], names: list[str]) -> dict[str, Winner]:
    """For every path of the flattened filesystem, the entry that wins (layer headers only)."""
    final: dict[str, Winner] = {}
    for index, (path, what) in enumerate(zip(layers, names, strict=True)):
        removed: list[str] = []
        opaque: list[str] = []
        added: list[tarfile.TarInfo] = []
        with _open(path, what) as tar:
            try:
                for member in tar:
                    name = normalized(member.name, what)
                    parent, base = posixpath.split(name)
                    if base == OPAQUE:
                        opaque.append(parent)
                    elif base.startswith(WHITEOUT):
                        removed.append(posixpath.join(parent, base[len(WHITEOUT) :]))
                    elif name:
                        member.name = name
                        added.append(member)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise LayerError(f"{what} is not a whole tar archive ({exc})") from None
        # Whiteouts apply to the lower layers only, before this layer's own entries.
        for parent in opaque:
            _drop(final, parent, keep_self=True)
        for gone in removed:
            _drop(final, gone)
        mine: set[str] = set()
        for member in added:
            if member.name in mine:
                continue  # the spec forbids duplicates in a layer: the first one counts
            mine.add(member.name)
            before = final.get(member.name)
            if before is not None and before.is_dir and not member.isdir():
                _drop(final, member.name)
            link = None
            if member.islnk():
                target = normalized(member.linkname, what)
                named = final.get(target)
                if named is None or named.is_dir:
                    raise LayerError(f"{what}: the hard link {member.name[:200]!r} names "
                                     f"{target[:200]!r}, which is not a file of the image "
                                     "below it")  # fmt: skip
                link = (target, named.layer)
            final[member.name] = Winner(index, member.isdir(), link)
    return final


def members(layers: list[Path], names: list[str], final: dict[str, Winner]) -> Iterator[Member]:
    """The flattened filesystem's entries, bottom layer first (file bodies readable while
    the next entry is not yet asked for)."""
    final = dict(final)  # each path is taken out once written
    # Hard links whose file is no longer that very entry: (path, layer) -> its bytes.
    copies_of = {
        w.link
        for w in final.values()
        if w.link and (final.get(w.link[0]) or Winner(-1, False)).layer != w.link[1]
    }
    with ExitStack() as stack:
        kept: dict[tuple[str, int], tuple[tarfile.TarInfo, IO[bytes]]] = {}
        for index, (path, what) in enumerate(zip(layers, names, strict=True)):
            tar = stack.enter_context(_open(path, what))
            for member in tar:
                name = normalized(member.name, what)
                if (name, index) in copies_of and member.isreg():
                    kept[(name, index)] = (member, _spool(tar, member, stack))
                winner = final.get(name)
                if winner is None or winner.layer != index or not name:
                    continue
                member.name = name
                final.pop(name)  # a duplicate later in the layer is not written twice
                if member.islnk() and winner.link is not None:
                    if winner.link in kept:
                        yield _copy(member.name, *kept[winner.link])
                        continue
                    member.linkname = winner.link[0]
                yield member, tar.extractfile(member) if member.isreg() else None


def _spool(tar: tarfile.TarFile, member: tarfile.TarInfo, stack: ExitStack) -> IO[bytes]:
    body = tar.extractfile(member)
    spool = stack.enter_context(tempfile.SpooledTemporaryFile(SPOOL_BYTES))  # noqa: SIM115
    if body is not None:
        while chunk := body.read(1 << 20):
            spool.write(chunk)
    return spool


def _copy(name: str, original: tarfile.TarInfo, body: IO[bytes]) -> Member:
    copy = tarfile.TarInfo(name)
    for attr in ("mode", "uid", "gid", "uname", "gname", "mtime", "size", "pax_headers"):
        setattr(copy, attr, getattr(original, attr))
    body.seek(0)
    return copy, body


__all__ = ["OPAQUE", "WHITEOUT", "LayerError", "Member", "Winner", "members", "normalized",
           "plan"]  # fmt: skip
