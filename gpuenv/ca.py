"""The CA bundle pip and uv trust during a build, and the loopback server that hands it over.

Corporate proxies intercept TLS, so the build's install step must trust their CA. It must
also never keep it: not in a layer, not in the history (build args land there), not in the
config. gpuenv serves the bundle on 127.0.0.1 for the length of the build; the install step
(builds use host networking) fetches it, uses it and deletes it before the layer is saved.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from gpuenv.contract import CA_PORT
from gpuenv.errors import GpuenvError


def find_bundle(explicit: Path | None, matrix_value: str | None, matrix_dir: Path) -> Path | None:
    """The first of --ca-bundle, the matrix's build.ca_bundle, $GPUENV_CA_BUNDLE, $PIP_CERT."""
    if explicit is not None:
        candidate, origin = explicit, "--ca-bundle"
    elif matrix_value:
        candidate, origin = matrix_dir / matrix_value, "build.ca_bundle"
    elif os.environ.get("GPUENV_CA_BUNDLE"):
        candidate, origin = Path(os.environ["GPUENV_CA_BUNDLE"]), "$GPUENV_CA_BUNDLE"
    elif os.environ.get("PIP_CERT"):
        candidate, origin = Path(os.environ["PIP_CERT"]), "$PIP_CERT"
    else:
        return None
    check_bundle(candidate, origin)
    return candidate


MAX_BUNDLE_BYTES = 16 << 20
CHECKED = "ca-checked.json"  # in gpuenv's cache: sha256 of a bundle -> valid until (epoch s)


def _known_good(path: Path) -> bool:
    """Whether these exact bytes passed check_bundle and one of their certificates is still
    valid (the verdict is remembered by content digest until that certificate expires), so
    a build that needs no CA need not import ssl and parse a 200 KB system bundle."""
    from gpuenv import cache
    from gpuenv.snapshot import file_digest

    until = cache.read_record(CHECKED).get(file_digest(path))
    return isinstance(until, (int, float)) and time.time() <= until


def _remember_good(text: bytes, until: float) -> None:
    import hashlib

    from gpuenv import cache

    now = time.time()
    kept = {k: v for k, v in cache.read_record(CHECKED).items()
            if isinstance(v, (int, float)) and v >= now}  # fmt: skip
    kept[hashlib.sha256(text).hexdigest()] = until
    cache.write_record(CHECKED, dict(sorted(kept.items(), key=lambda kv: -kv[1])[:32]))


