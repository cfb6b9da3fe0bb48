"""The image on shared storage: written once per image ID as a SquashFS, which Charliecloud,
Apptainer, enroot/pyxis and (through squashfuse) podman all run, with what each needs.

    DIR/gpuenv-<uid>/                                   this user's alone: 0700, owned, checked
    DIR/gpuenv-<uid>/images/<hex of the image ID>.sqfs  the root filesystem
    DIR/gpuenv-<uid>/images/<hex>.env                   the image's ENV, KEY=VALUE lines
                                                        (ch-run --set-env, podman --env-file)
    DIR/gpuenv-<uid>/images/<hex>.sh.env                the same, shell-quoted
                                                        (apptainer --env-file)
    DIR/gpuenv-<uid>/jobs/gpuenv-<job>.out              each job's output (and .failed)

DIR is shared with other users, so gpuenv writes there only through
gpuenv/store/private.py (a directory of its own, files created O_EXCL|O_NOFOLLOW 0600) and
reuses an image only when its three files hash as they did when this user wrote them: the
sha256 of each is recorded in the cache on the login node (RECORD), not beside them.

Inside the SquashFS, as `enroot import` writes them: /etc/environment (the ENV) and /etc/rc
(the working directory, entrypoint and command). The filesystem comes from the engine as
`docker export` gives it (gpuenv/engine/client.py), or, where there is no engine, from a
registry's layers flattened (registry_image.py, keyed by manifest digest instead of image
ID), and streams into tar2sqfs (squashfs-tools-ng); /.dockerenv and /dev's entries are left
out, as enroot does.
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
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from gpuenv.matrix.errors import GpuenvError
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.script import ImageFiles, check_path
from gpuenv.run.sync import Chunks
from gpuenv.store import private

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo

SHARED_ENV = "GPUENV_SLURM_SHARED"
RECORD = "slurm-images.json"  # in the cache: SquashFS path -> sha256 of its three files
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
    root: Path  # resolved: no symbolic link in it (with --login: a path on the cluster)
    uid: int = field(default_factory=os.getuid)  # the user's, where DIR is

    @property
    def own(self) -> Path:
        return self.root / f"gpuenv-{self.uid}"

    @property
    def images(self) -> Path:
        return self.own / "images"

    @property
    def jobs(self) -> Path:
        return self.own / "jobs"

    def files(self, image_id: str) -> ImageFiles:
        stem = self.images / image_id.removeprefix("sha256:")
        return ImageFiles(
            squashfs=f"{stem}.sqfs", env_file=f"{stem}.env", shell_env_file=f"{stem}.sh.env"
        )

    def make(self) -> None:
        """gpuenv's own directories under DIR, made or checked (store/private.py)."""
        try:
            own = private.own_directory(self.root, self.own.name, "--shared")
            for sub in (self.images, self.jobs):
                private.own_directory(own, sub.name, "--shared")
        except GpuenvError as exc:
            raise SlurmError(exc.message) from None


def shared_dir(option: str | None) -> Shared:
    """--shared DIR, else $GPUENV_SLURM_SHARED: a directory every node mounts at the same
    path (it must exist, and no other user may be able to replace what is in it; gpuenv
    makes its own gpuenv-<uid>/ under it)."""
    text = option or os.environ.get(SHARED_ENV, "")
    if not text:
        raise SlurmError(
            f"slurm run needs a directory every node sees at the same path: --shared DIR or "
            f"${SHARED_ENV}"
        )
    where = "--shared" if option else f"${SHARED_ENV}"
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise SlurmError(f"{where} {text}: no such directory (give a directory on shared storage)")
    check_path(str(path), where)
    try:
        private.check_unswappable(path, where)
    except GpuenvError as exc:
        raise SlurmError(exc.message) from None
    return Shared(path)


def environment_lines(info: ImageInfo) -> list[str]:
    """The image's ENV, as enroot writes /etc/environment: KEY=VALUE, one a line."""
    return [e for e in info.env if "=" in e and "\n" not in e]


def rc_script(info: ImageInfo) -> str:
    """/etc/rc as `enroot import` writes it (its docker::configure,
    https://github.com/NVIDIA/enroot/blob/master/src/docker.sh): enter the working
    directory, then exec the entrypoint with the command given, or with the image's."""
    workdir = shlex.quote(info.working_dir or "/")
    entry = shlex.join(info.entrypoint)
    cmd = shlex.join(info.cmd) if (info.entrypoint or info.cmd) else "/bin/sh"
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
    """The image's files on shared storage, written if they are not there yet, or not as
    this user wrote them (with the working directory's top directory among the mount
    points): the engine's `docker export` of it, once per image ID."""

    def exported(sink: IO[bytes], extra: dict[str, bytes], roots: set[str]) -> None:
        with engine.exported_filesystem(ref) as stream:
            rewrite(stream, sink, extra, roots)

    return ensure_from(lambda: nullcontext(exported), info.id, ref, info, shared, say, cwd)


# Writes the image's root filesystem as one tar to the sink, through rewrite_members (the
# engine's export, or layers flattened from a registry: registry_image.py).
Filesystem = Callable[[IO[bytes], dict[str, bytes], set[str]], None]
# What gives a Filesystem once the image must be written (a registry's layers fetched and
# checked first, so that a blob that lies leaves nothing written), and cleans up after.
Prepare = Callable[[], AbstractContextManager[Filesystem]]


