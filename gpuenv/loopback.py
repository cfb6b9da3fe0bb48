"""A loopback service on a fixed port that several gpuenv builds on one machine share.

Both things a build reaches on 127.0.0.1 live here: the CA bundle (gpuenv/ca.py) and the
wheelhouse's package index (gpuenv/proxy.py). Their addresses are part of the rendered RUN
lines, which must stay byte-identical for the engine's layer cache, so the ports are fixed
and concurrent builds must share them.

Every gpuenv server binds its port with SO_REUSEPORT, and the kernel spreads the install
steps' connections over all of them; that is only correct when they answer alike, so a
server joins only after fetching an identity (a probe path) from whoever listens there and
finding it equal to its own. A server with another identity waits until the port is free,
as does one that finds the port held by something that is not gpuenv (it did not set
SO_REUSEPORT, so the bind fails). Check and bind happen under a lock (an abstract Unix
socket: scoped, like loopback, to the network namespace, and released by the kernel when
its process dies), so two servers with different identities cannot both find the port free
and both bind.

Leaving must not drop connections: with SO_REUSEPORT every listener has its own queue, and
closing one resets what is queued on it. So a server that leaves while others listen hands
its listening socket to one of them (SCM_RIGHTS over an abstract Unix socket): the socket
stays open, in the kernel's group, and the other server accepts from it. The last one
answers what is queued, then closes.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from gpuenv.errors import GpuenvError

# Sharing the port needs Linux: SO_REUSEPORT's load balancing between listeners, abstract
# Unix sockets for the lock and the hand-over. Elsewhere builds take turns.
SHARING = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
_PEERS = 64  # hand-over addresses per port: concurrent builds one machine can share it with
_MAX_IDENTITY = 64 << 20
UNANSWERED = b"\0unanswered"

Answer = Callable[[socket.socket], None]  # one connection, answered and closed


class SharedServer:
    """Serves `answer` on 127.0.0.1:port while the context is open, sharing the port with
    the gpuenv servers there whose `probe` path gives the same `identity`."""

    def __init__(
        self,
        port: int,
        identity: bytes,
        answer: Answer,
        *,
        probe: str,
        what: str,
        wait_seconds: float = 1800,
        say: Any = None,
    ) -> None:
        self.port = port
        self.identity = identity
        self.answer = answer
        self.probe = probe
        self.what = what  # "CA bundle", for messages
        self.wait_seconds = wait_seconds
        self.say = say or (lambda message: None)
        self.shared = False  # True when another server was listening when this one joined
        self._loop: _Loop | None = None

    def __enter__(self) -> SharedServer:
        deadline = time.monotonic() + self.wait_seconds
        said = ""
        while True:
            with _port_lock(self.port, deadline):
                holder = fetch(self.port, self.probe)
                why = ""
                if holder is None or holder == self.identity:
                    try:
                        self._loop = _Loop(self.port, self.answer)
                        self.shared = holder is not None
                        break
                    except OSError:
                        why = "a process that does not share it (not gpuenv?) holds it"
                elif holder is UNANSWERED:
                    why = "what listens there does not answer"
                else:
                    why = f"another gpuenv build serves a different {self.what} there"
            if time.monotonic() > deadline:
                raise GpuenvError(
                    f"127.0.0.1:{self.port} stayed taken ({why}); gpuenv serves the build's "
                    f"{self.what} there and builds share it only with the same {self.what}. "
                    "Wait for that build, or stop what holds the port, and retry"
                )
            if why != said:
                self.say(f"waiting for 127.0.0.1:{self.port}: {why}")
                said = why
            time.sleep(0.5)
        if self.shared:
            self.say(f"sharing 127.0.0.1:{self.port} with another gpuenv build (same {self.what})")
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


def fetch(port: int, path: str) -> bytes | None:
    """What 127.0.0.1:port serves at path: None when nothing listens, UNANSWERED when
    something listens but gives no 200 answer in time (not gpuenv)."""
    chunks: list[bytes] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            while chunk := conn.recv(65536):
                chunks.append(chunk)
                if sum(map(len, chunks)) > _MAX_IDENTITY:
                    return UNANSWERED
    except ConnectionRefusedError:
        return None
    except OSError:
        return UNANSWERED
    head, sep, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not sep or head.split(b" ", 2)[1:2] != [b"200"] or not head.startswith(b"HTTP/1."):
        return UNANSWERED
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


class _Loop:
    """This process's listening sockets (its own, and any handed over to it) and the
    address other gpuenv servers hand theirs to, served by one thread."""

    def __init__(self, port: int, answer: Answer) -> None:
        self.port = port
        self.answer = answer
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
        self._thread = threading.Thread(target=self._run, name=f"gpuenv-{port}", daemon=True)

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
        threading.Thread(target=self.answer, args=(conn,), daemon=True).start()
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
