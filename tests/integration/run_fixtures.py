"""Fixtures for the `gpuenv run` integration tests (imported by test_engine_run.py).

They live apart from conftest.py, which belongs to the build tests. Everything here runs
`gpuenv run` as a user would: a subprocess of the installed CLI, in a fresh working
directory under /tmp (world-traversable, so that other uids can use it too), with
`--network none` (these machines have no bridge network).

- ``cpu_image``: the shipped CPU cell's image, built once if missing (cached when present).
- ``workdir``, ``gpuenv_run``, ``spawn_run``: a working directory and the CLI, run to the end
  or in the background with its output read line by line as it comes.
- ``leftovers``: after each test, fails (and cleans up) when a container gpuenv created for
  the test's working directory, or a driver probe container, is still there.
- ``docker_user``: a throw-away non-root user in the docker group (useradd/userdel).
- ``gpu_engine``: a second dockerd started by the session with a stand-in
  ``nvidia-container-runtime-hook`` on its PATH (docs/architecture.md, "The engine on these
  machines"), so that the engine accepts ``--gpus``. The stand-in records its argv and
  stdin and exits 0; it never makes a GPU, a driver or nvidia-smi appear.
"""

from __future__ import annotations

import contextlib
import grp
import os
import queue
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest
from support import cleanup
from support.cells import BASE_IMAGE, CPU_IMAGE, GPU_IMAGE, REPO
from support.cells import CPU_CELL as CPU_CELL
from support.cells import GPU_CELL as GPU_CELL
from support.cells import SHIPPED_MATRIX as SHIPPED_MATRIX
from support.cli import GPUENV as GPUENV
from support.cli import build_cells, clean_env
from support.dockerd import second_dockerd
from support.engine import has_image

SMALL_IMAGE = BASE_IMAGE  # the cells' base: ~125 MB, cheap to copy
RUN_LABEL = "io.gpuenv.run=1"
PROBE_LABEL = "io.gpuenv.probe=1"
STOP_GRACE = 2  # $GPUENV_STOP_GRACE for the tests (gpuenv's default is 10 s)


def base_env(**extra: str) -> dict[str, str]:
    return clean_env(GPUENV_STOP_GRACE=str(STOP_GRACE), **extra)


# --------------------------------------------------------------------------- images


@pytest.fixture(scope="session")
def cpu_image() -> str:
    """The shipped CPU cell's image; `gpuenv build` makes it once when it is missing."""
    if not has_image(CPU_IMAGE):
        build_cells(CPU_CELL)
    return CPU_IMAGE


@pytest.fixture(scope="session")
def gpu_image() -> str:
    """The shipped GPU cell's image when it is already built (the run tests never build
    5 GB of CUDA wheels just to check which image `-i` picked)."""
    if not has_image(GPU_IMAGE):
        pytest.skip(f"{GPU_IMAGE} is not built (gpuenv build {GPU_CELL})")
    return GPU_IMAGE


# --------------------------------------------------------------------------- running the CLI


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh working directory that any uid can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="gpuenv-run-", dir="/tmp"))
    path.chmod(0o755)
    cleanup.claim_dir(path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Running:
    """A background `gpuenv run` whose stdout/stderr lines are collected as they arrive."""

    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    out: list[tuple[float, str]] = field(default_factory=list)
    err: list[tuple[float, str]] = field(default_factory=list)
    _lines: queue.Queue[tuple[str, float, str]] = field(default_factory=queue.Queue)
    _readers: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr)):
            t = threading.Thread(target=self._read, args=(name, pipe), daemon=True)
            t.start()
            self._readers.append(t)

    def _read(self, name: str, pipe: Any) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            stamp = time.monotonic()
            (self.out if name == "out" else self.err).append((stamp, line))
            self._lines.put((name, stamp, line))
        pipe.close()

    def expect(self, needle: str, timeout: float = 60, stream: str = "out") -> float:
        """Wait until a line holding needle arrives on stream; returns its arrival time."""
        deadline = time.monotonic() + timeout
        while True:
            for stamp, line in list(self.out if stream == "out" else self.err):
                if needle in line:
                    return stamp
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self._lines.empty()):
                raise AssertionError(
                    f"no {needle!r} on std{stream} within {timeout}s "
                    f"(exit {self.proc.poll()})\n--- stdout\n{self.stdout}\n--- stderr\n"
                    f"{self.stderr}"
                )
            with contextlib.suppress(queue.Empty):
                self._lines.get(timeout=min(left, 0.2))

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        for t in self._readers:
            t.join(timeout=10)
        return code

    @property
    def stdout(self) -> str:
        return "".join(line for _, line in self.out)

    @property
    def stderr(self) -> str:
        return "".join(line for _, line in self.err)


