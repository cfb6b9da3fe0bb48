"""`gpuenv slurm run --login` from a client with Docker to a Slurm cluster whose login node it
reaches only over ssh (issue 46, item 1): support/slurm_cluster.py is the cluster,
support/login_node.py the login node (its own network and mount namespaces, an sshd; the
client's directory, cache and HOME hidden from it, proved before use).

The client has no Slurm configuration (no SLURM_CONF): every Slurm command runs on the
login node. The image is support/slurm_cluster.py's probe (the base plus one file, no
build); the job is a shell script, so the test needs no framework cell. gpuenv runs as a
client host of the module's own (a UTS namespace): the job directories it records, and
the engine volumes `gpuenv prune` counts as the user's, are the test's, never the
machine's user's.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import test_repository
from support.cli import GPUENV, output
from support.login_node import LoginNode, login_node
from support.slurm_cluster import MARKER, SlurmCluster, marked_pids, probe_image_for, slurm_cluster

pytestmark = pytest.mark.engine

PROBE_IMAGE = f"{test_repository('slurm')}:login-probe"
CLIENT_HOST = f"gpuenv-test-{uuid.uuid4().hex[:8]}"
# gpuenv, as CLIENT_HOST; the same process (exec), so a signal sent to it reaches gpuenv.
CLIENT = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', CLIENT_HOST, *GPUENV]
TRAIN = """\
set -e
echo "epoch 1 on $SLURMD_NODENAME in $(cat /gpuenv-probe)"
cat data.bin data.bin > model.ckpt
echo "read $(wc -c < data.bin) bytes; lr=0.1" > train.log
exit 3
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Path]]:
    with slurm_cluster() as lab:
        yield lab, tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def probe_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with probe_image_for(PROBE_IMAGE, tmp_path_factory.mktemp("probe")) as image:
        yield image


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The client's project directory and its gpuenv cache, both hidden from the login node."""
    root = tmp_path_factory.mktemp("client")
    (root / "project").mkdir()
    (root / "cache").mkdir()
    return root / "project", root / "cache"


@pytest.fixture(scope="module")
def node(cluster, client) -> Iterator[LoginNode]:
    lab, _ = cluster
    project, cache = client
    with login_node(lab, project, hide=[cache]) as login:
        yield login


def gpuenv_env(node: LoginNode, cache: Path, tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUENV_", "SLURM_"))}
    env.update({"PATH": node.path, "XDG_CACHE_HOME": str(cache), MARKER: node.marker.split("=")[1],
                "GPUENV_SLURM_TEST": tag})  # fmt: skip
    return env


def login_argv(node: LoginNode, shared: Path, image: str, *command: str) -> list[str]:
    return [*CLIENT, "slurm", "run", "--login", node.login, "--shared", str(shared), "-i", image,
            "-e", MARKER, "-e", "GPUENV_SLURM_TEST", "--", *command]  # fmt: skip


def crossed(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("gpuenv: working directory via")]
    return line


def test_a_job_from_the_client_reads_its_data_and_its_files_come_back(
    cluster, probe_image, client, node
):
    _, shared = cluster
    project, cache = client
    data = os.urandom(300_000)
    (project / "data.bin").write_bytes(data)
    (project / "train.sh").write_text(TRAIN)
    (project / ".env").write_text("TOKEN=kept-back\n")  # a secret: never sent
    env = gpuenv_env(node, cache, uuid.uuid4().hex)
    argv = login_argv(node, shared, probe_image, "sh", "train.sh")

    proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, output(proc)  # the job's own exit code
    assert proc.stdout.startswith("epoch 1 on n1 in inside the image"), output(proc)
    assert "sending the image to" in proc.stderr, output(proc)
    assert (project / "model.ckpt").read_bytes() == data + data
    assert (project / "train.log").read_text() == "read 300000 bytes; lr=0.1\n"
    line = crossed(proc.stderr)
    assert ": sent 2 files (300.2 kB), brought back 2 files (600.0 kB)" in line, line
    # On the cluster: the same bytes in the job directory; the secret never got there.
    work = shared / f"gpuenv-{os.getuid()}" / "work"
    (workdir,) = [p for p in work.iterdir() if p.is_dir()]  # and its record, .from
    assert (workdir / "model.ckpt").read_bytes() == data + data
    assert not (workdir / ".env").exists()

    # A one-line edit: only that file goes; the image is not sent again.
    (project / "train.sh").write_text(TRAIN.replace("lr=0.1", "lr=0.2").replace("exit 3", "true"))
    proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, output(proc)
    size = (project / "train.sh").stat().st_size
    line = crossed(proc.stderr)
    assert f": sent 1 file ({size} B), brought back 1 file (26 B)" in line, line
    assert "its sha256 there is this image's" in proc.stderr, output(proc)
    assert (project / "train.log").read_text() == "read 300000 bytes; lr=0.2\n"
    digest = hashlib.sha256((project / "model.ckpt").read_bytes()).hexdigest()
    assert digest == hashlib.sha256(data + data).hexdigest()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])  # fmt: skip
