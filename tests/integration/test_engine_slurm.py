"""`gpuenv run --slurm` (the older spelling of `slurm run`, forwarded to it) on a real Slurm
cluster (support/slurm_cluster.py: munged on a private socket, slurmctld and two slurmd
nodes with four fake-device GPUs each) with Charliecloud: the image is written once as a
SquashFS to a shared directory and the job runs in it on both nodes.

The image is the smallest that proves it: the 125 MB base with one file and one ENV added
(`docker commit`, no build), so the tasks show they run inside the image and that its ENV
is applied (ch-run applies none by itself). Every gpuenv started here carries the lab's
marker and a per-test one in its environment and passes both to the job by name (-e: the
job gets nothing else of the submitter's environment), which is how "no task process is
left" is checked.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import test_repository
from support.cli import GPUENV, output
from support.slurm_cluster import (
    MARKER,
    SlurmCluster,
    marked_pids,
    probe_image_for,
    slurm_cluster,
)

pytestmark = pytest.mark.engine

PROBE_IMAGE = f"{test_repository('slurm')}:probe"
# The markers reach the tasks only as the user's -e variables would.
MARKED = ("-e", MARKER, "-e", "GPUENV_SLURM_TEST")


@pytest.fixture(scope="module")
def lab() -> Iterator[SlurmCluster]:
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with probe_image_for(PROBE_IMAGE, tmp_path_factory.mktemp("probe")) as image:
        yield image


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The working directory (absent from the image: ch-run binds it) and a TMPDIR of its
    own, so that every per-task mount point can be seen removed."""
    (tmp_path / "work").mkdir()
    (tmp_path / "tmp").mkdir()
    return tmp_path


def env_for(lab: SlurmCluster, work: Path, tag: str) -> dict[str, str]:
    return lab.env(TMPDIR=str(work / "tmp"), GPUENV_SLURM_TEST=tag)


def slurm_run(lab: SlurmCluster, work: Path, shared: Path, image: str, *args: str,
              tag: str = "", timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = [*GPUENV, "run", "--slurm", "-i", image, "--shared", str(shared), *MARKED, *args]
    env = env_for(lab, work, tag or uuid.uuid4().hex)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          cwd=work / "work", env=env)  # fmt: skip


def squashfs(shared: Path) -> list[Path]:
    return sorted((shared / f"gpuenv-{os.getuid()}" / "images").glob("*.sqfs"))


def test_two_nodes_two_gpus_each_in_the_image(lab, probe_image, shared, work):
    """...and with only the environment asked for: a secret of the login node's
    environment reaches neither the job nor the container; an -e variable does."""
    script = ('echo "$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES env=$GPUENV_PROBE '
              'file=$(cat /gpuenv-probe | tr " " _) cwd=$(pwd) master=$MASTER_ADDR '
              'secret=${GPUENV_INDEX_PASSWORD:-none} given=$GIVEN"')  # fmt: skip
    argv = [*GPUENV, "run", "--slurm", "-i", probe_image, "--shared", str(shared), *MARKED,
            "-e", "GIVEN=yes", "--nodes", "2", "--gpus-per-node", "2", "--time", "5", "--",
            "bash", "-c", script]  # fmt: skip
    env = {**env_for(lab, work, uuid.uuid4().hex), "GPUENV_INDEX_PASSWORD": "s3cret"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          cwd=work / "work", env=env)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    cwd = work / "work"
    lines = sorted(proc.stdout.splitlines())
    # The rendezvous is the first node's NodeAddr (the lab's nodes are network namespaces).
    tail = f"master={lab.net.node_addr('n1')} secret=none given=yes"
    assert lines == [
        f"n1 gpus=0,1 env=from-the-image file=inside_the_image cwd={cwd} {tail}",
        f"n2 gpus=0,1 env=from-the-image file=inside_the_image cwd={cwd} {tail}",
    ], output(proc)
    assert "writing" in proc.stderr and len(squashfs(shared)) == 1, output(proc)
    assert list((work / "tmp").iterdir()) == []  # ch-run's mount points removed


def test_a_second_run_reuses_the_squashfs(lab, probe_image, shared, work):
    if not squashfs(shared):
        slurm_run(lab, work, shared, probe_image, "--", "true")
    (first,) = squashfs(shared)
    before = first.stat()
    proc = slurm_run(lab, work, shared, probe_image, "--", "cat", "/gpuenv-probe")
    assert proc.returncode == 0 and proc.stdout == "inside the image\n", output(proc)
    assert f"reusing {first}" in proc.stderr, output(proc)
    after = first.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_first_failing_task_sets_the_exit_code(lab, probe_image, shared, work):
    """Node 1's task exits 5 at once; node 0's would sleep a minute: srun ends it
    (--kill-on-bad-exit) and gpuenv exits 5, not the 143 of the task it killed."""
    start = time.monotonic()
    proc = slurm_run(lab, work, shared, probe_image, "--nodes", "2", "--", "bash", "-c",
                     '[ "$SLURM_NODEID" = 1 ] && exit 5; sleep 60')  # fmt: skip
    assert proc.returncode == 5, output(proc)
    assert time.monotonic() - start < 40
    assert list((work / "tmp").iterdir()) == []


def test_an_impossible_gpu_count_is_one_line(lab, probe_image, shared, work):
    jobs_before = lab.run("squeue", "-h", "-o", "%i").stdout
    proc = slurm_run(lab, work, shared, probe_image, "--nodes", "2", "--gpus-per-node", "5",
                     "--", "true")  # fmt: skip
    assert proc.returncode == 125, output(proc)
    assert proc.stderr.splitlines() == [
        "error: sbatch refused the job: Requested node configuration is not available "
        "(sbatch --test-only)"
    ], output(proc)
    assert lab.run("squeue", "-h", "-o", "%i").stdout == jobs_before


