"""Which engine gpuenv reaches, picked as the docker CLI picks it: DOCKER_HOST (the SDK reads
it and its TLS variables itself), else the current Docker context (DOCKER_CONTEXT, else
config.json's currentContext, in $DOCKER_CONFIG or ~/.docker), else the local socket. Plain
files and values: the SDK is made from them in transport.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpuenv.engine.values import EngineError
from gpuenv.matrix.errors import GpuenvError


@dataclass(frozen=True)
class ContextTls:
    """A context's TLS: its client certificate and key, its CA, whether the server is checked
    (SkipTLSVerify: TLS with the server unchecked)."""

    client_cert: tuple[str, str] | None
    ca_cert: str | None
    verify: bool


def named_address() -> str:
    """The engine's address as the user named it (for messages): DOCKER_HOST, the current
    context's endpoint, or the local socket."""
    try:
        address = os.environ.get("DOCKER_HOST") or endpoint()[0]
    except GpuenvError:  # a context that does not resolve
        return "the current Docker context"
    return address or "unix:///var/run/docker.sock"


def _docker_config_dir() -> Path:
    # os.path.expanduser, not Path.home(): a uid with no passwd entry and no HOME (a
    # container's or CI's) has no ~, which leaves "~/.docker" as it is (no contexts: the
    # local socket, as the docker CLI does) where Path.home() raises.
    return Path(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"))


def endpoint() -> tuple[str | None, ContextTls | None]:
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

    def present(file: str) -> str | None:
        return str(tls_dir / file) if (tls_dir / file).exists() else None

    cert, key = present("cert.pem"), present("key.pem")
    return host, ContextTls(client_cert=(cert, key) if cert and key else None,
                            ca_cert=present("ca.pem"), verify=not skip_verify)  # fmt: skip
