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
from gpuenv.gpu.gpus import GpuInfo, GpuRequest, explain_start_error
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError
from gpuenv.store import cache

if TYPE_CHECKING:
    from gpuenv.gpu.monitor import MonitorOptions
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project

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
    cwd: Path = field(default_factory=Path.cwd)
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


def grace_seconds() -> int:
    """The stop grace period: $GPUENV_STOP_GRACE when it is a whole number, else 10 s."""
    value = os.environ.get(GRACE_ENV, "").strip()
    return int(value) if value.isdigit() else GRACE_SECONDS


def fail(message: str, code: int = 125) -> GpuenvError:
    return GpuenvError(message, exit_code=code)


def command_for(args: list[str], cwd: Path) -> list[str]:
    """A .py script runs with the image's Python; anything else runs as a command."""
    if not args:
        raise fail("nothing to run: give a script (train.py) or a command", 125)
    first = args[0]
    if first.startswith("-"):
        raise fail(f"no such option: {first} (put the command after --, or fix the option)")
    if first.endswith(".py"):
        if not (cwd / first).is_file():
            raise fail(
                f"{first}: no such file in {cwd} (gpuenv mounts the current directory; "
                "run from the directory that holds the script)",
                127,
            )
        return ["python", *args]
    return list(args)


def check_options(
    env: list[str], volumes: list[str], ports: list[str], workdir: str | None, cwd: Path
) -> None:
    """`run`'s options, parsed once for their errors alone, before anything else happens."""
    parse_env(env, read=False)
    for item in volumes:
        parse_volume(item, cwd)
    parse_ports(ports)
    if workdir is not None and (not workdir.startswith("/") or _BAD_PATH.search(workdir)):
        raise fail(f"--workdir {workdir!r}: expected an absolute path in the container", 125)


_BAD_PATH = re.compile(r"[\x00-\x1f]")
_MISSING_SOURCE = re.compile(r"bind source path does not exist: ([^\s\"']+)")
_ENV_NAME = re.compile(r"[^\s=\x00]+")
_VOLUME_MODES = {"ro", "rw", "z", "Z", "ro,z", "ro,Z", "rw,z", "rw,Z"}


def parse_env(items: list[str], read: bool = True) -> dict[str, str]:
    """-e KEY=VALUE or -e KEY (the value from this environment). Errors name the key only:
    a value may be a secret."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _ENV_NAME.fullmatch(key) or "\n" in item:
            shown = repr(key[:80] + ("=..." if sep else ""))
            raise fail(f"-e {shown}: expected KEY=VALUE or KEY (a name without spaces)", 125)
        if not read:
            continue
        if not sep:
            if key not in os.environ:
                continue  # as docker run: -e KEY with KEY unset passes nothing
            value = os.environ[key]
        env[key] = value
    return env


def parse_volume(item: str, cwd: Path) -> str:
    parts = item.split(":")
    if (
        len(parts) not in (2, 3)
        or not parts[0]
        or not parts[1].startswith("/")
        or (len(parts) == 3 and parts[2] not in _VOLUME_MODES)
        or _BAD_PATH.search(item)
    ):
        raise fail(f"-v {item!r}: expected SRC:DST[:ro|rw] with an absolute DST", 125)
    src = parts[0]
    if src.startswith((".", "/", "~")):
        src = str((cwd / Path(src).expanduser()).resolve())
    return ":".join([src, *parts[1:]])


def parse_ports(items: list[str]) -> dict[str, Any]:
    ports: dict[str, Any] = {}
    for item in items:
        host, _, container = item.rpartition(":")
        cport, _, proto = container.partition("/")
        ip, _, hport = host.rpartition(":")
        if (
            not _port(cport)
            or (host and not ((hport == "" and ip) or _port(hport)))
            or proto not in ("", "tcp", "udp", "sctp")
            or (ip and not _ip(ip.strip("[]")))
        ):
            raise fail(f"-p {item!r}: expected [IP:]HOST_PORT:CONTAINER_PORT[/tcp|udp]", 125)
        key = container if "/" in container else f"{container}/tcp"
        if ip:
            ports[key] = (ip, int(hport)) if hport else (ip,)
        else:
            ports[key] = int(hport) if hport else None
    return ports


def _port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


def _ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def container_spec(opts: RunOptions) -> ContainerSpec:
    cwd = str(opts.cwd)
    if cwd == "/":
        raise fail("run gpuenv from your project directory: it mounts the current directory")
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
            raise fail(
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
    spec.platform = foreign_platform(engine, opts.image)
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


def foreign_platform(engine: Engine, image: str) -> str | None:
    """linux/<arch> of an image of another architecture than the engine's (an arm64 cell
    on an x86_64 engine, run under QEMU), so the engine runs it as that platform; None for
    the engine's own, which runs as every image always has."""
    info = engine.image(image)
    arch = info.architecture if info is not None else ""
    own = {"x86_64": "amd64", "aarch64": "arm64"}.get(engine.architecture(), "")
    return f"linux/{arch}" if arch and own and arch != own else None


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
        return fail(explained)
    missing_source = _MISSING_SOURCE.search(text)
    if missing_source:
        src = missing_source.group(1)
        here = " (this machine has it, but gpuenv sends only the working directory)"
        return fail(
            f"-v {src}: no such path on the engine's host ({engine_url}), which cannot see "
            f"this machine's files{here if os.path.exists(src) else ''}; put the data on "
            "that host, or in a volume there (-v NAME:/data)"
        )
    # "no such file or directory" alone may be about the engine's own files (podman's
    # container-init binary): it means the command only when it names the command.
    missing = "no such file or directory" in text and opts.command[0] in text
    if "executable file not found" in text or missing:
        return fail(f"{opts.command[0]}: command not found in {opts.image}", 127)
    if "permission denied" in text.lower() and "exec" in text:
        return fail(f"{opts.command[0]}: cannot be executed in {opts.image}", 126)
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


