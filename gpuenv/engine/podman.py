"""podman's differences: its Docker-compatible API service takes most of the Engine API,
but CDI devices go through its own API (a SpecGenerator, from a ContainerSpec here), its
errors come as JSON, and its tmpfs mounts take other options. The Engine asks `is_podman`
and comes here where podman differs."""

from __future__ import annotations

import json
import re
from typing import Any

from gpuenv.engine.transport import _translated
from gpuenv.engine.values import ContainerSpec, EngineError


def create_libpod(api: Any, spec: ContainerSpec) -> str:
    """Create through podman's own API (POST /libpod/containers/create, a SpecGenerator),
    which resolves CDI devices from the spec files on podman's host."""
    with _translated():
        response = api.post(api.base_url + "/v4.0.0/libpod/containers/create",
                            data=json.dumps(libpod_spec(spec)),
                            headers={"Content-Type": "application/json"})  # fmt: skip
        if response.status_code >= 300:
            text = _libpod_message(response.text)
            raise EngineError(f"podman refused the container: {text.strip()[:300]}",
                              detail=text, status=response.status_code)  # fmt: skip
        return str(response.json()["Id"])


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