def check_bundle(path: Path, origin: str) -> None:
    """A readable regular file (not a directory or /dev/zero) of PEM certificates that
    OpenSSL loads, at least one of them valid now: else an error naming where it came from."""
    if _known_good(path):
        return
    import ssl

    from gpuenv.yamlfile import read_capped

    where = f"CA bundle {path} (from {origin})"
    try:
        text = read_capped(path, MAX_BUNDLE_BYTES)
    except IsADirectoryError:
        raise GpuenvError(f"{where}: not a regular file") from None
    except OSError as exc:
        raise GpuenvError(f"{where}: {exc.strerror}") from None
    if len(text) > MAX_BUNDLE_BYTES:
        raise GpuenvError(f"{where}: larger than {MAX_BUNDLE_BYTES} bytes")
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise GpuenvError(f"{where} holds no PEM certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=text.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise GpuenvError(f"{where}: a PEM certificate in it does not parse") from None
    now = time.time()
    certs = context.get_ca_certs()
    valid = [
        c
        for c in certs
        if ssl.cert_time_to_seconds(c["notBefore"])
        <= now
        <= ssl.cert_time_to_seconds(c["notAfter"])
    ]
    if certs and not valid:
        raise GpuenvError(f"{where}: every certificate in it has expired (or is not yet valid)")
    if valid:
        _remember_good(text, max(ssl.cert_time_to_seconds(c["notAfter"]) for c in valid))


# Sharing the port needs Linux: SO_REUSEPORT's load balancing between listeners, abstract
# Unix sockets for the lock and the hand-over. Elsewhere builds take turns, as before.
SHARING = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
_PEERS = 64  # hand-over addresses per port: concurrent builds one machine can share it with
_MAX_BUNDLE = 64 << 20
_UNANSWERED = b"\0unanswered"


class CAServer:
    """Serves one file at CA_URL while the context is open.

    The port is fixed (the RUN line must stay byte-identical for the cache), so several gpuenv
    builds on one machine share it. Every gpuenv CA server binds with SO_REUSEPORT, and the
    kernel spreads the install steps' connections over all of them; that is only correct
    when they serve the same bytes, so a server joins only after fetching the bundle from
    whoever listens there and finding it identical. A build with another bundle waits until
    the port is free, as does one that finds the port held by something that is not gpuenv
    (it did not set SO_REUSEPORT, so the bind fails). Check and bind happen under a lock (an
    abstract Unix socket: scoped, like loopback, to the network namespace, and released by
    the kernel when its process dies), so two builds with different bundles cannot both find
    the port free and both bind.

    Leaving must not drop connections: with SO_REUSEPORT every listener has its own queue,
    and closing one resets what is queued on it. So a server that leaves while others listen
    hands its listening socket to one of them (SCM_RIGHTS over an abstract Unix socket): the
    socket stays open, in the kernel's group, and the other server accepts from it. The last
    one answers what is queued, then closes.
    """

    def __init__(
        self,
        bundle: Path,
        wait_seconds: float = 1800,
        say: Any = None,
        port: int = CA_PORT,
    ) -> None:
        self.data = bundle.read_bytes()
        self.wait_seconds = wait_seconds
        self.say = say or (lambda message: None)
        self.port = port
        self.shared = False  # True when another server was listening when this one joined
        self._loop: _Loop | None = None

    def __enter__(self) -> CAServer:
        deadline = time.monotonic() + self.wait_seconds
        said = ""
        while True:
            with _port_lock(self.port, deadline):
                holder = _fetch(self.port)
                why = ""
                if holder is None or holder == self.data:
                    try:
                        self._loop = _Loop(self.port, self.data)
                        self.shared = holder is not None
                        break
                    except OSError:
                        why = "a process that does not share it (not gpuenv?) holds it"
                elif holder is _UNANSWERED:
                    why = "what listens there does not answer"
                else:
                    why = "another gpuenv build serves a different CA bundle there"
            if time.monotonic() > deadline:
                raise GpuenvError(
                    f"127.0.0.1:{self.port} stayed taken ({why}); gpuenv serves the build's "
                    "CA bundle there and builds share it only with the same bundle. Wait for "
                    "that build, or stop what holds the port, and retry"
                )
            if why != said:
                self.say(f"waiting for 127.0.0.1:{self.port}: {why}")
                said = why
            time.sleep(0.5)
        if self.shared:
            self.say(f"sharing 127.0.0.1:{self.port} with another gpuenv build (same CA bundle)")
        self._loop.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with _port_lock(self.port, time.monotonic() + 60):
            loop.stop()
            if not loop.hand_over():
                loop.drain()
            loop.close()


def _fetch(port: int) -> bytes | None:
    """What 127.0.0.1:port serves at /ca.pem: None when nothing listens, _UNANSWERED when
    something listens but gives no 200 answer in time (not gpuenv)."""
    chunks: list[bytes] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"GET /ca.pem HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            while chunk := conn.recv(65536):
                chunks.append(chunk)
                if sum(map(len, chunks)) > _MAX_BUNDLE:
                    return _UNANSWERED
    except ConnectionRefusedError:
        return None
    except OSError:
        return _UNANSWERED
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep or head.split(b" ", 2)[1:2] != [b"200"] or not head.startswith(b"HTTP/1."):
        return _UNANSWERED
    return body


@contextmanager
def _port_lock(port: int, deadline: float) -> Iterator[None]:
    """Held by one gpuenv process of this network namespace at a time (Linux)."""
    if not SHARING:
        yield
        return
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:
            try:
                lock.bind(f"\0gpuenv-ca-{port}-lock")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise GpuenvError(
                        f"another gpuenv process kept the lock of 127.0.0.1:{port}; retry"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        lock.close()


def _answer(conn: socket.socket, data: bytes) -> None:
    """One HTTP exchange: GET /ca.pem gets the bundle, anything else 404."""
    try:
        conn.settimeout(10)
        request = b""
        while b"\r\n\r\n" not in request and len(request) < 16384:
            chunk = conn.recv(4096)
            if not chunk:
                break
            request += chunk
        words = request.split(b"\r\n", 1)[0].split()
        if words[:2] == [b"GET", b"/ca.pem"]:
            head = f"HTTP/1.0 200 OK\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
            conn.sendall(head.encode() + data)
        else:
            conn.sendall(
                b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
    except OSError:
        pass
    finally:
        conn.close()


class _Loop:
    """This process's listening sockets (its own, and any handed over to it) and the
    address other gpuenv servers hand theirs to, served by one thread."""

    def __init__(self, port: int, data: bytes) -> None:
        self.port = port
        self.data = data
        own = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            # Past connections in TIME_WAIT must not keep the port (two listeners never share
            # a port through SO_REUSEADDR on Linux; SO_REUSEPORT is what shares it).
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if SHARING:
                own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            own.bind(("127.0.0.1", port))
            own.listen(128)
        except OSError:
            own.close()
            raise
        own.setblocking(False)
        self.listeners = [own]
        self.peer: socket.socket | None = None
        self.peer_index = -1
        if SHARING:
            self.peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            for index in range(_PEERS):
                try:
                    self.peer.bind(f"\0gpuenv-ca-{port}-peer-{index}")
                except OSError:
                    continue
                self.peer.listen(8)
                self.peer_index = index
                break
            else:  # every hand-over address taken: serve, but leave by draining
                self.peer.close()
                self.peer = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpuenv-ca", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        import selectors

        with selectors.DefaultSelector() as sel:
            for listener in self.listeners:
                sel.register(listener, selectors.EVENT_READ, "listener")
            if self.peer is not None:
                sel.register(self.peer, selectors.EVENT_READ, "peer")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            while not self._stopping:
                for key, _ in sel.select():
                    if key.data == "wake":
                        return
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if key.data == "listener":
                        self._accept(sock)
                    else:
                        for listener in self._receive(sock):
                            self.listeners.append(listener)
                            sel.register(listener, selectors.EVENT_READ, "listener")

    def _accept(self, listener: socket.socket) -> bool:
        try:
            conn, _ = listener.accept()
        except OSError:
            return False
        conn.setblocking(True)
        threading.Thread(target=_answer, args=(conn, self.data), daemon=True).start()
        return True

    def _receive(self, peer: socket.socket) -> list[socket.socket]:
        """Listening sockets another server hands over (it waits for the acknowledgement)."""
        try:
            conn, _ = peer.accept()
        except OSError:
            return []
        received = []
        with conn:
            conn.settimeout(5)
            try:
                _, fds, _, _ = socket.recv_fds(conn, 16, 64)
                for fd in fds:
                    listener = socket.socket(fileno=fd)
                    listener.setblocking(False)
                    received.append(listener)
                conn.sendall(b"ok")
            except OSError:
                pass
        return received

    def stop(self) -> None:
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join()

    def hand_over(self) -> bool:
        """Give every listening socket to another gpuenv server of this port (under the lock,
        so it cannot be leaving too). False when there is none."""
        if not SHARING:
            return False
        fds = [s.fileno() for s in self.listeners]
        for index in range(_PEERS):
            if index == self.peer_index:
                continue
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.settimeout(5)
                    conn.connect(f"\0gpuenv-ca-{self.port}-peer-{index}")
                    socket.send_fds(conn, [b"listeners"], fds)
                    if conn.recv(2) == b"ok":
                        return True
            except OSError:
                continue
        return False

    def drain(self) -> None:
        """Answer the connections already queued (closing a listener resets them)."""
        for listener in self.listeners:
            while self._accept(listener):
                pass

    def close(self) -> None:
        for sock in [*self.listeners, self.peer, self._wake_r, self._wake_w]:
            if sock is not None:
                sock.close()
