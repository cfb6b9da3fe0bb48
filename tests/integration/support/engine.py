"""The Docker Engine the tests use: whether one answers, the docker CLI, and containers the
tests start themselves.

Tests start containers only through TrackedContainer (modelled on jupyter/docker-stacks'
TrackedContainer): it creates the container with this session's label, and removes it when
the ``with`` block ends, whatever happened, including a command that timed out (where
`docker run --rm` would leave the container running once its client is killed)."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

from support.cells import SESSION_ID
from support.cli import Proc, output

# This pytest session, on an engine others may share: the label of every container it starts
# by hand (support.cleanup removes what is left with it).
SESSION_LABEL_KEY = "io.gpuenv.test-session"
SESSION_LABEL = f"{SESSION_LABEL_KEY}={SESSION_ID}"


@functools.cache
def engine_problem() -> str | None:
    """None when an engine answers, else why not (gpuenv's own one-line message)."""
    try:
        from gpuenv.engine.client import connect
        from gpuenv.matrix.errors import GpuenvError
    except ImportError as exc:  # pragma: no cover - the project is not installed
        return f"gpuenv is not importable: {exc}"
    try:
        connect()
    except GpuenvError as exc:
        return exc.message
    return None


def docker(*args: str, host: str | None = None, check: bool = True, timeout: float = 600) -> Proc:
    """`docker [-H host] ARGS...` (text output); check=True fails with what it printed."""
    argv = ["docker", *(["-H", host] if host else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {output(proc)}")
    return proc


def inspect(ref: str, host: str | None = None) -> dict[str, Any] | None:
    """`docker image inspect`, or None when there is no such image."""
    proc = docker("image", "inspect", ref, host=host, check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 else None


def image_id(ref: str, host: str | None = None) -> str | None:
    proc = docker("image", "inspect", "-f", "{{.Id}}", ref, host=host, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def has_image(ref: str, host: str | None = None) -> bool:
    return image_id(ref, host) is not None


class TrackedContainer:
    """A container this session starts by hand; always removed on leaving the ``with``.

        with TrackedContainer(image, "python", "-c", code, user="1000") as c:
            proc = c.run()

    Created labelled ``io.gpuenv.test-session=<this session>``, with no network unless told
    otherwise (these machines have no bridge)."""

    def __init__(
        self,
        image: str,
        *cmd: str,
        user: str | None = None,
        network: str = "none",
        host: str | None = None,
        options: tuple[str, ...] = (),
    ) -> None:
        self.image, self.cmd, self.host = image, cmd, host
        self.create_args = ["--label", SESSION_LABEL, "--network", network, *options]
        if user is not None:
            self.create_args += ["--user", user]
        self.id: str | None = None

    def __enter__(self) -> TrackedContainer:
        proc = docker("create", *self.create_args, self.image, *self.cmd, host=self.host)
        self.id = proc.stdout.strip()
        return self

    def run(self, *, check: bool = True, timeout: float = 300) -> Proc:
        """Start it attached and wait: its exit status and output (stdout, stderr apart)."""
        assert self.id is not None, "use TrackedContainer in a with block"
        return docker("start", "-a", self.id, host=self.host, check=check, timeout=timeout)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.id is not None:
            docker("rm", "-f", "-v", self.id, host=self.host, check=False, timeout=120)
            self.id = None


def run_in_image(image: str, *cmd: str, user: str | None = None, timeout: float = 300) -> str:
    """stdout of CMD in a fresh container of IMAGE (no network), removed afterwards."""
    with TrackedContainer(image, *cmd, user=user) as container:
        return container.run(timeout=timeout).stdout


# What an image's files are, ignoring when they were written: each regular file, link and
# directory under / (not the kernel's or the runtime's mounts) with its mode, owner, size and
# sha256 or target, hashed in one line. Two builds of one lock on two engines, not rewritten
# --reproducible, differ only in mtimes and history: this compares what a container gets.
FILES_DIGEST = """
import hashlib, os, stat
skip = {"/proc", "/sys", "/dev", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/mnt"}
total = hashlib.sha256()
for top, dirs, files in os.walk("/"):
    dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in skip)
    for name in sorted(dirs + files):
        path = os.path.join(top, name)
        if path in skip:
            continue
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                what = hashlib.file_digest(f, "sha256").hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = os.readlink(path)
        else:
            what = ""
        size = st.st_size if what else 0
        total.update(f"{path} {st.st_mode:o} {st.st_uid} {st.st_gid} {size} {what}\\n".encode())
print(total.hexdigest())
"""


def logging_docker_cli(tmp: Path) -> dict[str, Path]:
    """A stand-in for the docker CLI gpuenv builds with: the same CLI (the one gpuenv picks
    here), with what each build prints (the engine's build log) and its arguments kept."""
    from gpuenv.engine.client import buildkit_cli, connect

    real = buildkit_cli(connect())[0][0]
    log, args = tmp / "build.log", tmp / "build.args"
    wrapper = tmp / "docker"
    wrapper.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = build ] || [ "$1 $2" = "buildx build" ]; then\n'
        f'  printf "%s\\n" "$*" >> {args}\n'
        "  set -o pipefail\n"
        f'  {real} "$@" 2>&1 | tee -a {log}\n'
        "  exit $?\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return {"wrapper": wrapper, "log": log, "args": args}