def test_a_signal_cancels_the_job_and_brings_back_what_it_wrote(
    cluster, probe_image, client, node, sig, code
):
    """Ctrl-C (SIGINT) or SIGTERM: scancel over ssh, no task left, what the job wrote back,
    the exit code a local run gives."""
    _, shared = cluster
    project, cache = client
    tag = uuid.uuid4().hex
    name = f"partial-{sig.name}.ckpt"
    script = f"echo partial > {name}; echo started; sleep 300"
    argv = login_argv(node, shared, probe_image, "sh", "-c", script)
    proc = subprocess.Popen(argv, cwd=project, env=gpuenv_env(node, cache, tag),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        seen = b""
        while b"started" not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stdout.readline()
        assert b"started" in seen, seen
        assert marked_pids(f"GPUENV_SLURM_TEST={tag}"), "the task carries the test's marker"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert b"cancelled job" in err
    assert marked_pids(f"GPUENV_SLURM_TEST={tag}") == []
    assert (project / name).read_text() == "partial\n"
    assert b"brought back 1 file (8 B)" in err, err


def test_prune_over_ssh_removes_the_job_directory_once_its_directory_is_gone(
    cluster, probe_image, client, node
):
    """`gpuenv prune --login` (issue 46, item 4) on what the tests above left: the job
    directory (it copies the project, recorded beside it as CLIENT_HOST:path) is kept while
    the project is here and removed once it is gone; the ended jobs' files go; the
    SquashFS stays (the engine has the image), there and in the client's cache, where one
    of an image the engine no longer has goes. A login ssh refuses is one line."""
    _, shared = cluster
    project, cache = client
    own = shared / f"gpuenv-{os.getuid()}"
    (workdir,) = [p for p in (own / "work").iterdir() if p.is_dir()]
    assert (own / "work" / f"{workdir.name}.from").read_text() == f"{CLIENT_HOST}:{project}\n"
    jobs = sorted(p.name for p in (own / "jobs").iterdir())
    (image,) = (own / "images").glob("*.sqfs")
    copies = cache / "gpuenv" / "slurm-login" / f"gpuenv-{os.getuid()}" / "images"
    assert (copies / image.name).exists(), "the copy written here before it was sent"
    gone = copies / ("0" * 64)
    for suffix in (".sqfs", ".env", ".sh.env"):
        gone.with_suffix(suffix).write_text("an image the engine no longer has\n")
    env = gpuenv_env(node, cache, "prune")
    argv = [*CLIENT, "prune", "--login", node.login, "--shared", str(shared)]
    where = f"{node.login}:{own}"

    refused = subprocess.run([*CLIENT, "prune", "--login", f"nobody@{node.login}", "--shared",
                              str(shared)], env=env, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert refused.returncode != 0, output(refused)
    assert refused.stderr.count("error:") == 1 and "refused the login" in refused.stderr

    dry = subprocess.run([*argv, "--dry-run"], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert dry.returncode == 0, output(dry)
    assert f"job directory {where}/work/{workdir.name} " in dry.stdout, output(dry)
    assert f"{CLIENT_HOST}:{project}: the directory is here" in dry.stdout, output(dry)
    assert f"gpuenv prune: would remove {len(jobs) + 1} of {len(jobs) + 4} " in dry.stdout

    moved = project.with_name("project-moved")
    project.rename(moved)
    try:
        pruned = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    finally:
        moved.rename(project)
    assert pruned.returncode == 0, output(pruned)
    assert f"{CLIENT_HOST}:{project}: the directory is gone; removed" in pruned.stdout
    assert f"SquashFS {where}/images/{image.name} " in pruned.stdout, output(pruned)
    assert f"gpuenv prune: removed {len(jobs) + 2} of {len(jobs) + 4} " in pruned.stdout
    assert not workdir.exists() and not (own / "work" / f"{workdir.name}.from").exists()
    assert list((own / "jobs").iterdir()) == [] and image.exists()
    assert sorted(p.name for p in copies.iterdir()) == sorted(
        p.name for p in (own / "images").iterdir()
    ), "the cache keeps the probe's copy and loses the one of an image gone"
