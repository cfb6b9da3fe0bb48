"""The batch script `gpuenv slurm run` submits: generated from the job's inputs alone.

One task per node (`--ntasks-per-node=1`): a launcher such as torchrun starts one process
per GPU inside it. Every task runs the workload in the image through the chosen runtime,
with the working directory bound at the same path and current, as the caller. The first
task that fails writes its exit code to a file beside the job's output; `srun
--kill-on-bad-exit=1` then ends the other tasks (a rank left waiting in a collective would
hang until --time), and the batch script exits with that first code rather than srun's
highest (which would be the 143 of a task it killed).

The job gets none of the login node's environment but what gpuenv names (EXPORTED, Slurm's
own SLURM_* always) and the user's -e variables, which the script exports: sbatch is given
that environment alone (`submission_environment`) and `--export` with those names, so
neither a site's SBATCH_EXPORT nor Slurm's default (ALL) can bring the rest (an index
password, cloud keys) into the job and its container. srun inside the script passes the
script's environment on (`--export=ALL`: sbatch's list would drop what the script sets).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuenv.run.slurm import SlurmError

RUNTIMES = ("charliecloud", "apptainer", "pyxis", "podman")
DEFAULT_RUNTIME = "charliecloud"
# torch.distributed's default is 29500; a port derived from the job ID keeps two jobs that
# share a first node apart.
MASTER_PORT_BASE = 20000

# Characters a path may hold on an #SBATCH line and in srun's comma-separated mount lists.
_SAFE_PATH = re.compile(r"/[A-Za-z0-9._+@/-]*")
_NAME = re.compile(r"[A-Za-z0-9._-]+")
# -e names become `export NAME=...` lines of a shell script: shell identifiers only.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a job gets from the login node's environment besides SLURM_* and -e: where programs
# are (ch-run, srun, squashfuse), who and where the user is, the locale and temporary
# directory, and the runtime directory podman needs. Names absent here are skipped by sbatch.
EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR",
            "XDG_RUNTIME_DIR")  # fmt: skip
# Slurm's input variables that would widen --export (sbatch(1), srun(1)).
WIDENING = ("SBATCH_EXPORT", "SLURM_EXPORT_ENV", "SBATCH_GET_USER_ENV")


# ---------------------------------------------------------------------- --time


def parse_time(text: str) -> str:
    """--time in Slurm's own syntax (sbatch(1), --time): MINUTES, MINUTES:SECONDS,
    HOURS:MINUTES:SECONDS, DAYS-HOURS, DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS, or
    UNLIMITED. Returned as D-HH:MM:SS (or UNLIMITED), which every Slurm reads the same."""
    raw = text.strip()
    if raw.upper() in ("UNLIMITED", "INFINITE"):
        return "UNLIMITED"
    seconds = _seconds(raw)
    if seconds is None or seconds <= 0:
        raise SlurmError(
            f"--time {text!r}: expected Slurm's syntax, e.g. 30 (minutes), 1:30:00, 2-00:00:00 "
            "(MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS[:MINUTES[:SECONDS]]) "
            "or UNLIMITED"
        )
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def _seconds(raw: str) -> int | None:
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", raw):
        return None
    days_text, dash, clock = raw.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if dash:  # DAYS-HOURS[:MINUTES[:SECONDS]]
        hours, minutes, secs = [*parts, 0, 0][:3]
        if hours > 23 or minutes > 59 or secs > 59:
            return None
        return int(days_text) * 86400 + hours * 3600 + minutes * 60 + secs
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        minutes, secs = parts
        return None if secs > 59 else minutes * 60 + secs
    hours, minutes, secs = parts
    return None if minutes > 59 or secs > 59 else hours * 3600 + minutes * 60 + secs


# ---------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class ImageFiles:
    """Where the image is on shared storage (gpuenv/run/slurm/image.py writes them)."""

    squashfs: str
    env_file: str  # KEY=VALUE lines, as the image's ENV (ch-run --set-env)
    shell_env_file: str  # KEY='VALUE' lines (apptainer --env-file)


@dataclass(frozen=True)
class JobInputs:
    name: str
    command: tuple[str, ...]
    image: ImageFiles
    image_id: str
    what: str  # the cell's name or the image reference, for the script's header
    cwd: str
    jobs_dir: str  # on shared storage: the job's output and its first failure's code
    runtime: str = DEFAULT_RUNTIME
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    time: str | None = None  # parse_time's form
    env: tuple[tuple[str, str], ...] = ()
    # REGISTRY/REPO@sha256:... for a runtime that pulls the image itself (pyxis, apptainer,
    # podman under --from-registry, verified by gpuenv first: registry_image.py); "" runs
    # the SquashFS.
    pull: str = ""


def enroot_uri(ref: str) -> str:
    """REGISTRY/REPO@sha256:... as enroot names it, REGISTRY#REPO@sha256:... (its docker://
    URI: https://github.com/NVIDIA/enroot/blob/master/doc/cmd/import.md; the @digest form is
    parsed by enroot's docker::_parse_uri, src/docker.sh): `#` keeps a registry with a port
    from being read as a Docker Hub namespace."""
    host, _, repository = ref.partition("/")
    return f"{host}#{repository}"


def check_path(path: str, what: str) -> str:
    """A path Slurm's #SBATCH lines and srun's mount lists carry as is."""
    if not _SAFE_PATH.fullmatch(path):
        raise SlurmError(
            f"{what} {path!r}: Slurm's #SBATCH lines and mount lists cannot carry spaces, "
            "quotes, commas, colons or % in a path; use a path without them"
        )
    return path


def check_env(env: tuple[tuple[str, str], ...]) -> None:
    """-e names: each is written as `export NAME=...` in the script."""
    for key, _ in env:
        if not _ENV_NAME.fullmatch(key):
            raise SlurmError(
                f"-e {key[:80]!r}: under slurm run a name is a shell variable's (letters, digits "
                "and _, not starting with a digit)"
            )


def submission_environment(environ: dict[str, str]) -> dict[str, str]:
    """What sbatch runs with: EXPORTED, and Slurm's SLURM_*/SBATCH_* settings (the cluster's
    configuration, an account) less those that would widen --export."""
    return {
        k: v
        for k, v in environ.items()
        if (k in EXPORTED or k.startswith(("SLURM_", "SBATCH_"))) and k not in WIDENING
    }


def check_partition(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise SlurmError(f"--partition {name!r}: expected a partition name (letters, digits, ._-)")
    return name


def job_name(what: str) -> str:
    """gpuenv-<cell> (an image reference: its last path part), as squeue shows it."""
    tail = what.rsplit("/", 1)[-1].split("@", 1)[0].replace(":", "-")
    return "gpuenv-" + (re.sub(r"[^A-Za-z0-9._-]", "-", tail)[:60] or "job")


def output_path(jobs_dir: str, job_id: str) -> str:
    return f"{jobs_dir}/gpuenv-{job_id}.out"


def failure_path(jobs_dir: str, job_id: str) -> str:
    return f"{jobs_dir}/gpuenv-{job_id}.failed"


# ---------------------------------------------------------------------- the script

# Each task: run the launcher, and record the first failing task's exit code (set -C: the
# file is created only if absent, so the first writer wins). $1 is that file.
_RECORD = """rc=$?
[ "$rc" -eq 0 ] || (set -C; echo "$rc" > "$f") 2>/dev/null
exit "$rc"
"""


def _task(setup: str, launch: str, cleanup: str = "") -> str:
    if cleanup:
        # Also when Slurm ends the task (scancel, --kill-on-bad-exit): TERM ends the wrapper
        # through exit, which runs the EXIT trap (sh's default for TERM would skip it).
        setup += f"trap '{cleanup}' EXIT\ntrap 'exit 143' TERM INT\n"
    return "f=$1; shift\n" + setup + launch + "\n" + _RECORD


def _charliecloud(job: JobInputs) -> tuple[list[str], str, list[str]]:
    # ch-run mounts the SquashFS at a directory of its own per task: its default
    # (/var/tmp/$USER.ch/mnt) is shared by every task on a node, and two tasks racing to
    # create it fail ("can't mkdir ... File exists"). It applies none of the image's ENV
    # by itself: --set-env reads it from the file beside the image.
    task = _task(
        'm=$(mktemp -d "${TMPDIR:-/tmp}/gpuenv-ch.XXXXXX") || exit 125\n',
        'ch-run -m "$m" "$@"',
        'rmdir "$m" 2>/dev/null',
    )
    # The working directory's top directory is bound (ch-run 0.31 cannot create a mount
    # point in a read-only image; image.py puts that directory in the SquashFS).
    top = "/" + job.cwd.strip("/").split("/", 1)[0]
    argv = ["--env-no-expand", f"--set-env={job.image.env_file}", "-b", top, "-c", job.cwd,
            job.image.squashfs, "--"]  # fmt: skip
    return [], task, argv


def _apptainer(job: JobInputs) -> tuple[list[str], str, list[str]]:
    # A docker:// image carries its ENV, which apptainer applies; a SquashFS's is beside it.
    env = [] if job.pull else ["--env-file", job.image.shell_env_file]
    argv = ["apptainer", "exec", *env, "--bind", job.cwd, "--pwd", job.cwd]
    if job.gpus_per_node:
        argv.append("--nv")  # the host's driver libraries and nvidia-smi, bound in
    image = f"docker://{job.pull}" if job.pull else job.image.squashfs
    return [], _task("", '"$@"'), [*argv, image]


def _pyxis(job: JobInputs) -> tuple[list[str], str, list[str]]:
    # enroot reads the ENV from /etc/environment and the entrypoint from /etc/rc inside
    # the SquashFS (image.py writes both). The task's wrapper runs inside the container,
    # so the jobs directory is mounted too (the first failure's code is written there).
    image = enroot_uri(job.pull) if job.pull else job.image.squashfs
    srun = [f"--container-image={image}",
            f"--container-mounts={job.cwd},{job.jobs_dir}",
            f"--container-workdir={job.cwd}"]  # fmt: skip
    return srun, _task("", '"$@"'), []


def _podman(job: JobInputs) -> tuple[list[str], str, list[str]]:
    # podman runs a root filesystem directory (--rootfs: the first argument is that
    # directory; :O puts a writable overlay on top): the SquashFS is mounted per task with
    # squashfuse, as podman-hpc does. The options go before it, in the wrapper itself.
    env = [] if job.pull else ["--env-file", job.image.env_file]  # a pulled image has its ENV
    opts = ["--userns=keep-id", "--security-opt=label=disable", "--network=host",
            "--ipc=host", *env, "-v", f"{job.cwd}:{job.cwd}", "-w", job.cwd]  # fmt: skip
    # What Slurm and gpuenv set for the task, passed into the container by name.
    for name in ("SLURM_*", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
                 *(k for k, _ in job.env)):  # fmt: skip
        opts += ["--env", name]
    if job.gpus_per_node:
        opts += ["--device", "nvidia.com/gpu=all"]  # CDI; Slurm's cgroup limits which
    if job.pull:
        # The command runs as itself, as under the other runtimes: no image ENTRYPOINT first.
        run = shlex.join([*opts, "--entrypoint=", job.pull])
        return [], _task("", f'podman run --rm {run} "$@"'), []
    task = _task(
        'm=$(mktemp -d "${TMPDIR:-/tmp}/gpuenv-podman.XXXXXX") || exit 125\n'
        f'squashfuse {shlex.quote(job.image.squashfs)} "$m" || exit 125\n',
        f'podman run --rm --rootfs {shlex.join(opts)} "$m:O" "$@"',
        'fusermount -u "$m" 2>/dev/null; rmdir "$m" 2>/dev/null',
    )
    return [], task, []


_LAUNCHERS = {
    "charliecloud": _charliecloud,
    "apptainer": _apptainer,
    "pyxis": _pyxis,
    "podman": _podman,
}


def batch_script(job: JobInputs) -> str:
    """The whole batch script, ready for sbatch (stdin) or --dry-run."""
    if job.runtime not in _LAUNCHERS:
        raise SlurmError(f"--runtime {job.runtime!r}: expected one of {', '.join(RUNTIMES)}")
    check_env(job.env)
    q = shlex.quote
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        # A node that fails ends the run (NODE_FAIL, the node named) rather than putting
        # the job back in the queue to start again later (JobRequeue's default) while
        # gpuenv waits on it.
        "#SBATCH --no-requeue",
    ]
    if job.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.time:
        head.append(f"#SBATCH --time={job.time}")
    if job.partition:
        head.append(f"#SBATCH --partition={job.partition}")
    head += [
        f"#SBATCH --output={output_path(job.jobs_dir, '%j')}",
        f"#SBATCH --chdir={job.cwd}",
        f"#SBATCH --export={','.join(EXPORTED)}",
        f"# gpuenv slurm run: {job.what} ({job.image_id}), runtime {job.runtime}",
        "",
        'export USER="${USER:-$(id -un)}"  # ch-run and enroot refuse to start without it',
        "# The rendezvous (torch.distributed's; give it to jax.distributed.initialize() as",
        "# coordinator_address): the allocation's first node at the address Slurm reaches it",
        "# by (NodeAddr), which is its name unless slurm.conf says otherwise and the name",
        "# alone need not resolve on the nodes.",
        'gpuenv_first="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'gpuenv_addr="$(scontrol show node -o "$gpuenv_first" | '
        "sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\"",
        'export MASTER_ADDR="${gpuenv_addr:-$gpuenv_first}"',
        f'export MASTER_PORT="$(({MASTER_PORT_BASE} + SLURM_JOB_ID % 10000))"',
    ]
    if job.runtime == "pyxis" and job.gpus_per_node:
        # enroot's NVIDIA hook exposes GPUs only when this is set; Slurm's cgroup (and
        # CUDA_VISIBLE_DEVICES) keep the job to its own.
        head.append("export NVIDIA_VISIBLE_DEVICES=all")
    head += [f"export {k}={q(v)}" for k, v in job.env]
    srun_opts, task, launcher = _LAUNCHERS[job.runtime](job)
    failed = failure_path(job.jobs_dir, "$SLURM_JOB_ID")
    groups = [
        ["srun", "--kill-on-bad-exit=1", "--export=ALL", *srun_opts],
        ["sh", "-c", task, "gpuenv-task", failed],
    ]
    groups += [launcher, list(job.command)] if launcher else [list(job.command)]
    body = [
        "",
        f'rm -f "{failed}"',
        " \\\n    ".join(" ".join(_quote_all(g)) for g in groups),
        "rc=$?",
        f'if [ -s "{failed}" ]; then read -r rc < "{failed}"; fi',
        'exit "$rc"',
    ]
    return "\n".join(head + body) + "\n"


def _quote_all(argv: list[str]) -> list[str]:
    # The failure file's path holds $SLURM_JOB_ID: double quotes keep it expanded.
    return [f'"{a}"' if "$SLURM_JOB_ID" in a else shlex.quote(a) for a in argv]


__all__ = [
    "DEFAULT_RUNTIME",
    "EXPORTED",
    "RUNTIMES",
    "WIDENING",
    "ImageFiles",
    "JobInputs",
    "batch_script",
    "check_env",
    "check_partition",
    "check_path",
    "enroot_uri",
    "failure_path",
    "job_name",
    "output_path",
    "parse_time",
    "submission_environment",
]
