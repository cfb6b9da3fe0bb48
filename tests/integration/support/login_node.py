"""A Slurm cluster's login node that the client reaches only over ssh, for
`gpuenv slurm run --login` (support/slurm_cluster.py is the cluster).

An sshd in a network namespace of its own AND a private mount namespace in which the
client's project directory, its cache directory and HOME are hidden behind empty tmpfs
mounts (as support/another_host.py hides them from its engine): what a job there sees of
the client's files is what gpuenv sent. The client reaches it through a veth pair on a
private /30, with a throwaway key, known_hosts and ssh config (an ``ssh`` wrapper first on
the client's PATH: the real ~/.ssh is never read). Slurm's client commands run there with
a copy of the lab's slurm.conf whose SlurmctldHost is the client's end of the veth
(slurmctld listens on every address of the root namespace; sshd's ``SetEnv SLURM_CONF``);
munged's socket and the shared directory are files both namespaces see. Entered with
``nsenter --net`` (``ip netns exec`` remounts /sys). Before it is handed out, a shell there
proves the hidden directories empty while the project directory here holds a file.

Teardown, whatever happened: sshd (and what its sessions left, marked) stopped by PID, the
namespace and the veth deleted, the directory removed. Skipped (with the reason) without
root, iproute2, nsenter/unshare or sshd.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.slurm_cluster import MARKER, SlurmCluster, end_marked

ALIAS = "gpuenv-login-node"


def _run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:500]}")
    return proc


@dataclass
class LoginNode:
    root: Path
    addr: str  # the login node's address (its end of the veth)
    hidden: tuple[Path, ...]
    sshd: subprocess.Popen[bytes]
    marker: str

    @property
    def login(self) -> str:
        """What --login takes: the ssh config's alias."""
        return ALIAS

    @property
    def path(self) -> str:
        """PATH with the lab's `ssh` wrapper (ssh -F <lab config>) first."""
        return f"{self.root / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def inside(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command in the login node's network and mount namespaces."""
        return _run("nsenter", f"--target={self.sshd.pid}", "--net", "--mount", *argv,
                    check=check)  # fmt: skip


def _unused_subnet() -> int:
    taken = _run("ip", "-4", "addr", "show", check=False).stdout
    taken += _run("ip", "-4", "route", "show", "table", "all", check=False).stdout
    for _ in range(50):
        x = random.randrange(1, 255)
        if f"10.232.{x}." not in taken:
            return x
    pytest.skip("no free 10.232.x.0/30 subnet for the login node's link")


@contextlib.contextmanager
def login_node(cluster: SlurmCluster, project_dir: Path, *,
               hide: Iterable[Path] = ()) -> Iterator[LoginNode]:  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("a login node (namespaces, sshd) needs root")
    tools = {n: shutil.which(n) or shutil.which(n, path="/usr/sbin:/sbin")
             for n in ("ip", "sshd", "ssh", "ssh-keygen", "nsenter", "unshare")}  # fmt: skip
    missing = sorted(n for n, p in tools.items() if p is None)
    if missing:
        pytest.skip(f"a login node needs {', '.join(missing)}")
    home = Path(os.path.expanduser("~")).resolve()
    hidden = tuple(dict.fromkeys(p.resolve() for p in (project_dir, *hide, home)))
    for d in hidden:
        d.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
    ns, host_if, ns_if = f"gpuenv-ln{tag}", f"gln{tag}", f"gnn{tag}"
    x = _unused_subnet()
    client_addr, addr = f"10.232.{x}.1", f"10.232.{x}.2"
    root = Path(tempfile.mkdtemp(prefix="gpuenv-ln-", dir="/tmp"))
    marker = f"{MARKER}=login-{cluster.lab_id}"
    sshd: subprocess.Popen[bytes] | None = None
    made_ns = made_privsep = False
    try:
        if _run("ip", "netns", "add", ns, check=False).returncode != 0:
            pytest.skip("cannot make a network namespace here")
        made_ns = True
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"{client_addr}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        enter = ("nsenter", f"--net=/run/netns/{ns}")
        _run(*enter, "ip", "addr", "add", f"{addr}/30", "dev", ns_if)
        _run(*enter, "ip", "link", "set", ns_if, "up")
        _run(*enter, "ip", "link", "set", "lo", "up")
        conf = _login_conf(cluster, root, client_addr)
        _keys(root, addr)
        if not Path("/run/sshd").exists():
            Path("/run/sshd").mkdir(mode=0o755)
            made_privsep = True
        sshd = _start_sshd(root, ns, addr, hidden, conf, marker, str(tools["sshd"]))
        node = LoginNode(root, addr, hidden, sshd, marker)
        _wait_for_ssh(node)
        _prove_hidden(node, project_dir.resolve())
        yield node
    finally:
        if sshd is not None and sshd.poll() is None:
            sshd.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                sshd.wait(timeout=10)
            if sshd.poll() is None:
                sshd.kill()
                sshd.wait()
        end_marked(marker)
        if made_ns:
            _run("ip", "netns", "del", ns, check=False)
        if _run("ip", "link", "show", host_if, check=False).returncode == 0:
            _run("ip", "link", "del", host_if, check=False)
        shutil.rmtree(root, ignore_errors=True)
        if made_privsep:
            with contextlib.suppress(OSError):
                Path("/run/sshd").rmdir()


