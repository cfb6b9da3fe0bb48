"""A private dockerd that the fault tests may restart, fill up and break: never the shared
engine at /var/run/docker.sock, which other sessions use.

Its data root is a loop-mounted ext4 filesystem of its own (a sparse file: only what is
written takes space), so a test can fill that disk for real and the engine's writes fail
with ENOSPC. Own socket, exec root and pidfile; no bridge, no iptables. ``restart()`` stops
dockerd by its PID (SIGTERM, as systemd does) and starts it again on the same data root.
Everything is stopped by PID and unmounted and removed when the context ends, even when the
test failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.engine import docker

DISK_MB = 4096  # the data root's filesystem (sparse; a few hundred MB are really written)


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class PrivateEngine:
    root: Path  # /tmp/gpuenv-pe-XXXX: socket, logs, exec root, the disk image
    mount: Path  # the ext4 filesystem; data root at mount/data
    dockerd: str
    # More dockerd options (another storage driver), and the CPUs it may run on (taskset):
    # its containers and build steps inherit them, so they see that many processors.
    options: tuple[str, ...] = ()
    cpus: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _logs: list[object] = field(default_factory=list)

    @property
    def sock(self) -> Path:
        return self.root / "d.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def docker(self, *args: str, check: bool = True, timeout: float = 600) -> Proc:
        return docker(*args, host=self.host, check=check, timeout=timeout)

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        log = (self.root / "dockerd.log").open("ab")
        self._logs.append(log)
        pinned = ["taskset", "-c", self.cpus] if self.cpus else []
        self.proc = subprocess.Popen(
            [*pinned, self.dockerd, "--data-root", str(self.mount / "data"),
             "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "d.pid"),
             "-H", self.host, "--bridge=none", "--iptables=false", "--ip-masq=false",
             *self.options],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                why = f"a private dockerd could not start (exit {self.proc.returncode}): "
                if self.restarts:  # it started before: failing to come back is a failure
                    pytest.fail(why + self.log_tail())
                pytest.skip(why + self.log_tail())
            try:
                answered = self.sock.exists() and self.docker("version", check=False, timeout=10)
            except subprocess.TimeoutExpired:  # restoring after a crash: not yet
                answered = False
            if answered and answered.returncode == 0:
                return
            time.sleep(0.2)
        pytest.fail(f"the private dockerd did not answer within {timeout} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return (self.root / "dockerd.log").read_text(errors="replace")[-1500:]

    def stop(self) -> None:
        """SIGTERM to dockerd (by PID), wait; its containerd too if it stayed."""
        if self.proc is not None:
            stop_dockerd(self.proc, self.root)
        self.proc = None

    def restart(self, crash: bool = False) -> None:
        """Stop dockerd (SIGTERM, as systemd does; SIGKILL with `crash`) and start it again
        on the same data root. After a crash its containerd is left to the new dockerd."""
        if crash and self.proc is not None:
            containerd = containerd_pid(self.root)
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            if containerd is not None:  # the whole engine crashed: its containerd too
                with contextlib.suppress(OSError):
                    os.kill(containerd, signal.SIGKILL)
                poll_gone(containerd)
        self.stop()
        self.restarts += 1
        self.start()

    # ------------------------------------------------------------------ state

    def containers(self) -> list[str]:
        """Every container of this engine, stopped ones too: `ID image status`."""
        out = self.docker("ps", "-a", "--no-trunc", "--format",
                          "{{.ID}} {{.Image}} {{.Status}}").stdout  # fmt: skip
        return [line for line in out.splitlines() if line.strip()]

    def image_id(self, ref: str) -> str | None:
        proc = self.docker("image", "inspect", "-f", "{{.Id}}", ref, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def tags(self) -> set[str]:
        out = self.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        return {line for line in out.split() if "<none>" not in line}

    def free_bytes(self) -> int:
        st = os.statvfs(self.mount)
        return st.f_bavail * st.f_frsize

    @contextlib.contextmanager
    def disk_nearly_full(self, leave_mb: int) -> Iterator[None]:
        """Fill the data root's filesystem until `leave_mb` MB are free; freed afterwards."""
        filler = self.mount / "filler"
        size = self.free_bytes() - leave_mb * 1024 * 1024
        try:
            if size > 0:
                with open(filler, "wb") as fh:
                    os.posix_fallocate(fh.fileno(), 0, size)
            yield
        finally:
            filler.unlink(missing_ok=True)