def _run_args(args: tuple[str, ...], image: str | None) -> list[str]:
    head = ["run"]
    if image is not None:
        head += ["-i", image, "--network", "none"]
    return [*head, *args]


@pytest.fixture
def gpuenv_run(workdir: Path, cpu_image: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    """gpuenv_run(*args, image=CPU image or None, cwd=workdir, env=None, prefix=(), argv=GPUENV)

    Runs `gpuenv run -i IMAGE --network none ARGS...` to the end (text output). With
    image=None the caller gives -i/--network itself (or none, to test the default cell)."""

    def go(
        *args: str,
        image: str | None = cpu_image,
        cwd: Path = workdir,
        env: dict[str, str] | None = None,
        prefix: tuple[str, ...] | list[str] = (),
        argv: list[str] | None = None,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [*prefix, *(argv or GPUENV), *_run_args(args, image)]
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=cwd,
            env=env if env is not None else base_env(),
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    return go


@pytest.fixture
def spawn_run(workdir: Path, cpu_image: str) -> Iterator[Callable[..., Running]]:
    """spawn_run(*args, image=..., env=None) -> Running: `gpuenv run` in the background.

    Any process still running at the end of the test is killed."""
    started: list[Running] = []

    def go(*args: str, image: str | None = cpu_image, env: dict[str, str] | None = None) -> Running:
        proc = subprocess.Popen(
            [*GPUENV, *_run_args(args, image)],
            cwd=workdir,
            env=env if env is not None else base_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        running = Running(proc)
        started.append(running)
        return running

    yield go
    for running in started:  # a failed test: let gpuenv clean up, then insist
        if running.proc.poll() is None:
            running.proc.send_signal(signal.SIGTERM)
            try:
                running.proc.wait(timeout=STOP_GRACE + 20)
            except subprocess.TimeoutExpired:
                running.proc.kill()
                running.proc.wait()


# --------------------------------------------------------------------------- containers


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


def containers_of(client: docker.DockerClient, workdir: Path) -> list[Any]:
    """gpuenv run containers (any state) whose working directory is workdir, plus probes."""
    found = []
    for label in (RUN_LABEL, PROBE_LABEL):
        for c in client.containers.list(all=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.NotFound):
                attrs = c.attrs
                mounts = {m.get("Source") for m in attrs.get("Mounts", [])}
                if label == PROBE_LABEL or str(workdir) in mounts:
                    found.append(c)
    return found


@pytest.fixture
def leftovers(docker_client: docker.DockerClient, workdir: Path) -> Iterator[Callable[[], list]]:
    """leftovers() -> containers gpuenv left for this test; checked again after the test
    (support/cleanup.py's fails_on_leftovers: new ones fail it, and are removed)."""

    def now() -> list[Any]:
        return containers_of(docker_client, workdir)

    with cleanup.fails_on_leftovers(lambda: {c.id: c.short_id for c in now()}):
        yield now


def wait_for_container(
    client: docker.DockerClient, workdir: Path | None, timeout: float = 30
) -> Any:
    """The (running) gpuenv run container for workdir (any when workdir is None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in client.containers.list(filters={"label": RUN_LABEL}):
            mounts = {m.get("Source") for m in c.attrs.get("Mounts", [])}
            if workdir is None or str(workdir) in mounts:
                return c
        time.sleep(0.1)
    raise AssertionError(f"no running gpuenv container for {workdir} within {timeout}s")


# --------------------------------------------------------------------------- other callers


@dataclass(frozen=True)
class Caller:
    """How to run the CLI as another uid: prefix + argv + environment."""

    name: str
    uid: int
    gid: int
    prefix: tuple[str, ...]
    argv: list[str]
    env: dict[str, str]


def _docker_gid() -> int:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        pytest.skip(f"DOCKER_HOST={host} is not a local socket: no docker group to join")
    gid = os.stat(host.removeprefix("unix://")).st_gid
    if gid == 0:
        pytest.skip("the Docker socket belongs to group root: no docker group to join")
    return gid


def _cli_for(prefix: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The CLI as that user can start it: the venv's entry point when its interpreter is
    reachable, else the system Python of the same version with the venv's site-packages and
    the repository on PYTHONPATH (a venv made from a pyenv Python under /root is not)."""
    probe = subprocess.run([*prefix, *GPUENV, "--help"], capture_output=True, env=env, timeout=60)
    if probe.returncode == 0:
        return GPUENV, env
    py = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin")
    if py is None:
        pytest.skip(f"no Python the test user can run: {probe.stderr.decode()[-300:]}")
    env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), *site.getsitepackages()])}
    argv = [py, "-m", "gpuenv"]
    probe = subprocess.run([*prefix, *argv, "--help"], capture_output=True, env=env, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"the test user cannot run gpuenv: {probe.stderr.decode()[-300:]}")
    return argv, env


