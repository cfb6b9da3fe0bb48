"""A real Slurm cluster on this machine for one test session (Slurm 22.05 from Debian).

munged on a private socket and key; slurmctld and two slurmd "nodes" (n1, n2) in the root
namespace on their own ports (Debian's build has MULTIPLE_SLURMD), each with four fake
GPUs (/dev/nvidiaN character devices made with mknod: slurmd 22.05 drops GPUs declared
with only Count=). Everything is under one temporary directory, with its own slurm.conf:
clients reach the cluster with SLURM_CONF pointing there, and the system's /etc/slurm is
never read. Recipe and pitfalls: ../shared/labs.md ("A Slurm cluster").

Every process the lab starts carries MARKER=<lab id> in its environment; slurmstepd is
re-parented to PID 1 and the tasks it starts inherit the submitter's environment, so at
teardown every process whose environment holds the marker is ended by PID (the tests mark
the gpuenv they start with it too). Skipped with the reason when Slurm is not installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKER = "GPUENV_SLURM_LAB"
NODES = ("n1", "n2")
GPUS_PER_NODE = 4
PARTITION = "lab"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun")


@dataclass
class SlurmCluster:
    root: Path
    lab_id: str

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, **extra: str) -> dict[str, str]:
        """This environment, marked, with SLURM_CONF pointing at the lab (and no GPUENV_*)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUENV_", "SLURM_"))}
        env.update({"SLURM_CONF": str(self.conf), MARKER: self.lab_id, "USER": "root"})
        env.update(extra)
        return env

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                              env=self.env())  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr}")
        return proc

    def idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in NODES)

    def marked_pids(self, marker: str | None = None) -> list[int]:
        """PIDs of processes whose environment holds MARKER=<marker> (the lab's by default)."""
        return marked_pids(f"{MARKER}={marker or self.lab_id}")


def marked_pids(entry: str) -> list[int]:
    needle = entry.encode() + b"\0"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # gone, or a kernel thread
        if needle in environ or environ.endswith(needle[:-1]):
            pids.append(int(proc.name))
    return pids


def end_marked(entry: str, timeout: float = 10) -> None:
    """TERM, then KILL, every process marked `entry`, by PID."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked_pids(entry):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while marked_pids(entry) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marked_pids(entry):
            return


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _write_conf(root: Path, ports: list[int]) -> None:
    host = socket.gethostname().split(".")[0]
    d = root
    nodes = "\n".join(
        f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={p} CPUs=2 "
        f"RealMemory=2000 Gres=gpu:{GPUS_PER_NODE}"
        for n, p in zip(NODES, ports[1:], strict=True)
    )
    (d / "slurm.conf").write_text(f"""\
ClusterName=gpuenvlab
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmctldPidFile={d}/slurmctld.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdSpoolDir={d}/spool/%n
SlurmdPidFile={d}/slurmd-%n.pid
SlurmdLogFile={d}/slurmd-%n.log
PlugStackConfig={d}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
GresTypes=gpu
SlurmdParameters=config_overrides
KillWait=5
MailProg=/bin/true
{nodes}
PartitionName={PARTITION} Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
""")
    last = GPUS_PER_NODE - 1
    (d / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName=n[1-2] Name=gpu File={d}/dev/nvidia[0-{last}]\n"
    )
    (d / "plugstack.conf").write_text("")


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = [p for p in PROGRAMS if shutil.which(p, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing; Debian: slurmctld slurmd "
            "slurm-client munge)"
        )
    # A short path: munged's and slurmd's sockets live under it (sun_path is 108 bytes).
    root = Path(tempfile.mkdtemp(prefix="gpuenv-slurm-", dir="/tmp"))
    root.chmod(0o755)
    lab = SlurmCluster(root, uuid.uuid4().hex[:12])
    env = lab.env()
    for sub in ("state", "spool", "dev", "munge"):
        (root / sub).mkdir()
    for i in range(GPUS_PER_NODE):
        os.mknod(root / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _write_conf(root, _free_ports(1 + len(NODES)))
    logs = []

    def start(*argv: str, log: str) -> subprocess.Popen[bytes]:
        fh = (root / log).open("wb")
        logs.append(fh)
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip

    try:
        start("munged", "-F", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
              f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munge/munged.log",
              f"--seed-file={root}/munge/munged.seed", log="munged.out")  # fmt: skip
        _wait(lambda: (root / "munge.sock").exists(), 10, "munged's socket", root)
        start("slurmctld", "-D", "-c", "-f", str(lab.conf), log="slurmctld.out")
        for node in NODES:
            start("slurmd", "-D", "-f", str(lab.conf), "-N", node, log=f"slurmd-{node}.out")
        _wait(lab.idle, 30, "both nodes idle", root)
        yield lab
    finally:
        end_marked(f"{MARKER}={lab.lab_id}")
        for fh in logs:
            fh.close()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def probe_image_for(ref: str, tmp: Path) -> Iterator[str]:
    """The smallest image that proves a job ran inside it: the base plus /gpuenv-probe and
    ENV GPUENV_PROBE, committed from a created container (no build); removed after."""
    from support.cells import BASE_IMAGE
    from support.engine import SESSION_LABEL, docker

    probe = tmp / "gpuenv-probe"
    probe.write_text("inside the image\n")
    cid = docker("create", "--label", SESSION_LABEL, "--network", "none", BASE_IMAGE,
                 "true").stdout.strip()  # fmt: skip
    try:
        docker("cp", str(probe), f"{cid}:/gpuenv-probe")
        docker("commit", "--change", "ENV GPUENV_PROBE=from-the-image", cid, ref)
    finally:
        docker("rm", "-f", cid, check=False)
    try:
        yield ref
    finally:
        docker("rmi", ref, check=False)


def _wait(ready: object, timeout: float, what: str, root: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        if time.monotonic() > deadline:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                for p in sorted(root.glob("*.log")) + sorted(root.glob("*.out"))
            )
            pytest.fail(f"Slurm lab: no {what} within {timeout:.0f} s\n{logs}")
        time.sleep(0.2)
