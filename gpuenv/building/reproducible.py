"""`gpuenv build --reproducible`: one image, bit for bit, from the same inputs on any engine.

Builders stamp wall-clock times into files, the config and the history, record their build
containers, and disagree on what a layer holds: an overlay2 diff lists directories that a
step merely touched, a rootless engine's naive diff does not; BuildKit and podman's builder
write headers and histories their own way; podman leaves the mount points of RUN steps
behind. The files a step makes are the same (tests/integration/test_engine_anywhere.py), so
this step saves the image, rewrites it in one canonical form and loads it back:

- each layer: its entries sorted by name, each header rebuilt from what the file is (type,
  mode, owner ids, size, link, device, xattrs; mtime clamped to SOURCE_DATE_EPOCH, the lock's
  exclude-newer date); an entry identical to what the layers below already hold (ignoring
  mtime) is left out, as are the builder's own traces: empty /etc/hostname, /etc/hosts,
  /etc/resolv.conf the layers below lack, and a whiteout of the install steps' mount point;
  layers left empty are dropped;
- the config: only what a container gets (architecture, os, Cmd, Entrypoint, Env, Labels
  but the builder's own, User, WorkingDir, ports, volumes, stop signal), `created` and one
  history entry per layer at the epoch, serialised with sorted keys, so its sha256 (the
  image ID) depends only on the contents. The history names no instructions: engines word
  them differently; `gpuenv render` gives the Dockerfile.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo

# Files a builder creates as mount points of a RUN step when the image lacks them.
RUNTIME_MOUNTS = ("etc/hostname", "etc/hosts", "etc/resolv.conf")
# The install steps' mount point (render.MOUNT), which podman's builder removes afterwards.
MOUNT_WHITEOUT = ".wh.mnt"
# Config keys a container gets, kept; labels a builder adds about itself, dropped.
CONFIG_KEYS = ("Cmd", "Entrypoint", "Env", "ExposedPorts", "Labels", "StopSignal", "User",
               "Volumes", "WorkingDir")  # fmt: skip
BUILDER_LABELS = ("io.buildah.version",)

Signature = tuple[Any, ...]


def epoch_iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _name(member: tarfile.TarInfo) -> str:
    name = member.name
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _signature(member: tarfile.TarInfo, digest: str) -> Signature:
    xattrs = tuple(sorted((k, v) for k, v in member.pax_headers.items() if "xattr" in k))
    # Go's archive/tar (the engine's) writes the file-type bits into the mode; Python's not.
    return (member.type, member.mode & 0o7777, member.uid, member.gid, member.linkname, digest,
            member.devmajor, member.devminor, xattrs)  # fmt: skip


def content_digest(src: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    """sha256 of a regular file's bytes in a layer; "" for anything else."""
    if not member.isreg():
        return ""
    handle = src.extractfile(member)
    assert handle is not None
    return hashlib.file_digest(handle, "sha256").hexdigest()


def _drop_under(state: dict[str, Signature], path: str) -> None:
    for key in [k for k in state if k == path or k.startswith(path + "/")]:
        del state[key]


def canonical_layer(
    src: tarfile.TarFile, dst: tarfile.TarFile, epoch: int, state: dict[str, Signature]
) -> int:
    """Write `src`'s canonical form to `dst`, given (and updating) the state of the layers
    below: path -> signature. Returns how many entries were written."""
    members = {_name(m): m for m in src.getmembers() if _name(m)}
    written = 0
    for name in sorted(members):
        member = members[name]
        parent, _, base = name.rpartition("/")
        if base.startswith(".wh."):
            if base == ".wh..wh..opq":
                for key in [k for k in state if k.startswith(parent + "/")]:
                    del state[key]
            else:
                target = f"{parent}/{base[4:]}" if parent else base[4:]
                if name == MOUNT_WHITEOUT or target not in state:
                    continue  # the builder's cleanup of its mount, or nothing to remove
                _drop_under(state, target)
        else:
            signature = _signature(member, content_digest(src, member))
            if state.get(name) == signature:
                continue  # a copy-up or a rewrite with the same contents
            if name in RUNTIME_MOUNTS and member.isreg() and member.size == 0 and name not in state:
                continue
            if member.isdir() is False or state.get(name, (None,))[0] != tarfile.DIRTYPE:
                _drop_under(state, name)  # a file replacing a directory, or a new entry
            state[name] = signature
        out = tarfile.TarInfo(name)
        out.type, out.mode = member.type, member.mode & 0o7777
        out.uid, out.gid = member.uid, member.gid
        out.size = member.size if member.isreg() else 0
        out.linkname, out.devmajor, out.devminor = member.linkname, member.devmajor, member.devminor
        out.mtime = min(int(member.mtime), epoch)
        out.pax_headers = {k: v for k, v in member.pax_headers.items() if "xattr" in k}
        if base.startswith(".wh."):
            # A marker: engines write it with the removed file's mode, or 0, or as a hard link
            # to another marker (one inode); canonically, an empty file.
            out.type, out.linkname, out.size = tarfile.REGTYPE, "", 0
            out.mode = out.uid = out.gid = 0
            out.mtime, out.pax_headers = epoch, {}
            dst.addfile(out)
        else:
            dst.addfile(out, src.extractfile(member) if member.isreg() else None)
        written += 1
    return written


