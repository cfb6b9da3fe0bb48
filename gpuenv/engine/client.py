"""The engine's typed operations: `Engine` (builds, containers, files, volumes; its image
operations in `images`) and `connect()`. The rest of gpuenv sees these and gpuenv's own
errors; the pieces they stand on:

- `transport`: addresses, contexts, TLS and ssh; the Docker SDK's client, every use of its
  private parts, and its errors, which leave as EngineError with one line saying what to do.
- `podman`: where podman's API service differs (CDI devices, tmpfs options, its errors).
- `buildkit`: the BuildKit driver, the docker CLI that builds a context directory;
  `apibuild`: the Engine API's own builder (an uploaded tar: podman's, the sdists').
- `values`: the errors and typed values crossing the boundary, re-exported here (the rest of
  gpuenv imports them from this module).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, BinaryIO

from gpuenv.engine import apibuild
from gpuenv.engine.address import endpoint, named_address
from gpuenv.engine.buildkit import Builds, buildkit_cli
from gpuenv.engine.images import ImageOperations
from gpuenv.engine.podman import _podman_tmpfs, create_libpod, libpod_spec
from gpuenv.engine.throwaway import ThrowawayContainers
from gpuenv.engine.transport import (
    _address,
    _attach_demuxed,
    _attach_tls,
    _bind_mount,
    _connection_error,
    _device_request,
    _ping,
    _pinged,
    _raw_socket,
    _sdk_client,
    _sdk_error,
    _socket_path,
    _status,
    _translated,
    _translated_stream,
    engine_error,
)
from gpuenv.engine.values import (
    BuildCancelled,
    BuildFailed,
    BuildInput,
    ContainerSpec,
    EngineError,
    GpuEngineFacts,
    ImageInfo,
    LogSink,
    VolumeInfo,
)
from gpuenv.matrix import contract

__all__ = [
    "BuildCancelled",
    "BuildFailed",
    "BuildInput",
    "ContainerSpec",
    "Engine",
    "EngineError",
    "GpuEngineFacts",
    "ImageInfo",
    "LogSink",
    "VolumeInfo",
    "buildkit_cli",
    "connect",
    "engine_error",
    "libpod_spec",
    "named_address",
]


class Engine(ImageOperations, ThrowawayContainers):
    def __init__(self, client: Any = None) -> None:
        """An SDK client, or None to make one (from the environment) on first use."""
        self._client = client
        self._podman: bool | None = None
        self._info: dict[str, Any] | None = None
        self._gpu_facts: GpuEngineFacts | None = None
        self._builds = Builds()  # the docker CLIs building on it now

    @property
    def _api(self) -> Any:
        if self._client is None:
            self._client = _sdk_client(*endpoint())
        return self._client.api

    @property
    def url(self) -> str:
        """Where the engine is: ssh://USER@HOST as named, else the SDK's base URL."""
        return _address(self._api)

    @property
    def is_local(self) -> bool:
        return self.url.startswith(("http+docker://localhost", "unix:"))

    def info(self) -> dict[str, Any]:
        """`docker info`, asked once per Engine (one command): what gpuenv reads of it (the
        engine's ID, machine, kernel, runtimes, CDI directories) does not change while a
        command runs, and the engine takes milliseconds to gather it (a run would ask twice:
        the working directory's verdict and the image's platform, issue 48)."""
        if self._info is None:
            with _translated():
                self._info = dict(self._api.info())
        return dict(self._info)

    def identity(self) -> str:
        """What tells this engine from another at its address, for what gpuenv keeps per
        engine without asking it (the working directory's verdict): an engine on this
        machine's Unix socket by that socket file, which its daemon makes when it starts
        (device, inode, change time: a restart, or another daemon there, is another
        identity; no request); any other engine by its ID (`docker info`). Where a run
        asked `info` for the ID alone, that was 10-110 ms of dockerd's time on this machine
        at load 7-11 (it asks runc and docker-init for their versions; issue 48)."""
        path = _socket_path(self._api) if self.is_local else None
        if path:
            try:
                found = os.stat(path)
            except OSError:
                pass
            else:
                return f"socket {found.st_dev}:{found.st_ino}:{found.st_ctime_ns}"
        return str(self.info().get("ID") or "")

    def ping(self, timeout: float) -> bool:
        """Whether the engine answers within `timeout` seconds (a dropped link never
        answers, and a stream from it never ends: callers watch with this)."""
        return _ping(self._api, timeout)

    def remove_container_patiently(self, cid: str, patience: float) -> bool:
        """Remove a container, waiting up to `patience` seconds for an engine that is
        restarting or a link that is down to come back; False when it did not. A local
        engine is asked at once (one that is down refuses at once); another is pinged
        first, since a request over a dropped link waits for the client's timeout."""
        if self.is_local:
            try:
                self.remove_container(cid)
                return True
            except EngineError:
                pass
        deadline = time.monotonic() + patience
        while True:
            if self.ping(timeout=5.0):
                try:
                    self.remove_container(cid)
                    return True
                except EngineError:
                    pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's connections; streams in flight (a build) end, and the engine
        cancels what they were doing. The docker CLIs building are told to cancel too: they
        would outlive gpuenv. (The SDK would open new connections on a later call.)"""
        self._builds.cancel()
        if self._client is not None:
            self._client.api.close()

    def end_builds(self) -> None:
        """gpuenv is ending (Ctrl-C or SIGTERM under `build -j`): the docker CLIs building
        other threads' cells are told to cancel, and none starts from now on (one started
        later would outlive gpuenv, and could tag)."""
        self._builds.end()

    # ------------------------------------------------------------------ builds

    def build(
        self,
        context: Any,
        *,
        labels: dict[str, str],
        nocache: bool,
        on_log: LogSink,
        patience: float = 30,
        network: str = "none",
        platform: str | None = None,
    ) -> str:
        """Build an uploaded tar context without tagging it; returns the full image ID
        (sha256:...), the form `image inspect` gives, so callers can compare the two.

        The caller tags only after success, so a failed or interrupted build never leaves a
        tag on a half-built image. forcerm removes intermediate containers either way.
        """
        # image_id: the full sha256:... ID from the aux message; short_id: the "Successfully
        # built <12 hex>" line, when no aux message came.
        running: list[str] = []  # the container of the step in progress ("Running in <id>")
        try:
            image_id, short_id = apibuild.stream(
                self._api, context, labels, nocache, on_log, running, network, platform
            )
        except EngineError as exc:
            # The engine went away mid-build (restarted, killed): its builder never removes
            # the step's container, which is left Dead once the engine is back. Remove it.
            left = running and not self.remove_container_patiently(running[-1], patience)
            raise EngineError(
                f"the Docker Engine at {self.url} went away during the build "
                f"({exc.detail.splitlines()[0][:200] if exc.detail else exc.message}); "
                "nothing was tagged; run the build again once the engine is back"
                + (f" (and docker rm -f {running[-1][:12]})" if left else ""),
                detail=exc.detail,
            ) from None
        if image_id is None and short_id is not None:
            info = self.image(short_id)
            image_id = info.id if info else None
        if image_id is None:
            raise BuildFailed("the engine ended the build without an image")
        return image_id

    @property
    def is_podman(self) -> bool:
        """podman's Docker-compatible API service: its /_ping names its own API version
        (Libpod-API-Version), or else its /version names the component; either is the
        answer the client kept when it was made (transport._client_class): no request."""
        if self._podman is not None:
            return self._podman
        pinged = _pinged(self._api)
        if pinged is not None:
            self._podman = "Libpod-API-Version" in pinged  # requests' headers: any case
            return self._podman
        with _translated():
            version = self._api.version()
        names = [str(c.get("Name", "")) for c in version.get("Components") or []]
        self._podman = any("podman" in n.lower() for n in names)
        return self._podman

    def gpu_facts(self) -> GpuEngineFacts:
        """What decides how this engine takes GPUs (asked once per Engine)."""
        if self._gpu_facts is None:
            self._gpu_facts = GpuEngineFacts.from_info(self.info(), self.is_podman, self.is_local)
        return self._gpu_facts

    def build_path(self) -> str:
        """How builds reach this engine, for `gpuenv doctor` (EngineError: none can)."""
        if self.is_podman:
            return ("podman's build endpoint: its builder takes the install steps' RUN --mount; "
                    "the context is uploaded whole")  # fmt: skip
        cli = " ".join(buildkit_cli()[0])
        return (f"BuildKit through `{cli}`: the context travels over the build session, "
                "only what changed since the last build of a cell")  # fmt: skip

    def network_names(self) -> set[str]:
        """The names of the engine's networks (`bridge` where it has Docker's default one)."""
        with _translated():
            return {str(n.get("Name") or "") for n in self._api.networks()}

    def architecture(self) -> str:
        """The engine's machine (x86_64, aarch64; podman says amd64, arm64)."""
        return str(self.info().get("Architecture") or "")

    def build_directory(self, build: BuildInput, *, nocache: bool, on_log: LogSink) -> str:
        """Build what `build` holds (a context directory whose Dockerfile mounts parts of it,
        RUN --mount), without tagging; returns the image ID. Its `secrets` (id -> file,
        BuildKit only) reach the steps that mount them and nothing the engine keeps; its
        `platform` (linux/arm64) builds for another architecture, the steps under the
        engine's QEMU emulation (binfmt_misc).
        Docker engines build it with BuildKit through the
        docker CLI (the SDK cannot drive BuildKit: docker/docker-py#2230), which sends the
        context over the build session: local, rootless, Desktop and remote engines alike.
        podman's API service builds it through its own endpoint (its builder takes the same
        mounts), from an uploaded tar."""
        if self.is_podman:
            with apibuild.uploaded(build.directory) as tar_file:
                return self.build(tar_file, labels=build.labels, nocache=nocache, on_log=on_log,
                                  network=build.network, platform=build.platform)  # fmt: skip
        return self._builds.build(self.url, build.directory, build.labels, nocache, build.network,
                                  on_log, build.platform, build.secrets)  # fmt: skip

    # ------------------------------------------------------------------ containers

    def create(self, spec: ContainerSpec) -> str:
        """Create (not start) a container; returns its ID. CDI devices go to podman through
        its own API (its Docker API drops device requests and takes a CDI name for a path),
        to Docker as a device request with driver "cdi", as `docker run --device` sends."""
        if self.is_podman and spec.device_requests:
            # Its Docker API drops them without a word (podman 4.3): a GPU run on the CPU.
            raise EngineError(
                "podman takes GPUs as CDI devices only; its API drops --gpus device requests "
                "(gpuenv asks for CDI devices on podman: this request came another way)"
            )
        if spec.cdi_devices and self.is_podman:
            return create_libpod(self._api, spec)
        if spec.tmpfs and self.is_podman:
            spec = replace(spec, tmpfs={p: _podman_tmpfs(o) for p, o in spec.tmpfs.items()})
        api = self._api
        requests = list(spec.device_requests)
        if spec.cdi_devices:
            requests.append({"Driver": "cdi", "Count": 0, "DeviceIDs": list(spec.cdi_devices),
                             "Capabilities": None, "Options": {}})  # fmt: skip
        with _translated():
            host = api.create_host_config(
                binds=spec.binds or None,
                mounts=[_bind_mount(*m) for m in spec.mounts] or None,
                port_bindings=spec.ports or None,
                device_requests=[_device_request(d) for d in requests] or None,
                init=spec.init,
                shm_size=spec.shm_size,
                ipc_mode=spec.ipc,
                network_mode=spec.network,
                tmpfs=spec.tmpfs or None,
                auto_remove=False,
                cap_drop=spec.cap_drop or None,
                security_opt=spec.security_opt or None,
                pids_limit=spec.pids_limit,
                mem_limit=spec.mem_limit,
            )
            created = api.create_container(
                image=spec.image,
                command=spec.command,
                user=spec.user,
                working_dir=spec.workdir,
                environment=spec.env or None,
                host_config=host,
                labels=spec.labels or None,
                tty=spec.tty,
                stdin_open=spec.stdin,
                ports=list(spec.ports) or None,
                # Named only for another architecture's image (Engine API 1.41+); the
                # engine then runs it without its platform-mismatch warning.
                **({"platform": spec.platform} if spec.platform else {}),
            )
        return str(created["Id"])

    def start(self, cid: str) -> None:
        with _translated():
            self._api.start(cid)

    def attach(self, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(stdout, stderr) chunks of a created container, from before it starts."""
        # Attached now (before the caller starts it), read later: nothing is missed.
        with _translated():
            if self.url.startswith("https://"):
                return _translated_stream(_attach_tls(self._api, cid))
            stream = _attach_demuxed(self._api, cid)
        return _translated_stream(stream)

    def attach_socket(self, cid: str) -> Any:
        """A raw socket to the container's TTY (stdin, stdout, stderr)."""
        with _translated():
            sock = self._api.attach_socket(
                cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        return _raw_socket(sock)

    def resize(self, cid: str, height: int, width: int) -> None:
        with _translated():
            self._api.resize(cid, height=height, width=width)

    def wait(self, cid: str, timeout: float | None = None) -> int:
        """The container's exit code once it has stopped."""
        with _translated():
            return int(self._api.wait(cid, timeout=timeout)["StatusCode"])

    def stop(self, cid: str, timeout: int) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds, as `docker stop` does."""
        with _translated():
            self._api.stop(cid, timeout=timeout)

    def logs(self, cid: str, *, stderr: bool = False) -> str:
        with _translated():
            return bytes(self._api.logs(cid, stdout=True, stderr=stderr)).decode(errors="replace")

    def remove_container(self, cid: str) -> None:
        """Remove (forcing) a container; one already gone, or going, is no error."""
        try:
            self._api.remove_container(cid, force=True, v=True)
        except Exception as exc:
            if _status(exc) in (404, 409) or _sdk_error(exc, "NotFound"):  # 409: removing
                return
            if isinstance(exc, OSError) or _connection_error(exc):
                raise engine_error(exc) from None
            raise

    def put_archive(self, cid: str, path: str, data: BinaryIO) -> None:
        """Extract a tar stream into a container's `path` (its volumes included); owners
        and modes as the tar's headers give them."""
        with _translated():
            if not self._api.put_archive(cid, path, data):
                raise EngineError(f"the engine refused files for {path} in {cid[:12]}")

    def get_archive(self, cid: str, path: str) -> Iterator[bytes]:
        """A container's `path` (its volumes included) as a tar stream, in chunks."""
        with _translated():
            stream, _ = self._api.get_archive(cid, path)
        return _translated_stream(stream)

    def create_volume(self, name: str, labels: dict[str, str]) -> dict[str, str]:
        """The named volume, created with `labels` when it is not there yet; the labels it
        has (a volume of that name made by someone else keeps its own)."""
        with _translated():
            try:
                found = self._api.inspect_volume(name)
            except Exception as exc:
                if not (_status(exc) == 404 or _sdk_error(exc, "NotFound")):
                    raise
                found = self._api.create_volume(name, labels=labels)
        return dict(found.get("Labels") or {})

    def volumes(self, label: str) -> list[VolumeInfo]:
        """The volumes carrying `label`, with their sizes: the engine's disk-usage report
        (`docker system df -v`), which has both in one call."""
        with _translated():
            found = self._api.df().get("Volumes") or []
        volumes = []
        for volume in found:
            labels = dict(volume.get("Labels") or {})
            if label in labels:
                usage = volume.get("UsageData") or {}
                volumes.append(VolumeInfo(str(volume["Name"]), labels,
                                          int(usage.get("Size", -1)),
                                          int(usage.get("RefCount", 0)) > 0))  # fmt: skip
        return volumes

    def remove_volume(self, name: str) -> None:
        with _translated():
            self._api.remove_volume(name)

    def exec(self, cid: str, command: list[str], user: str = "") -> tuple[int, str]:
        """Run a command in a running container; (exit code, stdout)."""
        api = self._api
        with _translated():
            exec_id = api.exec_create(cid, command, stdout=True, stderr=False, user=user)["Id"]
            out = api.exec_start(exec_id, demux=True)
            code = api.exec_inspect(exec_id).get("ExitCode") or 0
        stdout = (out[0] if isinstance(out, tuple) else out) or b""
        return int(code), stdout.decode(errors="replace")

    @contextmanager
    def exported_filesystem(self, ref: str) -> Iterator[Iterator[bytes]]:
        """The image's root filesystem as a tar stream, as `docker export` gives it: of a
        container created (never started, so nothing runs and nothing is written) and
        removed when the block ends. `docker save` would give layers to merge instead."""
        spec = ContainerSpec(ref, ["/bin/true"], network="none", init=False,
                             labels=contract.container_labels("export"))  # fmt: skip
        cid = self.create(spec)
        try:
            with _translated():
                stream = self._api.export(cid)
            yield _translated_stream(stream)
        finally:
            self.remove_container(cid)


def connect() -> Engine:
    """A new engine for DOCKER_HOST / the current context / the local socket; making it asks
    the engine its API version, which proves it answers. Its caller owns it, and closes it
    (`with connect() as engine:`): there is no engine shared by the process."""
    return Engine(_sdk_client(*endpoint()))
