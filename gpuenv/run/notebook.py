"""`gpuenv notebook`: JupyterLab in a cell's environment, reachable only from this user.

The server runs from the cell's notebook layer (gpuenv/run/jupyter.py), so its kernel is
the cell's own Python and framework, through `gpuenv run`'s machinery (gpuenv/run/local.py):
the working directory mounted at its own path (and the notebook root), the caller's
uid:gid, --gpus with its preflight, Ctrl-C stopping the container and removing it, and on
an engine that cannot see this directory, the directory's copy sent there and what the
notebooks wrote brought back when the server stops (gpuenv/run/sync.py).

Where it listens. An engine with Docker's default `bridge` network (its network list names
one) gets the server bound to all addresses of the container's own namespace and published
on the engine host's 127.0.0.1 only; an engine without one (dockerd --bridge=none, as on
this project's machines), or `--host-network`, gets it on the host's network, bound to
127.0.0.1. Either way it answers on the engine host's loopback and nowhere else, and every
request needs the token, a fresh random one per start, given to the server in its
environment (never on a command line).

Who gets the token. Nothing is printed or sent before the container's own log (the engine's
attach stream) says the server listens: it has bound its port (`port_retries=0`: a port
someone else holds fails the start), or the engine has published it. On this machine's
engine, a request with the token goes to 127.0.0.1:PORT only while every listener there is
this user's (the server runs as the caller) or root's (the engine's port proxy), read from
/proc/net/tcp and tcp6; another user's listener gets nothing, and the URL is not printed
(where there is no /proc/net, the log alone decides and nothing is sent). The URL is printed
once the server answers; on another host's engine, once the server says it runs, with the
`ssh -L` command that brings that loopback port here.
"""

from __future__ import annotations

import io
import os
import random
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast
from urllib.parse import urlsplit

from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import console, jupyter, local, preflight, target

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine

CONTAINER_PORT = 8888  # the server's port in its own namespace, when published
REMOTE_PORTS = (49152, 65535)  # where a port on another host's loopback is drawn from
ANSWER_TIMEOUT = 300  # seconds to wait for a local server to answer before saying so
RUNNING = "is running at"  # jupyter_server's line once it listens


@dataclass(frozen=True)
class Placement:
    network: str | None  # "host", or None: the engine's default network (its bridge)
    ports: list[str]  # -p items: [127.0.0.1:PORT:CONTAINER_PORT] on a bridge
    listen: str  # the address the server binds in its namespace
    server_port: int  # the port it binds there
    port: int  # the port on the engine host's loopback that reaches it


def placement(networks: set[str], host_network: bool, port: int) -> Placement:
    """On the host network bound to loopback, or published on loopback from a bridge."""
    if host_network or "bridge" not in networks:
        return Placement("host", [], "127.0.0.1", port, port)
    return Placement(None, [f"127.0.0.1:{port}:{CONTAINER_PORT}"], "0.0.0.0", CONTAINER_PORT,
                     port)  # fmt: skip


def server_command(where: Placement, root: Path, uid: int) -> list[str]:
    """Jupyter's command line (no secret on it: the token is in the environment)."""
    command = [
        "jupyter", "lab", "--no-browser", f"--ServerApp.ip={where.listen}",
        f"--ServerApp.port={where.server_port}", "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        # Nothing fetched from outside: no news feed, no update check, no extension index.
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]  # fmt: skip
    if uid == 0:  # the caller is root: the server runs as the caller, as `gpuenv run` does
        command.append("--ServerApp.allow_root=True")
    return command


def free_port() -> int:
    """A port free on this machine's loopback now (the engine's host, when it is local)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tunnel_hint(engine_url: str, port: int) -> str:
    """How to reach a port on the engine host's loopback from here."""
    parts = urlsplit(engine_url)
    host = parts.hostname or engine_url
    if parts.scheme == "ssh":
        user = f"{parts.username}@" if parts.username else ""
        via = f" -p {parts.port}" if parts.port else ""
        return f"ssh -N -L {port}:127.0.0.1:{port}{via} {user}{host}"
    return f"ssh -N -L {port}:127.0.0.1:{port} USER@{host}"


class ServerLog(io.RawIOBase):
    """The server's output, passed on to stderr, except the lines that carry the token
    (Jupyter's own URLs, wrong on a bridge or another host): `running` is set once the
    server says it listens."""

    def __init__(self, token: str, out: BinaryIO | None = None) -> None:
        self.token = token.encode()
        self.out = out
        self.running = threading.Event()
        self._partial = b""

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        out = self.out or sys.stderr.buffer
        lines = (self._partial + bytes(data)).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if RUNNING.encode() in line:
                self.running.set()
            if self.token not in line:
                out.write(line + b"\n")
        out.flush()
        return len(data)


