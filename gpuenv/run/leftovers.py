"""What gpuenv leaves behind, listed and pruned (`gpuenv prune`).

- On the engine: the working-directory volumes a remote engine keeps (run/sync.py: one per
  client host, user and path, labelled with that owner);
- on a Slurm cluster's shared directory (run/slurm/image.py, `gpuenv-<uid>/`): the jobs'
  output and failure files, and the images' SquashFS files; read here on a login node
  (`--shared`), or over ssh from anywhere (`--login`, run/slurm/cluster_files.py), which
  also finds `slurm run --login`'s job directories (`work/`, each the copy of a client's
  directory, whose `host:path` was recorded beside it), and then also the SquashFS copies
  `slurm run --login` wrote in this machine's cache before sending them (no job mounts
  those: stale once the engine no longer has their image).

Only the user's own are ever listed for removal: a volume whose label names another user or
another client host is counted and left alone, and the shared directory's part is the
user's own `gpuenv-<uid>/`, checked as `slurm run` checks it. What is stale, and so removed
by default: a volume whose directory is gone from this host (its copy can never be used
again); a job's files once Slurm says the job ended (or has forgotten it); a SquashFS whose
image the engine no longer has, and a job directory whose directory is gone from this host,
once no job of the user's is pending or running (gpuenv cannot tell which image a queued job
mounts, nor in which directory it runs). `--all` removes every one of the user's that
nothing can be using; `--dry-run` removes nothing.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.building.results import human_size
from gpuenv.engine.client import EngineError, VolumeInfo

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.run.slurm.cluster_files import ClusterDir, ClusterFiles
    from gpuenv.run.slurm.image import Shared


@dataclass(frozen=True)
class Leftover:
    kind: str  # "volume", "job file", "SquashFS"
    name: str  # the volume's name, the file's path
    size: int  # bytes; -1 where unknown
    mirrors: str  # what it is a copy of: the directory, the job, the image ID
    why: str  # its state, in words
    stale: bool  # removed without --all
    in_use: bool = False  # never removed, --all or not
    there: str | None = None  # on a cluster over ssh: the path under gpuenv-<uid>/

    def removable(self, everything: bool) -> bool:
        return not self.in_use and (self.stale or everything)


def own_volumes(
    found: list[VolumeInfo], label: str, uid: int, exists: Callable[[str], bool]
) -> tuple[list[Leftover], int]:
    """The user's volumes among `found` (their `label` is `<this host>:<uid>:<path>`, as
    run/sync.py writes it), and how many volumes of other users or hosts were left alone."""
    prefix = f"{socket.gethostname()}:{uid}:"
    mine: list[Leftover] = []
    others = 0
    for volume in sorted(found, key=lambda v: v.name):
        owner = volume.labels.get(label, "")
        if not owner.startswith(prefix):
            others += 1
            continue
        path = owner.removeprefix(prefix)
        if volume.in_use:
            why, stale = "a container has it mounted", False
        elif exists(path):
            why, stale = "the directory is here", False
        else:
            why, stale = "the directory is gone", True
        mine.append(Leftover("volume", volume.name, volume.size, path, why, stale,
                             volume.in_use))  # fmt: skip
    return mine, others


JOB_FILE = re.compile(r"gpuenv-(\d+)\.(out|failed)")


def shared_files(
    jobs: Path,
    images: Path,
    job_ended: Callable[[str], bool | None],
    engine_has: Callable[[str], bool],
) -> list[Leftover]:
    """The job files under `jobs` and the SquashFS files under `images` (the user's own
    directories). `job_ended` answers for a job ID from Slurm, None where Slurm cannot be
    asked: then the job's files stay, and so do the SquashFS files (it may be running)."""
    job_files = [(str(p), _size(p)) for p in _files(jobs) if JOB_FILE.fullmatch(p.name)]
    squashfs = [
        (str(p), sum(_size(q) for q in (p, p.with_suffix(".env"), p.with_suffix(".sh.env"))))
        for p in _files(images)
        if p.suffix == ".sqfs"
    ]
    found = _job_files(job_files, job_ended)
    return found + _images(squashfs, any(f.in_use for f in found), engine_has)


def _job_files(
    files: list[tuple[str, int]], job_ended: Callable[[str], bool | None]
) -> list[Leftover]:
    found = []
    for path, size in files:
        job = _job_id(path)
        ended = job_ended(job)
        if ended is None:
            why, stale, busy = "Slurm cannot be asked whether the job ended", False, True
        elif ended:
            why, stale, busy = "the job ended", True, False
        else:
            why, stale, busy = "the job is pending or running", False, True
        found.append(Leftover("job file", path, size, f"job {job}", why, stale, busy))
    return found


def _job_id(path: str) -> str:
    match = JOB_FILE.fullmatch(path.rsplit("/", 1)[-1])
    return match.group(1) if match else ""


def _images(
    files: list[tuple[str, int]], busy_jobs: bool, engine_has: Callable[[str], bool]
) -> list[Leftover]:
    found = []
    for path, size in files:
        image_id = f"sha256:{path.rsplit('/', 1)[-1].removesuffix('.sqfs')}"
        if busy_jobs:
            why, stale, busy = "a job of yours may still mount it", False, True
        elif engine_has(image_id):
            why, stale, busy = "the engine has the image: the next run uses it", False, False
        else:
            why, stale, busy = "the engine no longer has the image", True, False
        found.append(Leftover("SquashFS", path, size, image_id, why, stale, busy))
    return found


