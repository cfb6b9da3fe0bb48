"""What an image's layers hold, file by file, and where two images part.

A reproducible build that gives another image ID is only useful if it says where: the first
layer whose diff ID differs, and in it the files that differ and how (content, mode, owner,
mtime, type or link target), as diffoscope reports two tars. Both sides are either images an
engine holds (`gpuenv verify --rebuild`: the published image against its rebuild) or a
record written when an image was built (`gpuenv build --reproducible --record FILE`, checked
by `--expect FILE` on another day or machine): per layer its diff ID and one short entry per
file, enough to name what changed without the other image at hand.
"""

from __future__ import annotations

import gzip
import json
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuenv.building.reproducible import content_digest
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine

RECORD_VERSION = 1
# The most files one difference lists; a layer that differs everywhere (another framework
# release) is summarised by count after these.
LIMIT = 20
_KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "directory",
          tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hard link"}  # fmt: skip


class Entry(NamedTuple):
    """One file of a layer, as a reproducible image holds it."""

    kind: str
    mode: str  # octal, "0644"
    owner: str  # "uid:gid"
    mtime: int
    content: str  # sha256 of a regular file's bytes, first 16 hex ("" for anything else)
    link: str  # a link's target ("" for anything else)


Files = dict[str, Entry]


def entries(layer: tarfile.TarFile) -> Files:
    out: Files = {}
    for member in layer:
        name = member.name.removeprefix("./").rstrip("/")
        content = content_digest(layer, member)[:16]
        out[name] = Entry(_KINDS.get(member.type, "other"), f"{member.mode & 0o7777:04o}",
                          f"{member.uid}:{member.gid}", int(member.mtime), content,
                          member.linkname)  # fmt: skip
    return out


def differences(expected: Files, got: Files, limit: int = LIMIT) -> list[str]:
    """One line per file that differs, in path order: what it was and what it is."""
    lines = []
    changed = [p for p in sorted(expected.keys() | got.keys()) if expected.get(p) != got.get(p)]
    for path in changed[:limit]:
        want, have = expected.get(path), got.get(path)
        if want is None or have is None:
            lines.append(f"{path}: {'only in the rebuild' if want is None else 'missing'}")
            continue
        pairs = zip(Entry._fields, want, have, strict=True)
        what = [f"{field} {_shown(field, a)} -> {_shown(field, b)}" for field, a, b in pairs
                if a != b]  # fmt: skip
        lines.append(f"{path}: {', '.join(what)}")
    if len(changed) > limit:
        lines.append(f"... and {len(changed) - limit} more files")
    return lines


def _shown(field: str, value: object) -> str:
    if field == "mtime":
        return datetime.fromtimestamp(int(str(value)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value) or "-"


# ------------------------------------------------------------------ images an engine holds


class Saved:
    """An image as `docker save` wrote it: its config and its layers, read on demand."""

    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)  # noqa: SIM115  # closed by saved()
        manifest = json.load(self._member(self.tar, "manifest.json"))[0]
        self.config: dict[str, Any] = json.load(self._member(self.tar, manifest["Config"]))
        self.diff_ids: list[str] = list(self.config.get("rootfs", {}).get("diff_ids", []))
        self._layers: list[str] = list(manifest["Layers"])

    def files(self, index: int) -> Files:
        with tarfile.open(fileobj=self._member(self.tar, self._layers[index])) as layer:
            return entries(layer)

    def contents(self, index: int) -> Iterator[tuple[str, bytes]]:
        """Each regular file of a layer and its bytes (a scan for what must not be there)."""
        with tarfile.open(fileobj=self._member(self.tar, self._layers[index])) as layer:
            for member in layer:
                handle = layer.extractfile(member) if member.isreg() else None
                if handle is not None:
                    yield member.name, handle.read()

    @staticmethod
    def _member(tar: tarfile.TarFile, name: str) -> Any:
        handle = tar.extractfile(name)
        if handle is None:
            raise GpuenvError(f"docker save output lacks {name}")
        return handle


@contextmanager
def saved(engine: Engine, ref: str) -> Iterator[Saved]:
    with tempfile.TemporaryDirectory(prefix="gpuenv-layers-") as tmp:
        path = Path(tmp) / "image.tar"
        engine.save(ref, str(path))
        image = Saved(path)
        try:
            yield image
        finally:
            image.tar.close()


def record(engine: Engine, ref: str) -> dict[str, Any]:
    """What `--expect` later compares with: the image ID, and per layer its diff ID and
    files."""
    info = engine.image(ref)
    if info is None:
        raise GpuenvError(f"{ref}: no such image to record")
    with saved(engine, ref) as image:
        layers = [{"diff_id": diff_id, "files": {p: list(e) for p, e in image.files(i).items()}}
                  for i, diff_id in enumerate(image.diff_ids)]  # fmt: skip
    return {
        "version": RECORD_VERSION,
        "image": ref,
        "id": info.id,
        "layers": layers,
        "recipe": info.labels.get(contract.RECIPE, ""),
    }


