"""podman's Docker-compatible API service (`podman system service`), as RHEL and HPC sites
run it: its own storage and run directories under a temporary directory, a Unix socket
there, started and stopped by PID. Skipped (with the reason) when podman is missing or it
cannot start here.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.private_engine import end_processes_under, poll_gone, unmount_under


@dataclass
class PodmanEngine:
    root: Path

    @property
    def sock(self) -> str:
        return f"unix://{self.root / 'podman.sock'}"

    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.sock}

    def podman(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CONTAINERS_CONF": str(self.root / "containers.conf")}
        return subprocess.run(["podman", *self.storage(), *args], capture_output=True, env=env,
                              text=True, timeout=300, check=False, **kw)  # type: ignore[call-overload]  # fmt: skip

    def storage(self) -> list[str]:
        return ["--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
                "--storage-driver", "overlay"]  # fmt: skip


def load_into_podman(engine: PodmanEngine, ref: str) -> None:
    """`docker save REF | podman load`: the image ID (its config's digest) is kept."""
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    try:
        load = engine.podman("load", stdin=save.stdout)
    finally:
        assert save.stdout is not None
        save.stdout.close()
        save.wait(timeout=300)
    assert load.returncode == 0 and save.returncode == 0, load.stderr


@contextlib.contextmanager
def podman_engine() -> Iterator[PodmanEngine]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: podman)")
    root = Path(tempfile.mkdtemp(prefix="gpuenv-pm-", dir="/tmp"))
    engine = PodmanEngine(root)
    # podman gives containers nofile and nproc limits above what this sandbox lets runc set
    # ("error setting rlimit ... operation not permitted"); modest ones start.
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1024)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    conf = root / "containers.conf"
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", '
                    f'"nproc={nproc}:{nproc}"]\n')  # fmt: skip
    log = (root / "service.log").open("wb")
    proc = subprocess.Popen(
        ["podman", *engine.storage(), "system", "service", "--time=0", engine.sock],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.skip(f"podman's service did not start: {(root / 'service.log').read_text()}")
            ping = subprocess.run(["docker", "-H", engine.sock, "version"], capture_output=True,
                                  text=True, timeout=10, check=False)  # fmt: skip
            if ping.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail("podman's service did not answer within 60 s")
            time.sleep(0.2)
        yield engine
    finally:
        log.close()
        with contextlib.suppress(Exception):
            engine.podman("rm", "--all", "--force")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        poll_gone(proc.pid, timeout=5)
        end_processes_under(root)  # conmon of a container that outlived the service
        # Not `podman system reset`: it removes more than this lab's storage.
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