# ---------------------------------------------------------------------- target


@dataclass
class Target:
    image: str
    labels: dict[str, str]
    cell: Cell | None = None  # when chosen from the matrix


def target_for(
    engine: Engine,
    image: str | None,
    want_gpu: bool,
    file: Path | None,
    project: Project | None = None,
    gpus: GpuRequest | None = None,
) -> Target:
    """The image `gpuenv run` uses: -i IMAGE as is, else a cell (the default CPU or GPU
    cell without -i), built first if it is missing. `project`: the matrix when the caller
    opened it already; else it is opened here (from its snapshot when unchanged). `gpus`:
    the workload's request on this engine, checked before a missing cell is built."""
    from gpuenv.project.project import looks_like_image, open_project

    if image is not None and looks_like_image(image):
        labels = engine.labels(image)
        if labels is None:
            raise fail(f"image {image} not found in the engine")
        return Target(image, labels)
    project = project or open_project(file, cached=True)
    cell = project.default_cell(want_gpu) if image is None else project.one_cell(image, "-i")
    labels = engine.labels(cell.image)
    if labels is None:
        if gpus is not None:
            check_engine_gives_gpus(engine, cell, gpus)
        _build_for_run(engine, project, cell)
        labels = engine.labels(cell.image) or {}
    return Target(cell.image, labels, cell)


def check_engine_gives_gpus(engine: Engine, cell: Cell, gpus: GpuRequest) -> None:
    """Before building a cell (a GPU cell is gigabytes) for `run --gpus`: does this engine
    give containers GPUs at all? Asked of the engine itself, by starting a container with
    the request from an image it already has (the cell's base): the API reports no NVIDIA
    hook, and dockerd finds one on its own PATH, not gpuenv's (doctor's host-side checks
    cannot see that, nor a remote engine's host). An engine without the runtime, CDI or
    hook refuses the start at once: that refusal, explained, is the one error, and nothing
    is built. Anything else (the start works, no base to ask with yet, another error) is
    left to the driver probe after the build (gpu_preflight)."""
    image = cell.base.image
    if engine.image(image) is None:
        return
    spec = ContainerSpec(image, ["true"], **devices_for(engine, gpus), network="none",
                         labels=contract.container_labels("probe"), init=False)  # fmt: skip
    cid = engine.create(spec)
    try:
        engine.start(cid)
    except EngineError as exc:
        explained = explain_start_error(exc.detail, cell.image)
        if explained:
            raise fail(explained) from None
    finally:
        engine.remove_container(cid)


def _build_for_run(engine: Engine, project: Project, cell: Cell) -> None:
    from gpuenv.building import builder as build
    from gpuenv.building.progress import ConsoleReporter

    print(f"gpuenv: {cell.image} is not built yet; building it first", file=sys.stderr)
    reporter = ConsoleReporter()
    try:
        ca_bundle = project.ca_bundle(None)
        from gpuenv.building.registry import registry_from_env
        from gpuenv.publish.attest.verify import vetting_from_env

        vet = vetting_from_env() if registry_from_env() else None  # pulls must verify
        results = build.plan_and_build(engine, project, [cell], reporter, ca_bundle=ca_bundle,
                                       vet=vet)  # fmt: skip
    finally:
        reporter.close()
    if results[0].status == "failed":
        raise fail(f"building {cell.image} failed: {results[0].error}")


# ---------------------------------------------------------------------- preflight


