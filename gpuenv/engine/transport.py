"""How gpuenv reaches an engine, through the Docker SDK for Python: the one file that knows
the SDK's insides (its private attributes are used here and nowhere else).

The SDK (requests, urllib3, ssl) is imported on first use, so commands that never reach
the engine (`--help`, `matrix`, `render`) do not pay for it. Every engine is reached through
the SDK, at the address the docker CLI would use (address.py: DOCKER_HOST, with unix://,
tcp:// with TLS from DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, ssh://; else the current Docker
context, its TLS made a TLSConfig here; else the local socket).
`ssh://` runs the user's own `ssh` (its config, keys, agent, known hosts) with `docker system
dial-stdio` on the remote host, as the docker CLI does (_SshTarget below).

Every engine failure a user can meet (engine down, socket permissions, a missing image, a
refused container) leaves here as an EngineError with one line saying what to do, and the
engine's own text in `detail` for callers that explain it further (the NVIDIA toolkit's
messages, gpuenv/gpu/gpus.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpuenv.engine.address import ContextTls, named_address
from gpuenv.engine.values import EngineError

# What the SDK, requests and the socket say when no engine answers at the address.
_UNREACHABLE = ("No such file", "Connection refused", "Connection aborted",
                "Failed to establish", "timed out", "FileNotFoundError", "Connection broken",
                "RemoteDisconnected")  # fmt: skip


def engine_error(exc: Exception) -> EngineError:
    text = str(exc)
    host = named_address()  # as the user named it (DOCKER_HOST, the context, the socket)
    if "Permission denied" in text or "PermissionError" in text:
        message = (
            f"permission denied on the Docker socket ({host}); add your user to the docker "
            "group (sudo usermod -aG docker $USER, then log in again) or run as root"
        )
    elif any(s in text for s in _UNREACHABLE):
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
    return EngineError(message, detail=text, status=_status(exc))


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


def _address(api: Any) -> str:
    """Where the SDK's client `api` is: ssh://USER@HOST as named, else its base URL."""
    ssh = getattr(api, "_custom_adapter", None)  # the ssh transport's Adapter knows it
    return str(getattr(ssh, "address", None) or api.base_url)


def _socket_path(api: Any) -> str | None:
    """The Unix socket the SDK's client `api` reaches its engine at; None for another
    transport (tcp, TLS, ssh: its adapter knows an address of its own)."""
    adapter = getattr(api, "_custom_adapter", None)
    if adapter is None or getattr(adapter, "address", None):  # ssh's Adapter
        return None
    path = getattr(adapter, "socket_path", None)
    return path if isinstance(path, str) else None


def _pinged(api: Any) -> Any:
    """The headers of the /_ping that gave the client its API version; None when it came
    from /version (_client_class)."""
    return getattr(api, "pinged", None)


def _ping(api: Any, timeout: float) -> bool:
    """Whether the engine answers /_ping within `timeout` seconds."""
    try:
        resp = api.get(api._url("/_ping"), timeout=timeout)
        return bool(resp.status_code == 200)
    except Exception:  # refused, reset, timed out, TLS: all mean "not now"
        return False


