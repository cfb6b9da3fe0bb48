"""The Docker Engine, through the Docker SDK for Python. The only module that imports docker.

The SDK (requests, urllib3, ssl) is imported on first use, so commands that never reach
the engine (`--help`, `matrix`, `render`) do not pay for it. Every engine is reached through
the SDK, at the address the docker CLI would use: DOCKER_HOST (unix://, tcp:// with TLS from
DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, ssh://), else the current Docker context (DOCKER_CONTEXT,
else config.json's currentContext, in $DOCKER_CONFIG or ~/.docker), else the local socket.
`ssh://` runs the user's own `ssh` (its config, keys, agent, known hosts) with `docker system
dial-stdio` on the remote host, as the docker CLI does (_SshTarget below).

The rest of gpuenv sees typed operations (image info, build, tag/remove, a container spec
→ create/start/attach/wait/stop/remove, logs, push/pull, save/load, history) and gpuenv's
own errors: every engine failure a user can meet (engine down, socket permissions, a
missing image, a refused container) leaves here as an EngineError with one line saying
what to do, and the engine's own text in `detail` for callers that explain it further
(the NVIDIA toolkit's messages, gpuenv/gpu/gpus.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

LogSink = Callable[[str], None]
# What the docker CLI ends a build with when the engine went away under it (restarted,
# killed, the link down), not because a step failed: the session's stream ended unanswered.
_ENGINE_GONE = (
    "did not provide an image ID",
    "Cannot connect to the Docker daemon",
    "error during connect",
    "transport is closing",
    "connection reset by peer",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class EngineError(GpuenvError):
    """The engine refused or failed; `detail` is its own text, `status` its HTTP status."""

    def __init__(self, message: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(message, exit_code=125)
        self.detail = detail or message
        self.status = status


class BuildFailed(Exception):
    """A build step failed; the message is the engine's."""


@dataclass(frozen=True)
class ImageInfo:
    """What `docker image inspect` says, in the parts gpuenv reads."""

    id: str
    tags: tuple[str, ...] = ()
    size: int = 0
    created: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    env: tuple[str, ...] = ()  # KEY=VALUE, as in the config
    user: str = ""
    working_dir: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    architecture: str = ""  # amd64, arm64: what the image's config says
    # The layers' diff_ids: digests the engine checked against the layers' own bytes
    # (unlike labels, which say what the image's author wrote).
    layers: tuple[str, ...] = ()

    @property
    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env if "=" in e)

    @property
    def claims(self) -> contract.ImageLabels:
        return contract.ImageLabels(self.labels)

    @classmethod
    def from_inspect(cls, data: dict[str, Any]) -> ImageInfo:
        config = data.get("Config") or {}
        return cls(
            id=str(data["Id"]),
            tags=tuple(data.get("RepoTags") or ()),
            size=int(data.get("Size") or 0),
            created=str(data.get("Created") or ""),
            labels=dict(config.get("Labels") or {}),
            env=tuple(config.get("Env") or ()),
            user=str(config.get("User") or ""),
            working_dir=str(config.get("WorkingDir") or ""),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            architecture=str(data.get("Architecture") or ""),
            layers=tuple(str(x) for x in (data.get("RootFS") or {}).get("Layers") or ()),
        )


@dataclass
class ContainerSpec:
    """A container as gpuenv asks for one; `device_requests` hold the Engine API's
    DeviceRequest bodies (gpuenv.gpu.gpus.GpuRequest.as_api()), `cdi_devices` fully
    qualified CDI device names (nvidia.com/gpu=0): gpuenv.gpu.cdi chooses which."""

    image: str
    command: list[str]
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    binds: list[str] = field(default_factory=list)
    # (source, target, read-only): binds of the engine host's paths, as Docker's --mount
    # makes them: a source that is not there is the engine's error, never an empty
    # directory the engine creates (what `binds` does).
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    ports: dict[str, Any] = field(default_factory=dict)
    tmpfs: dict[str, str] = field(default_factory=dict)
    device_requests: list[dict[str, Any]] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    init: bool = True
    shm_size: str | None = None
    ipc: str | None = None
    network: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tty: bool = False
    stdin: bool = False
    platform: str | None = None  # linux/arm64: an image of another architecture, emulated


@dataclass(frozen=True)
class GpuEngineFacts:
    """What an engine says that decides how it takes GPUs (gpuenv.gpu.cdi.choose_path)."""

    podman: bool
    version: str  # the server's (podman's own version on podman)
    runtimes: tuple[str, ...] = ()  # registered OCI runtimes ("nvidia" among them?)
    cdi_spec_dirs: tuple[str, ...] = ()  # Docker >= 25 with CDI enabled lists them
    cdi_devices: tuple[str, ...] = ()  # Docker >= 28.3's DiscoveredDevices from CDI
    local: bool = True

    @classmethod
    def from_info(cls, info: dict[str, Any], podman: bool, local: bool) -> GpuEngineFacts:
        """From the engine's /info (podman's Docker API answers it too)."""
        found = [str(d.get("ID") or "") for d in info.get("DiscoveredDevices") or []
                 if isinstance(d, dict) and d.get("Source") == "cdi"]  # fmt: skip
        return cls(
            podman=podman,
            version=str(info.get("ServerVersion") or ""),
            runtimes=tuple(sorted(info.get("Runtimes") or {})),
            cdi_spec_dirs=tuple(str(d) for d in info.get("CDISpecDirs") or []),
            cdi_devices=tuple(d for d in found if d),
            local=local,
        )