@pytest.fixture(scope="session")
def docker_user() -> Iterator[Caller]:
    """A throw-away user (own group, member of the docker group), removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("creating a test user needs root, useradd and runuser")
    group = grp.getgrgid(_docker_gid()).gr_name
    name = f"gpuenv-t{os.getpid()}"
    home = Path(tempfile.mkdtemp(prefix="gpuenv-home-", dir="/tmp"))
    home.rmdir()  # useradd --create-home makes it, owned by the user
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", str(home), "--user-group",
         "--groups", group, "--shell", "/bin/sh", name],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    try:
        import pwd

        entry = pwd.getpwnam(name)
        prefix = ["runuser", "-u", name, "--"]
        argv, env = _cli_for(prefix, base_env())
        yield Caller(name, entry.pw_uid, entry.pw_gid, tuple(prefix), argv, env)
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def nameless_uid() -> Caller:
    """uid 4242 with no passwd entry (as in CI runners), in the docker group, HOME unset."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("switching to uid 4242 needs root and setpriv")
    import pwd

    with contextlib.suppress(KeyError):
        pwd.getpwuid(4242)
        pytest.skip("uid 4242 has a passwd entry on this machine")
    prefix = ["setpriv", "--reuid=4242", "--regid=4242", f"--groups={_docker_gid()}", "--"]
    env = base_env()
    env.pop("HOME", None)
    argv, env = _cli_for(prefix, env)
    return Caller("uid4242", 4242, 4242, tuple(prefix), argv, env)


# --------------------------------------------------------------------------- a GPU-capable engine

HOOK = """#!/bin/sh
# Stand-in for nvidia-container-runtime-hook (gpuenv tests): records how the engine called
# it (argv, then the OCI state on stdin) and succeeds. It never makes a GPU appear.
{{ printf 'argv:'; printf ' %s' "$@"; printf '\\n'; cat; printf '\\n'; }} >> {log}
exit 0
"""


@dataclass
class GpuEngine:
    host: str  # DOCKER_HOST value
    hook_log: Path
    client: docker.DockerClient
    root: Path

    def clean(self) -> list[str]:
        """Remove every container of this (test-only) engine; returns their IDs."""
        removed = []
        for c in self.client.containers.list(all=True):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)
            removed.append(c.id)
        return removed


@pytest.fixture(scope="session")
def gpu_engine() -> Iterator[GpuEngine]:
    """A second dockerd (tests/integration/dockerd.py) with a stand-in hook on its PATH, so
    that it accepts --gpus (and injects NVIDIA_VISIBLE_DEVICES). SMALL_IMAGE is copied in."""
    if not has_image(SMALL_IMAGE):
        pytest.skip(f"{SMALL_IMAGE} is missing (gpuenv base makes it)")

    def install_hook(root: Path) -> Path:
        (root / "bin").mkdir()
        (root / "hook.log").touch()
        hook = root / "bin" / "nvidia-container-runtime-hook"
        hook.write_text(HOOK.format(log=root / "hook.log"))
        hook.chmod(0o755)
        return root / "bin"

    with second_dockerd("gpuenv-dd-", install_hook) as (client, root):
        host = f"unix://{root / 'd.sock'}"
        saver = subprocess.Popen(["docker", "save", SMALL_IMAGE], stdout=subprocess.PIPE)
        loaded = subprocess.run(
            ["docker", "-H", host, "load"],
            stdin=saver.stdout, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        saver.stdout.close()  # type: ignore[union-attr]
        saver.wait(timeout=60)
        assert loaded.returncode == 0, f"docker load into the test engine: {loaded.stderr}"
        yield GpuEngine(host, root / "hook.log", client, root)
