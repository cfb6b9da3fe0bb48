"""Fixtures for the publishing tests (test_engine_push.py, test_engine_workflow_act.py).

- ``registry``: Debian's ``docker-registry`` (distribution 2.8), started by the session on
  127.0.0.1:<free port> with its own config: no auth, filesystem storage in a temporary
  directory, deletes enabled. Stopped by its PID at the end; its storage is removed. The
  package is not installed here: scripts/test.sh installs it (CI runs that).
- ``pushed``: the JAX CPU cell (the smallest framework cell, ~0.4 GB where the shipped
  TF cell is ~2.3 GB: the push's claims hold for any cell, and compressing and uploading
  2.3 GB took about two minutes of CI) built into ``REPOSITORY`` and pushed once per module
  to ``REGISTRY/team`` with the alias ``latest``. Other tests reuse it: the engine then knows
  the layers' digests, so later pushes of the same layers only check or mount them.
- ``fake_registry``: a tiny http.server on loopback that answers like a broken registry
  (``"5xx"`` or ``"401"``), started and stopped by the test.
- ``loopback_refs``: lists the engine's 127.0.0.1:* references. The registries above are
  claimed for the session (support/cleanup.py): the janitor removes every reference the
  session created under them (pushes tag, pulls add).

Every command runs the installed CLI in a subprocess with XDG_CACHE_HOME in a temporary
directory, so validation records from this machine's real cache never decide a refusal.
A build there fetches its wheels into that directory's wheelhouse (JAX's once per session);
a cell whose layers the engine has is still a cache hit.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import cleanup
from support.cells import EXTRA_PIP as EXTRA_PIP
from support.cells import JAX_CPU_CELL, jax_cpu_matrix, test_repository
from support.cells import REPO as REPO
from support.cli import Proc, build_json, clean_env, gpuenv_cmd
from support.engine import docker as docker_cmd
from support.engine import inspect as inspect

CELL = JAX_CPU_CELL  # the cell test_engine_push.py builds and pushes
REPOSITORY = test_repository("push")
IMAGE = f"{REPOSITORY}:{CELL}"
PUSHPULL = test_repository("pushpull")  # a repository of its own for the pull-before-build test
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
BUILD_TIMEOUT = 1800


def free_port() -> int:
    """A loopback port nothing listens on now. Claimed for the session: a failed push there
    still leaves the local tags gpuenv made for it, and the janitor removes them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cleanup.claim_registry(f"127.0.0.1:{port}")
    return port


def cell_matrix(directory: Path, *, name: str = REPOSITORY, extra: str = "") -> Path:
    """DIRECTORY/matrix.yaml: the JAX CPU cell's matrix under repository NAME, with EXTRA
    YAML appended. Not locked, as the shipped matrix the module pushed before: a locked
    cell's push sends its locked base too (test_engine_base_pull.py's claim)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "matrix.yaml"
    path.write_text(jax_cpu_matrix(name) + extra, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the CLI


@dataclass
class Cli:
    cache: Path  # XDG_CACHE_HOME of every command

    def __call__(
        self,
        *args: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        timeout: float = 900,
    ) -> Proc:
        full = clean_env(**{"XDG_CACHE_HOME": str(self.cache), **(env or {})})
        return gpuenv_cmd(*args, check=check, env=full, timeout=timeout)


@pytest.fixture(scope="session")
def publish_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(scope="session")
def cli(publish_cache: Path, loopback_refs: Callable[[], set[str]]) -> Cli:
    """cli("push", ..., check=True, env={...}) -> CompletedProcess (text)."""
    return Cli(publish_cache)


def results_by_ref(proc: Proc) -> dict[str, dict[str, Any]]:
    return {r["ref"]: r for r in json.loads(proc.stdout)["results"]}


# --------------------------------------------------------------------------- engine references


def _loopback_refs() -> set[str]:
    out = docker_cmd(
        "images", "--digests", "--format", "{{.Repository}} {{.Tag}} {{.Digest}}"
    ).stdout
    refs = set()
    for line in out.splitlines():
        repo, tag, digest = [*line.split(), "", "", ""][:3]
        if not repo.startswith("127.0.0.1:"):
            continue
        if tag and tag != "<none>":
            refs.add(f"{repo}:{tag}")
        if digest and digest != "<none>":
            refs.add(f"{repo}@{digest}")
    return refs


@pytest.fixture(scope="session")
def loopback_refs() -> Callable[[], set[str]]:
    """A function listing the engine's 127.0.0.1:* references. Those the session creates in
    its registries are removed by the session janitor (support/cleanup.py, claim_registry)."""
    return _loopback_refs


# --------------------------------------------------------------------------- the registry


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    pid: int

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def get_json(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url(path), timeout=30) as resp:
            return dict(json.load(resp))

    def tags(self, repository: str) -> list[str]:
        return list(self.get_json(f"/v2/{repository}/tags/list").get("tags") or [])

    def manifest_digest(self, repository: str, tag: str) -> str:
        req = urllib.request.Request(
            self.url(f"/v2/{repository}/manifests/{tag}"),
            method="HEAD",
            headers={"Accept": MANIFEST_V2},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return str(resp.headers["Docker-Content-Digest"])


CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


@pytest.fixture(scope="session")
def registry() -> Iterator[Registry]:
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        pytest.skip("needs Debian's docker-registry (scripts/test.sh installs it)")
    workdir = Path(tempfile.mkdtemp(prefix="gpuenv-registry-"))
    port = free_port()
    config = workdir / "config.yml"
    config.write_text(CONFIG.format(root=workdir / "storage", port=port))
    log = (workdir / "registry.log").open("wb")
    proc = subprocess.Popen(
        [binary, "serve", str(config)], stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    reg = Registry(f"127.0.0.1:{port}", proc.pid)  # claimed by free_port
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                tail = (workdir / "registry.log").read_text(errors="replace")[-1500:]
                pytest.fail(f"docker-registry exited {proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(reg.url("/v2/"), timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("docker-registry did not answer /v2/ within 30 s")
            time.sleep(0.1)
        yield reg
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- images


# The cell's image is in a module repository (its module's janitor removes it): these are
# the module's fixtures, though the registry is the session's.


@pytest.fixture(scope="module")
def alias_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JAX CPU cell's matrix with the alias ``latest``."""
    return cell_matrix(tmp_path_factory.mktemp("aliases"), extra=f"aliases:\n  latest: {CELL}\n")


