"""Local base images: a Debian suite bootstrapped with mmdebstrap and imported into the engine.

These are the offline, archive-pinned bases for air-gapped sites (and the only bases on
machines that cannot pull). SOURCE_DATE_EPOCH makes mmdebstrap's tar reproducible for the
same package versions; Debian replaces versions at point releases, so the root filesystem
digest is recorded in a label (io.gpuenv.rootfs) for the lock to pin.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuenv.engine.client import Engine, ImageInfo
from gpuenv.matrix import contract
from gpuenv.matrix.cell import Base, Cell
from gpuenv.matrix.errors import GpuenvError

SOURCE_DATE_EPOCH = "1735689600"  # 2025-01-01T00:00:00Z; fixed so reruns give the same tar
PACKAGES = ("python3", "python3-venv", "ca-certificates")
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Keep the image small: no manuals, translations or docs (copyright files stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/lintian/*",
)


def mirror(variable: str, default: str) -> str:
    """A Debian mirror from the environment. One with credentials in it is refused: they
    would be on mmdebstrap's command line, which every local user can read in /proc, and
    mmdebstrap writes its mirrors into the root filesystem's /etc/apt/sources.list, so
    into the base and every image built on it (docs/hardening.md)."""
    from urllib.parse import urlsplit

    value = os.environ.get(variable, default)
    if "@" in urlsplit(value).netloc:
        raise GpuenvError(
            f"${variable} holds credentials (user:password@); they would be on mmdebstrap's "
            "command line and in /etc/apt/sources.list of every image: use a mirror that "
            "needs none (one on your network, or an apt proxy that holds them)"
        )
    return value


def mmdebstrap_command(suite: str, arch: str = "amd64") -> list[str]:
    mirror_url = mirror("GPUENV_DEBIAN_MIRROR", MIRROR)
    security = mirror("GPUENV_DEBIAN_SECURITY_MIRROR", SECURITY_MIRROR)
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--format=tar",
        "--quiet",
        # Another architecture's maintainer scripts run under QEMU (binfmt_misc; mmdebstrap
        # checks with arch-test). --mode=chrootless would avoid emulation, but bookworm's
        # python3.11-minimal postinst does not support DPKG_ROOT and fails there.
        f"--arch={arch}",
        # Without merged-usr, bookworm pulls in usrmerge and a full perl (+50 MB).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(PACKAGES)}",
        '--aptopt=Acquire::Languages "none"',
        *(f"--dpkgopt={opt}" for opt in DPKG_OPTIONS),
        # Docker provides both at run time; leaving the host's copies would leak them.
        '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
        suite,
        "-",
        f"deb {mirror_url} {suite} main",
        f"deb {mirror_url} {suite}-updates main",
        f"deb {security} {suite}-security main",
    ]


def ensure(
    engine: Engine, base: Base, info: ImageInfo | None, progress: Callable[[str], None]
) -> str:
    """The base's image ID, bootstrapping it first when it is missing. `info` is what the
    engine holds under the base's reference (None: nothing), asked by the caller."""
    if info is not None:
        if info.architecture and info.architecture != base.arch:
            raise GpuenvError(
                f"base {base.image} is {info.architecture} in the engine, but the cell is "
                f"{base.arch}; load the {base.arch} image under that reference "
                f"(docker pull --platform linux/{base.arch} {base.image}, or docker load it)"
            )
        return info.id
    if base.kind == "image":
        raise GpuenvError(
            f"base image {base.image} is not in the engine and gpuenv does not pull; "
            f"docker pull {base.image} (or docker load it) first"
        )
    if base.arch != _engine_arch(engine):
        _check_foreign(base.arch)
    return bootstrap(engine, base.value, progress, base.arch)


def ensure_all(
    engine: Engine, cells: list[Cell], save_dir: Path | None, progress: Callable[[str], None]
) -> list[tuple[str, str, Path | None]]:
    """`gpuenv base`: each base the cells need, once: (image, image ID, saved tar or None)."""
    out: list[tuple[str, str, Path | None]] = []
    for cell in cells:
        if any(cell.base.image == image for image, _, _ in out):
            continue
        image_id = ensure(engine, cell.base, engine.image(cell.base.image), progress)
        target = None
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            target = save_dir / (cell.base.image.replace("/", "-").replace(":", "-") + ".tar")
            engine.save(cell.base.image, str(target))
        out.append((cell.base.image, image_id, target))
    return out


def _engine_arch(engine: Engine) -> str:
    machine = engine.architecture()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def _check_foreign(arch: str) -> None:
    """mmdebstrap runs another architecture's maintainer scripts under QEMU on this machine:
    say how to enable it rather than let mmdebstrap fail deep inside."""
    if shutil.which("arch-test") is None:
        raise GpuenvError(
            f"an {arch} base needs QEMU user emulation here and arch-test is not installed; "
            "sudo apt-get install qemu-user-static binfmt-support arch-test (see gpuenv doctor)"
        )
    if subprocess.call(["arch-test", arch], stdout=subprocess.DEVNULL) != 0:
        raise GpuenvError(
            f"this machine cannot run {arch} programs, which bootstrapping an {arch} base "
            "needs; enable QEMU through binfmt_misc (gpuenv doctor says how)"
        )