def _login_conf(cluster: SlurmCluster, root: Path, ctld_addr: str) -> Path:
    """The lab's slurm.conf for the login node: slurmctld at the client's end of the veth."""
    d = root / "slurm"
    d.mkdir()
    text = cluster.conf.read_text()
    text = re.sub(r"^SlurmctldHost=(\S+?)\([^)]*\)$", rf"SlurmctldHost=\1({ctld_addr})",
                  text, flags=re.MULTILINE)  # fmt: skip
    (d / "slurm.conf").write_text(text)
    for name in ("gres.conf", "plugstack.conf"):
        shutil.copy(cluster.root / name, d / name)
    return d / "slurm.conf"


def _keys(root: Path, addr: str) -> None:
    d = root / "ssh"
    d.mkdir(mode=0o700)
    for key in ("host", "client"):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpuenv-login-{key}",
             "-f", str(d / key))  # fmt: skip
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    (d / "known_hosts").write_text(f"{ALIAS} {(d / 'host.pub').read_text().strip()}\n")
    (d / "config").write_text(
        f"Host {ALIAS}\n  HostName {addr}\n  Port 22\n  User root\n  HostKeyAlias {ALIAS}\n"
        f"  GlobalKnownHostsFile /dev/null\n  UserKnownHostsFile {d / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  IdentityFile {d / 'client'}\n  ConnectTimeout 10\n"
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    ssh = shutil.which("ssh") or "/usr/bin/ssh"
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {ssh} -F {d / "config"} "$@"\n')
    (bin_dir / "ssh").chmod(0o755)


def _start_sshd(root: Path, ns: str, addr: str, hidden: tuple[Path, ...], conf: Path,
                marker: str, sshd: str) -> subprocess.Popen[bytes]:  # fmt: skip
    d = root / "ssh"
    key, _, value = marker.partition("=")
    (d / "sshd_config").write_text(
        f"ListenAddress {addr}:22\nHostKey {d / 'host'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\n"
        # A loaded CI machine logs in slowly: sshd's default throttle (MaxStartups 10:30:100)
        # would reset the job's polls' connections.
        "MaxStartups 100:30:200\n"
        # The cluster's configuration, as a login node's /etc/slurm gives it; the lab's
        # marker, so that teardown finds what sessions left.
        f"SetEnv SLURM_CONF={conf} {key}={value}\n"
    )
    mounts = "".join(f"mount -t tmpfs -o mode=0755 none {shlex.quote(str(p))} && "
                     for p in hidden)  # fmt: skip
    script = f"{mounts}exec {shlex.quote(sshd)} -D -e -f {d / 'sshd_config'}"
    log = (root / "sshd.log").open("wb")
    try:
        return subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation",
             "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, key: value},
        )  # fmt: skip
    finally:
        log.close()


def _wait_for_ssh(node: LoginNode) -> None:
    """`sinfo` over ssh answers: the login node reaches slurmctld."""
    env = {**os.environ, "PATH": node.path}
    deadline = time.monotonic() + 30
    while True:
        proc = subprocess.run(["ssh", "-T", "-o", "BatchMode=yes", "--", ALIAS, "sinfo", "-h"],
                              env=env, capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        if proc.returncode == 0:
            return
        if node.sshd.poll() is not None or time.monotonic() > deadline:
            tail = (node.root / "sshd.log").read_text(errors="replace")[-1500:]
            pytest.fail(f"the login node is not reachable over ssh: {proc.stderr[-800:]}\n"
                        f"sshd: {tail}")  # fmt: skip
        time.sleep(0.3)


def _prove_hidden(node: LoginNode, project_dir: Path) -> None:
    probe = project_dir / ".login-node-probe"
    probe.write_text("this machine's file\n")
    try:
        listing = " ".join(shlex.quote(str(d)) for d in node.hidden)
        seen = node.inside("sh", "-c", f"ls -A {listing}").stdout
    finally:
        probe.unlink()
    entries = [ln for ln in seen.splitlines() if ln and not ln.endswith(":")]
    assert entries == [], f"the login node sees the client's files: {seen}"
