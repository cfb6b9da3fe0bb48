"""A second, throwaway dockerd for the tests that need an engine of their own (an empty data
root, or a stand-in runtime hook on its PATH). Own data-root, exec-root, pidfile and socket;
no bridge, no iptables. Stopped by its PID, its containerd too if dockerd was killed, and
its directories removed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from support.private_engine import stop_dockerd, unmount_under


@contextlib.contextmanager
def second_dockerd(
    prefix: str, prepare: Callable[[Path], Path | None] | None = None
) -> Iterator[tuple[docker.DockerClient, Path]]:
    """Yields (client, root); DOCKER_HOST is client.api.base_url's unix://<root>/d.sock.

    ``prepare(root)`` may return a directory to put first on dockerd's PATH."""
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    if os.geteuid() != 0 or dockerd is None:
        pytest.skip("a second dockerd needs root and the dockerd binary")
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: socket paths
    path_dir = prepare(root) if prepare else None
    env = dict(os.environ)
    if path_dir is not None:
        env["PATH"] = f"{path_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    sock = root / "d.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [dockerd, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "d.pid"), "-H", f"unix://{sock}",
         "--bridge=none", "--iptables=false", "--ip-masq=false"],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    client = None
    try:
        client = _wait(proc, sock, root)
        yield client, root
    finally:
        _stop(proc, client, root)
        log.close()


def _wait(proc: subprocess.Popen[bytes], sock: Path, root: Path) -> docker.DockerClient:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
            pytest.skip(f"a second dockerd could not start here (exit {proc.returncode}): {tail}")
        if sock.exists():
            client = docker.DockerClient(base_url=f"unix://{sock}", timeout=300)
            try:
                client.ping()
                return client
            except Exception:
                client.close()
        time.sleep(0.2)
    tail = (root / "dockerd.log").read_text(errors="replace")[-1500:]
    pytest.skip(f"a second dockerd did not answer within 60 s: {tail}")


def _stop(proc: subprocess.Popen[bytes], client: docker.DockerClient | None, root: Path) -> None:
    if client is not None:
        with contextlib.suppress(Exception):
            for c in client.containers.list(all=True):
                c.remove(force=True)
        client.close()
    stop_dockerd(proc, root)
    unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)
