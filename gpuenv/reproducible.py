"""`gpuenv build --reproducible`: make two builds of the same inputs the same image, bit for bit.

The classic builder stamps wall-clock times into every layer's files and into the config
and history, and records build-container IDs. Two `--no-cache` builds from one lock and
one base hold the same files (tests/integration/test_engine_lock.py checks it), so the rest is
metadata; this step saves the image, rewrites it deterministically and loads it back:

- every file's mtime clamped to SOURCE_DATE_EPOCH (the lock's exclude-newer date), entries
  kept in the engine's order (already deterministic), ownership and xattrs kept;
- layer digests recomputed; config `created` and each history `created` set to the epoch;
  the build-container traces (`container`, `container_config.Hostname`, the parent
  `Image` IDs) blanked;
- the config serialised with sorted keys, so its sha256 (the image ID) depends only on
  the contents.
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

from gpuenv.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine import Engine, ImageInfo


def epoch_iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_layer(src: tarfile.TarFile, dst: tarfile.TarFile, epoch: int) -> None:
    for member in src:
        member.mtime = min(int(member.mtime), epoch)
        # Sub-second times arrive as PAX records; the clamped whole-second mtime replaces them.
        member.pax_headers = {
            k: v for k, v in member.pax_headers.items() if k not in ("atime", "ctime", "mtime")
        }
        data = src.extractfile(member) if member.isreg() else None
        dst.addfile(member, data)


def normalize_config(config: dict[str, Any], diff_ids: list[str], epoch: int) -> dict[str, Any]:
    stamp = epoch_iso(epoch)
    config = json.loads(json.dumps(config))
    config["created"] = stamp
    config.pop("container", None)
    for key in ("config", "container_config"):
        section = config.get(key)
        if isinstance(section, dict):
            section["Image"] = ""
            if key == "container_config":
                section["Hostname"] = ""
    for entry in config.get("history", []):
        entry["created"] = stamp
    config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
    return config


def normalize(engine: Engine, ref: str, epoch: int) -> str:
    """Rewrite the image tagged ref in place; returns its new (deterministic) ID."""
    with tempfile.TemporaryDirectory(prefix="gpuenv-repro-") as tmp:
        saved = Path(tmp) / "saved.tar"
        engine.save(ref, str(saved))
        out = Path(tmp) / "normalized.tar"
        with tarfile.open(saved) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
            manifest = json.load(_member(src, "manifest.json"))[0]
            config = json.load(_member(src, manifest["Config"]))
            diff_ids, layer_names = [], []
            for layer in manifest["Layers"]:
                layer_file = Path(tmp) / "layer.tar"
                with (
                    tarfile.open(fileobj=_member(src, layer), mode="r|") as lsrc,
                    tarfile.open(layer_file, "w", format=tarfile.PAX_FORMAT) as ldst,
                ):
                    normalize_layer(lsrc, ldst, epoch)
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
            new_manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": layer_names}]
            _add_bytes(dst, "manifest.json", json.dumps(new_manifest).encode(), epoch)
        engine.load(str(out))
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
    from gpuenv.base import SOURCE_DATE_EPOCH

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
