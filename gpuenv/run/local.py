"""`gpuenv run`: a workload in a cell's image, as if it ran locally.

The current directory is mounted at the same path and is the working directory; the
container runs as the caller's uid:gid with a writable HOME; output streams live; the exit
code is the container's. Every path (success, failure, engine error, interrupt) removes the
container. gpuenv's own failures exit 125 (engine, preflight, image), 126 or 127, as
`docker run` does.

Ctrl-C or SIGTERM stops the container as `docker stop` does: SIGTERM, then SIGKILL after a
grace period of GRACE_SECONDS (10 s), or `$GPUENV_STOP_GRACE` seconds when that is set to a
whole number (0 kills at once); a second signal kills at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from gpuenv.engine.client import ContainerSpec, Engine, EngineError
from gpuenv.gpu.cdi import devices_for
from gpuenv.gpu.gpus import GpuRequest, explain_start_error
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run.console import run_error, warn
from gpuenv.run.options import parse_env, parse_ports, parse_volume

if TYPE_CHECKING:
    from gpuenv.gpu.monitor import MonitorOptions

GRACE_SECONDS = 10
GRACE_ENV = "GPUENV_STOP_GRACE"
SHM_SIZE = "2g"  # TensorFlow input pipelines and NCCL want more than Docker's 64 MB
HOME = "/home/gpuenv-run"


@dataclass
class RunOptions:
    image: str
    command: list[str]
    gpus: GpuRequest | None = None
    env: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    network: str | None = None
    workdir: str | None = None
    ipc: str | None = None
    interactive: bool = False
    monitor: MonitorOptions | None = None  # --monitor: sample the container's GPUs
    # The image's (amd64, arm64) when the caller inspected it already: not asked again.
    architecture: str | None = None
    cwd: Path = field(default_factory=Path.cwd)
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


def grace_seconds() -> int:
    """The stop grace period: $GPUENV_STOP_GRACE when it is a whole number, else 10 s."""
    value = os.environ.get(GRACE_ENV, "").strip()
    return int(value) if value.isdigit() else GRACE_SECONDS


_MISSING_SOURCE = re.compile(r"bind source path does not exist: ([^\s\"']+)")


def container_spec(opts: RunOptions) -> ContainerSpec:
    cwd = str(opts.cwd)
    if cwd == "/":
        raise run_error("run gpuenv from your project directory: it mounts the current directory")
    multi = multi_gpu_settings(opts.gpus, os.environ)
    env = {"HOME": HOME, **multi.env, **parse_env(opts.env)}
    return ContainerSpec(
        image=opts.image,
        command=opts.command,
        user=f"{opts.uid}:{opts.gid}",
        workdir=opts.workdir or cwd,
        env=env,
        binds=[f"{cwd}:{cwd}", *(parse_volume(v, opts.cwd) for v in opts.volumes)],
        ports=parse_ports(opts.ports),
        # A writable HOME owned by the caller, even for a uid with no passwd entry.
        tmpfs={HOME: f"rw,exec,uid={opts.uid},gid={opts.gid},mode=0755"},
        device_requests=[opts.gpus.as_api()] if opts.gpus else [],
        init=True,
        shm_size=None if opts.ipc else multi.shm_size,
        ipc=opts.ipc,
        network=opts.network,
        labels=contract.container_labels("run"),
        tty=opts.interactive,
        stdin=opts.interactive,
    )


@dataclass(frozen=True)
class MultiGpu:
    shm_size: str = SHM_SIZE
    env: dict[str, str] = field(default_factory=dict)


SHM_PER_GPU_GB = 2  # NCCL's shared-memory transport and each GPU's data-loader workers
SHM_ALL_GPUS = "16g"  # --gpus all: the count is the host's; a tmpfs limit costs nothing unused


def gpu_count(gpus: GpuRequest | None) -> int | None:
    """How many GPUs a request gives: N, the ids named, or None for all (the host's)."""
    if gpus is None:
        return 0
    if gpus.device_ids:
        return len(gpus.device_ids)
    return None if gpus.count == -1 else gpus.count


def multi_gpu_settings(gpus: GpuRequest | None, environ: Mapping[str, str]) -> MultiGpu:
    """What a container with several GPUs needs (NVIDIA's advice for NCCL and multi-GPU
    data loading): /dev/shm sized per GPU (2 GB each, 16 GB for all, instead of 2 GB; --ipc
    host replaces it) and the host's NCCL_* settings (NCCL_DEBUG, NCCL_SOCKET_IFNAME,
    NCCL_P2P_DISABLE...) passed through; -e still overrides them. One GPU, or none, keeps
    run's defaults. Locked memory (NVIDIA's --ulimit memlock=-1) is left to the engine's
    default-ulimits: raising it fails the start where dockerd may not (seen on this
    project's engine: "error setting rlimit type 8: operation not permitted")."""
    n = gpu_count(gpus)
    if n is not None and n <= 1:
        return MultiGpu()
    shm = SHM_ALL_GPUS if n is None else f"{max(2, SHM_PER_GPU_GB * n)}g"
    nccl = {k: v for k, v in environ.items() if k.startswith("NCCL_")}
    return MultiGpu(shm, nccl)


class _Stopper:
    """First SIGINT/SIGTERM: stop the container (SIGTERM, grace period, SIGKILL).
    A second one: kill it at once."""

    def __init__(self, engine: Engine, cid: str) -> None:
        self.engine, self.cid = engine, cid
        self.signals = 0
        self.first = 0  # the first signal's number: the run then exits 128 + it
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _Stopper:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.signals += 1
        self.first = self.first or signum
        timeout = grace_seconds() if self.signals == 1 else 0
        threading.Thread(target=self._stop, args=(timeout,), daemon=True).start()

    def _stop(self, timeout: int) -> None:
        # The container may already be gone; removal happens in run() either way.
        with contextlib.suppress(GpuenvError):
            self.engine.stop(self.cid, timeout=timeout)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def check_bind_sources(binds: list[str]) -> None:
    """Refuse a bind whose host path does not exist: Docker's -v would create it, empty and
    owned by root, and a typo in a data path would train on nothing."""
    for bind in binds:
        src = bind.split(":", 1)[0]
        if src.startswith("/") and not os.path.exists(src):
            raise run_error(
                f"-v {bind}: {src} does not exist on this machine; fix the path, or create "
                f"it first (mkdir -p {src})"
            )


def run(
    engine: Engine,
    opts: RunOptions,
    stdout: BinaryIO | None = None,
    stderr: BinaryIO | None = None,
) -> int:
    """Run the container to its end; its exit code (128 + the signal when Ctrl-C or SIGTERM
    stopped it). Output goes to this process's streams, or to `stdout`/`stderr` when given
    (gpuenv bench reads the workload's result there). On an engine that cannot see the
    working directory, the directory travels there and what the workload wrote comes back
    (gpuenv/run/sync.py)."""
    from gpuenv.run import sync

    spec = container_spec(opts)
    spec.platform = foreign_platform(engine, opts.image, opts.architecture)
    spec = replace(spec, **devices_for(engine, opts.gpus))  # the hook's request, or CDI
    if sync.visibility(engine, opts.cwd, opts.image, spec.platform).sees:
        if engine.is_local:  # a remote engine's paths are on its host, not here
            check_bind_sources(spec.binds)
        return _run(engine, spec, opts, stdout, stderr)
    spec = engine_host_binds(spec)
    with sync.synced(engine, opts.cwd, opts.image, opts.uid, opts.gid, spec.platform) as synced:
        spec.binds[0] = f"{synced.volume}:{opts.cwd}"
        # Sent once the engine has taken the container: a refused -v sends nothing.
        return _run(engine, spec, opts, stdout, stderr, before_start=synced.send)


def engine_host_binds(spec: ContainerSpec) -> ContainerSpec:
    """-v sources on an engine that cannot see this machine: the engine host's own paths,
    as Docker users expect, but bound the way --mount binds, so that a path only this
    machine has is the engine's refusal (explained by _start_error), never an empty
    directory the engine creates. Named volumes stay as they are."""
    host = [b for b in spec.binds[1:] if b.startswith("/")]
    mounts = [(src, dst, rest == ["ro"]) for src, dst, *rest in (b.split(":") for b in host)]
    kept = [spec.binds[0], *(b for b in spec.binds[1:] if not b.startswith("/"))]
    return replace(spec, binds=kept, mounts=[*spec.mounts, *mounts])


def _run(
    engine: Engine,
    spec: ContainerSpec,
    opts: RunOptions,
    stdout: BinaryIO | None,
    stderr: BinaryIO | None,
    before_start: Callable[[], None] | None = None,
) -> int:
    try:
        cid = engine.create(spec)
    except EngineError as exc:
        raise _start_error(exc, opts, engine.url) from None
    try:
        if before_start is not None:
            before_start()
        with (
            _Stopper(engine, cid) as stopper,
            _watching(engine, cid, opts),
        ):
            if opts.interactive and sys.stdin.isatty():
                code = _run_tty(engine, cid)
            else:
                code = _run_streaming(engine, cid, stdout, stderr)
        return 128 + stopper.first if stopper.first else code
    except EngineError as exc:
        raise _start_error(exc, opts, engine.url) from None
    finally:
        _remove(engine, cid)


def foreign_platform(engine: Engine, image: str, architecture: str | None = None) -> str | None:
    """linux/<arch> of an image of another architecture than the engine's (an arm64 cell
    on an x86_64 engine, run under QEMU), so the engine runs it as that platform; None for
    the engine's own, which runs as every image always has. `architecture`: the image's,
    when the caller has it (else the image is inspected). An image of this machine's own
    architecture on an engine of this machine (its socket) is run as it is without asking
    the engine its machine (a `docker info`: 10-110 ms of dockerd's time here, issue 48);
    a local engine in a VM of another architecture then runs it as `docker run` would."""
    if architecture is None:
        info = engine.image(image)
        architecture = info.architecture if info is not None else ""
    if engine.is_local and architecture and architecture == _MACHINES.get(os.uname().machine):
        return None
    own = _MACHINES.get(engine.architecture(), "")
    return f"linux/{architecture}" if architecture and own and architecture != own else None


_MACHINES = {"x86_64": "amd64", "aarch64": "arm64"}  # uname's machine: the image's name


def _remove(engine: Engine, cid: str) -> None:
    """Remove the container, waiting a while for an engine that went away (restarted, or a
    link that dropped) to come back; a container left behind is named, never silent."""
    if engine.remove_container_patiently(cid, 0):
        return
    patience = remove_patience()
    print(
        f"gpuenv: the Docker Engine does not answer; waiting up to {patience} s for it to "
        f"remove container {cid[:12]}",
        file=sys.stderr,
    )
    if not engine.remove_container_patiently(cid, patience):
        warn(
            f"container {cid[:12]} could not be removed: the Docker Engine at {engine.url} "
            f"did not answer; once it is back: docker rm -f {cid[:12]}"
        )


def _watching(
    engine: Engine, cid: str, opts: RunOptions
) -> contextlib.AbstractContextManager[None]:
    """The GPU sampler when --monitor asked for one (monitor.py imported only then)."""
    if opts.monitor is None:
        return contextlib.nullcontext()
    from gpuenv.gpu import monitor

    return monitor.watching(engine, cid, opts.image, opts.gpus, opts.monitor)


def _start_error(exc: Exception, opts: RunOptions, engine_url: str = "") -> GpuenvError:
    """The engine's refusal, explained: the NVIDIA toolkit's errors, a -v source its host
    does not have, a command that is not there (127) or cannot be executed (126), else the
    engine's own message (125)."""
    text = str(getattr(exc, "detail", "") or exc)
    explained = explain_start_error(text, opts.image)
    if explained:
        return run_error(explained)
    missing_source = _MISSING_SOURCE.search(text)
    if missing_source:
        src = missing_source.group(1)
        here = " (this machine has it, but gpuenv sends only the working directory)"
        return run_error(
            f"-v {src}: no such path on the engine's host ({engine_url}), which cannot see "
            f"this machine's files{here if os.path.exists(src) else ''}; put the data on "
            "that host, or in a volume there (-v NAME:/data)"
        )
    # "no such file or directory" alone may be about the engine's own files (podman's
    # container-init binary): it means the command only when it names the command.
    missing = "no such file or directory" in text and opts.command[0] in text
    if "executable file not found" in text or missing:
        return run_error(f"{opts.command[0]}: command not found in {opts.image}", 127)
    if "permission denied" in text.lower() and "exec" in text:
        return run_error(f"{opts.command[0]}: cannot be executed in {opts.image}", 126)
    if isinstance(exc, GpuenvError):
        return exc
    from gpuenv.engine.client import engine_error

    return engine_error(exc)


def _run_streaming(
    engine: Engine, cid: str, out: BinaryIO | None = None, err: BinaryIO | None = None
) -> int:
    stream = engine.attach(cid)
    engine.start(cid)
    out, err = out or sys.stdout.buffer, err or sys.stderr.buffer
    code: list[int] = []
    failure: list[BaseException] = []

    def pump() -> None:
        try:
            for stdout, stderr in stream:
                if stdout:
                    out.write(stdout)
                    out.flush()
                if stderr:
                    err.write(stderr)
                    err.flush()
            code.append(engine.wait(cid))
        except BaseException as exc:  # handed to the main thread
            failure.append(exc)

    # The stream is read in a helper thread: over a link that drops, a read never returns
    # (no reset ever arrives), so the main thread watches the engine and gives up on it.
    reader = threading.Thread(target=pump, name="gpuenv-attach", daemon=True)
    reader.start()
    _watch(engine, reader)
    if failure:
        raise failure[0]
    return code[0]


HEARTBEAT_SECONDS = 2.0  # how often a run asks the engine whether it is still there
LOST_AFTER_SECONDS = 10.0  # no answer for this long: the engine (or the link) is gone
REMOVE_PATIENCE_SECONDS = 30  # how long a run waits for a lost engine to remove its container
PATIENCE_ENV = "GPUENV_REMOVE_PATIENCE"


def remove_patience() -> int:
    value = os.environ.get(PATIENCE_ENV, "").strip()
    return int(value) if value.isdigit() else REMOVE_PATIENCE_SECONDS


def _watch(engine: Engine, reader: threading.Thread) -> None:
    """Wait for the reader. Over a network link (tcp, TLS, ssh) also ask the engine every
    HEARTBEAT_SECONDS and raise EngineError when it has not answered for LOST_AFTER_SECONDS:
    a link that drops sends no reset, so the stream's read would never return. On a local
    socket no heartbeat: an engine that dies closes the socket, which ends the stream (the
    reader then fails with the engine's error), and one that is only slow to answer (a busy
    host) must not cost a workload its run."""
    last_answer = time.monotonic()
    while reader.is_alive():
        reader.join(HEARTBEAT_SECONDS)
        if not reader.is_alive():
            return
        if engine.is_local:
            continue
        if engine.ping(timeout=HEARTBEAT_SECONDS):
            last_answer = time.monotonic()
        elif time.monotonic() - last_answer > LOST_AFTER_SECONDS:
            raise EngineError(
                f"lost the Docker Engine at {engine.url}: no answer for "
                f"{int(LOST_AFTER_SECONDS)} s (the engine stopped, or the network to it went "
                "down); the run's output and exit status are unknown"
            )


def _run_tty(engine: Engine, cid: str) -> int:
    """Relay a raw terminal to the container's TTY (REPL, pdb, a shell)."""
    import select
    import termios
    import tty

    raw = engine.attach_socket(cid)
    engine.start(cid)
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def resize(*_: object) -> None:
        try:
            size = os.get_terminal_size(fd)
            engine.resize(cid, height=size.lines, width=size.columns)
        except Exception:
            pass

    previous = signal.signal(signal.SIGWINCH, resize)
    try:
        tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead
        resize()
        while True:
            ready, _, _ = select.select([fd, raw], [], [])
            if raw in ready:
                data = raw.recv(65536)
                if not data:
                    break
                os.write(sys.stdout.fileno(), data)
            if fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    break
                raw.sendall(data)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
    return engine.wait(cid)