def answers(url: str, token: str) -> bool:
    """Whether the server at `url` answers its API with the token (HTTP 200)."""
    request = urllib.request.Request(f"{url}/api/status",
                                     headers={"Authorization": f"token {token}"})  # fmt: skip
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    try:
        with opener.open(request, timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


PROC_NET = Path("/proc/net")
LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening


def listeners(port: int, tables: dict[str, str] | None = None) -> list[int] | None:
    """The owners (uids) of the listening sockets that would take a connection to
    127.0.0.1:`port` on this machine: bound to 127.0.0.1 or 0.0.0.0, or (IPv6, dual stack)
    to :: or ::ffff:127.0.0.1. From /proc/net/tcp and tcp6 (`tables`: their text, for the
    tests); None where this machine has none to read (not Linux)."""
    if tables is None:
        try:
            tables = {n: (PROC_NET / n).read_text() for n in ("tcp", "tcp6")}
        except OSError:
            return None
    loopback = {"127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"}
    owners: list[int] = []
    for name, text in tables.items():
        family = socket.AF_INET6 if name == "tcp6" else socket.AF_INET
        for row in text.splitlines()[1:]:
            fields = row.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            address, _, hexport = fields[1].partition(":")
            if int(hexport, 16) == port and _address(address, family) in loopback:
                owners.append(int(fields[7]))
    return owners


def _address(hexed: str, family: int) -> str:
    """/proc/net/tcp's address: 32-bit words in this machine's byte order, in hex."""
    words = [int(hexed[i : i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hexed), 8)]
    return socket.inet_ntop(family, b"".join(words))


def strangers(port: int) -> list[int] | None:
    """Owners of a listener on 127.0.0.1:`port` that are neither this user (the server runs
    as the caller) nor root (the engine, and its port proxy, when the port is published);
    None where this machine cannot say."""
    owners = listeners(port)
    if owners is None:
        return None
    return sorted(set(owners) - {os.getuid(), 0})


def _announce(engine: Engine, url: str, token: str, where: Placement, log: ServerLog,
              done: threading.Event, name: str) -> None:  # fmt: skip
    """Print the URL once the container's own log says the server listens: on this
    machine's engine, also once no other user listens on its port and the server answers
    there (the token goes to no other listener); on another host's, with the tunnel that
    reaches it."""
    link = f"{url}/lab?token={token}"
    while not done.is_set() and not log.running.wait(0.5):
        pass
    if done.is_set():
        return
    if engine.is_local:
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while True:
            others = strangers(where.port)
            if others:
                console.warn(
                    f"127.0.0.1:{where.port} is also listened on by uid "
                    f"{', '.join(map(str, others))}, not this user's server: the URL is not "
                    "printed and its token sent nowhere; Ctrl-C, and start again with "
                    "another --port"
                )
                return
            if others is None or answers(url, token):
                break  # None: no /proc/net here; the log alone says the server listens
            if time.monotonic() > deadline:
                console.warn(f"JupyterLab has not answered at {url} after {ANSWER_TIMEOUT} s")
                return
            if done.wait(0.5):
                return
        print(f"JupyterLab in {name}: {link}", flush=True)
    else:
        print(f"JupyterLab in {name}, on {engine.url}'s loopback only: {link}", flush=True)
        print(f"  reach it from here with: {tunnel_hint(engine.url, where.port)}", flush=True)
    console.say("Ctrl-C stops the server")


def serve(
    pattern: str | None, gpus: str | None, file: Path | None, *, host_network: bool = False,
    port: int | None = None, cwd: Path | None = None,
) -> int:  # fmt: skip
    """Start JupyterLab in the cell (the default CPU or GPU cell without one) and serve
    until Ctrl-C; the exit code is the server's (130 after Ctrl-C)."""
    from gpuenv.engine import client
    from gpuenv.gpu.gpus import parse_gpus
    from gpuenv.project.project import looks_like_image, open_project

    if pattern is not None and looks_like_image(pattern):
        raise GpuenvError(f"{pattern}: gpuenv notebook takes a cell name (gpuenv matrix lists "
                          "them), not an image", exit_code=125)  # fmt: skip
    if port is not None and not 0 < port < 65536:
        raise GpuenvError(f"--port {port}: expected 1-65535", exit_code=125)
    request = parse_gpus(gpus) if gpus is not None else None
    cwd = cwd or Path.cwd()
    project = open_project(file, cached=True)
    if pattern is not None:
        project.one_cell(pattern, "CELL")  # its errors name the argument, before the engine
    with client.connect() as engine:
        cell_target = target.choose(engine, pattern, project, "--gpus all", request is not None,
                                    request)  # fmt: skip
        assert cell_target.cell is not None  # a cell name: checked above
        preflight.gpu_preflight(engine, cell_target, request)
        layer = jupyter.ensure(engine, project, cell_target.cell, console.say)
        if not layer.built:
            console.say(f"notebook layer {layer.image} (up to date)")
        chosen = port or (free_port() if engine.is_local else random.randint(*REMOTE_PORTS))
        where = placement(engine.network_names(), host_network, chosen)
        token = secrets.token_hex(24)
        opts = local.RunOptions(
            image=layer.image, command=server_command(where, cwd, os.getuid()), gpus=request,
            env=[f"JUPYTER_TOKEN={token}"], ports=where.ports, network=where.network, cwd=cwd,
        )  # fmt: skip
        log = ServerLog(token)
        done = threading.Event()
        url = f"http://127.0.0.1:{where.port}"
        announcer = threading.Thread(
            target=_announce, args=(engine, url, token, where, log, done, cell_target.cell.name),
            name="gpuenv-notebook-url", daemon=True,
        )  # fmt: skip
        announcer.start()
        try:
            stream = cast(BinaryIO, log)
            return local.run(engine, opts, stdout=stream, stderr=stream)
        finally:
            done.set()
            announcer.join(5)
