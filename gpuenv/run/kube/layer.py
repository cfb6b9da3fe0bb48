"""The working directory as a thin code layer on top of the cell's image.

A pod cannot mount your laptop's directory, and ConfigMaps stop at 1 MiB, so gpuenv builds
one more image: `FROM <cell image>` + `COPY workspace /workspace`, owned by the image's
user (uid 1000), pushed beside the cell's image and run by digest. The build context is
made here, deterministically: files in sorted order, mtimes 0, owners 0, modes reduced to
0644/0755, so the same directory gives the same bytes and the same content hash (which
names the tag, so an unchanged directory is not rebuilt or pushed again).

What is left out (version control, caches, secrets, `.dockerignore`) and the limits are
those of every directory gpuenv sends: `gpuenv/run/workdir.py`. Data belongs on a PVC
(--pvc).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpuenv.matrix import contract
from gpuenv.run import workdir as workdirs

DIR = "workspace"  # inside the build context
BASE_LABEL = "io.gpuenv.code-base"  # the digest of the cell image the layer is built on


@dataclass(frozen=True)
class CodeContext:
    tar: bytes  # the build context: Dockerfile + workspace/
    digest: str  # sha256 hex over the context (and so over the base it names)
    files: int
    size: int  # bytes of file content


def dockerfile(base_ref: str, workdir: str, base_digest: str = "") -> str:
    """FROM the cell's pushed tag; its digest is recorded in a label, so that a new cell
    image gives a new context (and content hash) even under the same tag."""
    uid = contract.UID
    label = f"LABEL {BASE_LABEL}={base_digest}\n" if base_digest else ""
    return f"FROM {base_ref}\n{label}COPY --chown={uid}:{uid} {DIR} {workdir}\nWORKDIR {workdir}\n"


def _info(name: str, st: os.stat_result, kind: bytes, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)  # mtime 0, owner 0 with no names: TarInfo's defaults
    info.type = kind
    info.size = size
    executable = kind == tarfile.DIRTYPE or bool(st.st_mode & stat.S_IXUSR)
    info.mode = 0o755 if executable else 0o644
    return info


def build_context(
    root: Path, base_ref: str, workdir: str = "/workspace", *, base_digest: str = ""
) -> CodeContext:
    """The code layer's build context for `root`, or GpuenvError past the limits."""
    entries = workdirs.listing(root, "mount it from a PVC (--pvc CLAIM:/data)")
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        text = dockerfile(base_ref, workdir, base_digest).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        tar.addfile(_info(DIR, os.stat(root), tarfile.DIRTYPE))
        for rel, entry in entries.items():
            path = root / rel
            st = os.lstat(path)
            name = f"{DIR}/{rel}"
            if entry.kind == "l":
                link = _info(name, st, tarfile.SYMTYPE)
                link.linkname = entry.link
                tar.addfile(link)
            elif entry.kind == "d":
                tar.addfile(_info(name, st, tarfile.DIRTYPE))
            else:
                total += entry.size
                with open(path, "rb") as fh:
                    tar.addfile(_info(name, st, tarfile.REGTYPE, entry.size), fh)
    data = buf.getvalue()
    return CodeContext(data, hashlib.sha256(data).hexdigest(), len(entries), total)
