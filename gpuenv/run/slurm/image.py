"""The image on shared storage: written once per image ID as a SquashFS, which Charliecloud,
Apptainer, enroot/pyxis and (through squashfuse) podman all run, with what each needs.

    DIR/gpuenv/images/<hex of the image ID>.sqfs        the root filesystem
    DIR/gpuenv/images/<hex>.env                         the image's ENV, KEY=VALUE lines
                                                        (ch-run --set-env, podman --env-file)
    DIR/gpuenv/images/<hex>.sh.env                      the same, shell-quoted
                                                        (apptainer --env-file)
    DIR/gpuenv/jobs/gpuenv-<job>.out                    each job's output

Inside the SquashFS, as `enroot import` writes them: /etc/environment (the ENV) and /etc/rc
(the working directory, entrypoint and command). The filesystem comes from the engine as
`docker export` gives it (gpuenv/engine/client.py) and streams into tar2sqfs (squashfs-tools-ng)
without touching the disk; /.dockerenv and /dev's entries are left out, as enroot does.
Deterministic: every timestamp is 0 (tar2sqfs -k) and the files added carry none, so one
image ID gives the same bytes. Written under a temporary name and renamed into place, the
SquashFS last: its presence means the rest is there.
"""

from __future__ import annotations

import io
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.script import ImageFiles, check_path

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo

SHARED_ENV = "GPUENV_SLURM_SHARED"
TAR2SQFS = "tar2sqfs"
# zstd at level 3: the base image (125 MB) packs in 0.5 s against gzip's 11 s, for 4% more
# bytes; the kernel (since 4.14), squashfuse and Charliecloud all read it.
COMPRESSION = ["-c", "zstd", "-X", "level=3"]
# Top directories added (empty) to every SquashFS so that a working directory under them can
# be bound: ch-run 0.31 cannot create a mount point in a read-only image, so it binds the
# working directory's top directory (/home, /scratch, ...), which must exist in the image.
# The working directory's own top directory is added too, when the SquashFS is written.
MOUNT_ROOTS = ("home", "scratch", "work", "project", "projects", "data", "shared", "gpfs",
               "lustre", "nfs", "fs", "global", "users", "mnt", "tmp", "opt", "srv")  # fmt: skip


@dataclass(frozen=True)
class Shared:
    root: Path

    @property
    def images(self) -> Path:
        return self.root / "gpuenv" / "images"

    @property
    def jobs(self) -> Path:
        return self.root / "gpuenv" / "jobs"

    def files(self, image_id: str) -> ImageFiles:
        stem = self.images / image_id.removeprefix("sha256:")
        return ImageFiles(
            squashfs=f"{stem}.sqfs", env_file=f"{stem}.env", shell_env_file=f"{stem}.sh.env"
        )


def shared_dir(option: str | None) -> Shared:
    """--shared DIR, else $GPUENV_SLURM_SHARED: a directory every node mounts at the same
    path (it must exist; gpuenv makes its own gpuenv/ under it)."""
    text = option or os.environ.get(SHARED_ENV, "")
    if not text:
        raise SlurmError(
            f"--slurm needs a directory every node sees at the same path: --shared DIR or "
            f"${SHARED_ENV}"
        )
    where = "--shared" if option else f"${SHARED_ENV}"
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise SlurmError(f"{where} {text}: no such directory (give a directory on shared storage)")
    check_path(str(path), where)
    return Shared(path)


def environment_lines(info: ImageInfo) -> list[str]:
    """The image's ENV, as enroot writes /etc/environment: KEY=VALUE, one a line."""
    return [e for e in info.env if "=" in e and "\n" not in e]


def rc_script(info: ImageInfo) -> str:
    """/etc/rc as `enroot import` writes it (its docker::configure,
    https://github.com/NVIDIA/enroot/blob/master/src/docker.sh): enter the working
    directory, then exec the entrypoint with the command given, or with the image's."""
    q = shlex.quote
    workdir = q(info.working_dir or "/")
    entry = " ".join(q(a) for a in info.entrypoint)
    cmd = " ".join(q(a) for a in info.cmd) if (info.entrypoint or info.cmd) else "/bin/sh"
    given = " ".join(x for x in (entry, '"$@"') if x)
    default = " ".join(x for x in (entry, cmd) if x)
    return (
        f"mkdir -p {workdir} 2> /dev/null\n"
        f"cd {workdir} && unset OLDPWD || exit 1\n\n"
        "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
        f"if [ $# -gt 0 ]; then\n    exec {given}\nelse\n    exec {default}\nfi\n"
    )


