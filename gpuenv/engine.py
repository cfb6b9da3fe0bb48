"""The Docker Engine, through the Docker SDK for Python. The only module that imports docker.

Every engine failure a user can meet (engine down, socket permissions, missing image, a
failed build) leaves here as a GpuenvError with one line saying what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from docker.context import ContextAPI

from gpuenv.errors import GpuenvError

LogSink = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _base_url() -> tuple[str | None, dict[str, Any]]:
    """DOCKER_HOST if set, else the current Docker context's endpoint (as the CLI does)."""
    if os.environ.get("DOCKER_HOST"):
        return None, {}
    try:
        ctx = ContextAPI.get_current_context()
    except Exception:  # a broken ~/.docker/config.json must not stop a local engine
        return None, {}
    if ctx is None or ctx.name == "default":
        return None, {}
    endpoint = ctx.endpoints.get("docker", {})
    return endpoint.get("Host"), {"tls": ctx.TLSConfig} if ctx.TLSConfig else {}


class Engine:
    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.api = client.api

    @property
    def url(self) -> str:
        return str(self.api.base_url)

    def info(self) -> dict[str, Any]:
        try:
            return dict(self.api.info())
        except docker.errors.DockerException as exc:
            raise engine_error(exc) from None

    # ------------------------------------------------------------------ images

    def image(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect`, or None when there is no such image."""
        try:
            return dict(self.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return None
            raise engine_error(exc) from None

    def labels(self, ref: str) -> dict[str, str] | None:
        info = self.image(ref)
        if info is None:
            return None
        return dict((info.get("Config") or {}).get("Labels") or {})

    def gpuenv_images(self) -> list[dict[str, str]]:
        """Labels of every tagged image gpuenv built (they carry io.gpuenv.cell)."""
        try:
            images = self.api.images(filters={"label": "io.gpuenv.cell", "dangling": False})
        except docker.errors.DockerException as exc:
            raise engine_error(exc) from None
        return [dict(i.get("Labels") or {}) for i in images if i.get("RepoTags")]

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":")
        self.api.tag(image_id, repo, tag)

    def remove_if_untagged(self, image_id: str) -> bool:
        """Remove a superseded image only when no tag points at it any more (removing by
        ID would also drop a tag a user added, e.g. docker tag acme/tf:cell acme/tf:rel1)."""
        info = self.image(image_id)
        if info is None or info.get("RepoTags"):
            return False
        return self.remove_image(image_id)

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        try:
            self.api.remove_image(ref, force=force, noprune=False)
            return True
        except docker.errors.APIError:
            return False

    def import_image(self, tar_path: str, ref: str, changes: list[str]) -> str:
        """`docker import` of a root filesystem tar file, tagged ref."""
        repo, _, tag = ref.rpartition(":")
        try:
            out = self.api.import_image(src=tar_path, repository=repo, tag=tag, changes=changes)
        except docker.errors.APIError as exc:
            raise engine_error(exc) from None
        status = str(out)
        match = re.search(r"sha256:[0-9a-f]{64}", status)
        if match is None:
            raise GpuenvError(f"docker import of {ref} failed: {status.strip()[:300]}")
        return match.group(0)

    # ------------------------------------------------------------------ builds

    def build(
        self,
        context: Any,
        *,
        labels: dict[str, str],
        nocache: bool,
        on_log: LogSink,
    ) -> str:
        """Build an uploaded tar context without tagging it; returns the full image ID
        (sha256:...), the form `image inspect` gives, so callers can compare the two.

        The caller tags only after success, so a failed or interrupted build never leaves a
        tag on a half-built image. forcerm removes intermediate containers either way.
        """
        stream: Iterator[dict[str, Any]] = self.api.build(
            fileobj=context,
            custom_context=True,
            encoding="gzip" if getattr(context, "gzipped", False) else None,
            labels=labels,
            nocache=nocache,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode="host",
            decode=True,
        )
        image_id = None  # the full sha256:... ID from the aux message
        short_id = None  # the "Successfully built <12 hex>" line, when no aux message came
        for chunk in stream:
            if "stream" in chunk:
                # The engine passes the step's colour codes through; logs get plain text.
                for line in _ANSI.sub("", str(chunk["stream"])).splitlines():
                    on_log(line)
                    m = re.match(r"Successfully built ([0-9a-f]{12,64})", line)
                    if m:
                        short_id = m.group(1)
            if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                image_id = str(chunk["aux"]["ID"])
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail") or {}
                raise BuildFailed(str(detail.get("message") or chunk.get("error")).strip())
        if image_id is None and short_id is not None:
            info = self.image(short_id)
            image_id = str(info["Id"]) if info else None
        if image_id is None:
            raise BuildFailed("the engine ended the build without an image")
        return image_id


class BuildFailed(Exception):
    """A build step failed; the message is the engine's."""


def engine_error(exc: Exception) -> GpuenvError:
    text = str(exc)
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if "Permission denied" in text or "PermissionError" in text:
        return GpuenvError(
            f"permission denied on the Docker socket ({host}); add your user to the docker "
            "group (sudo usermod -aG docker $USER, then log in again) or run as root",
            exit_code=125,
        )
    if any(
        s in text
        for s in (
            "No such file",
            "Connection refused",
            "Connection aborted",
            "Failed to establish",
            "timed out",
            "FileNotFoundError",
        )
    ):
        return GpuenvError(
            f"cannot reach the Docker Engine at {host}: is dockerd running? "
            "(on Debian: sudo scripts/engine.sh starts one)",
            exit_code=125,
        )
    if "no space left on device" in text:
        return GpuenvError("the engine's disk is full; free space (docker image prune) and retry")
    return GpuenvError(f"Docker Engine error: {text.splitlines()[0][:300]}", exit_code=125)


@dataclass
class _Connection:
    engine: Engine | None = None


_conn = _Connection()


def connect() -> Engine:
    """A client for DOCKER_HOST / the current context / the local socket, checked by a ping."""
    if _conn.engine is not None:
        return _conn.engine
    base_url, extra = _base_url()
    try:
        # With the default version="auto" the client asks the engine for its API version
        # first, which already proves the engine answers: no separate ping.
        client = docker.DockerClient(base_url=base_url, **extra) if base_url else docker.from_env()
    except docker.errors.DockerException as exc:
        raise engine_error(exc) from None
    except OSError as exc:
        raise engine_error(exc) from None
    _conn.engine = Engine(client)
    return _conn.engine


# ---------------------------------------------------------------------- containers
# Thin wrappers so that run.py and doctor.py never touch the SDK themselves.


def device_request(body: dict[str, Any]) -> Any:
    return docker.types.DeviceRequest(
        driver=body["Driver"],
        count=body["Count"],
        device_ids=body["DeviceIDs"],
        capabilities=body["Capabilities"],
        options=body["Options"],
    )


def create_container(engine: Engine, spec: dict[str, Any]) -> str:
    """Create (not start) a container from a plain spec dict; returns its ID."""
    api = engine.api
    host = api.create_host_config(
        binds=spec.get("binds") or None,
        port_bindings=spec.get("ports") or None,
        device_requests=[device_request(d) for d in spec.get("device_requests", [])] or None,
        init=spec.get("init", True),
        shm_size=spec.get("shm_size"),
        ipc_mode=spec.get("ipc"),
        network_mode=spec.get("network"),
        tmpfs=spec.get("tmpfs") or None,
        auto_remove=False,
    )
    created = api.create_container(
        image=spec["image"],
        command=spec["command"],
        user=spec.get("user"),
        working_dir=spec.get("workdir"),
        environment=spec.get("env") or None,
        host_config=host,
        labels=spec.get("labels") or None,
        tty=spec.get("tty", False),
        stdin_open=spec.get("stdin", False),
        ports=list(spec.get("ports", {}).keys()) or None,
    )
    return str(created["Id"])


def remove_container(engine: Engine, cid: str) -> None:
    try:
        engine.api.remove_container(cid, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):  # 409: removal already in progress
            raise


APIError = docker.errors.APIError
DockerException = docker.errors.DockerException


def exec_output(engine: Engine, cid: str, command: list[str], user: str = "") -> tuple[int, str]:
    """Run a command in a running container; (exit code, stdout)."""
    api = engine.api
    exec_id = api.exec_create(cid, command, stdout=True, stderr=False, user=user)["Id"]
    out = api.exec_start(exec_id, demux=True)
    stdout = (out[0] if isinstance(out, tuple) else out) or b""
    code = api.exec_inspect(exec_id).get("ExitCode") or 0
    return int(code), stdout.decode(errors="replace")


def run_capture(engine: Engine, image: str, command: list[str]) -> tuple[int, str]:
    """Run a short command in a throwaway container (no network); (exit code, stdout)."""
    spec = {"image": image, "command": command, "network": "none", "init": False,
            "labels": {"io.gpuenv.probe": "1"}}  # fmt: skip
    cid = create_container(engine, spec)
    try:
        engine.api.start(cid)
        code = int(engine.api.wait(cid, timeout=120)["StatusCode"])
        out = engine.api.logs(cid, stdout=True, stderr=False).decode(errors="replace")
    finally:
        remove_container(engine, cid)
    return code, out


def save_image(engine: Engine, ref: str, path: str) -> None:
    """`docker save` to a tar file."""
    try:
        with open(path, "wb") as fh:
            for chunk in engine.api.get_image(ref):
                fh.write(chunk)
    except docker.errors.DockerException as exc:
        raise engine_error(exc) from None


def load_image(engine: Engine, path: str) -> list[str]:
    """`docker load` of a tar file; returns what the engine said it loaded."""
    try:
        with open(path, "rb") as fh:
            out = engine.api.load_image(fh)
    except docker.errors.DockerException as exc:
        raise engine_error(exc) from None
    messages = []
    for item in out if isinstance(out, list) else [out]:
        if isinstance(item, dict) and item.get("error"):
            raise GpuenvError(f"docker load {path}: {item['error']}")
        if isinstance(item, dict) and item.get("stream"):
            messages.append(str(item["stream"]).strip())
    return messages