def normalize_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> dict[str, Any]:
    stamp = epoch_iso(epoch)
    given = config.get("config") or {}
    kept: dict[str, Any] = {k: given[k] for k in CONFIG_KEYS if given.get(k)}
    labels = {k: v for k, v in (kept.get("Labels") or {}).items() if k not in BUILDER_LABELS}
    if labels:
        kept["Labels"] = labels
    else:
        kept.pop("Labels", None)
    out: dict[str, Any] = {
        "architecture": config.get("architecture", ""),
        "os": config.get("os", "linux"),
        "config": kept,
        "created": stamp,
        "history": [
            {"created": stamp, "created_by": f"gpuenv --reproducible: layer {i + 1}"}
            for i in range(len(diff_ids))
        ],
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if config.get("variant"):
        out["variant"] = config["variant"]
    return out


def normalize(engine: Engine, ref: str, epoch: int) -> str:
    """Rewrite the image tagged ref in place; returns its new (canonical) ID."""
    with tempfile.TemporaryDirectory(prefix="gpuenv-repro-") as tmp:
        saved = Path(tmp) / "saved.tar"
        engine.save(ref, str(saved))
        out = Path(tmp) / "normalized.tar"
        state: dict[str, Signature] = {}
        with tarfile.open(saved) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
            manifest = json.load(_member(src, "manifest.json"))[0]
            config = json.load(_member(src, manifest["Config"]))
            diff_ids, layer_names = [], []
            for layer in manifest["Layers"]:
                given, layer_file = Path(tmp) / "given.tar", Path(tmp) / "layer.tar"
                with given.open("wb") as fh:
                    handle = _member(src, layer)
                    while chunk := handle.read(1 << 20):
                        fh.write(chunk)
                with (
                    tarfile.open(given) as lsrc,
                    tarfile.open(layer_file, "w", format=tarfile.PAX_FORMAT) as ldst,
                ):
                    written = canonical_layer(lsrc, ldst, epoch, state)
                given.unlink()
                if not written:
                    continue  # an instruction that changed nothing (BuildKit's WORKDIR)
                digest = _sha256(layer_file)
                name = f"{digest}/layer.tar"
                if name not in layer_names:
                    _add_file(dst, name, layer_file, epoch)
                diff_ids.append(f"sha256:{digest}")
                layer_names.append(name)
            new_config = normalize_config(config, diff_ids, epoch)
            blob = json.dumps(new_config, sort_keys=True, separators=(",", ":")).encode()
            config_name = f"{hashlib.sha256(blob).hexdigest()}.json"
            _add_bytes(dst, config_name, blob, epoch)
            # Loaded untagged, then tagged by the engine's own rule: podman names a loaded
            # `a/b:t` docker.io/a/b:t but a built one localhost/a/b:t, and would keep both.
            new_manifest = [{"Config": config_name, "RepoTags": None, "Layers": layer_names}]
            _add_bytes(dst, "manifest.json", json.dumps(new_manifest).encode(), epoch)
        engine.load(str(out))
    engine.tag(f"sha256:{config_name.removesuffix('.json')}", ref)
    info = engine.image(ref)
    if info is None:
        raise GpuenvError(f"normalising {ref}: the engine lost the image on load")
    return info.id


def _member(tar: tarfile.TarFile, name: str) -> Any:
    handle = tar.extractfile(name)
    if handle is None:
        raise GpuenvError(f"docker save output lacks {name}")
    return handle


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _add_file(dst: tarfile.TarFile, name: str, path: Path, epoch: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = path.stat().st_size, epoch, 0o644
    with path.open("rb") as fh:
        dst.addfile(info, fh)


def _add_bytes(dst: tarfile.TarFile, name: str, data: bytes, epoch: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), epoch, 0o644
    dst.addfile(info, io.BytesIO(data))


def epoch_for(lock_exclude_newer: str | None, default: int) -> int:
    """SOURCE_DATE_EPOCH for a cell: the lock's exclude-newer date, else the base's epoch."""
    if lock_exclude_newer:
        stamp = datetime.strptime(lock_exclude_newer, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return int(stamp.timestamp())
    return default


def is_normalized(info: ImageInfo, epoch: int) -> bool:
    return info.created.startswith(epoch_iso(epoch)[:19])


def normalize_images(
    engine: Engine, refs: list[str], lock_exclude_newer: str | None
) -> list[tuple[str, str, bool]]:
    """`build --reproducible`: normalise each image; (ref, image ID, changed) per image.
    The image a normalisation supersedes is removed once nothing tags it."""
    from gpuenv.building.base import SOURCE_DATE_EPOCH

    epoch = epoch_for(lock_exclude_newer, int(SOURCE_DATE_EPOCH))
    out = []
    for ref in refs:
        info = engine.image(ref)
        if info is None:
            raise GpuenvError(f"normalising {ref}: no such image")
        if is_normalized(info, epoch):
            out.append((ref, info.id, False))
            continue
        image_id = normalize(engine, ref, epoch)
        if info.id != image_id:
            engine.remove_if_untagged(info.id)
        out.append((ref, image_id, True))
    return out