def recorded_files(layer: dict[str, Any]) -> Files:
    return {p: Entry(*e) for p, e in layer["files"].items()}


def against_record(engine: Engine, expected: dict[str, Any], ref: str) -> list[str]:
    """Where the image `ref` parts from a record: [] when it is the recorded image, else the
    first differing layer and its files (or the config, when every layer is the same)."""
    info = engine.image(ref)
    if info is None:
        raise GpuenvError(f"{ref}: no such image")
    if info.id == expected["id"]:
        return []
    with saved(engine, ref) as image:
        recorded = [layer["diff_id"] for layer in expected["layers"]]
        index = _first(recorded, image.diff_ids)
        if index is None:
            return [f"{ref} is {info.id[:19]}, {expected['id'][:19]} expected: every layer is "
                    "the same, the config differs (labels, environment or history)"]  # fmt: skip
        head = _where(ref, index, recorded, image.diff_ids)
        if index >= len(recorded):
            return [head]
        return [head, *differences(recorded_files(expected["layers"][index]), image.files(index))]


def between(engine: Engine, expected_ref: str, ref: str) -> list[str]:
    """Where the image `ref` parts from `expected_ref` (both held by the engine)."""
    with saved(engine, expected_ref) as want, saved(engine, ref) as have:
        index = _first(want.diff_ids, have.diff_ids)
        if index is None:
            return [f"every layer is the same; {_config_differences(want.config, have.config)}"]
        head = _where(ref, index, want.diff_ids, have.diff_ids)
        if index >= min(len(want.diff_ids), len(have.diff_ids)):
            return [head]
        return [head, *differences(want.files(index), have.files(index))]


def _config_differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Which parts of two image configs differ, labels by name."""
    ca, cb = a.get("config") or {}, b.get("config") or {}
    keys = sorted(k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k))
    la, lb = ca.get("Labels") or {}, cb.get("Labels") or {}
    labels = sorted(k for k in la.keys() | lb.keys() if la.get(k) != lb.get(k))
    named = [f"Labels ({', '.join(labels)})" if k == "Labels" else k for k in keys]
    return f"the config differs in {', '.join(named)}" if named else "the history differs"


def _first(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _where(ref: str, index: int, expected: list[str], got: list[str]) -> str:
    if index >= len(expected) or index >= len(got):
        return f"{ref} has {len(got)} layers, {len(expected)} expected"
    return (f"layer {index + 1} of {len(got)} differs: {got[index][:19]} here, "
            f"{expected[index][:19]} expected")  # fmt: skip


# ------------------------------------------------------------------ record files


def write_records(engine: Engine, images: dict[str, str], path: Path) -> None:
    """`build --record FILE`: each cell's image (cell name -> reference), gzipped when the
    name ends in .gz (no name or time in the gzip header: the same images, the same file)."""
    cells = {cell: record(engine, ref) for cell, ref in sorted(images.items())}
    data = json.dumps({"version": RECORD_VERSION, "cells": cells}, sort_keys=True,
                      separators=(",", ":")).encode()  # fmt: skip
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def check_records(
    engine: Engine, expected: dict[str, Any], images: dict[str, str], path: Path
) -> None:
    """`build --expect FILE`: an error naming where each recorded cell's image parts from
    its record (the layer, the files), and the recipes when they differ."""
    from gpuenv.building.recipe import current, from_label

    lines, differ = [], []
    for cell, ref in sorted(images.items()):
        if cell in expected["cells"]:
            where = against_record(engine, expected["cells"][cell], ref)
            lines += where
            differ += [cell] if where else []
    if not differ:
        return
    recorded = {from_label(str(r.get("recipe", ""))) for r in expected["cells"].values()}
    now = current()
    why = (
        ""
        if recorded == {now}
        else (f"; recorded by {', '.join(sorted(str(r) for r in recorded))}, this is {now}")
    )
    raise GpuenvError(f"{', '.join(differ)}: not the image {path} records{why}",
                      details=tuple(lines))  # fmt: skip


def load_record(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)
    except (OSError, ValueError) as exc:
        raise GpuenvError(f"{path}: cannot read a layer record ({exc}); write one with "
                          "gpuenv build --reproducible --record FILE") from None  # fmt: skip
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION or "cells" not in data:
        raise GpuenvError(f"{path}: not a layer record of this gpuenv (version "
                          f"{RECORD_VERSION}); write one with --record")  # fmt: skip
    return data
