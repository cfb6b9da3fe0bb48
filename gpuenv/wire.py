"""The Engine API over a local Unix socket, with the standard library only.

gpuenv/engine.py is the engine's one front door; this is the transport it uses for a local
engine, kept apart so that the one command that must answer in milliseconds (a no-op
`gpuenv build` remembered by gpuenv/verdict.py) can ask the engine a question without
importing the engine module (dataclasses, the SDK's error mapping). Nothing else imports
it: the rest of gpuenv goes through gpuenv.engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

DEFAULT_SOCKET = "/var/run/docker.sock"


def local_socket() -> str | None:
    """The Unix socket of a local engine, when that is what the SDK would connect to:
    DOCKER_HOST=unix:///PATH, or no DOCKER_HOST, no DOCKER_CONTEXT other than default, and
    no current context other than default in the Docker config. None otherwise (the SDK
    then reads contexts, TLS and ssh itself)."""
    host = os.environ.get("DOCKER_HOST", "")
    if host:
        path = host.removeprefix("unix://")
        ok = host.startswith("unix://") and path.startswith("/") and "\0" not in path
        return path if ok and len(path) < 108 else None
    if os.environ.get("DOCKER_CONTEXT", "default") != "default":
        return None
    config_dir = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        with open(os.path.join(config_dir, "config.json"), encoding="utf-8") as fh:
            current = json.load(fh).get("currentContext")
    except FileNotFoundError:
        current = None
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: let the SDK decide, as before
    return DEFAULT_SOCKET if current in (None, "", "default") else None


class ApiError(Exception):
    """An Engine API answer other than success, worded as the SDK's APIError is (callers
    match the engine's own text in it: gpus.explain_start_error, run._start_error)."""

    def __init__(self, status: int, reason: str, message: str, url: str) -> None:
        kind = "Client" if status < 500 else "Server"
        super().__init__(f'{status} {kind} Error for {url}: {reason} ("{message}")')
        self.status_code = status
        self.explanation = message


def quote_segment(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def frames(recv: Callable[[], bytes]) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The engine's multiplexed stream (non-TTY), read by `recv` (b"" at the end): frames of
    an 8-byte header (stream 1 stdout, 2 stderr; big-endian length in bytes 4-7) and a
    payload. The one reader of it: the socket transport's attach and the TLS attach."""
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


MAX_ANSWER = 64 << 20  # an Engine API answer gpuenv reads whole (inspect, info, create)


def _read_head(reader: Any, url: str) -> tuple[int, str, dict[str, str]]:
    """Status line and headers; ApiError when the peer does not speak HTTP."""
    line = reader.readline(65537)
    parts = line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ApiError(502, "Bad Gateway", f"no Engine API answer ({line[:80]!r})", url)
    headers: dict[str, str] = {}
    for _ in range(200):
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            return int(parts[1]), parts[2].strip() if len(parts) > 2 else "", headers
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    raise ApiError(502, "Bad Gateway", "no end to the answer's headers", url)


def _read_body(reader: Any, headers: dict[str, str], url: str) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = reader.readline(1024).split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise ApiError(502, "Bad Gateway", "a malformed chunked answer", url) from None
            if size == 0:
                return bytes(out)
            if len(out) + size > MAX_ANSWER:
                raise ApiError(502, "Bad Gateway", "an answer larger than 64 MiB", url)
            out += reader.read(size)
            reader.readline(1024)  # the CRLF after the chunk
    length = headers.get("content-length")
    if length is not None and length.isdigit():
        if int(length) > MAX_ANSWER:
            raise ApiError(502, "Bad Gateway", "an answer larger than 64 MiB", url)
        return bytes(reader.read(int(length)))
    return bytes(reader.read(MAX_ANSWER))


class Socket:
    """HTTP/1.1 to the engine's Unix socket with the standard library: one connection per
    request (a Unix socket connects in microseconds), JSON in and out."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _open(self, timeout: float | None) -> Any:
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        return sock

    def request(
        self,
        method: str,
        url: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = 60,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> bytes:
        """One request, `Connection: close`; the body (Content-Length, chunked, or up to
        the close). http.client would cost its import (email.parser & co, ~15 ms) on
        every `run`; the engine's answers need no more than this."""
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {url} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n\r\n"
        sock = self._open(timeout)
        try:
            sock.sendall(head.encode() + data)
            with sock.makefile("rb") as reader:
                status, reason, headers = _read_head(reader, url)
                raw = _read_body(reader, headers, url)
        finally:
            sock.close()
        if status not in ok:
            raise self._error(status, reason, raw, url)
        return raw

    def json(
        self,
        method: str,
        url: str,
        body: dict[str, Any] | None = None,
        *,
        timeout: float | None = 60,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> Any:
        raw = self.request(method, url, body, timeout=timeout, ok=ok)
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise ApiError(
                502, "Bad Gateway", "the answer is not the Engine API's JSON", url
            ) from None

    @staticmethod
    def _error(status: int, reason: str, raw: bytes, url: str) -> ApiError:
        try:
            message = str(json.loads(raw).get("message") or "")
        except (ValueError, AttributeError):
            message = raw.decode(errors="replace").strip()
        return ApiError(status, reason, message, f"http+docker://localhost{url}")

    def attach(self, cid: str, *, tty: bool) -> Iterator[tuple[bytes | None, bytes | None]]:
        """A created container's output from the start: (stdout, stderr) chunks until the
        container's streams close, demultiplexed (a TTY's single stream is all stdout). The
        request is sent now, so nothing written after a later start is missed."""
        url = f"/containers/{quote_segment(cid)}/attach?logs=1&stream=1&stdout=1&stderr=1"
        sock = self._open(None)
        try:
            sock.sendall(
                f"POST {url} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n"
                "Upgrade: tcp\r\nContent-Length: 0\r\n\r\n".encode()
            )
            reader = sock.makefile("rb")
            status, reason, headers = _read_head(reader, url)
            if status not in (101, 200):
                raise self._error(status, reason, _read_body(reader, headers, url), url)
        except BaseException:
            sock.close()
            raise
        return self._raw(sock, reader) if tty else self._frames(sock, reader)

    @staticmethod
    def _raw(sock: Any, reader: Any) -> Iterator[tuple[bytes | None, bytes | None]]:
        try:
            while chunk := reader.read1(65536):
                yield chunk, None
        finally:
            reader.close()
            sock.close()

    @staticmethod
    def _frames(sock: Any, reader: Any) -> Iterator[tuple[bytes | None, bytes | None]]:
        try:
            yield from frames(lambda: reader.read1(65536))
        finally:
            reader.close()
            sock.close()
