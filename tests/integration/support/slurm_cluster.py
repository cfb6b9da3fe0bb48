"""A real Slurm cluster on this machine for one test session (Slurm 22.05 from Debian).

munged on a private socket and key; slurmctld in the root namespace; two slurmd "nodes"
(n1, n2) that are separate hosts: each in a network namespace of its own, reachable only at
the address slurm.conf gives it (NodeAddr), each with four fake GPUs (/dev/nvidiaN
character devices made with mknod: slurmd 22.05 drops GPUs declared with only Count=). The
nodes and the root namespace meet on a /24 through a bridge in a namespace of its own
(veth pairs into it): the root namespace's end is slurmctld's address (SlurmctldHost), and
node to node traffic (a job's rendezvous) crosses the bridge; no sysctl is touched. Nodes
are entered with ``nsenter --net`` (``ip netns exec`` remounts /sys and slurmd then finds
no cgroups). Everything else is under one temporary directory, with its own slurm.conf:
clients reach the cluster with SLURM_CONF pointing there, and the system's /etc/slurm is
never read; munged's socket is a file, which every namespace sees. Recipe and pitfalls:
../shared/labs.md ("A Slurm cluster").

slurmctld declares a node down after SlurmdTimeout (short here: a test kills a node's
slurmd and its tasks with kill_node() and waits for Slurm to say so); restore_node() starts
its slurmd again and waits for it idle (ReturnToService=2).

Every process the lab starts carries MARKER=<lab id> in its environment; slurmstepd is
re-parented to PID 1 and the tasks it starts inherit the submitter's environment, so at
teardown every process whose environment holds the marker is ended by PID (the tests mark
the gpuenv they start with it too), then the namespaces are deleted (with them the bridge
and every veth). Skipped with the reason when Slurm is not installed, or without root or
iproute2's bridge.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

MARKER = "GPUENV_SLURM_LAB"
NODES = ("n1", "n2")
GPUS_PER_NODE = 4
PARTITION = "lab"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun",
            "ip", "nsenter", "unshare")  # fmt: skip
# Seconds without an answer from a node's slurmd before slurmctld sets it DOWN (and fails its
# jobs): the default, 300, would make the killed-node test wait five minutes.
SLURMD_TIMEOUT = 6


@dataclass
class Network:
    """The lab's link: slurmctld's address here and each node's namespace and address."""

    tag: str
    subnet: int  # 10.233.<subnet>.0/24

    @property
    def ctld_addr(self) -> str:
        return f"10.233.{self.subnet}.1"

    @property
    def bridge_ns(self) -> str:
        return f"gpuenv-sb{self.tag}"

    @property
    def host_if(self) -> str:
        return f"gsb{self.tag}"

    def node_addr(self, node: str) -> str:
        return f"10.233.{self.subnet}.{11 + NODES.index(node)}"

    def node_ns(self, node: str) -> str:
        return f"gpuenv-{node}{self.tag}"


@dataclass
class SlurmCluster:
    root: Path
    lab_id: str
    net: Network
    slurmd: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

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

    def on_node(self, node: str) -> list[int]:
        """PIDs of the processes in `node`'s network namespace (its slurmd, slurmstepd, tasks)."""
        ns = os.stat(f"/run/netns/{self.net.node_ns(node)}").st_ino
        pids = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(proc / "ns" / "net").st_ino == ns:
                        pids.append(int(proc.name))
        return pids

    def kill_node(self, node: str) -> None:
        """The node dies: SIGKILL to every process in its namespace (nothing else is there)."""
        for pid in self.on_node(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.slurmd[node].wait(timeout=10)

    def start_node(self, node: str) -> None:
        env = self.env()
        log = (self.root / f"slurmd-{node}.out").open("ab")
        # A host of its own: its network, its hostname (the node's name) and an /etc/hosts
        # naming every node at its address (a private mount namespace; ch-run binds the
        # host's /etc/hosts into the image), as a cluster's DNS would: gloo and NCCL find the
        # address to announce from the hostname, which here says 127.0.0.1 for every node.
        host = ('hostname "$1" && mount --bind "$2" /etc/hosts && '
                'exec slurmd -D -f "$3" -N "$1"')  # fmt: skip
        self.slurmd[node] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.net.node_ns(node)}", "unshare", "--uts",
             "--mount", "--propagation", "private", "sh", "-c", host, "slurmd-host", node,
             str(self.root / "hosts"), str(self.conf)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        log.close()  # the child holds its own descriptor

    def restore_node(self, node: str, timeout: float = 60) -> None:
        """After kill_node: slurmd again, and the node idle (ReturnToService=2 returns it)."""
        self.start_node(node)
        _wait(self.idle, timeout, f"{node} idle again", self.root)


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


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _unused_subnet() -> int:
    taken = _ip("-4", "addr", "show", check=False).stdout
    taken += _ip("-4", "route", "show", "table", "all", check=False).stdout
    for _ in range(50):
        x = random.randrange(1, 255)
        if f"10.233.{x}." not in taken:
            return x
    pytest.skip("no free 10.233.x.0/24 subnet for the Slurm lab's nodes")


