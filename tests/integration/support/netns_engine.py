"""A remote Docker Engine over a real network link: dockerd in a network namespace of this
machine, joined to it by a veth pair on private addresses, listening on tcp :2376 with TLS
(a throwaway CA, server and client certificates made with openssl).

The test reaches it as a user reaches a remote engine: DOCKER_HOST=tcp://ADDR:2376,
DOCKER_TLS_VERIFY=1, DOCKER_CERT_PATH=<ca.pem, cert.pem, key.pem>. ``link_down()`` and
``link_up()`` set the host's end of the veth down and up (the link dropping mid-run). The
engine also listens on a unix socket in its directory, for the test's own inspection.

Teardown, whatever happened: dockerd and its containerd stopped by PID, the namespace
deleted (which takes its end of the veth; the host's end is deleted too if it is left),
mounts under the directory unmounted, the directory removed. Skipped (with the reason) when
not root, or when `ip netns` or openssl is missing.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.engine import docker
from support.private_engine import end_processes_under, stop_dockerd, unmount_under

PORT = 2376


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:500]}")
    return proc


@dataclass
class RemoteEngine:
    root: Path
    ns: str
    host_if: str
    addr: str  # the namespace's address (the engine's)
    proc: subprocess.Popen[bytes]

    @property
    def docker_host(self) -> str:
        return f"tcp://{self.addr}:{PORT}"

    @property
    def cert_path(self) -> Path:
        return self.root / "client"

    def env(self) -> dict[str, str]:
        """What a user sets to reach it."""
        return {"DOCKER_HOST": self.docker_host, "DOCKER_TLS_VERIFY": "1",
                "DOCKER_CERT_PATH": str(self.cert_path)}  # fmt: skip

    @property
    def sock(self) -> str:
        return f"unix://{self.root / 'd.sock'}"

    def docker(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """The docker CLI on the engine's unix socket (the test's own view, not the link's)."""
        return docker(*args, host=self.sock, check=check, timeout=timeout)

    def containers(self) -> list[str]:
        out = self.docker(
            "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Image}} {{.Status}}"
        ).stdout
        return [line for line in out.splitlines() if line.strip()]

    def link_down(self) -> None:
        _run("ip", "link", "set", self.host_if, "down")

    def link_up(self) -> None:
        _run("ip", "link", "set", self.host_if, "up")


def _certificates(root: Path, addr: str) -> None:
    """CA, server certificate (SAN: the address) and client certificate, in root/."""
    ca, server, client = root / "ca", root / "server", root / "client"
    for d in (ca, server, client):
        d.mkdir()
    days = "2"
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca / "key.pem"),
         "-out", str(ca / "ca.pem"), "-days", days, "-subj", "/CN=gpuenv-test-ca")  # fmt: skip
    for d, cn, ext in (
        (server, "gpuenv-test-engine", f"subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth\n"),
        (client, "gpuenv-test-client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / "ext.cnf").write_text(ext)
        _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
             "-out", str(d / "req.csr"), "-subj", f"/CN={cn}")  # fmt: skip
        _run("openssl", "x509", "-req", "-in", str(d / "req.csr"), "-CA", str(ca / "ca.pem"),
             "-CAkey", str(ca / "key.pem"), "-CAcreateserial", "-out", str(d / "cert.pem"),
             "-days", days, "-extfile", str(d / "ext.cnf"))  # fmt: skip
        shutil.copy(ca / "ca.pem", d / "ca.pem")
        for f in ("key.pem",):
            os.chmod(d / f, 0o600)


def _unused_subnet() -> int:
    routes = _run("ip", "-4", "route", "show", "table", "all", check=False).stdout
    addrs = _run("ip", "-4", "addr", "show", check=False).stdout
    for _ in range(50):
        x = random.randrange(1, 255)
        if f"10.231.{x}." not in routes and f"10.231.{x}." not in addrs:
            return x
    pytest.skip("no free 10.231.x.0/30 subnet for the test link")


@contextlib.contextmanager
def remote_engine() -> Iterator[RemoteEngine]:
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    ip = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if os.geteuid() != 0:
        pytest.skip("a remote engine in a network namespace needs root")
    if dockerd is None or ip is None or shutil.which("openssl") is None:
        pytest.skip("needs dockerd, iproute2 (ip netns) and openssl")
    if _run("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("`ip netns` is not available here")
    tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
    ns, host_if, ns_if = f"gpuenv-t{tag}", f"gvh{tag}", f"gvn{tag}"
    x = _unused_subnet()
    host_addr, addr = f"10.231.{x}.1", f"10.231.{x}.2"
    root = Path(tempfile.mkdtemp(prefix="gpuenv-ns-", dir="/tmp"))
    proc: subprocess.Popen[bytes] | None = None
    log = None
    made_ns = False
    try:
        added = _run("ip", "netns", "add", ns, check=False)
        if added.returncode != 0:
            pytest.skip(f"cannot make a network namespace here: {added.stderr.strip()[:300]}")
        made_ns = True
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"{host_addr}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        for cmd in (
            ("ip", "addr", "add", f"{addr}/30", "dev", ns_if),
            ("ip", "link", "set", ns_if, "up"),
            ("ip", "link", "set", "lo", "up"),
        ):
            _run("ip", "netns", "exec", ns, *cmd)
        _certificates(root, addr)
        s = root / "server"
        log = (root / "dockerd.log").open("wb")
        proc = subprocess.Popen(
            # nsenter joins the network namespace only: `ip netns exec` would also remount
            # /sys, and dockerd would find no cgroups there.
            ["nsenter", f"--net=/var/run/netns/{ns}", dockerd, "--data-root", str(root / "data"),
             "--exec-root", str(root / "exec"), "--pidfile", str(root / "d.pid"),
             "-H", f"unix://{root / 'd.sock'}", "-H", f"tcp://{addr}:{PORT}",
             "--tlsverify", "--tlscacert", str(s / "ca.pem"), "--tlscert", str(s / "cert.pem"),
             "--tlskey", str(s / "key.pem"),
             "--bridge=none", "--iptables=false", "--ip-masq=false"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        engine = RemoteEngine(root, ns, host_if, addr, proc)
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
                pytest.skip(
                    f"dockerd in a namespace could not start (exit {proc.returncode}): {tail}"
                )
            if (root / "d.sock").exists() and docker("version", host=engine.sock, check=False,
                                                      timeout=10).returncode == 0:  # fmt: skip
                break
            if time.monotonic() > deadline:
                pytest.fail("dockerd in the namespace did not answer within 60 s")
            time.sleep(0.2)
        yield engine
    finally:
        _teardown(root, ns, host_if, proc, made_ns)
        if log is not None:
            log.close()


def _teardown(root: Path, ns: str, host_if: str, proc: subprocess.Popen[bytes] | None,
              made_ns: bool) -> None:  # fmt: skip
    with contextlib.suppress(Exception):
        _run("ip", "link", "set", host_if, "up", check=False)  # a test that ended with it down
    if proc is not None:
        with contextlib.suppress(Exception):
            for cid in docker("ps", "-aq", host=f"unix://{root / 'd.sock'}", check=False,
                              timeout=30).stdout.split():  # fmt: skip
                docker("rm", "-f", cid, host=f"unix://{root / 'd.sock'}", check=False, timeout=30)
        stop_dockerd(proc, root)  # nsenter execs dockerd: the PID is dockerd's own
    if made_ns:
        _run("ip", "netns", "del", ns, check=False)
    if _run("ip", "link", "show", host_if, check=False).returncode == 0:
        _run("ip", "link", "del", host_if, check=False)
    end_processes_under(root)
    unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)
