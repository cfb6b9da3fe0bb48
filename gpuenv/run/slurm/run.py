"""`gpuenv slurm run`: options checked, the image written to shared storage, the batch
job submitted and followed.

Exit codes as local `gpuenv run`: the job's (its first failing task's, 128+N for a signal),
125 for gpuenv's own failures (no Slurm on PATH, a request sbatch refuses, such as "Requested
node configuration is not available", a job pending for a reason that never clears, a job
someone else cancelled, a node that failed), 124 when the job ran past --time, 127 for a
script that is not there, 130/143 after Ctrl-C/SIGTERM, which cancel the job (scancel) and
wait until Slurm has ended its processes.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gpuenv.run.console import say, warn
from gpuenv.run.interrupts import Interrupted, raising_interrupted, signals_to
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.jobs import NEVER, Job, Slurm
from gpuenv.run.slurm.script import (
    DEFAULT_RUNTIME,
    RUNTIMES,
    JobInputs,
    batch_script,
    check_partition,
    check_path,
    job_name,
    output_path,
    parse_time,
)

Tail = Callable[[int, BinaryIO], int]  # (offset, out) -> the new offset
POLL_SECONDS = 0.5
CANCEL_PATIENCE = 120  # seconds for Slurm to end a cancelled job's processes (KillWait...)


@dataclass
class SlurmOptions:
    command: list[str]
    image: str | None = None
    env: list[str] = field(default_factory=list)
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    time: str | None = None
    runtime: str = DEFAULT_RUNTIME
    shared: str | None = None
    detach: bool = False
    dry_run: bool = False
    file: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)
    login: str | None = None  # [USER@]HOST[:PORT]: Slurm over ssh (login.py)


def check(opts: SlurmOptions) -> tuple[str | None, str | None]:
    """Every option, before Slurm or the engine are reached: (--time, --partition)."""
    if opts.nodes < 1:
        raise SlurmError(f"--nodes {opts.nodes}: expected 1 or more")
    if opts.gpus_per_node < 0:
        raise SlurmError(f"--gpus-per-node {opts.gpus_per_node}: expected 0 or more")
    if opts.runtime not in RUNTIMES:
        raise SlurmError(f"--runtime {opts.runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if opts.detach and opts.dry_run:
        raise SlurmError("--detach and --dry-run: give one")
    if str(opts.cwd) == "/":
        raise SlurmError("run gpuenv from your project directory: it binds the current directory")
    return (
        parse_time(opts.time) if opts.time else None,
        check_partition(opts.partition) if opts.partition else None,
    )


def submit(opts: SlurmOptions) -> int:
    from gpuenv.engine import client as engine
    from gpuenv.run import options, target
    from gpuenv.run.slurm import image

    time_limit, partition = check(opts)
    check_path(str(opts.cwd), "the working directory")
    argv = options.command_for(opts.command, opts.cwd)
    env = options.parse_env(opts.env)
    # Slurm first: no point writing gigabytes to find out there is no cluster. A dry run
    # needs none (it still asks sbatch --test-only when there is one).
    slurm = find_slurm(required=not opts.dry_run)
    shared = image.shared_dir(opts.shared)
    project = target.project_for(opts.image, opts.file)
    eng = engine.connect()
    try:
        chosen = target.choose(eng, opts.image, project, "--gpus-per-node N",
                               opts.gpus_per_node > 0)  # fmt: skip
        info = eng.image(chosen.image)
        if info is None:
            raise SlurmError(f"image {chosen.image} not found in the engine")
        what = chosen.cell.name if chosen.cell else chosen.image
        inputs = JobInputs(
            name=job_name(what), command=tuple(argv), image=shared.files(info.id),
            image_id=info.id, what=what, cwd=str(opts.cwd), jobs_dir=str(shared.jobs),
            runtime=opts.runtime, nodes=opts.nodes, gpus_per_node=opts.gpus_per_node,
            partition=partition, time=time_limit, env=tuple(env.items()),
        )  # fmt: skip
        script = batch_script(inputs)
        # Asked before the image is written: a request the cluster can never satisfy
        # ("Requested node configuration is not available") costs no SquashFS.
        verdict = slurm.test_only(script) if slurm is not None else None
        if opts.dry_run:
            return print_script(script, verdict)
        files = image.ensure(eng, chosen.image, info, shared, say, str(opts.cwd))
    finally:
        eng.close()
    if opts.runtime == "charliecloud":
        check_mount_point(files.squashfs, str(opts.cwd))
    assert slurm is not None
    return submit_and_follow(slurm, script, str(shared.jobs), opts)


def print_script(script: str, verdict: str | None) -> int:
    """--dry-run: the batch script on stdout, sbatch --test-only's answer when there was one."""
    sys.stdout.write(script)
    sys.stdout.flush()
    if verdict:
        say(f"sbatch --test-only: {verdict}")
    return 0


def submit_and_follow(slurm: Slurm, script: str, jobs_dir: str, opts: SlurmOptions) -> int:
    """Submit the batch script on this machine's Slurm, then follow the job to its end (its
    exit code), or print its ID and return with --detach."""
    job_id = slurm.submit(script)
    out = output_path(jobs_dir, job_id)
    say(f"submitted batch job {job_id} ({opts.nodes} node(s), runtime {opts.runtime}); "
        f"output: {out}")  # fmt: skip
    if opts.detach:
        print(job_id)
        return 0
    return attach(slurm, job_id, Path(out))


