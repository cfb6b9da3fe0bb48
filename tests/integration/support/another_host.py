"""Another host: a Docker Engine that cannot see this machine's files, as no real remote host
can, reached the ways users reach one (TCP+TLS, ``ssh://``) across a slow link.

dockerd runs in a network namespace of its own AND a private mount namespace in which the
test's project directory, gpuenv's cache directory and HOME are hidden behind empty tmpfs
mounts (docs: /work/shared/labs.md, "Another host"). Before the lab is handed out it proves
that a container given ``-v PROJECT_DIR:PROJECT_DIR`` sees an empty directory there.

- **The link**: a veth pair on a private /30; both ends shaped with ``tc ... tbf rate
  50mbit burst 256kb latency 50ms`` (client to engine, and back), so everything between the
  client and the engine crosses a 50 Mbit/s link (this kernel has no netem: no added delay).
- **TLS**: ``tcp://ADDR:2376`` with a throwaway CA, server and client certificates.
- **ssh**: an sshd in the same namespaces, a key the test makes, a throwaway ssh config
  (``ssh -F``) reached through an ``ssh`` wrapper first on the client's PATH: the real
  ~/.ssh is never read or written (OpenSSH takes ~ from the password database, not $HOME).
  sshd's ``SetEnv DOCKER_HOST=unix://<lab socket>`` makes ``docker system dial-stdio`` on
  the remote side reach the lab's engine, as it reaches a GPU box's own socket. Extra host
  aliases stand for what users get wrong: an unknown host key, a key the host refuses, and
  a host with no ``docker`` on PATH (``ssh_host(problem)``).
- **A package index near the engine**: a PEP 503 mirror over a directory of wheels the test
  supplies (``publish()``) on the namespace's own loopback, ``mirror_url``: the engine's
  host-network containers reach it without the slow link; the client cannot reach it at
  all. It serves as the indexes users put near a GPU box do (nginx in front of devpi,
  Artifactory, a CDN's edge): HTTP/1.1 with kept connections, files sent by the kernel
  (``sendfile``), not ``python -m http.server``'s HTTP/1.0 (a connection per file, each
  copied through the interpreter 64 KiB at a time); each request is logged with its
  duration and bytes (``mirror_requests()``). Its files are on a tmpfs of its own
  (``mirror_in_memory``), as a separate machine's storage would be.

Use::

    with another_host(project_dir, hide=[cache_dir], wheels=wheel_dir) as lab:
        env = clean_env(**lab.env("ssh"))        # or "tls": what points gpuenv at it
        gpuenv_cmd("doctor", cwd=project_dir, env=env)
        lab.docker("images")                     # the test's own view (its unix socket)

The base image ``gpuenv/debian:bookworm`` is loaded into it from the shared engine. Teardown,
whatever happened: sshd, the mirror, dockerd and its containerd stopped by PID, the
namespace and the veth (with their qdiscs) deleted, leftover processes naming the lab's
directory ended by PID, mounts under it unmounted, the directory removed. Skipped (with the
reason) without root, iproute2, tc, openssl, sshd or dockerd.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from support.cells import BASE_IMAGE
from support.cli import Proc
from support.engine import docker
from support.netns_engine import _certificates, _unused_subnet
from support.private_engine import end_processes_under, load_image, stop_dockerd, unmount_under

TLS_PORT = 2376
SSH_PORT = 22
MIRROR_PORT = 3141
DISK_GB = 64  # the engine's own disk: a sparse file, so only what is written takes space
RATE = "50mbit"
SSH_ALIAS = "gpuenv-another-host"
# ssh_host(problem): host aliases in the lab's ssh config that fail the way users' do.
SSH_PROBLEMS = ("unknown-host-key", "refused-key", "no-docker")
Kind = Literal["tls", "ssh"]


def _run(
    *argv: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env=env)  # fmt: skip
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:500]}")
    return proc


@dataclass
class AnotherHost:
    root: Path  # /tmp/gpuenv-ah-XXXX: certificates, keys, configs, logs, data root, socket
    ns: str
    addr: str  # the engine's address, on the namespace's end of the veth
    host_if: str  # the client's end of the veth
    project_dir: Path  # the client's directory the engine cannot see
    hidden: tuple[Path, ...]  # every directory hidden from it (project, cache, HOME)
    dockerd: subprocess.Popen[bytes]
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)  # sshd, the mirror

    # ------------------------------------------------------------------ reaching it

    def docker_host(self, kind: Kind, problem: str = "") -> str:
        """DOCKER_HOST for TLS (tcp://ADDR:2376) or ssh (ssh://root@ALIAS)."""
        if kind == "tls":
            return f"tcp://{self.addr}:{TLS_PORT}"
        return f"ssh://root@{self.ssh_host(problem)}"

    def ssh_host(self, problem: str = "") -> str:
        """The ssh config's host alias: the lab, or one of SSH_PROBLEMS."""
        assert problem in ("", *SSH_PROBLEMS), problem
        return f"{SSH_ALIAS}-{problem}" if problem else SSH_ALIAS

    @property
    def cert_path(self) -> Path:
        return self.root / "client"

    @property
    def ssh_path(self) -> str:
        """PATH with the lab's `ssh` wrapper (ssh -F <lab config>) first."""
        return f"{self.root / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"

    def env(self, kind: Kind, problem: str = "") -> dict[str, str]:
        """The environment variables that point gpuenv (or the docker CLI) at the lab, as a
        user sets them; merge into the subprocess's environment (support.cli.clean_env)."""
        if kind == "tls":
            return {"DOCKER_HOST": self.docker_host("tls"), "DOCKER_TLS_VERIFY": "1",
                    "DOCKER_CERT_PATH": str(self.cert_path)}  # fmt: skip
        return {"DOCKER_HOST": self.docker_host("ssh", problem), "PATH": self.ssh_path}

    # ------------------------------------------------------------------ the test's own view

    @property
    def sock(self) -> str:
        """The engine's unix socket: the test's own view, not across the link."""
        return f"unix://{self.root / 'd.sock'}"

    def docker(self, *args: str, check: bool = True, timeout: float = 300) -> Proc:
        """The docker CLI on the lab's unix socket (fast, not the user's path)."""
        return docker(*args, host=self.sock, check=check, timeout=timeout)

    def inside(
        self, *argv: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
    ) -> Proc:
        """A command in the lab's network and mount namespaces (what its host sees)."""
        enter = ("nsenter", f"--target={self.dockerd.pid}", "--net", "--mount")
        return _run(*enter, *argv, check=check, timeout=timeout, env=env)

    # ------------------------------------------------------------------ the mirror

    @property
    def mirror_url(self) -> str:
        """The PEP 503 index near the engine (`pip --index-url`), on the lab's loopback:
        its containers on the host network reach it; this machine does not."""
        return f"http://127.0.0.1:{MIRROR_PORT}/simple/"

    def mirror_requests(self) -> list[MirrorRequest]:
        """The requests the mirror has answered so far, in the order they ended."""
        log = self.root / "mirror.log"
        if not log.exists():
            return []
        rows = []
        for line in log.read_text(errors="replace").splitlines():
            start, seconds, size, status, _method, path = line.split(" ", 5)
            rows.append(MirrorRequest(float(start), float(seconds), int(size), int(status), path))
        return rows

    def publish(self, wheels: Path) -> None:
        """Put every wheel of `wheels` on the mirror (hard links where they can be) and
        rewrite its index pages, each link with the file's sha256."""
        mirror = self.root / "mirror"
        files = mirror / "files"
        files.mkdir(parents=True, exist_ok=True)
        for wheel in sorted(wheels.glob("*.whl")):
            target = files / wheel.name
            if not target.exists():
                try:
                    os.link(wheel, target)
                except OSError:
                    shutil.copy2(wheel, target)
        _write_index(mirror)


def add_uv_wheel(cache_home: Path, wheels: Path, machine: str = "x86_64") -> Path:
    """Link the uv wheel a build fetched into the wheelhouse under XDG_CACHE_HOME
    `cache_home` into `wheels` (for the mirror: the lab's host fetches uv near too, by the
    hash the client read from its page); its path there."""
    from gpuenv.building.render import UV_VERSION
    from gpuenv.store.wheelhouse import IndexFile, uv_wheel

    store = cache_home / "gpuenv" / "wheelhouse"
    for page in sorted(store.glob("pages/*/uv.json")):
        files = [IndexFile(**f) for f in json.loads(page.read_text())["files"]]
        wheel = uv_wheel(files, UV_VERSION, machine)
        if wheel is not None and (store / "files" / wheel.sha256[:2] / wheel.sha256).is_file():
            target = wheels / wheel.filename
            if not target.exists():
                os.link(store / "files" / wheel.sha256[:2] / wheel.sha256, target)
            return target
    raise AssertionError(f"no uv {UV_VERSION} wheel for {machine} in {store}")


def _write_index(mirror: Path) -> None:
    """simple/index.html and simple/<project>/index.html for mirror/files/*.whl."""
    projects: dict[str, list[Path]] = {}
    for wheel in sorted((mirror / "files").glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-", 1)[0]).lower()
        projects.setdefault(name, []).append(wheel)
    simple = mirror / "simple"
    simple.mkdir(exist_ok=True)
    links = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    for name, wheels in projects.items():
        page = simple / name
        page.mkdir(exist_ok=True)
        rows = []
        for wheel in wheels:
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            href = html.escape(f"../../files/{wheel.name}#sha256={digest}")
            rows.append(f'<a href="{href}">{html.escape(wheel.name)}</a>\n')
        (page / "index.html").write_text(
            f"<!DOCTYPE html><html><body>\n{''.join(rows)}</body></html>\n"
        )


# ---------------------------------------------------------------------- the lab


@contextlib.contextmanager
def another_host(
    project_dir: Path,
    *,
    hide: Iterable[Path] = (),
    wheels: Path | None = None,
    rate: str = RATE,
    base_image: str = BASE_IMAGE,
    mirror_in_memory: bool = True,
) -> Iterator[AnotherHost]:
    """The lab, ready: the engine answers on its socket, over TLS and over ssh; `hide`
    (gpuenv's cache directory, say) is hidden from it with project_dir and HOME.

    The mirror's files are on a tmpfs of their own (`mirror_in_memory`): an index near a GPU
    box is another machine, whose storage the box's builds do not load, and which serves a
    wheel as popular as a framework's from its memory. On this machine's one disk they were
    read back at 27-42 MB/s in the builds' rounds (the framework's wheel, evicted by each
    round's 5-8 GB of writes, queued behind their trims: `benchmarks/engines.py`)."""
    tools = {name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
             for name in ("dockerd", "ip", "tc", "openssl", "sshd", "ssh", "ssh-keygen",
                          "nsenter", "unshare")}  # fmt: skip
    if os.geteuid() != 0:
        pytest.skip("another host (namespaces, sshd) needs root")
    missing = sorted(name for name, path in tools.items() if path is None)
    if missing:
        pytest.skip(f"another host needs {', '.join(missing)} (scripts/engine.sh installs them)")
    if _run("ip", "netns", "list", check=False).returncode != 0:
        pytest.skip("`ip netns` is not available here")
    hidden = _hidden(project_dir, hide)
    tag = f"{os.getpid() % 10000:04d}{random.randrange(100):02d}"
    ns, host_if, ns_if = f"gpuenv-ah{tag}", f"gah{tag}", f"gan{tag}"
    x = _unused_subnet()
    client_addr, addr = f"10.231.{x}.1", f"10.231.{x}.2"
    root = Path(tempfile.mkdtemp(prefix="gpuenv-ah-", dir="/tmp"))  # short: socket paths
    procs: list[subprocess.Popen[bytes]] = []
    made_ns = made_privsep = False
    try:
        if _run("ip", "netns", "add", ns, check=False).returncode != 0:
            pytest.skip("cannot make a network namespace here")
        made_ns = True
        # Before dockerd: its private mount namespace copies the mounts.
        if mirror_in_memory:
            (root / "mirror").mkdir()
            _run("mount", "-t", "tmpfs", "-o", "mode=0755", "gpuenv-mirror", str(root / "mirror"))
        _own_disk(root)
        _link(ns, host_if, ns_if, client_addr, addr, rate)
        _certificates(root, addr)
        _ssh_keys(root, addr)
        made_privsep = _privsep_dir()
        dockerd = _start_dockerd(root, ns, addr, hidden, str(tools["dockerd"]))
        procs.append(dockerd)
        lab = AnotherHost(root, ns, addr, host_if, project_dir.resolve(), hidden, dockerd)
        _wait_for_engine(lab)
        lab.others.append(_start_sshd(lab, str(tools["sshd"])))
        procs.extend(lab.others)
        lab.others.append(_start_mirror(lab))
        procs.extend(lab.others[1:])
        if wheels is not None:
            lab.publish(wheels)
        else:
            _write_index(root / "mirror")
        _wait_for_mirror(lab)
        load_image(lab.sock, base_image)
        _prove_hidden(lab, base_image)
        _wait_for_ssh(lab)
        yield lab
    finally:
        _teardown(root, ns, host_if, procs, made_ns, made_privsep)


def _own_disk(root: Path) -> None:
    """The engine's data root, root/data: a filesystem of its own, as another host's disk
    is (a sparse file, loop-mounted ext4 with its journal, as mkfs.ext4 makes it). Left on
    this machine's filesystem, a no-journal ext4 mounted `discard`, each lab paid for the
    labs and builds before it: with no journal, ext4 gives a new file no inode freed in the
    last 60 s (360 s while its inode table block is unwritten) and checks each candidate in
    turn (fs/ext4/ialloc.c, recently_deleted()), and a lab's directories land in the block
    groups the previous lab's removal just freed. perf: 13% find_get_block_common, 12%
    recently_deleted, 4% ext4_get_group_desc, all under ext4_create, while uv unpacked the
    CPU cell's wheels; the same fetch in a container here took 3.1, 10.6, 13.6, 22.3, 24.9 s
    of system time in five runs in a row, each removing the one before. Without mkfs.ext4
    the data root stays on this machine's filesystem (root/data, a directory)."""
    disk = root / "data"
    disk.mkdir()
    mkfs = shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if mkfs is None:
        return
    image = root / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(DISK_GB * 1024**3)
    _run(mkfs, "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image))
    _run("mount", "-o", "loop", str(image), str(disk))


def _hidden(project_dir: Path, hide: Iterable[Path]) -> tuple[Path, ...]:
    home = Path(os.path.expanduser("~"))
    out: list[Path] = []
    for d in (project_dir, *hide, home):
        d = d.resolve()
        d.mkdir(parents=True, exist_ok=True)  # a mount point must exist
        if d not in out:
            out.append(d)
    return tuple(out)


def _link(ns: str, host_if: str, ns_if: str, client_addr: str, addr: str, rate: str) -> None:
    """The veth pair, its addresses, and the rate limit on both ends (each shapes what it
    sends: the client's end the uploads, the lab's end what comes back)."""
    shape = ("qdisc", "add", "dev", "{}", "root", "tbf", "rate", rate, "burst", "256kb",
             "latency", "50ms")  # fmt: skip
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    _run("ip", "link", "set", ns_if, "netns", ns)
    _run("ip", "addr", "add", f"{client_addr}/30", "dev", host_if)
    _run("ip", "link", "set", host_if, "up")
    _run("tc", *(a.format(host_if) for a in shape))
    for cmd in (
        ("ip", "addr", "add", f"{addr}/30", "dev", ns_if),
        ("ip", "link", "set", ns_if, "up"),
        ("ip", "link", "set", "lo", "up"),
        ("tc", *(a.format(ns_if) for a in shape)),
    ):
        _run("ip", "netns", "exec", ns, *cmd)


def _ssh_keys(root: Path, addr: str) -> None:
    """sshd's host key; the client's key (authorized), a key the host refuses, and a key
    whose sessions get a PATH without docker; the ssh config with one alias for each."""
    d = root / "ssh"
    d.mkdir(mode=0o700)
    keys = ("host", "client", "refused", "nodocker")
    for key in keys:
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"gpuenv-lab-{key}",
             "-f", str(d / key))  # fmt: skip
    pub = {key: (d / f"{key}.pub").read_text().strip() for key in keys}
    (d / "authorized_keys").write_text(
        f'{pub["client"]}\nenvironment="PATH=/nonexistent" {pub["nodocker"]}\n'
    )
    (d / "known_hosts").write_text(f"{SSH_ALIAS} {pub['host']}\n")
    (d / "no_known_hosts").write_text("")
    common = (
        f"  HostName {addr}\n  Port {SSH_PORT}\n  User root\n  HostKeyAlias {SSH_ALIAS}\n"
        f"  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
        f"  IdentitiesOnly yes\n  IdentityAgent none\n  ConnectTimeout 10\n"
    )
    hosts = {
        SSH_ALIAS: ("client", "known_hosts"),
        f"{SSH_ALIAS}-unknown-host-key": ("client", "no_known_hosts"),
        f"{SSH_ALIAS}-refused-key": ("refused", "known_hosts"),
        f"{SSH_ALIAS}-no-docker": ("nodocker", "known_hosts"),
    }
    (d / "config").write_text(
        "".join(
            f"Host {alias}\n{common}  IdentityFile {d / key}\n  UserKnownHostsFile {d / kh}\n"
            for alias, (key, kh) in hosts.items()
        )
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    ssh = shutil.which("ssh") or "/usr/bin/ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {ssh} -F {d / "config"} "$@"\n')
    wrapper.chmod(0o755)


def _privsep_dir() -> bool:
    """sshd refuses to start without its privilege separation directory (made at boot by
    the ssh service, which this machine does not run). True when this lab made it."""
    path = Path("/run/sshd")
    if path.exists():
        return False
    path.mkdir(mode=0o755)
    return True


def _start_dockerd(
    root: Path, ns: str, addr: str, hidden: tuple[Path, ...], dockerd: str
) -> subprocess.Popen[bytes]:
    s = root / "server"
    config = {
        "hosts": [f"unix://{root / 'd.sock'}", f"tcp://{addr}:{TLS_PORT}"],
        "tls": True, "tlsverify": True, "tlscacert": str(s / "ca.pem"),
        "tlscert": str(s / "cert.pem"), "tlskey": str(s / "key.pem"),
        "data-root": str(root / "data"), "exec-root": str(root / "exec"),
        "pidfile": str(root / "d.pid"), "bridge": "none", "iptables": False,
        "ip-masq": False,
    }  # fmt: skip
    (root / "daemon.json").write_text(json.dumps(config, indent=1))
    mounts = "".join(f"mount -t tmpfs -o mode=0755 none {shlex.quote(str(d))} && "
                     for d in hidden)  # fmt: skip
    script = f"{mounts}exec {shlex.quote(dockerd)} --config-file {root / 'daemon.json'}"
    log = (root / "dockerd.log").open("wb")
    # nsenter, unshare and sh each exec the next: the PID is dockerd's own. nsenter joins
    # the network namespace only (`ip netns exec` remounts /sys: dockerd finds no cgroups).
    try:
        return subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--propagation",
             "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()


def _wait_for_engine(lab: AnotherHost) -> None:
    deadline = time.monotonic() + 60
    while True:
        if lab.dockerd.poll() is not None:
            tail = (lab.root / "dockerd.log").read_text(errors="replace")[-1500:]
            pytest.skip(f"dockerd on another host could not start "
                        f"(exit {lab.dockerd.returncode}): {tail}")  # fmt: skip
        if (lab.root / "d.sock").exists() and lab.docker(
            "version", check=False, timeout=10
        ).returncode == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail("dockerd on another host did not answer within 60 s")
        time.sleep(0.2)


def _start_sshd(lab: AnotherHost, sshd: str) -> subprocess.Popen[bytes]:
    d = lab.root / "ssh"
    (d / "sshd_config").write_text(
        f"ListenAddress {lab.addr}:{SSH_PORT}\nHostKey {d / 'host'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        # The lab's directory is under /tmp (world-writable): StrictModes would refuse it.
        "UsePAM no\nStrictModes no\nPermitUserEnvironment PATH\n"
        # What a GPU box's own engine is to its docker CLI: the socket DOCKER_HOST names.
        f"SetEnv DOCKER_HOST={lab.sock}\n"
    )
    log = (lab.root / "sshd.log").open("wb")
    try:
        return subprocess.Popen(
            ["nsenter", f"--target={lab.dockerd.pid}", "--net", "--mount", sshd, "-D", "-e",
             "-f", str(d / "sshd_config")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()


# The mirror's server (python3 -c, argv: directory, port, log). A static index near a GPU
# box keeps connections open and lets the kernel send the files: nginx's defaults
# (`keepalive_timeout 75s`, `sendfile on` in Debian's nginx.conf, `tcp_nodelay on`), as
# devpi's and Artifactory's deployments put nginx in front. So: HTTP/1.1 (http.server
# closes after each response under its default HTTP/1.0), socket.sendfile (os.sendfile: no
# copy through the interpreter) and TCP_NODELAY (without it a kept connection's small reply
# waited 40 ms for the client's delayed ACK: measured here with curl). One line per request
# once its body is sent: the wall-clock start, the seconds it took, the bytes, the status and
# the path.
MIRROR_SERVER = """\
import http.server, sys, threading, time
DIRECTORY, PORT, LOG = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
lock = threading.Lock()
class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a kept connection's next small reply waits for no ACK
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=DIRECTORY, **kwargs)
    def copyfile(self, source, outputfile):
        outputfile.flush()
        self.sent = self.connection.sendfile(source)
    def log_request(self, code="-", size="-"):
        self.code = code
    def parse_request(self):
        self.began = time.time()
        return super().parse_request()
    def handle_one_request(self):
        self.sent, self.code, self.requestline = 0, "-", ""
        super().handle_one_request()
        if self.requestline:
            with lock:
                LOG.write(f"{self.began:.3f} {time.time() - self.began:.3f} {self.sent} "
                          f"{int(self.code) if isinstance(self.code, int) else 0} "
                          f"{self.command} {self.path}\\n")
http.server.ThreadingHTTPServer.daemon_threads = True
server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("serving", flush=True)
server.serve_forever()
"""


@dataclass(frozen=True)
class MirrorRequest:
    """One request the mirror answered (MIRROR_SERVER's log line)."""

    start: float  # wall clock
    seconds: float
    size: int  # bytes of body sent
    status: int
    path: str


def _start_mirror(lab: AnotherHost) -> subprocess.Popen[bytes]:
    mirror = lab.root / "mirror"
    mirror.mkdir(exist_ok=True)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    log = (lab.root / "mirror.err").open("wb")
    try:
        return subprocess.Popen(
            ["nsenter", f"--target={lab.dockerd.pid}", "--net", "--mount", python, "-c",
             MIRROR_SERVER, str(mirror), str(MIRROR_PORT), str(lab.root / "mirror.log")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()


def _wait_for_mirror(lab: AnotherHost) -> None:
    """The mirror listens (it says so once bound: a connection made from then on waits in
    its backlog), within 60 s."""
    out = lab.root / "mirror.err"
    deadline = time.monotonic() + 60
    while "serving" not in out.read_text(errors="replace"):
        if lab.others[-1].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the lab's mirror did not start: {out.read_text()[-1500:]}")
        time.sleep(0.05)


def _prove_hidden(lab: AnotherHost, image: str) -> None:
    """A container with each hidden directory bound at its own path sees it empty, while
    here the project directory holds a file (made for the proof, then removed)."""
    probe = lab.project_dir / ".another-host-probe"
    probe.write_text("this machine's file\n")
    try:
        binds = [a for d in lab.hidden for a in ("-v", f"{d}:{d}:ro")]
        listing = " ".join(shlex.quote(str(d)) for d in lab.hidden)
        seen = lab.docker("run", "--rm", "--network", "none", *binds, image, "sh", "-c",
                          f"ls -A {listing}").stdout  # fmt: skip
    finally:
        probe.unlink()
    entries = [line for line in seen.splitlines() if line and not line.endswith(":")]
    assert entries == [], f"the lab's engine sees this machine's files: {seen}"


def _wait_for_ssh(lab: AnotherHost) -> None:
    """The ssh path works end to end: the docker CLI over ssh:// answers."""
    env = {**os.environ, "PATH": lab.ssh_path}
    argv = ["docker", "-H", lab.docker_host("ssh"), "version", "--format", "{{.Server.Version}}"]
    deadline = time.monotonic() + 30
    while True:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        if proc.returncode == 0:
            return
        if lab.others[0].poll() is not None or time.monotonic() > deadline:
            tail = (lab.root / "sshd.log").read_text(errors="replace")[-1500:]
            pytest.fail(f"the lab's engine is not reachable over ssh: {proc.stderr[-800:]}\n"
                        f"sshd: {tail}")  # fmt: skip
        time.sleep(0.3)


def _teardown(root: Path, ns: str, host_if: str, procs: list[subprocess.Popen[bytes]],
              made_ns: bool, made_privsep: bool) -> None:  # fmt: skip
    sock = f"unix://{root / 'd.sock'}"
    if procs and (root / "d.sock").exists():
        with contextlib.suppress(Exception):
            for cid in docker("ps", "-aq", host=sock, check=False, timeout=30).stdout.split():
                docker("rm", "-f", cid, host=sock, check=False, timeout=30)
    for proc in procs[1:]:  # sshd, the mirror
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if procs:
        stop_dockerd(procs[0], root)
    if made_ns:
        _run("ip", "netns", "del", ns, check=False)
    if _run("ip", "link", "show", host_if, check=False).returncode == 0:
        _run("ip", "link", "del", host_if, check=False)  # its qdisc goes with it
    end_processes_under(root)
    _run("umount", str(root / "data"), check=False)  # the engine's own disk, if made
    unmount_under(root)  # what is left, lazily
    shutil.rmtree(root, ignore_errors=True)
    if made_privsep:
        with contextlib.suppress(OSError):
            Path("/run/sshd").rmdir()