def bootstrap(
    engine: Engine, suite: str, progress: Callable[[str], None], arch: str = "amd64"
) -> str:
    """mmdebstrap the suite to a tar, hash it, import it labelled, and tag it last."""
    ref = Base("debian", suite, "", arch).image
    if shutil.which("mmdebstrap") is None:
        raise GpuenvError(
            f"base {ref} is missing and mmdebstrap is not installed; install it "
            "(sudo apt-get install mmdebstrap, or run scripts/engine.sh) and retry"
        )
    command = mmdebstrap_command(suite, arch)  # a mirror it refuses: before anything runs
    foreign = arch != _engine_arch(engine)
    about = "a few minutes: its packages' scripts run emulated" if foreign else "about 20 s"
    progress(f"bootstrapping {ref} from Debian's archive ({about})")
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    with tempfile.NamedTemporaryFile(suffix=".tar") as tar, tempfile.TemporaryFile() as log:
        rc = subprocess.call(command, stdout=tar, stderr=log, env=env)
        if rc != 0:
            log.seek(0)
            lines = log.read().decode(errors="replace").strip().splitlines() or ["?"]
            errors = [line for line in lines if line.startswith(("E:", "error"))] or lines
            raise GpuenvError(f"mmdebstrap {suite} failed (exit {rc}): {errors[-1]}")
        tar.seek(0)
        digest = hashlib.file_digest(tar, "sha256").hexdigest()
        changes = [
            'CMD ["python3"]',
            f"LABEL {contract.BASE}=debian:{suite} {contract.ROOTFS}=sha256:{digest} "
            f"{contract.SOURCE_DATE_EPOCH}={SOURCE_DATE_EPOCH}",
        ]
        if foreign:
            image_id = _load_as(engine, tar.name, digest, ref, arch, suite)
        else:
            image_id = engine.import_image(tar.name, ref, changes)
    progress(f"made {ref} (rootfs sha256:{digest[:12]})")
    return image_id


def _load_as(engine: Engine, rootfs: str, digest: str, ref: str, arch: str, suite: str) -> str:
    """The root filesystem loaded as a one-layer image whose config says `arch`: Docker
    20.10 ignores `docker import --platform` (moby/moby#42813, fixed in Engine 23), and
    an image recorded as the engine's own architecture would be built, run and pushed as
    that. A docker-archive (`docker save`'s format: manifest.json, the config, the layer
    tar) carries the config as written; the image ID is the config's digest."""
    config = {
        "architecture": arch,
        "os": "linux",
        "created": "2025-01-01T00:00:00Z",  # SOURCE_DATE_EPOCH, so the ID is reproducible
        "config": {
            "Cmd": ["python3"],
            "Labels": {
                contract.BASE: f"debian:{suite}",
                contract.ROOTFS: f"sha256:{digest}",
                contract.SOURCE_DATE_EPOCH: SOURCE_DATE_EPOCH,
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
        "history": [{"created": "2025-01-01T00:00:00Z", "created_by": f"mmdebstrap {suite}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {"Config": f"{config_id}.json", "RepoTags": [ref], "Layers": [f"{digest}/layer.tar"]}
    ]
    import tarfile

    with tempfile.NamedTemporaryFile(suffix=".tar") as archive:
        with tarfile.open(fileobj=archive, mode="w") as out:
            for name, data in (
                (f"{config_id}.json", config_bytes),
                ("manifest.json", json.dumps(manifest).encode()),
            ):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                out.addfile(member, io.BytesIO(data))
            out.add(rootfs, arcname=f"{digest}/layer.tar")
        archive.flush()
        engine.load(archive.name)
    info = engine.image(ref)
    if info is None or info.architecture != arch:
        raise GpuenvError(f"loading {ref} did not give an {arch} image")
    return info.id


def published_tag(image: str, locked: dict[str, Any]) -> str:
    """The tag a locked base is pushed under beside its cells' images, and pulled back by:
    base-<the base's own tag>-<12 hex of what the lock pins it by> (the root filesystem,
    else the image ID). Derived from the lock alone, so a lock names its base's tag on any
    machine, and a base bootstrapped later (another root filesystem) gets another tag."""
    import re

    pin = str(locked.get("rootfs") or locked.get("id") or "")
    if not pin.startswith("sha256:"):
        raise GpuenvError(f"matrix.lock pins base {image} by neither a root filesystem nor an "
                          "image ID; re-lock it: gpuenv lock")  # fmt: skip
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", image.rpartition(":")[2] if ":" in image else image)
    return f"base-{name[:64]}-{pin.removeprefix('sha256:')[:12]}"


def package_list(engine: Engine, image: str, platform: str | None = None) -> list[str]:
    """The Debian packages of a base, name=version, sorted (what the lock records)."""
    query = ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"]
    code, out = engine.run_capture(image, query, platform)
    if code != 0:
        return []
    return sorted(line for line in out.splitlines() if "=" in line)