def say(message: str) -> None:
    """Progress for the user (here and on a cluster), on stderr: stdout is the workload's."""
    print(f"gpuenv: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def gpu_preflight(engine: Engine, target: Target, gpus: GpuRequest | None) -> None:
    """Refuse or warn before the workload starts, never after it trained on the CPU."""
    claims = contract.ImageLabels(target.labels)
    if gpus is None:
        if claims.is_gpu:
            warn(
                f"{target.image} is a GPU image but no --gpus was given: its framework will "
                "fall back to the CPU (add --gpus all)"
            )
        return
    if claims.variant == "cpu":
        warn(
            f"{target.image} is a CPU image: the framework in it cannot use the GPUs; the devices "
            "are passed anyway (for nvidia-smi and the like). Use a GPU cell to train on them"
        )
    found = probe_gpus(engine, target.image, gpus)
    if not found:
        return
    from gpuenv.gpu.capability import gpu_verdict
    from gpuenv.gpu.gpus import driver_verdict

    verdicts = []
    if claims.cuda:
        verdicts.append(driver_verdict(found[0].driver, claims.cuda))
    if claims.is_gpu and claims.framework:
        verdicts.append(gpu_verdict(found, claims.framework, claims.framework_version))
    for verdict in verdicts:
        if verdict.level == "error":
            raise fail(verdict.message)
    for verdict in verdicts:
        if verdict.level == "warning":
            warn(verdict.message)


DRIVERS = "drivers.json"  # in gpuenv's cache (gpuenv/store/cache.py)
DRIVER_MAX_AGE = 24 * 3600  # seconds; a driver can be upgraded without a reboot


def _engine_identity(engine: Engine) -> tuple[str, str]:
    """(engine ID, what changes when the engine's host may have a new driver): a reboot
    or new kernel, a daemon restart (its ID stays, its start changes the boot's view)."""
    info = engine.info()
    return str(info.get("ID") or engine.url), str(info.get("KernelVersion") or "")


def cached_gpus(engine: Engine, now: float | None = None) -> list[GpuInfo] | None:
    """The GPUs (driver, name, compute capability) learnt earlier for this engine, unless
    they may be stale: another kernel (a reboot, where driver upgrades take effect), past
    DRIVER_MAX_AGE, or $GPUENV_REPROBE=1 (on demand)."""
    import time

    if os.environ.get("GPUENV_REPROBE") == "1":
        return None
    engine_id, kernel = _engine_identity(engine)
    entry = cache.read_record(DRIVERS).get(engine_id)
    if not isinstance(entry, dict) or entry.get("kernel") != kernel:
        return None  # also an entry from before entries carried their context
    age = (now if now is not None else time.time()) - float(entry.get("at") or 0)
    if not 0 <= age <= DRIVER_MAX_AGE:
        return None
    try:
        return [GpuInfo(str(g["driver"]), str(g["name"]), str(g["compute_cap"]))
                for g in entry["gpus"]] or None  # fmt: skip
    except (KeyError, TypeError):
        return None


def remember_gpus(engine: Engine, gpus: list[GpuInfo]) -> None:
    import time
    from dataclasses import asdict

    engine_id, kernel = _engine_identity(engine)
    entry = {"gpus": [asdict(g) for g in gpus], "kernel": kernel, "at": int(time.time())}
    cache.update_record(DRIVERS, {engine_id: entry})


def probe_gpus(engine: Engine, image: str, gpus: GpuRequest) -> list[GpuInfo] | None:
    """The host's GPUs and driver, learnt by a probe container and cached per engine.

    The Docker API reports neither the driver nor the runtime hook, and a remote engine's
    host is not this machine, so the only honest source is nvidia-smi inside a container
    that got GPUs. The probe also surfaces the toolkit's own errors before the workload.
    """
    from gpuenv.gpu.gpus import parse_nvidia_smi_query

    known = cached_gpus(engine)
    if known is not None:
        return known
    command = ["nvidia-smi", "--query-gpu=driver_version,name,compute_cap",
               "--format=csv,noheader"]  # fmt: skip
    spec = ContainerSpec(image, command, **devices_for(engine, gpus), network="none",
                         labels=contract.container_labels("probe"), init=False)  # fmt: skip
    try:
        cid = engine.create(spec)
    except EngineError as exc:
        raise _start_error(exc, RunOptions(image=image, command=command), engine.url) from None
    try:
        engine.start(cid)
        code = engine.wait(cid, timeout=60)
        output = engine.logs(cid, stderr=True)
    except EngineError as exc:
        explained = explain_start_error(exc.detail, image)
        if explained:
            raise fail(explained) from None
        warn(f"could not learn the host's NVIDIA driver: {exc.detail.splitlines()[0][:200]}")
        return None
    finally:
        engine.remove_container(cid)
    found = parse_nvidia_smi_query(output) if code == 0 else []
    if not found:
        warn(
            "could not learn the host's NVIDIA driver (nvidia-smi in a probe container "
            f"exited {code}); the driver check is skipped"
        )
        return None
    remember_gpus(engine, found)
    return found