def cluster_leftovers(
    files: ClusterFiles,
    who: str,
    engine_has: Callable[[str], bool],
    here: str,
    exists: Callable[[str], bool],
) -> list[Leftover]:
    """What the listing over ssh found (cluster_files.py), judged as on a login node; a job
    directory is stale when it copies a directory of this host (`here`) that is gone, once
    no job of the user's is pending or running. Named `who:path`."""

    def named(rel: str) -> str:
        return f"{who}:{files.own}/{rel}"

    found = _job_files(files.jobs, files.job_ended)
    busy_jobs = files.queue is None or bool(files.queue)
    found += _images(files.images, busy_jobs, engine_has)
    for path, size, record in files.work:
        host, colon, mirrored = record.partition(":")
        if busy_jobs:
            why, stale = "a job of yours may still run in it", False
        elif not colon:
            why, stale = "made before gpuenv recorded the directory it copies", False
        elif host != here:
            why, stale = f"a copy of {host}'s directory: whether it is gone is known there", False
        elif exists(mirrored):
            why, stale = "the directory is here: the next run sends only what changed", False
        else:
            why, stale = "the directory is gone", True
        found.append(Leftover("job directory", path, size, record or "an unknown directory",
                              why, stale, busy_jobs))  # fmt: skip
    return [
        Leftover(f.kind, named(f.name), f.size, f.mirrors, f.why, f.stale, f.in_use, f.name)
        for f in found
    ]


def remove_files(leftover: Leftover) -> None:
    """A job file, or a SquashFS with the environment files written beside it."""
    path = Path(leftover.name)
    for each in (path, path.with_suffix(".env"), path.with_suffix(".sh.env")):
        if leftover.kind == "SquashFS" or each == path:
            each.unlink(missing_ok=True)


def line(leftover: Leftover, removed: bool, dry_run: bool) -> str:
    """One line per leftover: kind, name, size, what it copies, its state and the verdict."""
    if removed:
        verdict = "would remove" if dry_run else "removed"
    elif leftover.in_use:
        verdict = "kept"
    else:
        verdict = "kept (--all removes it)"
    size = human_size(leftover.size if leftover.size >= 0 else None)
    return (f"{leftover.kind} {leftover.name}  {size}  {leftover.mirrors}: "
            f"{leftover.why}; {verdict}")  # fmt: skip


def _files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    except FileNotFoundError:
        return []


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def prune(
    engine: Engine, shared: Shared | ClusterDir | None, *, everything: bool, dry_run: bool
) -> list[str]:
    """List the user's leftovers on `engine` and, with `shared`, on the cluster's shared
    directory (here, or over ssh: a ClusterDir); remove the stale ones (`everything`: all
    that nothing can be using) unless `dry_run`. The lines to print, the summary last."""
    from gpuenv.run.slurm import cluster_files
    from gpuenv.run.slurm.image import Shared
    from gpuenv.run.slurm.login import cache_copies
    from gpuenv.run.sync import VOLUME_LABEL

    found, others = own_volumes(engine.volumes(VOLUME_LABEL), VOLUME_LABEL, os.getuid(),
                                os.path.isdir)  # fmt: skip

    def engine_has(image_id: str) -> bool:
        return engine.image(image_id) is not None

    if isinstance(shared, Shared) and shared.own.exists():
        shared.make()  # the user's own gpuenv-<uid>/, checked as slurm run checks it
        found += shared_files(shared.jobs, shared.images, _job_ended(), engine_has)
    elif isinstance(shared, cluster_files.ClusterDir):
        there = cluster_files.listing(shared)
        found += cluster_leftovers(there, shared.login.who, engine_has, socket.gethostname(),
                                   os.path.isdir)  # fmt: skip
        # The SquashFS copies written here before they were sent: no job mounts them.
        copies = cache_copies()
        if copies is not None and copies.own.exists():
            copies.make()
            found += shared_files(copies.jobs, copies.images, lambda job: True, engine_has)
    removed_there: set[str] = set()
    if isinstance(shared, cluster_files.ClusterDir) and not dry_run:
        removed_there = cluster_files.remove(
            shared, [f.there for f in found if f.there and f.removable(everything)]
        )
    lines, gone, freed = [], 0, 0
    for leftover in found:
        remove = leftover.removable(everything)
        if remove and not dry_run:
            try:
                if leftover.kind == "volume":
                    engine.remove_volume(leftover.name)
                elif leftover.there is not None:
                    if leftover.there not in removed_there:
                        raise OSError("it could not be removed there")
                else:
                    remove_files(leftover)
            except (EngineError, OSError) as exc:
                lines.append(f"{line(leftover, False, dry_run)} ({exc})")
                continue
        lines.append(line(leftover, remove, dry_run))
        gone += remove
        freed += max(leftover.size, 0) if remove else 0
    verb = "would remove" if dry_run else "removed"
    alone = f"; {others} volume(s) of other users or hosts left alone" if others else ""
    lines.append(f"gpuenv prune: {verb} {gone} of {len(found)} ({human_size(freed)}){alone}")
    return lines


def _job_ended() -> Callable[[str], bool | None]:
    """Whether Slurm says a job ended (or has forgotten it); None where it cannot be asked
    (no Slurm commands here, slurmctld not answering)."""
    from gpuenv.run.slurm import SlurmError
    from gpuenv.run.slurm.jobs import Slurm

    try:
        slurm: Slurm | None = Slurm.find()
    except SlurmError:
        slurm = None

    def ended(job_id: str) -> bool | None:
        if slurm is None:
            return None
        try:
            job = slurm.job(job_id)
        except SlurmError:
            return None
        return job is None or job.ended

    return ended