def _attach_demuxed(api: Any, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
    """attach as the SDK's attach(stream=True, logs=True, demux=True) does, to a container
    gpuenv created without a TTY: the SDK's own asks the engine first (an inspect) whether
    the container has one."""
    response = api._post(
        api._url("/containers/{0}/attach", cid),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        params={"logs": 1, "stdout": 1, "stderr": 1, "stream": 1},
        stream=True,
    )
    frames = api._read_from_socket(response, True, tty=False, demux=True)

    def read() -> Iterator[tuple[bytes | None, bytes | None]]:
        try:  # the response held while its socket is read (collected, it closes it)
            yield from frames
        finally:
            response.close()

    return read()


def _attach_tls(api: Any, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
    """attach over TLS, read without the SDK's reader: it polls the socket's descriptor
    before each read, and bytes the TLS layer has already decrypted do not wake a poll,
    so a remote workload's output arrived only when more came (often: at its end).
    SSLSocket.recv returns those pending bytes at once."""
    response = api._post(
        api._url("/containers/{0}/attach", cid),
        params={"logs": 1, "stdout": 1, "stderr": 1, "stream": 1},
        stream=True,
    )
    sock = api._get_raw_response_socket(response)
    sock.settimeout(None)  # a quiet workload is not a failure; _watch notices a dead link
    return _frames(lambda: sock.recv(65536))


def _raw_socket(sock: Any) -> Any:
    """The socket under the SDK's attach socket (a SocketIO on Unix sockets)."""
    return getattr(sock, "_sock", sock)


def _translated_stream(stream: Iterator[Any]) -> Iterator[Any]:
    with _translated():
        yield from stream


def _bind_mount(source: str, target: str, read_only: bool) -> Any:
    from docker.types import Mount

    return Mount(target, source, type="bind", read_only=read_only)


def _device_request(body: dict[str, Any]) -> Any:
    import docker.types

    return docker.types.DeviceRequest(
        driver=body["Driver"],
        count=body["Count"],
        device_ids=body["DeviceIDs"],
        capabilities=body["Capabilities"],
        options=body["Options"],
    )


def _client_class() -> Any:
    """docker.DockerClient whose API client learns the engine's API version as the docker
    CLI does, from /_ping's API-Version header, and keeps those headers: whether the engine
    is podman (Engine.is_podman) is in them too (podman's /_ping sends Libpod-API-Version:
    "clients will use the header availability to test which backend engine is in use",
    containers/podman pkg/api/handlers/compat/ping.go), so no run asks /version. dockerd
    answers /version by asking containerd, runc and docker-init for theirs: 5-25 ms on this
    machine, more on a busy one, against 0.1-0.7 ms for /_ping (issue 48). An engine whose
    /_ping names no API version is asked /version, the SDK's way; that answer is kept."""
    import docker

    class Api(docker.APIClient):
        _answer: Any = None
        pinged: Any = None  # /_ping's headers, when they gave the API version

        def _retrieve_server_version(self) -> Any:
            sdk: Any = super()  # the SDK's private parts, which its stubs leave out
            try:
                response = self.get(sdk._url("/_ping", versioned_api=False))
            except Exception as exc:  # as the SDK's own words it (a DockerException)
                raise docker.errors.DockerException(
                    f"Error while fetching server API version: {exc}"
                ) from exc
            found = response.headers.get("API-Version") if response.status_code == 200 else None
            if not found:
                return sdk._retrieve_server_version()
            self.pinged = response.headers
            return found

        def version(self, api_version: bool = True) -> Any:
            if self._answer is None:
                self._answer = super().version(api_version)
            return self._answer

    class Client(docker.DockerClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.api = Api(*args, **kwargs)

    return Client


def _tls_config(tls: ContextTls) -> Any:
    from docker.tls import TLSConfig

    return TLSConfig(client_cert=tls.client_cert, ca_cert=tls.ca_cert, verify=tls.verify)


def _sdk_client(base_url: str | None, tls: ContextTls | None) -> Any:
    address = base_url or os.environ.get("DOCKER_HOST") or ""
    if address.startswith("ssh://"):
        return _ssh_client(_SshTarget.parse(address))
    # With the default version="auto" the client asks the engine for its API version
    # first, which already proves the engine answers: no separate ping.
    try:
        with _translated(), _without_ca_overrides():
            client_class = _client_class()
            client = (
                client_class(base_url=base_url, **({"tls": _tls_config(tls)} if tls else {}))
                if base_url
                else client_class.from_env()
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

    class Adapter(UnixHTTPAdapter):
        address = target.address  # what the engine is known by (Engine.url)

        def get_connection(self, url: Any, proxies: Any = None) -> Pool:
            with self.pools.lock:
                pool = self.pools.get(url)
                if not pool:
                    pool = Pool(url, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                    self.pools[url] = pool
            return pool

    # A Unix-socket client (its version given, so it asks nothing yet) whose transport is
    # then swapped for ssh's; the first request, for the API version, dials.
    client = _client_class()(base_url="unix:///gpuenv-ssh", version="1.24")
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