def top_directory(cwd: str) -> str:
    """/home/ada/project -> home."""
    return cwd.strip("/").split("/", 1)[0]


def root_entries(squashfs: str) -> set[str] | None:
    """The names in the SquashFS's / (rdsquashfs, squashfs-tools-ng); None if unreadable."""
    tool = shutil.which("rdsquashfs")
    if tool is None:
        return None
    proc = subprocess.run([tool, "-l", "/", squashfs], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    if proc.returncode != 0:
        return None
    return {ln.split()[3] for ln in proc.stdout.splitlines() if len(ln.split()) >= 4}


def ensure(engine: Engine, ref: str, info: ImageInfo, shared: Shared,
           say: Callable[[str], None], cwd: str = "/") -> ImageFiles:  # fmt: skip
    """The image's files on shared storage, written if they are not there yet (with the
    working directory's top directory among the mount points)."""
    files = shared.files(info.id)
    if Path(files.squashfs).is_file():
        say(f"reusing {files.squashfs}")
        return files
    tool = shutil.which(TAR2SQFS)
    if tool is None:
        raise SlurmError(
            "tar2sqfs not found: gpuenv writes the image for the cluster as a SquashFS with it "
            "(Debian/Ubuntu: apt install squashfs-tools-ng)"
        )
    try:
        shared.images.mkdir(parents=True, exist_ok=True)
        shared.jobs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SlurmError(f"--shared {shared.root}: cannot write there ({exc.strerror})") from None
    env = environment_lines(info)
    _write_atomically(Path(files.env_file), "".join(f"{line}\n" for line in env).encode())
    shell = "".join(f"{k}={shlex.quote(v)}\n" for k, _, v in (e.partition("=") for e in env))
    _write_atomically(Path(files.shell_env_file), shell.encode())
    say(f"writing {ref} to {files.squashfs} (once per image ID)")
    extra = {
        "etc/environment": ("\n".join(env) + "\n").encode() if env else b"",
        "etc/rc": rc_script(info).encode(),
    }
    roots = {*MOUNT_ROOTS, top_directory(cwd)} - {""}
    target = Path(files.squashfs)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    argv = [tool, "-q", *COMPRESSION, "-j", str(os.cpu_count() or 1), "-k", "-f", str(tmp)]
    # Its messages go to a file: a pipe nobody reads while the tar streams in could fill.
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err)
        try:
            assert proc.stdin is not None
            try:
                with engine.exported_filesystem(ref) as stream:
                    rewrite(stream, proc.stdin, extra, roots)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # tar2sqfs gave up: its own message says why
            if proc.wait() != 0:
                err.seek(0)
                lines = err.read().decode(errors="replace").strip().splitlines()
                raise SlurmError(f"tar2sqfs failed writing {target}: {(lines or ['?'])[-1]}")
            os.replace(tmp, target)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            tmp.unlink(missing_ok=True)
    return files


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks as a readable stream (for tarfile's stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            try:
                self._left = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def rewrite(chunks: Iterator[bytes], sink: IO[bytes], extra: dict[str, bytes],
            roots: set[str] | frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Copy the exported filesystem's tar to `sink`, without /.dockerenv and /dev's
    entries (the runtimes mount /dev), with `extra` files replacing or added and the top
    directories `roots` added where the image has no such entry."""
    reader = io.BufferedReader(_Chunks(chunks), 1 << 20)
    with (
        tarfile.open(fileobj=reader, mode="r|") as source,
        tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out,
    ):
        seen: set[str] = set()
        for member in source:
            name = member.name.removeprefix("./").rstrip("/")
            seen.add(name)
            if name == ".dockerenv" or name.startswith("dev/") or name in extra:
                continue
            out.addfile(member, source.extractfile(member) if member.isreg() else None)
        for name, data in sorted(extra.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if name == "etc/rc" else 0o644
            out.addfile(info, io.BytesIO(data))
        for name in sorted(roots - seen):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            out.addfile(info)


__all__ = ["MOUNT_ROOTS", "SHARED_ENV", "Shared", "ensure", "environment_lines", "rc_script",
           "rewrite", "root_entries", "shared_dir", "top_directory"]  # fmt: skip
