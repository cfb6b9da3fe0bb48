"""The BuildKit driver: Docker engines build through the docker CLI (the SDK cannot drive
BuildKit: docker/docker-py#2230), which sends the context over the build session: local,
rootless, Desktop and remote engines alike. `Builds` runs those CLIs for one engine and
cancels them when gpuenv ends (a CLI left running would outlive gpuenv, and could tag)."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from gpuenv.engine.values import BuildCancelled, BuildFailed, EngineError, LogSink

# What the docker CLI ends a build with when the engine went away under it (restarted,
# killed, the link down), not because a step failed: the session's stream ended unanswered.
_ENGINE_GONE = (
    "did not provide an image ID",
    "Cannot connect to the Docker daemon",
    "error during connect",
    "transport is closing",
    "connection reset by peer",
)
# What the docker CLI ends a build with when it was cancelled (SIGINT: end() or a terminal's
# Ctrl-C), not because a step failed.
_CANCELLED = "context canceled"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class Builds:
    """The docker CLIs building on one engine now (subprocess.Popen), and whether gpuenv is
    ending (end(): no docker CLI starts building any more)."""

    def __init__(self) -> None:
        self._procs: set[Any] = set()
        self._ending = False
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """The docker CLIs building now are told to cancel."""
        with self._lock:
            procs = list(self._procs)
        _cancel(procs)

    def end(self) -> None:
        """Cancel the builds in flight, and start none from now on."""
        with self._lock:
            self._ending = True
            procs = list(self._procs)
        _cancel(procs)

    def build(
        self, url: str, directory: Path, labels: dict[str, str], nocache: bool, network: str,
        on_log: LogSink, platform: str | None = None, secrets: dict[str, Path] | None = None,
    ) -> str:  # fmt: skip
        """Build `directory` with BuildKit on the engine at `url`, without tagging; the
        image ID."""
        import subprocess
        import tempfile

        cli, env = buildkit_cli()
        with tempfile.TemporaryDirectory(prefix="gpuenv-build-") as tmp:
            iidfile = Path(tmp) / "iid"
            command = [*cli, "--progress", "plain", "--network", network,
                       "--iidfile", str(iidfile)]  # fmt: skip
            for key, value in sorted(labels.items()):
                command += ["--label", f"{key}={value}"]
            if nocache:
                command.append("--no-cache")
            if platform:
                command += ["--platform", platform]
            for name, path in sorted((secrets or {}).items()):
                command += ["--secret", f"id={name},src={path}"]
            command.append(str(directory))
            tail: list[str] = []
            with self._lock:
                if self._ending:
                    raise EngineError("gpuenv is ending: the build was not started")
                proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace")  # fmt: skip
                self._procs.add(proc)
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    line = _ANSI.sub("", line.rstrip("\n"))
                    on_log(line)
                    tail.append(line)
                    del tail[:-20]
            except BaseException:
                _cancel([proc])
                raise
            finally:
                code = proc.wait()
                self._procs.discard(proc)
            if code != 0:
                errors = [t for t in tail if t.startswith(("ERROR", "error", "failed to"))]
                why = (errors or tail or [f"exit {code}"])[-1]
                message = why.removeprefix("ERROR: ").strip()
                with self._lock:  # end() set it before it cancelled this CLI
                    ending = self._ending
                if ending:  # whatever the CLI said as it ended: gpuenv's interruption
                    raise BuildCancelled(message)
                if any(sign in line for line in tail[-3:] for sign in _ENGINE_GONE):
                    raise EngineError(f"the Docker Engine at {url} went away during the "
                                      "build; nothing was tagged", detail=why)  # fmt: skip
                if any(_CANCELLED in line for line in tail[-3:]):
                    raise BuildCancelled(message)
                raise BuildFailed(message)
            return iidfile.read_text().strip()


def _cancel(builds: list[Any]) -> None:
    """Ctrl-C or SIGTERM to gpuenv alone: each docker CLI building is sent SIGINT, on which it
    cancels its build (the engine stops the step, nothing is tagged), as at a terminal;
    killed if it has not ended within 30 s."""
    import signal
    import subprocess

    for proc in builds:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    for proc in builds:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def buildkit_cli(engine: object = None) -> tuple[list[str], dict[str, str]]:
    """The command that builds with BuildKit on this engine, and its environment: the first
    of $GPUENV_DOCKER_CLI and each `docker` on PATH (then /usr/bin/docker) that has buildx
    (`docker buildx build --load`) or is older than 23, whose own client BuildKit is
    (`DOCKER_BUILDKIT=1 docker build`; from 23 on, `docker build` needs buildx). It talks to
    the engine gpuenv talks to: DOCKER_HOST and TLS from the environment, or the socket
    (`engine` is not asked: the same CLI serves every engine)."""
    import shutil
    import subprocess

    env = dict(os.environ)
    if _cli.found is not None:
        return list(_cli.found), {**env, "DOCKER_BUILDKIT": "1"}
    candidates = [os.environ.get("GPUENV_DOCKER_CLI", "")]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidates.append(os.path.join(directory, "docker") if directory else "")
    candidates.append("/usr/bin/docker")
    tried = []
    for candidate in dict.fromkeys(c for c in candidates if c):
        path = shutil.which(candidate)
        if path is None or path in tried:
            continue
        tried.append(path)
        probe = {**env, "DOCKER_CLI_HINTS": "false"}
        buildx = subprocess.run([path, "buildx", "version"], env=probe, capture_output=True,
                                text=True, check=False, timeout=30)  # fmt: skip
        if buildx.returncode == 0:
            _cli.found = (path, "buildx", "build", "--load")
            break
        version = subprocess.run([path, "version", "--format", "{{.Client.Version}}"],
                                 env=probe, capture_output=True, text=True, check=False,
                                 timeout=30)  # fmt: skip
        major = re.match(r"(\d+)\.", version.stdout.strip())
        if major and int(major.group(1)) < 23:
            _cli.found = (path, "build")
            break
    if _cli.found is None:
        raise EngineError(
            "building needs BuildKit, through a docker CLI with buildx (tried: "
            f"{', '.join(tried) or 'no docker on PATH'}); install docker-buildx (Debian, "
            "Ubuntu: docker-buildx; Docker's own packages: docker-buildx-plugin), or point "
            "GPUENV_DOCKER_CLI at a docker CLI that has it"
        )
    return list(_cli.found), {**env, "DOCKER_BUILDKIT": "1"}


class _Cli:
    found: tuple[str, ...] | None = None


_cli = _Cli()
