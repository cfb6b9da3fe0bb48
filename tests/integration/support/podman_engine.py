"""podman's Docker-compatible API service (`podman system service`), as RHEL and HPC sites
run it: its own storage and run directories under a temporary directory, a Unix socket
there, started and stopped by PID. Skipped (with the reason) when podman is missing or it
cannot start here.

With `cdi_dir`, the service runs in a private mount namespace where that directory is
mounted on /run/cdi (= /var/run/cdi, where podman 4.3 reads CDI specs; it has no setting for
another place): the lab's specs reach its podman alone, never this machine's other engines
or `gpuenv doctor`. An empty /run/cdi is made for the mount if there is none, and removed.
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


CDI_RUN_DIR = Path("/run/cdi")


@contextlib.contextmanager
def podman_engine(cdi_dir: Path | None = None) -> Iterator[PodmanEngine]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (Debian: podman)")
    if cdi_dir is not None and shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is needed to give podman a private /run/cdi")
    made_run_cdi = False
    if cdi_dir is not None and not CDI_RUN_DIR.exists():
        CDI_RUN_DIR.mkdir(mode=0o755)
        made_run_cdi = True
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
    service = ["podman", *engine.storage(), "system", "service", "--time=0", engine.sock]
    if cdi_dir is not None:  # unshare and sh exec: the PID stays the service's
        service = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f'mount --bind "$0" {CDI_RUN_DIR} && exec "$@"', str(cdi_dir),
                   *service]  # fmt: skip
    proc = subprocess.Popen(
        service,
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
        if made_run_cdi:
            with contextlib.suppress(OSError):
                CDI_RUN_DIR.rmdir()