def ensure_from(prepare: Prepare, key: str, ref: str, info: ImageInfo, shared: Shared,
                say: Callable[[str], None], cwd: str = "/") -> ImageFiles:  # fmt: skip
    """The image's files on shared storage under `key` (an image ID, or a manifest digest),
    written from what `prepare` gives if they are not there yet or not as this user wrote
    them."""
    shared.make()
    files = shared.files(key)
    if os.path.lexists(files.squashfs):
        if _as_written(files):
            say(f"reusing {files.squashfs}")
            return files
        say(f"{files.squashfs} is not as gpuenv wrote it (changed since, or written where this "
            "login node keeps no record of it): writing it again")  # fmt: skip
    tool = shutil.which(TAR2SQFS)
    if tool is None:
        raise SlurmError(
            "tar2sqfs not found: gpuenv writes the image for the cluster as a SquashFS with it "
            "(Debian/Ubuntu: apt install squashfs-tools-ng)"
        )
    once = "image ID" if key == info.id else "manifest digest"
    say(f"writing {ref} to {files.squashfs} (once per {once})")
    try:
        with prepare() as filesystem:
            _write(filesystem, info, shared.images, files, tool, cwd)
    except OSError as exc:
        raise SlurmError(
            f"--shared {shared.root}: cannot write {exc.filename or shared.images} "
            f"({exc.strerror or exc})"
        ) from None
    _remember(files)
    return files


def _write(filesystem: Filesystem, info: ImageInfo, images: Path, files: ImageFiles,
           tool: str, cwd: str) -> None:  # fmt: skip
    env = environment_lines(info)
    private.write_file(images, Path(files.env_file).name,
                       "".join(f"{line}\n" for line in env).encode())  # fmt: skip
    shell = "".join(f"{k}={shlex.quote(v)}\n" for k, _, v in (e.partition("=") for e in env))
    private.write_file(images, Path(files.shell_env_file).name, shell.encode())
    extra = {
        "etc/environment": ("\n".join(env) + "\n").encode() if env else b"",
        "etc/rc": rc_script(info).encode(),
    }
    roots = {*MOUNT_ROOTS, top_directory(cwd)} - {""}
    target = Path(files.squashfs)
    # tar2sqfs -f writes into the file made here (0600, O_EXCL in a directory of ours).
    with private.new_file(images, target.name) as (fd, tmp):
        os.close(fd)
        argv = [tool, "-q", *COMPRESSION, "-j", str(os.cpu_count() or 1), "-k", "-f", str(tmp)]
        # Its messages go to a file: a pipe nobody reads while the tar streams in could fill.
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err)
            try:
                assert proc.stdin is not None
                try:
                    filesystem(proc.stdin, extra, roots)
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # tar2sqfs gave up: its own message says why
                if proc.wait() != 0:
                    err.seek(0)
                    lines = err.read().decode(errors="replace").strip().splitlines()
                    raise SlurmError(f"tar2sqfs failed writing {target}: {(lines or ['?'])[-1]}")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def _digests(files: ImageFiles) -> dict[str, str | None]:
    paths = (files.squashfs, files.env_file, files.shell_env_file)
    return {p: private.sha256_of(Path(p)) for p in paths}


def _as_written(files: ImageFiles) -> bool:
    """Whether the three files hash as they did when this user wrote them."""
    from gpuenv.store.cache import read_record

    recorded = read_record(RECORD).get(files.squashfs)
    digests = _digests(files)
    return isinstance(recorded, dict) and None not in digests.values() and recorded == digests


def _remember(files: ImageFiles) -> None:
    """Record the files' digests (records of SquashFS files gone since are dropped). Without
    a cache directory nothing is recorded, and the next run writes the image again."""
    from gpuenv.store.cache import read_record, write_record

    records = {p: d for p, d in read_record(RECORD).items() if os.path.lexists(p)}
    records[files.squashfs] = _digests(files)
    write_record(RECORD, records)


def rewrite(chunks: Iterator[bytes], sink: IO[bytes], extra: dict[str, bytes],
            roots: set[str] | frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Copy the exported filesystem's tar to `sink` (rewrite_members)."""
    reader = io.BufferedReader(Chunks(chunks), 1 << 20)
    with tarfile.open(fileobj=reader, mode="r|") as source:
        members = ((m, source.extractfile(m) if m.isreg() else None) for m in source)
        rewrite_members(members, sink, extra, roots)


Member = tuple[tarfile.TarInfo, IO[bytes] | None]  # an entry and, for a file, its bytes


def rewrite_members(members: Iterable[Member], sink: IO[bytes], extra: dict[str, bytes],
                    roots: set[str] | frozenset[str] = frozenset()) -> None:  # fmt: skip
    """Write the root filesystem's entries to `sink` as one tar, without /.dockerenv and
    /dev's entries (the runtimes mount /dev), with `extra` files replacing or added and the
    top directories `roots` added where the image has no such entry."""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:
        seen: set[str] = set()
        for member, body in members:
            name = member.name.removeprefix("./").rstrip("/")
            seen.add(name)
            if name == ".dockerenv" or name.startswith("dev/") or name in extra:
                continue
            out.addfile(member, body if member.isreg() else None)
        for name, data in sorted(extra.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if name == "etc/rc" else 0o644
            out.addfile(info, io.BytesIO(data))
        for name in sorted(roots - seen):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            out.addfile(info)


__all__ = ["MOUNT_ROOTS", "SHARED_ENV", "Filesystem", "Member", "Prepare", "Shared", "ensure",
           "ensure_from", "environment_lines", "rc_script", "rewrite", "rewrite_members",
           "root_entries", "shared_dir", "top_directory"]  # fmt: skip