def test_no_slurm_on_path(lab, probe_image, shared, work):
    argv = [*GPUENV, "run", "--slurm", "-i", probe_image, "--shared", str(shared), "--", "true"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**lab.env(), "PATH": str(work / "tmp")})  # fmt: skip
    assert proc.returncode == 125, output(proc)
    assert len(proc.stderr.splitlines()) == 1, output(proc)
    assert proc.stderr.startswith("error: slurm run: sbatch, scontrol, scancel not found on PATH")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_cancels_the_job(lab, probe_image, shared, work, sig, code):
    tag = uuid.uuid4().hex
    script = 'echo "started $SLURMD_NODENAME"; sleep 300'
    argv = [*GPUENV, "run", "--slurm", "-i", probe_image, "--shared", str(shared), *MARKED,
            "--nodes", "2", "--", "bash", "-c", script]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=work / "work", env=env_for(lab, work, tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        seen = _read_until(proc, b"started", count=2, timeout=60)
        assert seen.count(b"started") == 2, seen
        tasks = marked_pids(f"GPUENV_SLURM_TEST={tag}")
        assert len(tasks) > 2, "the tasks carry the test's marker"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert b"cancelled job" in err
    assert marked_pids(f"GPUENV_SLURM_TEST={tag}") == []
    job_id = err.split(b"submitted batch job ", 1)[1].split()[0].decode()
    state = lab.run("scontrol", "show", "job", "-o", job_id).stdout
    assert "JobState=CANCELLED" in state
    assert list((work / "tmp").iterdir()) == []


def _read_until(proc: subprocess.Popen[bytes], needle: bytes, count: int, timeout: float) -> bytes:
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(needle) < count and time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            seen += os.read(proc.stdout.fileno(), 65536)
    return seen


def test_detach_prints_the_job_id(lab, probe_image, shared, work):
    proc = slurm_run(lab, work, shared, probe_image, "--detach", "--", "true")
    assert proc.returncode == 0 and proc.stdout.strip().isdigit(), output(proc)
    job_id = proc.stdout.strip()
    deadline = time.monotonic() + 30
    while "JobState=COMPLETED" not in lab.run("scontrol", "show", "job", "-o", job_id).stdout:
        assert time.monotonic() < deadline, "the detached job did not complete"
        time.sleep(0.2)


@pytest.mark.parametrize("runtime", ["charliecloud", "apptainer", "pyxis", "podman"])
def test_dry_run_scripts_pass_sbatch_test_only(lab, probe_image, shared, work, runtime):
    """Apptainer, enroot/pyxis and podman are not packaged for bookworm: their scripts are
    checked by sbatch --test-only here (which gpuenv's dry run asks itself), not run."""
    jobs_before = lab.run("squeue", "-h", "-o", "%i").stdout
    proc = slurm_run(lab, work, shared, probe_image, "--runtime", runtime, "--dry-run",
                     "--nodes", "2", "--gpus-per-node", "4", "--time", "1:00:00", "--",
                     "python", "-c", "print(1)")  # fmt: skip
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=gpuenv-"), output(proc)
    assert "sbatch --test-only: Job " in proc.stderr and "on nodes n[1-2]" in proc.stderr
    assert lab.run("squeue", "-h", "-o", "%i").stdout == jobs_before
    # Independently of gpuenv: the printed script itself.
    check = subprocess.run(["sbatch", "--test-only"], input=proc.stdout, capture_output=True,
                           text=True, timeout=30, env=lab.env())  # fmt: skip
    assert check.returncode == 0, check.stderr


def test_prune_removes_the_files_of_ended_jobs_and_the_squashfs_of_images_gone(
    lab, probe_image, shared, work
):
    """`gpuenv prune --shared` (issue 46, item 4), after the module's jobs: the files of
    every job Slurm says ended go; the probe image's SquashFS stays (the engine has it: the
    next run uses it); a SquashFS whose image the engine no longer has goes with its
    environment files, once no job of the user's is pending or running."""
    if not squashfs(shared):
        slurm_run(lab, work, shared, probe_image, "--", "true")
    own = shared / f"gpuenv-{os.getuid()}"
    gone = own / "images" / ("0" * 64)
    for suffix in (".sqfs", ".env", ".sh.env"):
        gone.with_suffix(suffix).write_text("an image the engine no longer has\n")
    deadline = time.monotonic() + 60  # the detached job of the test above, if still running
    while lab.run("squeue", "-h", "-o", "%i").stdout.strip() and time.monotonic() < deadline:
        time.sleep(1)
    jobs = sorted(p.name for p in (own / "jobs").iterdir())
    assert jobs, "the module's jobs left their output files"
    # As a client host of the test's own (a UTS namespace): the engine's volumes it counts
    # as the user's are none, and the machine's user's are never the test's to remove.
    argv = [
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        f"gpuenv-test-{uuid.uuid4().hex[:8]}",
        *GPUENV,
        "prune",
        "--shared",
        str(shared),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env=lab.env())  # fmt: skip
    assert proc.returncode == 0, output(proc)
    assert not list((own / "jobs").iterdir()), output(proc)
    assert not list((own / "images").glob("0000*")), output(proc)
    (kept,) = squashfs(shared)
    assert f"SquashFS {kept} " in proc.stdout and "the next run uses it; kept" in proc.stdout
    assert f"gpuenv prune: removed {len(jobs) + 1} of {len(jobs) + 2} " in proc.stdout, output(proc)
