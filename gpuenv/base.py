"""Local base images: a Debian suite bootstrapped with mmdebstrap and imported into the engine.

These are the offline, archive-pinned bases for air-gapped sites (and the only bases on
machines that cannot pull). SOURCE_DATE_EPOCH makes mmdebstrap's tar reproducible for the
same package versions; Debian replaces versions at point releases, so the root filesystem
digest is recorded in a label (io.gpuenv.rootfs) for the lock to pin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpuenv import contract
from gpuenv.cell import Base, Cell
from gpuenv.engine import Engine
from gpuenv.errors import GpuenvError

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


def mmdebstrap_command(suite: str) -> list[str]:
    mirror = os.environ.get("GPUENV_DEBIAN_MIRROR", MIRROR)
    security = os.environ.get("GPUENV_DEBIAN_SECURITY_MIRROR", SECURITY_MIRROR)
    command = [
        "mmdebstrap",
        "--variant=minbase",
        "--format=tar",
        "--quiet",
        # Without merged-usr, bookworm pulls in usrmerge and a full perl (+50 MB).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        f"--include={','.join(PACKAGES)}",
        '--aptopt=Acquire::Languages "none"',
        *(f"--dpkgopt={opt}" for opt in DPKG_OPTIONS),
        # Docker provides both at run time; leaving the host's copies would leak them.
        '--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"',
        suite,
        "-",
        f"deb {mirror} {suite} main",
        f"deb {mirror} {suite}-updates main",
        f"deb {security} {suite}-security main",
    ]
    return command


def ensure(engine: Engine, base: Base, progress: Callable[[str], None]) -> str:
    """The base's image ID, bootstrapping it first when it is missing."""
    info = engine.image(base.image)
    if info is not None:
        return info.id
    if base.kind == "image":
        raise GpuenvError(
            f"base image {base.image} is not in the engine and gpuenv does not pull; "
            f"docker pull {base.image} (or docker load it) first"
        )
    return bootstrap(engine, base.value, progress)


def ensure_all(
    engine: Engine, cells: list[Cell], save_dir: Path | None, progress: Callable[[str], None]
) -> list[tuple[str, str, Path | None]]:
    """`gpuenv base`: each base the cells need, once: (image, image ID, saved tar or None)."""
    out: list[tuple[str, str, Path | None]] = []
    for cell in cells:
        if any(cell.base.image == image for image, _, _ in out):
            continue
        image_id = ensure(engine, cell.base, progress)
        target = None
        if save_dir is not None:
            save_dir.mkdir(parents=True, exist_ok=True)
            target = save_dir / (cell.base.image.replace("/", "-").replace(":", "-") + ".tar")
            engine.save(cell.base.image, str(target))
        out.append((cell.base.image, image_id, target))
    return out


def bootstrap(engine: Engine, suite: str, progress: Callable[[str], None]) -> str:
    """mmdebstrap the suite to a tar, hash it, import it labelled, and tag it last."""
    ref = f"gpuenv/debian:{suite}"
    if shutil.which("mmdebstrap") is None:
        raise GpuenvError(
            f"base {ref} is missing and mmdebstrap is not installed; install it "
            "(sudo apt-get install mmdebstrap, or run scripts/engine.sh) and retry"
        )
    progress(f"bootstrapping {ref} from Debian's archive (about 20 s)")
    env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
    with tempfile.NamedTemporaryFile(suffix=".tar") as tar, tempfile.TemporaryFile() as log:
        rc = subprocess.call(mmdebstrap_command(suite), stdout=tar, stderr=log, env=env)
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
        image_id = engine.import_image(tar.name, ref, changes)
    progress(f"made {ref} (rootfs sha256:{digest[:12]})")
    return image_id


def package_list(engine: Engine, image: str) -> list[str]:
    """The Debian packages of a base, name=version, sorted (what the lock records)."""
    code, out = engine.run_capture(image, ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"])
    if code != 0:
        return []
    return sorted(line for line in out.splitlines() if "=" in line)
