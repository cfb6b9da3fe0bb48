"""The CA server: builds with the same bundle share the port, others wait for it.

Each test uses a free port of its own, not 47811, so a real build on this machine cannot
disturb it (the server's port is a parameter; builds always use contract.CA_PORT)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from gpuenv.ca import CAServer
from gpuenv.errors import GpuenvError

BUNDLE = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(server: CAServer) -> str:
    """The error of a server that could not start (it must not have started)."""
    with pytest.raises(GpuenvError) as caught:
        server.__enter__()
    return caught.value.message


def get(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ca.pem", timeout=5) as reply:
        return reply.read()


def test_two_servers_with_the_same_bundle_both_listen_and_the_survivor_serves(tmp_path, port):
    bundle = write(tmp_path, "a.pem", BUNDLE)
    said: list[str] = []
    first = CAServer(bundle, wait_seconds=5, port=port).__enter__()
    start = time.monotonic()
    with CAServer(bundle, wait_seconds=5, say=said.append, port=port) as second:
        assert time.monotonic() - start < 3  # joined, did not wait
        assert second.shared and not first.shared
        assert any("sharing" in s for s in said), said
        assert all(get(port) == BUNDLE for _ in range(20))
        first.__exit__(None, None, None)
        # The first server is gone; the second keeps serving alone.
        assert all(get(port) == BUNDLE for _ in range(20))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_different_bundle_waits_then_fails_with_the_reason(tmp_path, port):
    other = write(tmp_path, "b.pem", BUNDLE.replace(b"MIIB", b"MIIC"))
    said: list[str] = []
    with CAServer(write(tmp_path, "a.pem", BUNDLE), port=port):
        message = refused(CAServer(other, wait_seconds=1.5, say=said.append, port=port))
        assert all(get(port) == BUNDLE for _ in range(10))  # never joined
    assert f"127.0.0.1:{port} stayed taken" in message
    assert "different CA bundle" in message
    assert said == [
        f"waiting for 127.0.0.1:{port}: another gpuenv build serves a different CA bundle there"
    ]


def test_a_different_bundle_takes_over_once_the_port_is_free(tmp_path, port):
    first = CAServer(write(tmp_path, "a.pem", BUNDLE), port=port).__enter__()
    other_bytes = BUNDLE.replace(b"MIIB", b"MIIC")
    threading.Timer(1.0, first.__exit__, (None, None, None)).start()
    start = time.monotonic()
    with CAServer(write(tmp_path, "b.pem", other_bytes), wait_seconds=10, port=port) as second:
        assert time.monotonic() - start >= 0.9
        assert not second.shared
        assert get(port) == other_bytes


def test_a_port_held_by_something_else_waits_and_fails(tmp_path, port):
    with socket.socket() as holder:  # no SO_REUSEPORT, answers nothing
        holder.bind(("127.0.0.1", port))
        holder.listen()
        message = refused(CAServer(write(tmp_path, "a.pem", BUNDLE), wait_seconds=1, port=port))
    assert "stayed taken" in message


def test_a_non_gpuenv_server_of_the_same_bytes_is_not_joined(tmp_path, port):
    """Same bytes, but its socket does not allow sharing: the bind fails, and it waits."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(BUNDLE)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        message = refused(CAServer(write(tmp_path, "a.pem", BUNDLE), wait_seconds=1.5, port=port))
    finally:
        server.shutdown()
        server.server_close()
    assert "does not share it" in message


def test_many_servers_join_and_leave_while_clients_fetch(tmp_path, port):
    """Connections queued on a server that is closing are still answered (drained)."""
    bundle = write(tmp_path, "a.pem", BUNDLE)
    anchor = CAServer(bundle, port=port).__enter__()
    errors: list[BaseException] = []
    stop = threading.Event()

    def fetch_loop() -> None:
        while not stop.is_set():
            try:
                assert get(port) == BUNDLE
            except BaseException as exc:
                errors.append(exc)

    clients = [threading.Thread(target=fetch_loop) for _ in range(4)]
    for c in clients:
        c.start()
    try:
        for _ in range(5):
            with CAServer(bundle, wait_seconds=5, port=port):
                time.sleep(0.2)
    finally:
        stop.set()
        for c in clients:
            c.join()
        anchor.__exit__(None, None, None)
    assert errors == []