def engine_error(exc: Exception) -> EngineError:
    text = str(exc)
    status = getattr(exc, "status_code", None)
    host = _conn.engine.url if _conn.engine is not None else named_address()
    if "Permission denied" in text or "PermissionError" in text:
        message = (
            f"permission denied on the Docker socket ({host}); add your user to the docker "
            "group (sudo usermod -aG docker $USER, then log in again) or run as root"
        )
    elif any(
        s in text
        for s in (
            "No such file",
            "Connection refused",
            "Connection aborted",
            "Failed to establish",
            "timed out",
            "FileNotFoundError",
            "Connection broken",
            "RemoteDisconnected",
        )
    ):
        message = (
            f"cannot reach the Docker Engine at {host}: is dockerd running? "
            "(on Debian: sudo scripts/engine.sh starts one)"
        )
        if host.startswith(("ssh://", "tcp://", "https://", "http://")):
            message = (
                f"cannot reach the Docker Engine at {host}: the connection failed or ended "
                "(is the host up, and dockerd running there?)"
            )
    elif "no space left on device" in text:
        message = "the engine's disk is full; free space (docker image prune) and retry"
    else:
        message = f"Docker Engine error: {(text.splitlines() or [''])[0][:300]}"
    return EngineError(message, detail=text, status=status)


def _sdk_error(exc: BaseException, name: str = "DockerException") -> bool:
    """Whether exc is the SDK's `name` error (False when the SDK was never imported: then
    nothing can have raised one)."""
    errors = sys.modules.get("docker.errors")
    return errors is not None and isinstance(exc, getattr(errors, name))


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


def _connection_error(exc: BaseException) -> bool:
    """An SDK error, or what a connection that breaks mid-stream raises below the SDK
    (urllib3, requests: an engine restarted during a build, "Connection broken"). Checked
    by the modules already imported: when they were not, nothing can have raised them."""
    if _sdk_error(exc):
        return True
    for module, name in (("requests.exceptions", "RequestException"),
                         ("urllib3.exceptions", "HTTPError")):  # fmt: skip
        found = sys.modules.get(module)
        if found is not None and isinstance(exc, getattr(found, name)):
            return True
    return False


@contextmanager
def _translated() -> Iterator[None]:
    """SDK, Engine API and socket failures leave as EngineError."""
    try:
        yield
    except OSError as exc:
        raise engine_error(exc) from None
    except Exception as exc:
        if _connection_error(exc):
            raise engine_error(exc) from None
        raise


def named_address() -> str:
    """The engine's address as the user named it (for messages): DOCKER_HOST, the current
    context's endpoint, or the local socket."""
    try:
        address = os.environ.get("DOCKER_HOST") or _endpoint()[0]
    except GpuenvError:  # a context that does not resolve
        return "the current Docker context"
    return address or "unix:///var/run/docker.sock"