@pytest.fixture(scope="module")
def cell_built(cli: Cli, alias_matrix: Path) -> dict[str, Any]:
    """The JAX CPU cell's image (built once if missing or stale; cached otherwise)."""
    result = build_json(cli("build", CELL, "-f", str(alias_matrix), "--json",
                            timeout=BUILD_TIMEOUT))[CELL]  # fmt: skip
    assert result["status"] in ("built", "cached", "pulled"), result
    info = inspect(IMAGE)
    assert info is not None
    return info


@dataclass
class Pushed:
    registry: Registry
    repository: str  # in the registry: team/push
    image: dict[str, Any]  # `docker image inspect` of the local image
    results: dict[str, dict[str, Any]]  # by ref
    seconds: float

    def ref(self, tag: str) -> str:
        return f"{self.registry.host}/{self.repository}:{tag}"


@pytest.fixture(scope="module")
def pushed(registry: Registry, cell_built: dict[str, Any], alias_matrix: Path, cli: Cli) -> Pushed:
    """The cell and its alias `latest`, pushed to REGISTRY/team once per module."""
    start = time.monotonic()
    proc = cli(
        "push", CELL, "-f", str(alias_matrix), "--registry", f"{registry.host}/team", "--json",
    )  # fmt: skip
    seconds = time.monotonic() - start
    return Pushed(registry, "team/push", cell_built, results_by_ref(proc), seconds)


# --------------------------------------------------------------------------- a broken registry


class _Broken(http.server.BaseHTTPRequestHandler):
    """Answers like a registry that fails.

    "5xx": 500 for everything but blob HEADs, which say the blob exists: the engine then
    skips the layer uploads (it retries failed uploads itself, 5 times over 50 s) and meets
    the 500 at the manifest, which it does not retry, so gpuenv's own retries show.
    "401": every request needs credentials the engine does not have."""

    mode = "5xx"
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.mode == "401":
            body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="gpuenv-test"')
        elif self.command == "HEAD" and "/blobs/sha256:" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", "1024")
            self.send_header("Docker-Content-Digest", self.path.rsplit("/", 1)[-1])
            self.end_headers()
            return
        else:
            body = b"internal error"
            self.send_response(500)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class FakeRegistry:
    host: str
    seen: list[str]


@pytest.fixture
def fake_registry() -> Iterator[Callable[[str], FakeRegistry]]:
    """fake_registry("5xx" | "401") -> a broken registry on loopback, stopped after the test."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(mode: str) -> FakeRegistry:
        seen: list[str] = []
        handler = type("Handler", (_Broken,), {"mode": mode, "seen": seen})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        host = f"127.0.0.1:{server.server_address[1]}"
        cleanup.claim_registry(host)
        return FakeRegistry(host, seen)

    yield start
    for server in servers:
        with contextlib.suppress(Exception):
            server.shutdown()
        server.server_close()