def _make_network(net: Network) -> None:
    """The bridge in a namespace of its own; a veth from here and one from each node's
    namespace into it. Each end is made in its namespace (`ip -n`, `peer ... netns`), so no
    name but the root namespace's own end is ever seen here."""
    _ip("netns", "add", net.bridge_ns)
    _ip("-n", net.bridge_ns, "link", "add", "br0", "type", "bridge")
    _ip("link", "add", net.host_if, "type", "veth", "peer", "name", "up0", "netns", net.bridge_ns)
    _ip("addr", "add", f"{net.ctld_addr}/24", "dev", net.host_if)
    _ip("link", "set", net.host_if, "up")
    ports = ["up0"]
    for node in NODES:
        ns = net.node_ns(node)
        _ip("netns", "add", ns)
        _ip("-n", net.bridge_ns, "link", "add", node, "type", "veth", "peer", "name", "eth0",
            "netns", ns)  # fmt: skip
        _ip("-n", ns, "addr", "add", f"{net.node_addr(node)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        ports.append(node)
    for port in ports:
        _ip("-n", net.bridge_ns, "link", "set", port, "master", "br0", "up")
    _ip("-n", net.bridge_ns, "link", "set", "br0", "up")


def _remove_network(net: Network) -> None:
    # Deleting a namespace deletes its veths, and with each its peer (the root's end too).
    for ns in (*(net.node_ns(n) for n in NODES), net.bridge_ns):
        _ip("netns", "delete", ns, check=False)
    _ip("link", "delete", net.host_if, check=False)


def _write_conf(root: Path, ports: list[int], net: Network) -> None:
    host = socket.gethostname().split(".")[0]
    d = root
    (d / "hosts").write_text(
        f"127.0.0.1 localhost\n{net.ctld_addr} {host}\n"
        + "".join(f"{net.node_addr(n)} {n}\n" for n in NODES)
    )
    nodes = "\n".join(
        f"NodeName={n} NodeAddr={net.node_addr(n)} NodeHostname={n} Port={p} CPUs=2 "
        f"RealMemory=2000 Gres=gpu:{GPUS_PER_NODE}"
        for n, p in zip(NODES, ports[1:], strict=True)
    )
    (d / "slurm.conf").write_text(f"""\
ClusterName=gpuenvlab
SlurmctldHost={host}({net.ctld_addr})
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
SlurmdTimeout={SLURMD_TIMEOUT}
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
    if os.geteuid() != 0:
        pytest.skip("the Slurm lab's nodes (network namespaces) need root")
    net = Network(f"{os.getpid() % 10000:04d}{random.randrange(100):02d}", _unused_subnet())
    # A short path: munged's and slurmd's sockets live under it (sun_path is 108 bytes).
    root = Path(tempfile.mkdtemp(prefix="gpuenv-slurm-", dir="/tmp"))
    root.chmod(0o755)
    lab = SlurmCluster(root, uuid.uuid4().hex[:12], net)
    env = lab.env()
    for sub in ("state", "spool", "dev", "munge"):
        (root / sub).mkdir()
    for i in range(GPUS_PER_NODE):
        os.mknod(root / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _write_conf(root, _free_ports(1 + len(NODES)), net)
    logs = []

    def start(*argv: str, log: str) -> subprocess.Popen[bytes]:
        fh = (root / log).open("wb")
        logs.append(fh)
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip

    try:
        _make_network(net)
        start("munged", "-F", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
              f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munge/munged.log",
              f"--seed-file={root}/munge/munged.seed", log="munged.out")  # fmt: skip
        _wait(lambda: (root / "munge.sock").exists(), 10, "munged's socket", root)
        start("slurmctld", "-D", "-c", "-f", str(lab.conf), log="slurmctld.out")
        for node in NODES:
            lab.start_node(node)
        _wait(lab.idle, 30, "both nodes idle", root)
        yield lab
    finally:
        end_marked(f"{MARKER}={lab.lab_id}")
        _remove_network(net)
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