def _docker_config_dir() -> Path:
    # os.path.expanduser, not Path.home(): a uid with no passwd entry and no HOME (a
    # container's or CI's) has no ~, which leaves "~/.docker" as it is (no contexts: the
    # local socket, as the docker CLI does) where Path.home() raises.
    return Path(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"))


def _endpoint() -> tuple[str | None, Any]:
    """(address, TLS) as the docker CLI picks them: DOCKER_HOST (None here: the SDK reads it
    and its TLS variables itself), else the current context's endpoint, else (None, None)
    for the local socket.

    Contexts are read here, not through the SDK's ContextAPI: it ignores DOCKER_CONTEXT when
    picking the current context, and looks for contexts beside ~/.docker/config.json when
    $DOCKER_CONFIG holds no config.json; the CLI does neither. The format is the CLI's:
    contexts/meta/<sha256(name)>/meta.json, TLS files in contexts/tls/<sha256(name)>/docker/."""
    import hashlib
    import json

    if os.environ.get("DOCKER_HOST"):
        return None, None
    config_dir = _docker_config_dir()
    name, source = os.environ.get("DOCKER_CONTEXT", ""), "DOCKER_CONTEXT"
    if not name:
        try:
            config = json.loads((config_dir / "config.json").read_text())
            name = str(config.get("currentContext") or "") if isinstance(config, dict) else ""
        except (OSError, ValueError):  # a broken config.json must not stop a local engine
            name = ""
        source = f"currentContext in {config_dir / 'config.json'}"
    if name in ("", "default"):
        return None, None
    digest = hashlib.sha256(name.encode()).hexdigest()
    meta = config_dir / "contexts" / "meta" / digest / "meta.json"
    try:
        endpoint = json.loads(meta.read_text())["Endpoints"]["docker"]
        host = str(endpoint["Host"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EngineError(
            f"Docker context {name!r} ({source}) not found or unreadable ({meta}); "
            "`docker context ls` lists the contexts, `docker context use default` the local "
            "engine"
        ) from None
    tls_dir = config_dir / "contexts" / "tls" / digest / "docker"
    skip_verify = bool(endpoint.get("SkipTLSVerify", False))  # TLS, the server unchecked
    if not host.startswith("tcp://") or not (tls_dir.is_dir() or skip_verify):
        return host, None
    from docker.tls import TLSConfig

    def present(file: str) -> str | None:
        return str(tls_dir / file) if (tls_dir / file).exists() else None

    cert, key = present("cert.pem"), present("key.pem")
    return host, TLSConfig(client_cert=(cert, key) if cert and key else None,
                           ca_cert=present("ca.pem"), verify=not skip_verify)  # fmt: skip


class Engine:
    def __init__(self, client: Any = None) -> None:
        """An SDK client, or None to make one (from the environment) on first use."""
        self._client = client
        self._podman: bool | None = None
        self._gpu_facts: GpuEngineFacts | None = None
        self._builds: set[Any] = set()  # the docker CLIs building now (subprocess.Popen)
        self._ending = False  # by end_builds(): no docker CLI starts building any more
        self._builds_lock = threading.Lock()

    @property
    def _api(self) -> Any:
        if self._client is None:
            self._client = _sdk_client(*_endpoint())
        return self._client.api

    @property
    def url(self) -> str:
        """Where the engine is: ssh://USER@HOST as named, else the SDK's base URL."""
        ssh = getattr(self._api, "_custom_adapter", None)
        return ssh.address if isinstance(ssh, _SshAddress) else str(self._api.base_url)

    @property
    def is_local(self) -> bool:
        return self.url.startswith(("http+docker://localhost", "unix:"))

    def info(self) -> dict[str, Any]:
        with _translated():
            return dict(self._api.info())

    def ping(self, timeout: float) -> bool:
        """Whether the engine answers within `timeout` seconds (a dropped link never
        answers, and a stream from it never ends: callers watch with this)."""
        try:
            resp = self._api.get(self._api._url("/_ping"), timeout=timeout)
            return bool(resp.status_code == 200)
        except Exception:  # refused, reset, timed out, TLS: all mean "not now"
            return False

    def remove_container_patiently(self, cid: str, patience: float) -> bool:
        """Remove a container, waiting up to `patience` seconds for an engine that is
        restarting or a link that is down to come back; False when it did not."""
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

    def close(self) -> None:
        """Close the client's connections (the engine stays usable: they reopen on the next
        call); streams in flight (a build) end, and the engine cancels what they were
        doing. The docker CLIs building are told to cancel too: they would outlive gpuenv."""
        with self._builds_lock:
            builds = list(self._builds)
        _cancel(builds)
        if self._client is not None:
            self._client.api.close()

    def end_builds(self) -> None:
        """gpuenv is ending (Ctrl-C or SIGTERM under `build -j`): the docker CLIs building
        other threads' cells are told to cancel, and none starts from now on (one started
        later would outlive gpuenv, and could tag)."""
        with self._builds_lock:
            self._ending = True
            builds = list(self._builds)
        _cancel(builds)

    # ------------------------------------------------------------------ images

    def image(self, ref: str) -> ImageInfo | None:
        """`docker image inspect`, or None when there is no such image."""
        try:
            return ImageInfo.from_inspect(self._api.inspect_image(ref))
        except Exception as exc:
            if _status(exc) == 404 or _sdk_error(exc, "ImageNotFound"):
                return None
            if isinstance(exc, OSError) or _connection_error(exc):
                raise engine_error(exc) from None
            raise

    def labels(self, ref: str) -> dict[str, str] | None:
        info = self.image(ref)
        return None if info is None else dict(info.labels)

    def container_image(self, container: str) -> ImageInfo | None:
        """The image a container runs (one gpuenv may not have started), or None when
        there is no such container."""
        try:
            data = self._api.inspect_container(container)
        except Exception as exc:
            if _sdk_error(exc, "NotFound"):
                return None
            if isinstance(exc, OSError) or _sdk_error(exc):
                raise engine_error(exc) from None
            raise
        return self.image(str(data["Image"]))

    def gpuenv_images(self) -> list[dict[str, str]]:
        """Labels of every tagged image gpuenv built (they carry io.gpuenv.cell)."""
        with _translated():
            images = self._api.images(filters={"label": contract.CELL, "dangling": False})
        return [dict(i.get("Labels") or {}) for i in images if i.get("RepoTags")]

    def history(self, ref: str) -> list[dict[str, Any]]:
        """The image's layers, newest first: {"size", "created_by"}."""
        with _translated():
            history = self._api.history(ref)
        return [
            {
                "size": int(h.get("Size") or 0),
                "created_by": " ".join(str(h.get("CreatedBy") or "(imported)").split()),
            }
            for h in history
        ]

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":")
        with _translated():
            self._api.tag(image_id, repo, tag)

    def remove_if_untagged(self, image_id: str) -> bool:
        """Remove a superseded image only when no tag points at it any more (removing by
        ID would also drop a tag a user added, e.g. docker tag acme/tf:cell acme/tf:rel1)."""
        info = self.image(image_id)
        if info is None or info.tags:
            return False
        return self.remove_image(image_id)

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        try:
            self._api.remove_image(ref, force=force, noprune=False)
            return True
        except Exception as exc:
            if _sdk_error(exc, "APIError"):
                return False
            raise

    def import_image(self, tar_path: str, ref: str, changes: list[str]) -> str:
        """`docker import` of a root filesystem tar file, tagged ref."""
        repo, _, tag = ref.rpartition(":")
        with _translated():
            out = self._api.import_image(src=tar_path, repository=repo, tag=tag, changes=changes)
        status = str(out)
        match = re.search(r"sha256:[0-9a-f]{64}", status)
        if match is None:
            raise GpuenvError(f"docker import of {ref} failed: {status.strip()[:300]}")
        return match.group(0)

    def save(self, ref: str, path: str) -> None:
        """`docker save` to a tar file."""
        with _translated(), open(path, "wb") as fh:
            for chunk in self._api.get_image(ref):
                fh.write(chunk)

    def load(self, path: str) -> list[str]:
        """`docker load` of a tar file; returns what the engine said it loaded. A FIFO or a
        device given as the file is refused, not waited on."""
        from gpuenv.matrix.files import open_regular

        try:
            archive = open_regular(path)
        except OSError as exc:
            raise GpuenvError(f"{path}: cannot read ({exc.strerror}); give a tar file "
                              "(docker save, gpuenv base --save)") from None  # fmt: skip
        messages = []
        with _translated(), archive as fh:
            # The reply streams while the engine loads: it is read to its end, so the image
            # is there when this returns (an unread stream let a tag on a slow vfs engine
            # come first: "No such image") and an error inside the stream is seen.
            for item in self._api.load_image(fh):
                if isinstance(item, dict) and item.get("error"):
                    raise GpuenvError(f"docker load {path}: {item['error']}")
                if isinstance(item, dict) and item.get("stream"):
                    messages.append(str(item["stream"]).strip())
        return messages

    # ------------------------------------------------------------------ registries

    def push(self, ref: str) -> Iterator[dict[str, Any]]:
        """The decoded push stream. The SDK raises nothing for a failed push: the error is
        inside the stream, and the caller must read it to the end (gpuenv/publish/push.py)."""
        repo, _, tag = ref.rpartition(":")
        with _translated():
            yield from self._api.push(repo, tag=tag, stream=True, decode=True)

    def pull(self, ref: str) -> Iterator[dict[str, Any]]:
        """The decoded pull stream (errors may come inside it, as for push). REPO@DIGEST
        pulls exactly that manifest (the API takes the digest as the tag)."""
        repo, _, tag = ref.partition("@") if "@" in ref else ref.rpartition(":")
        with _translated():
            yield from self._api.pull(repo, tag=tag, stream=True, decode=True)

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
            image_id, short_id = self._build_stream(
                context, labels, nocache, on_log, running, network, platform
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
        """podman's Docker-compatible API service (its version names the component)."""
        if self._podman is not None:
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
        cli = " ".join(buildkit_cli(self)[0])
        return (f"BuildKit through `{cli}`: the context travels over the build session, "
                "only what changed since the last build of a cell")  # fmt: skip

    def network_names(self) -> set[str]:
        """The names of the engine's networks (`bridge` where it has Docker's default one)."""
        with _translated():
            return {str(n.get("Name") or "") for n in self._api.networks()}

    def architecture(self) -> str:
        """The engine's machine (x86_64, aarch64; podman says amd64, arm64)."""
        return str(self.info().get("Architecture") or "")

    def build_directory(
        self,
        directory: Path,
        *,
        labels: dict[str, str],
        nocache: bool,
        network: str,
        on_log: LogSink,
        platform: str | None = None,
        secrets: dict[str, Path] | None = None,
    ) -> str:
        """Build a context directory whose Dockerfile mounts parts of it (RUN --mount), without
        tagging; returns the image ID. `secrets` (id -> file, BuildKit only) reach the steps
        that mount them and nothing the engine keeps. `platform` (linux/arm64) builds for another
        architecture: its steps run under the engine's QEMU emulation (binfmt_misc).
        Docker engines build it with BuildKit through the
        docker CLI (the SDK cannot drive BuildKit: docker/docker-py#2230), which sends the
        context over the build session: local, rootless, Desktop and remote engines alike.
        podman's API service builds it through its own endpoint (its builder takes the same
        mounts), from an uploaded tar."""
        if self.is_podman:
            return self._build_uploaded(directory, labels, nocache, network, on_log, platform)
        return self._build_buildkit(directory, labels, nocache, network, on_log, platform,
                                    secrets or {})  # fmt: skip

    def _build_uploaded(
        self, directory: Path, labels: dict[str, str], nocache: bool, network: str,
        on_log: LogSink, platform: str | None = None,
    ) -> str:  # fmt: skip
        import tarfile
        import tempfile

        with tempfile.TemporaryFile() as tar_file:
            with tarfile.open(fileobj=tar_file, mode="w") as tar:
                tar.add(directory, arcname=".")
            tar_file.seek(0)
            return self.build(
                tar_file, labels=labels, nocache=nocache, on_log=on_log, network=network,
                platform=platform,
            )  # fmt: skip

    def _build_buildkit(
        self, directory: Path, labels: dict[str, str], nocache: bool, network: str,
        on_log: LogSink, platform: str | None = None, secrets: dict[str, Path] | None = None,
    ) -> str:  # fmt: skip
        import subprocess
        import tempfile

        cli, env = buildkit_cli(self)
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
            with self._builds_lock:
                if self._ending:
                    raise EngineError("gpuenv is ending: the build was not started")
                proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace")  # fmt: skip
                self._builds.add(proc)
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
                self._builds.discard(proc)
            if code != 0:
                errors = [t for t in tail if t.startswith(("ERROR", "error", "failed to"))]
                why = (errors or tail or [f"exit {code}"])[-1]
                if any(sign in line for line in tail[-3:] for sign in _ENGINE_GONE):
                    raise EngineError(f"the Docker Engine at {self.url} went away during the "
                                      "build; nothing was tagged", detail=why)  # fmt: skip
                raise BuildFailed(why.removeprefix("ERROR: ").strip())
            return iidfile.read_text().strip()

    def _build_stream(
        self,
        context: Any,
        labels: dict[str, str],
        nocache: bool,
        on_log: LogSink,
        running: list[str],
        network: str,
        platform: str | None = None,
    ) -> tuple[str | None, str | None]:
        image_id = short_id = None
        with _translated():
            stream: Iterator[dict[str, Any]] = self._api.build(
                fileobj=context,
                custom_context=True,
                encoding="gzip" if getattr(context, "gzipped", False) else None,
                labels=labels,
                nocache=nocache,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode=network,
                decode=True,
                **({"platform": platform} if platform else {}),
            )
            for chunk in stream:
                if "stream" in chunk:
                    # The engine passes the step's colour codes through; logs get plain text.
                    for line in _ANSI.sub("", str(chunk["stream"])).splitlines():
                        on_log(line)
                        m = re.match(r"Successfully built ([0-9a-f]{12,64})", line)
                        if m:
                            short_id = m.group(1)
                        m = re.match(r"\s*---> Running in ([0-9a-f]{12,64})", line)
                        if m:
                            running.append(m.group(1))
                if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                    image_id = str(chunk["aux"]["ID"])
                if "error" in chunk or "errorDetail" in chunk:
                    detail = chunk.get("errorDetail") or {}
                    raise BuildFailed(str(detail.get("message") or chunk.get("error")).strip())
        return image_id, short_id

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
            return self._create_libpod(spec)
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

    def _create_libpod(self, spec: ContainerSpec) -> str:
        """Create through podman's own API (POST /libpod/containers/create, a SpecGenerator),
        which resolves CDI devices from the spec files on podman's host."""
        api = self._api
        with _translated():
            response = api.post(api.base_url + "/v4.0.0/libpod/containers/create",
                                data=json.dumps(libpod_spec(spec)),
                                headers={"Content-Type": "application/json"})  # fmt: skip
            if response.status_code >= 300:
                text = _libpod_message(response.text)
                raise EngineError(f"podman refused the container: {text.strip()[:300]}",
                                  detail=text, status=response.status_code)  # fmt: skip
            return str(response.json()["Id"])

    def start(self, cid: str) -> None:
        with _translated():
            self._api.start(cid)

    def attach(self, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(stdout, stderr) chunks of a created container, from before it starts."""
        # Attached now (before the caller starts it), read later: nothing is missed.
        with _translated():
            if self.url.startswith("https://"):
                return _translated_stream(self._attach_tls(cid))
            stream = self._api.attach(
                cid, stdout=True, stderr=True, stream=True, logs=True, demux=True
            )
        return _translated_stream(stream)

    def _attach_tls(self, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """attach over TLS, read without the SDK's reader: it polls the socket's descriptor
        before each read, and bytes the TLS layer has already decrypted do not wake a poll,
        so a remote workload's output arrived only when more came (often: at its end).
        SSLSocket.recv returns those pending bytes at once."""
        api = self._api
        response = api._post(
            api._url("/containers/{0}/attach", cid),
            params={"logs": 1, "stdout": 1, "stderr": 1, "stream": 1},
            stream=True,
        )
        sock = api._get_raw_response_socket(response)
        sock.settimeout(None)  # a quiet workload is not a failure; _watch notices a dead link
        return _frames(lambda: sock.recv(65536))

    def attach_socket(self, cid: str) -> Any:
        """A raw socket to the container's TTY (stdin, stdout, stderr)."""
        with _translated():
            sock = self._api.attach_socket(
                cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
        return getattr(sock, "_sock", sock)

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

    def run_capture(
        self,
        image: str,
        command: list[str],
        platform: str | None = None,
        *,
        network: str = "none",
        files: dict[str, bytes] | None = None,
    ) -> tuple[int, str]:
        """Run a short command in a throwaway container (no network unless asked); (exit
        code, stdout). `files` (absolute path -> bytes) are put in before it starts."""
        spec = ContainerSpec(image, command, network=network, init=False, platform=platform,
                             labels=contract.container_labels("probe"))  # fmt: skip
        cid = self.create(spec)
        try:
            if files:
                with _translated():
                    self._api.put_archive(cid, "/", _tar_of(files))
            self.start(cid)
            code = self.wait(cid, timeout=120)
            out = self.logs(cid)
        finally:
            self.remove_container(cid)
        return code, out

    def run_collecting(
        self,
        image: str,
        command: list[str],
        *,
        files: dict[str, bytes],
        collect: str,
        timeout: float,
        platform: str | None = None,
        max_bytes: int = 512 << 20,
    ) -> tuple[int, str, bytes]:
        """Run a command in a throwaway container with no network, `files` (absolute path
        -> bytes) put in first; (exit code, its output, directory `collect` as a tar, or
        b"" when the command failed). The container is removed whatever happens; a run
        past `timeout` seconds is stopped (exit 124). Through the API only, so a remote
        engine runs it as a local one."""
        spec = ContainerSpec(image, command, network="none", init=False, platform=platform,
                             labels=contract.container_labels("sdist"))  # fmt: skip
        cid = self.create(spec)
        try:
            with _translated():
                self._api.put_archive(cid, "/", _tar_of(files))
            self.start(cid)
            try:
                code = self.wait(cid, timeout=timeout)
            except EngineError:
                code = 124  # the wait timed out (the SDK's read timeout)
            output = self.logs(cid, stderr=True)
            collected = b""
            if code == 0:
                chunks: list[bytes] = []
                size = 0
                for chunk in self.get_archive(cid, collect):
                    size += len(chunk)
                    if size > max_bytes:
                        raise EngineError(f"{collect} in the container is larger than "
                                          f"{max_bytes} bytes")  # fmt: skip
                    chunks.append(chunk)
                collected = b"".join(chunks)
        finally:
            self.remove_container(cid)
        return code, output, collected


def _tar_of(files: dict[str, bytes]) -> bytes:
    """A tar of absolute paths -> contents (mode 0644, owned by root), for put_archive."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _translated_stream(stream: Iterator[Any]) -> Iterator[Any]:
    with _translated():
        yield from stream


def _bind_mount(source: str, target: str, read_only: bool) -> Any:
    from docker.types import Mount

    return Mount(target, source, type="bind", read_only=read_only)


def libpod_spec(spec: ContainerSpec) -> dict[str, Any]:
    """The ContainerSpec as podman's SpecGenerator (its API's JSON), for the containers that
    need podman's own API: those with CDI devices."""
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for bind in spec.binds:
        src, dst, *mode = bind.split(":")
        flags = [o for m in mode for o in m.split(",") if o]
        if src.startswith("/"):
            mounts.append({"type": "bind", "source": src, "destination": dst,
                           "options": ["rbind", *flags]})  # fmt: skip
        else:  # a named volume
            volumes.append({"Name": src, "Dest": dst, "Options": flags})
    for src, dst, read_only in spec.mounts:  # --mount binds: a missing source is refused
        mounts.append({"type": "bind", "source": src, "destination": dst,
                       "options": ["rbind", "ro"] if read_only else ["rbind"]})  # fmt: skip
    for path, tmpfs in spec.tmpfs.items():
        mounts.append({"type": "tmpfs", "source": "tmpfs", "destination": path,
                       "options": _podman_tmpfs(tmpfs).split(",")})  # fmt: skip
    body: dict[str, Any] = {
        "image": spec.image,
        "command": spec.command,
        "env": spec.env,
        "labels": spec.labels,
        "mounts": mounts,
        "volumes": volumes,
        "devices": [{"path": name} for name in spec.cdi_devices],
        "init": spec.init,
        "terminal": spec.tty,
        "stdin": spec.stdin,
        "portmappings": [_port_mapping(key, host) for key, host in spec.ports.items()],
    }
    if spec.user:
        body["user"] = spec.user
    if spec.workdir:
        body["work_dir"] = spec.workdir
    if spec.shm_size:
        body["shm_size"] = _bytes(spec.shm_size)
    if spec.ipc:
        body["ipcns"] = {"nsmode": spec.ipc}
    if spec.network:
        body["netns"] = {"nsmode": "bridge" if spec.network == "bridge" else spec.network}
    return body


def _libpod_message(text: str) -> str:
    """podman's error body ({"cause", "message", "response"}): its message, else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    return str(body.get("message") or text) if isinstance(body, dict) else text


def _port_mapping(key: str, host: Any) -> dict[str, Any]:
    """parse_ports' "8888/tcp" -> 8888 | None | (ip,) | (ip, port) as a podman PortMapping."""
    port, _, proto = key.partition("/")
    ip, hport = ("", host) if not isinstance(host, tuple) else (host[0], (host[1:] or [None])[0])
    return {"container_port": int(port), "host_port": int(hport or 0), "host_ip": ip,
            "protocol": proto or "tcp"}  # fmt: skip


def _bytes(size: str) -> int:
    """Docker's --shm-size form ("2g"; units b, k, m, g) as bytes."""
    match = re.fullmatch(r"(\d+)([bkmg]?)", size.lower())
    if match is None:
        raise EngineError(f"shm size {size!r}: expected a number with b, k, m or g")
    power = "bkmg".index(match.group(2) or "b")
    return int(match.group(1)) * (1 << (10 * power))


def _podman_tmpfs(options: str) -> str:
    """podman refuses tmpfs's uid=/gid= options ("unknown mount option"); its own `U` chowns
    the mount to the container's user, which is the uid:gid asked for."""
    kept = [o for o in options.split(",") if not o.startswith(("uid=", "gid="))]
    return ",".join([*kept, "U"]) if len(kept) < len(options.split(",")) else options


def _device_request(body: dict[str, Any]) -> Any:
    import docker.types

    return docker.types.DeviceRequest(
        driver=body["Driver"],
        count=body["Count"],
        device_ids=body["DeviceIDs"],
        capabilities=body["Capabilities"],
        options=body["Options"],
    )


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


def buildkit_cli(engine: Engine) -> tuple[list[str], dict[str, str]]:
    """The command that builds with BuildKit on this engine, and its environment: the first
    of $GPUENV_DOCKER_CLI and each `docker` on PATH (then /usr/bin/docker) that has buildx
    (`docker buildx build --load`) or is older than 23, whose own client BuildKit is
    (`DOCKER_BUILDKIT=1 docker build`; from 23 on, `docker build` needs buildx). It talks to
    the engine gpuenv talks to: DOCKER_HOST and TLS from the environment, or the socket."""
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


@dataclass
class _Connection:
    engine: Engine | None = None


_conn = _Connection()


def connect() -> Engine:
    """A client for DOCKER_HOST / the current context / the local socket; making it asks
    the engine its API version, which proves it answers."""
    if _conn.engine is not None:
        return _conn.engine
    _conn.engine = Engine(_sdk_client(*_endpoint()))
    return _conn.engine


def _sdk_client(base_url: str | None, tls: Any) -> Any:
    import docker

    address = base_url or os.environ.get("DOCKER_HOST") or ""
    if address.startswith("ssh://"):
        return _ssh_client(_SshTarget.parse(address))
    # With the default version="auto" the client asks the engine for its API version
    # first, which already proves the engine answers: no separate ping.
    try:
        with _translated(), _without_ca_overrides():
            client = (
                docker.DockerClient(base_url=base_url, **({"tls": tls} if tls else {}))
                if base_url
                else docker.from_env()
            )
    except (ValueError, TypeError) as exc:  # the SDK's parse errors of a malformed address
        raise EngineError(
            f"DOCKER_HOST={address[:200]!r} is not a Docker Engine address ({exc}); "
            "expected unix:///PATH, tcp://HOST:PORT or ssh://USER@HOST"
        ) from None
    _pin_engine_ca(client.api)
    return client


# ---------------------------------------------------------------------- ssh://

_DIAL = ("docker", "system", "dial-stdio")  # what the docker CLI runs on the remote host


@dataclass(frozen=True)
class _SshTarget:
    """ssh://[USER@]HOST[:PORT], reached as the docker CLI reaches it: the user's `ssh`
    (first on PATH, so their config, keys, agent and known hosts apply) running
    `docker system dial-stdio` there, which joins its stdin and stdout to the engine that
    the remote docker CLI would use (its DOCKER_HOST, context, or socket)."""

    address: str
    host: str
    user: str | None
    port: int | None

    @classmethod
    def parse(cls, address: str) -> _SshTarget:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError:
            parts, port = None, None
        if (parts is None or not parts.hostname or parts.path not in ("", "/")
                or parts.query or parts.password):  # fmt: skip
            raise EngineError(
                f"{address[:200]!r} is not an ssh:// engine address: expected "
                "ssh://[USER@]HOST[:PORT] (the docker CLI's form; no path or password)"
            )
        return cls(address, parts.hostname, parts.username, port)

    def argv(self, *command: str) -> list[str]:
        user = ["-l", self.user] if self.user else []
        port = ["-p", str(self.port)] if self.port else []
        # The docker CLI's own options: no TTY, a bounded connect.
        return ["ssh", "-o", "ConnectTimeout=30", "-T", *user, *port, "--", self.host, *command]

    def failure(self, code: int | None, stderr: str) -> EngineError:
        """What a failed `ssh ... docker system dial-stdio` means, as one line with the fix."""
        said = " ".join(line.strip() for line in stderr.splitlines() if line.strip())[-300:]
        who = f"{self.user}@{self.host}" if self.user else self.host
        if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION" in stderr:
            fix = (
                f"the host key of {self.host} is not known or has changed ({said}); "
                f"check it and accept it once with `ssh {who}` (it goes to known_hosts)"
            )
        elif "Permission denied" in stderr or "Too many authentication failures" in stderr:
            fix = (f"{self.host} refused the login as {self.user or 'your user'} ({said}); "
                   "load the key into your agent (ssh-add) or name it in ~/.ssh/config "
                   f"(IdentityFile), and check that `ssh {who}` logs in")  # fmt: skip
        elif code == 127 or "command not found" in stderr or "docker: not found" in stderr:
            fix = (f"`ssh {who}` works but the remote host has no `docker` command on the PATH "
                   f"of a non-interactive session ({said}); install the docker CLI there "
                   "(Docker 18.09 or later), or put it on that PATH")  # fmt: skip
        elif code == 255:
            fix = f"ssh to {who} failed ({said or 'exit 255'}); check that `ssh {who}` logs in"
        else:
            fix = (f"`docker system dial-stdio` on {self.host} could not reach its engine "
                   f"({said or f'exit {code}'}); check `ssh {who} docker version`")  # fmt: skip
        return EngineError(f"cannot reach the Docker Engine at {self.address}: {fix}",
                           detail=stderr)  # fmt: skip


class _SshAddress:
    """What the ssh transport is known by (Engine.url)."""

    address = ""


def _ssh_client(target: _SshTarget) -> Any:
    """An SDK client whose every connection is one `ssh ... docker system dial-stdio`, its
    stdin and stdout one end of a socket pair and the connection's socket the other end: to
    the SDK it is a Unix socket (select, timeouts and partial reads behave as on one, which
    the TTY relay and the heartbeat of a remote run rely on). The SDK's own ssh transport
    needs paramiko even to shell out, and reads a pipe where a socket is expected. ssh runs
    in its own process group (Ctrl-C at the terminal is gpuenv's to handle: it still
    removes the container over this connection); its stderr is kept for the error."""
    import shutil
    import socket
    import subprocess
    import tempfile

    import docker
    from docker.transport.unixconn import (
        UnixHTTPAdapter,
        UnixHTTPConnection,
        UnixHTTPConnectionPool,
    )

    if shutil.which("ssh") is None:
        raise EngineError(
            f"DOCKER_HOST={target.address} needs the ssh client, and there is no `ssh` on "
            "PATH; install OpenSSH's client (Debian, Ubuntu: openssh-client)"
        )
    dialled: list[tuple[Any, Any]] = []  # (ssh process, its stderr file), the latest last

    class Connection(UnixHTTPConnection):
        def connect(self) -> None:
            ours, theirs = socket.socketpair()
            # Kept with the process (the last few), read when a dial fails.
            stderr = tempfile.TemporaryFile()  # noqa: SIM115
            try:
                end = theirs.fileno()
                proc = subprocess.Popen(target.argv(*_DIAL), stdin=end, stdout=end,
                                        stderr=stderr, process_group=0)  # fmt: skip
            except OSError:
                ours.close()
                stderr.close()
                raise
            finally:
                theirs.close()
            dialled[:] = [*dialled[-4:], (proc, stderr)]
            ours.settimeout(self.timeout)
            self.sock = ours

    class Pool(UnixHTTPConnectionPool):
        def _new_conn(self) -> Any:
            timeout: Any = self.timeout  # the SDK's own pool passes it so
            return Connection(self.base_url, self.socket_path, timeout)

    class Adapter(UnixHTTPAdapter, _SshAddress):
        address = target.address

        def get_connection(self, url: Any, proxies: Any = None) -> Pool:
            with self.pools.lock:
                pool = self.pools.get(url)
                if not pool:
                    pool = Pool(url, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                    self.pools[url] = pool
            return pool

    # A Unix-socket client (its version given, so it asks nothing yet) whose transport is
    # then swapped for ssh's; the first request, for the API version, dials.
    client = docker.DockerClient(base_url="unix:///gpuenv-ssh", version="1.24")
    api: Any = client.api
    api._custom_adapter = Adapter("http+unix:///gpuenv-ssh", timeout=api.timeout)
    api.mount("http+docker://", api._custom_adapter)
    try:
        api._version = api._retrieve_server_version()
    except Exception as exc:
        if not _connection_error(exc) and not isinstance(exc, OSError):
            raise
        if not dialled:
            raise engine_error(exc) from None
        proc, stderr = dialled[-1]
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # ssh still up: the engine's side failed
            code = None
        stderr.seek(0)
        raise target.failure(code, stderr.read().decode(errors="replace")) from None
    return client


_CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@contextmanager
def _without_ca_overrides() -> Iterator[None]:
    """While the client is made (its first request asks the API version): see below."""
    saved = {k: os.environ.pop(k) for k in _CA_OVERRIDES if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _pin_engine_ca(api: Any) -> None:
    """Verify a TLS engine (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) against its own CA.

    The SDK sets the session's `verify` to DOCKER_CERT_PATH/ca.pem, but requests lets
    $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE replace a session's `verify` on every request
    (psf/requests#3829), and machines behind a TLS-intercepting proxy set those: the
    engine's certificate then fails verification against the proxy's CA."""
    pinned = getattr(api, "verify", None)
    if not isinstance(pinned, str):
        return
    merge = api.merge_environment_settings

    def merge_keeping_ca(url: str, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        settings = merge(url, proxies, stream, verify, cert)
        settings["verify"] = pinned
        return settings

    api.merge_environment_settings = merge_keeping_ca


def _frames(recv: Callable[[], bytes]) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The engine's multiplexed stream (non-TTY), read by `recv` (b"" at the end): frames of
    an 8-byte header (stream 1 stdout, 2 stderr; big-endian length in bytes 4-7) and a
    payload (the TLS attach above reads it itself)."""
    buf = b""

    def fill(n: int) -> bool:
        nonlocal buf
        while len(buf) < n:
            chunk = recv()
            if not chunk:
                return False
            buf += chunk
        return True

    while fill(8):
        kind, size = buf[0], int.from_bytes(buf[4:8], "big")
        if not fill(8 + size):
            return
        payload, buf = buf[8 : 8 + size], buf[8 + size :]
        yield (None, payload) if kind == 2 else (payload, None)
