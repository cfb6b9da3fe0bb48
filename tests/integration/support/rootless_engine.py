"""A rootless Docker Engine: Debian's dockerd-rootless.sh (rootlesskit + slirp4netns) run by a
throwaway local user, as a user without root runs Docker. Its network namespace is
rootlesskit's own, so it shares nothing of this machine's loopback.

The user is made for the lab (useradd gives it subordinate id ranges) and removed after;
/dev/net/tun is 0600 on these machines and slirp4netns cannot open it then, so it is made
0666 for the lab (what Debian's udev rule gives) and restored. Teardown, whatever happened:
dockerd stopped by the PID in its pid file, every process of the user and its subordinate
uids ended by PID, mounts under its directories unmounted, the user and its files removed.
Skipped (with the reason) when not root or a piece is missing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.private_engine import poll_gone, unmount_under

SCRIPT = Path("/usr/share/docker.io/contrib/dockerd-rootless.sh")
TUN = Path("/dev/net/tun")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[:500]}")
    return proc


@dataclass
class RootlessEngine:
    user: str
    uid: int
    runtime: Path  # XDG_RUNTIME_DIR: docker.sock, docker.pid
    home: Path

    @property
    def sock(self) -> str:
        return f"unix://{self.runtime / 'docker.sock'}"

    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.sock}


def _subordinate_range(user: str) -> tuple[int, int] | None:
    for line in Path("/etc/subuid").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name == user:
            start, _, count = rest.partition(":")
            return int(start), int(count)
    return None


def _pids_of(uids: range | list[int]) -> list[int]:
    wanted = set(uids)
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid in wanted:
                    pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def rootless_engine(log: Path) -> Iterator[RootlessEngine]:
    if os.geteuid() != 0:
        pytest.skip("the rootless engine lab makes a local user: needs root")
    missing = [t for t in ("rootlesskit", "slirp4netns", "newuidmap", "useradd") if not
               shutil.which(t, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")]  # fmt: skip
    if missing or not SCRIPT.exists() or not TUN.exists():
        pytest.skip(f"a rootless dockerd needs rootlesskit, slirp4netns, uidmap and {SCRIPT}")
    user = f"gpuenv-rl{os.getpid() % 100000}"
    tun_mode = TUN.stat().st_mode & 0o777
    made_user = False
    engine: RootlessEngine | None = None
    out = log.open("wb")
    try:
        _run("useradd", "--create-home", "--shell", "/bin/sh", user)
        made_user = True
        entry = pwd.getpwnam(user)
        runtime = Path(f"/run/user/{entry.pw_uid}")
        runtime.mkdir(parents=True, exist_ok=True)
        os.chown(runtime, entry.pw_uid, entry.pw_gid)
        runtime.chmod(0o700)
        TUN.chmod(0o666)
        engine = RootlessEngine(user, entry.pw_uid, runtime, Path(entry.pw_dir))
        env = {"HOME": entry.pw_dir, "USER": user, "XDG_RUNTIME_DIR": str(runtime),
               "PATH": SYSTEM_PATH}  # fmt: skip
        subprocess.Popen(
            ["setsid", "runuser", "-u", user, "--", "env", "-i",
             *(f"{k}={v}" for k, v in env.items()), str(SCRIPT),
             "--data-root", f"{entry.pw_dir}/docker-data"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            ping = _run("docker", "-H", engine.sock, "version", check=False, timeout=10)
            if ping.returncode == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the rootless dockerd did not answer: {log.read_text()[-1500:]}")
            time.sleep(0.3)
        yield engine
    finally:
        out.close()
        if engine is not None:
            _stop(engine)
        TUN.chmod(tun_mode)
        if made_user:
            _run("userdel", "--remove", user, check=False)
            shutil.rmtree(f"/run/user/{engine.uid}" if engine else "/nonexistent", True)


def _stop(engine: RootlessEngine) -> None:
    """dockerd by its pid file, then whatever the user and its subordinate ids still run."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((engine.runtime / "docker.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        poll_gone(pid, timeout=30)
    span = _subordinate_range(engine.user)
    uids = [engine.uid, *(range(span[0], span[0] + span[1]) if span else [])]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_of(uids)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        for pid in pids:
            poll_gone(pid, timeout=10)
    unmount_under(engine.home)
    unmount_under(engine.runtime)
