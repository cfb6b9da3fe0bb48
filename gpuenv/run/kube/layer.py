"""The working directory as a thin code layer on top of the cell's image.

A pod cannot mount your laptop's directory, and ConfigMaps stop at 1 MiB, so gpuenv builds
one more image: `FROM <cell image>` + `COPY workspace /workspace`, owned by the image's
user (uid 1000), pushed beside the cell's image and run by digest. The build context is
made here, deterministically: files in sorted order, mtimes 0, owners 0, modes reduced to
0644/0755, so the same directory gives the same bytes and the same content hash (which
names the tag, so an unchanged directory is not rebuilt or pushed again).

Left out: version-control and cache directories (DEFAULT_IGNORE) and what `.dockerignore`
lists (shell patterns over the relative path; `!` exceptions are refused rather than
half-honoured). Refused: more than MAX_BYTES or MAX_FILES; data belongs on a PVC (--pvc).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from gpuenv.matrix import contract
from gpuenv.run.kube import KubeError

MAX_BYTES = 200 * 1024 * 1024
MAX_FILES = 20_000
DEFAULT_IGNORE = (
    ".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "node_modules", ".DS_Store",
)  # fmt: skip
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


def read_ignore(root: Path) -> list[str]:
    path = root / ".dockerignore"
    if not path.is_file():
        return []
    patterns = []
    for n, raw in enumerate(path.read_text("utf-8", errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise KubeError(
                f"{path}:{n}: '!' exceptions are not supported by gpuenv's code layer; "
                "list what to leave out instead"
            )
        patterns.append(line.strip("/").removeprefix("./"))
    return patterns


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in (*DEFAULT_IGNORE, *patterns):
        if "/" in pattern:
            if fnmatchcase(rel, pattern) or any(
                fnmatchcase("/".join(parts[:i]), pattern) for i in range(1, len(parts))
            ):
                return True
        elif any(fnmatchcase(p, pattern) for p in parts):
            return True
    return False


def collect(root: Path) -> list[str]:
    """Relative POSIX paths of what goes into the layer (directories too), sorted."""
    patterns = read_ignore(root)
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if not _ignored(rel, patterns):
                keep.append(d)
                found.append(rel)
        dirnames[:] = keep  # os.walk does not follow symlinked directories
        for f in filenames:
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            if not _ignored(rel, patterns):
                found.append(rel)
    return sorted(found)


def _info(name: str, st: os.stat_result, kind: bytes, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    executable = kind == tarfile.DIRTYPE or bool(st.st_mode & stat.S_IXUSR)
    info.mode = 0o755 if executable else 0o644
    return info


def build_context(
    root: Path, base_ref: str, workdir: str = "/workspace", *, base_digest: str = ""
) -> CodeContext:
    """The code layer's build context for `root`, or KubeError past the limits."""
    paths = collect(root)
    if len(paths) > MAX_FILES:
        raise KubeError(
            f"{root} holds {len(paths)} files, more than the code layer takes ({MAX_FILES}); "
            "leave data out (.dockerignore) and mount it from a PVC (--pvc CLAIM:/data)"
        )
    buf = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        text = dockerfile(base_ref, workdir, base_digest).encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mtime, info.mode = len(text), 0, 0o644
        tar.addfile(info, io.BytesIO(text))
        tar.addfile(_info(DIR, os.stat(root), tarfile.DIRTYPE))
        for rel in paths:
            path = root / rel
            st = os.lstat(path)
            name = f"{DIR}/{rel}"
            if stat.S_ISLNK(st.st_mode):
                link = _info(name, st, tarfile.SYMTYPE)
                link.linkname = os.readlink(path)
                tar.addfile(link)
            elif stat.S_ISDIR(st.st_mode):
                tar.addfile(_info(name, st, tarfile.DIRTYPE))
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > MAX_BYTES:
                    raise KubeError(
                        f"{root} holds more than {MAX_BYTES // (1024 * 1024)} MiB, more than "
                        "the code layer takes; leave data out (.dockerignore) and mount it "
                        "from a PVC (--pvc CLAIM:/data)"
                    )
                with open(path, "rb") as fh:
                    tar.addfile(_info(name, st, tarfile.REGTYPE, st.st_size), fh)
            # sockets, fifos and devices have no place in an image: left out
    data = buf.getvalue()
    return CodeContext(data, hashlib.sha256(data).hexdigest(), len(paths), total)