def check_mount_point(squashfs: str, cwd: str) -> None:
    """ch-run binds the working directory's top directory, which must be in the image (a
    SquashFS written from another directory may lack it)."""
    from gpuenv.run.slurm.image import root_entries, top_directory

    top = top_directory(cwd)
    entries = root_entries(squashfs)
    if entries is not None and top not in entries:
        raise SlurmError(
            f"the working directory {cwd}: /{top} is not in {squashfs} (written from another "
            "directory), and Charliecloud cannot create it in a read-only image; remove that "
            "file to have it written again from here, or use --runtime apptainer or pyxis"
        )


def find_slurm(required: bool) -> Slurm | None:
    try:
        return Slurm.find()
    except SlurmError:
        if required:
            raise
        return None


def attach(slurm: Slurm, job_id: str, out_path: Path, *, tail: Tail | None = None,
           sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    """Follow the job to its exit code; Ctrl-C or SIGTERM cancel it (scancel) and wait for
    Slurm to end its processes."""
    try:
        with raising_interrupted():
            return follow(slurm, job_id, out_path, sys.stdout.buffer, sleep=sleep, tail=tail)
    except (Interrupted, KeyboardInterrupt) as exc:
        code = exc.code if isinstance(exc, Interrupted) else 130
        # A second signal while cancelling must not leave the job running.
        with signals_to(signal.SIG_IGN):
            _cancel(slurm, job_id, sleep)
        return code


def _cancel(slurm: Slurm, job_id: str, sleep: Callable[[float], None]) -> None:
    with suppress(SlurmError):
        slurm.cancel(job_id)
        deadline = time.monotonic() + CANCEL_PATIENCE
        while time.monotonic() < deadline:
            job = slurm.job(job_id)
            if job is None or job.ended:
                say(f"cancelled job {job_id}")
                return
            sleep(POLL_SECONDS)
        warn(f"job {job_id} was cancelled but Slurm still ends its processes (squeue -j {job_id})")


def follow(slurm: Slurm, job_id: str, out_path: Path, out: BinaryIO, *,
           tail: Tail | None = None,
           sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    """Pending reasons in words, the job's output as it grows (`tail`: what the output
    gained since an offset, written to `out`; the output file here by default), then its
    exit code."""

    def _copy_new(path: Path, offset: int, out: BinaryIO) -> int:
        return tail(offset, out) if tail is not None else _copy_file(path, offset, out)

    offset = 0
    said = ""
    while True:
        job = slurm.job(job_id)
        offset = _copy_new(out_path, offset, out)
        if job is None:
            raise SlurmError(
                f"Slurm no longer knows job {job_id} (it forgets ended jobs after MinJobAge); "
                f"its output is in {out_path}"
            )
        if job.pending:
            if job.reason in NEVER:
                _cancel(slurm, job_id, sleep)
                why = job.reason_words()
                raise SlurmError(f"job {job_id} can never start: {why}; cancelled it")
            line = f"job {job_id} pending: {job.reason_words()}"
        elif job.ended:
            sleep(POLL_SECONDS)  # shared storage may show the last bytes a moment later
            _copy_new(out_path, offset, out)
            lost = slurm.lost_nodes(job.nodes) if job.state == "NODE_FAIL" else []
            return exit_code(job, lost)
        else:
            line = f"job {job_id} {job.state.lower()} on {job.nodes}"
        if line != said:
            say(line)
            said = line
        sleep(POLL_SECONDS)


def exit_code(job: Job, lost: list[str] | None = None) -> int:
    """The ended job's exit code, as the batch script (its first failing task) gave it;
    `lost`: the nodes Slurm holds down, named when it failed the job for a node."""
    if job.state in ("COMPLETED", "FAILED"):
        return 128 + job.signal if job.signal else job.exit_code
    if job.state == "TIMEOUT":
        say(f"job {job.id} ran past --time: Slurm ended it")
        return 124
    if job.state == "OUT_OF_MEMORY":
        say(f"job {job.id} ran out of memory on {job.nodes}")
        return 137
    words = {
        "CANCELLED": "was cancelled (scancel, or an administrator)",
        "NODE_FAIL": f"failed: Slurm lost node {', '.join(lost)} of {job.nodes}"
        if lost
        else f"lost a node ({job.nodes})",
        "PREEMPTED": "was preempted",
        "BOOT_FAIL": "could not boot its nodes",
        "DEADLINE": "reached its deadline",
    }
    raise SlurmError(f"job {job.id} {words.get(job.state, job.state)}")


def _copy_file(path: Path, offset: int, out: BinaryIO) -> int:
    """Write what the output file gained since `offset`; the new offset."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            while chunk := fh.read(1 << 16):
                out.write(chunk)
                offset += len(chunk)
    except FileNotFoundError:
        return offset  # not started yet
    out.flush()
    return offset


__all__ = ["SlurmOptions", "attach", "exit_code", "follow", "submit"]