Proc = subprocess.CompletedProcess[str]


def poll_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


@contextlib.contextmanager
def private_engine(
    prefix: str = "gpuenv-pe-",
    options: tuple[str, ...] = (),
    cpus: str | None = None,
    disk_mb: int | None = None,
) -> Iterator[PrivateEngine]:
    """A started private engine (dockerd `options`, on `cpus` alone, a data root of
    `disk_mb`, sparse); stopped, unmounted and removed afterwards."""
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    if (
        os.geteuid() != 0
        or dockerd is None
        or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:" + os.environ.get("PATH", "")) is None
    ):
        pytest.skip("a private dockerd needs root, dockerd and mkfs.ext4")  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: socket paths
    mount = root / "disk"
    mount.mkdir()
    image = root / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate((disk_mb or DISK_MB) * 1024 * 1024)
    mkfs = shutil.which("mkfs.ext4", path="/usr/sbin:/sbin") or "mkfs.ext4"
    mounted = False
    engine = PrivateEngine(root, mount, dockerd, options, cpus)
    try:
        made = _run(mkfs, "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image))
        if made.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()[:300]}")
        mounted_proc = _run("mount", "-o", "loop", str(image), str(mount))
        if mounted_proc.returncode != 0:
            pytest.skip(f"cannot loop-mount a filesystem here: {mounted_proc.stderr.strip()[:300]}")
        mounted = True
        engine.start()
        yield engine
    finally:
        engine.stop()
        for log in engine._logs:
            with contextlib.suppress(Exception):
                log.close()  # type: ignore[attr-defined]
        end_processes_under(root)
        unmount_under(root)
        if mounted:
            _run("umount", str(mount))
            if _run("mountpoint", "-q", str(mount)).returncode == 0:
                _run("umount", "-l", str(mount))
        shutil.rmtree(root, ignore_errors=True)


def containerd_pid(root: Path) -> int | None:
    """The containerd a dockerd started under root (its command line names root), or None."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((root / "exec/containerd/containerd.pid").read_text())
        if str(root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def stop_dockerd(proc: subprocess.Popen[bytes], root: Path) -> None:
    """SIGTERM to a dockerd these tests started (by PID; SIGKILL after 60 s), then to the
    containerd it started if that outlived it (a dockerd that was killed leaves it)."""
    containerd = containerd_pid(root)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if containerd is not None and containerd_pid(root) == containerd:
        with contextlib.suppress(OSError):
            os.kill(containerd, signal.SIGTERM)


def end_processes_under(root: Path) -> None:
    """Processes whose command line names root: containerd shims that outlived their
    containerd (killed with dockerd in a crash test). Ours, by PID, SIGTERM then SIGKILL."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(root).encode() in (entry / "cmdline").read_bytes():
                    mine.append(int(entry.name))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        for pid in mine:
            poll_gone(pid, timeout=5)


def unmount_under(root: Path) -> None:
    """Every mount below root, deepest first (dockerd's netns file, overlays, the disk's)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(str(root) + "/")), key=len,
                        reverse=True):  # fmt: skip
        if point != str(root / "disk"):  # the data root's disk: unmounted by its owner
            _run("umount", "-l", point)


def load_image(host: str, ref: str) -> None:
    """`docker save REF | docker -H HOST load`: an image of the shared engine, copied."""
    save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
    try:
        load = subprocess.run(["docker", "-H", host, "load"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    finally:
        assert save.stdout is not None
        save.stdout.close()
        save.wait(timeout=300)
    assert load.returncode == 0 and save.returncode == 0, load.stderr
