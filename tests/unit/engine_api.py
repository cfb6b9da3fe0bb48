"""A tiny Engine API on a Unix socket (http.server): routes (method, path) -> (status,
payload) or one of the special answers below ("ping": dockerd's /_ping, with the
API-Version header a client learns the API version from; "ping-podman": podman's);
`routes.seen` lists every request served, in order ("GET /v1.41/info", the query left out).
The `fake_socket` fixture (conftest.py) serves one for a test."""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any


class Routes(dict[tuple[str, str], Any]):
    """(method, path) -> answer; `seen`: the requests served, "METHOD /path"."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.seen: list[str] = []


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler(routes: Routes) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            route = routes.get((self.command, self.path.split("?")[0]))
            routes.seen.append(f"{self.command} {self.path.split('?')[0]}")
            if route == "garbage":
                self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n")
                return
            if route in ("ping", "ping-podman"):  # as dockerd answers (podman: its own too)
                self.send_response(200)
                self.send_header("API-Version", "1.41")
                if route == "ping-podman":
                    self.send_header("Libpod-API-Version", "4.3.1")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")
                return
            if route == "attach-tty":  # a TTY's stream: raw bytes, no frames
                self.wfile.write(b"HTTP/1.1 101 UPGRADED\r\n\r\nhello\r\nworld\r\n")
                self.close_connection = True
                return
            if route == "attach":
                self.wfile.write(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: "
                                 b"application/vnd.docker.raw-stream\r\n\r\n")  # fmt: skip
                # The output once the container is started, as an engine sends it: frames
                # sent with the headers could be read ahead with them by the client's
                # buffered reader, which the SDK's frame reader then never sees (seen here
                # once in a loaded suite: "111 is not a valid stream", the 'o' of out1).
                attached, deadline = len(routes.seen), time.monotonic() + 5
                while time.monotonic() < deadline and not any(
                    r.endswith("/start") for r in routes.seen[attached:]
                ):
                    time.sleep(0.005)
                for stream, data in ((1, b"out1\n"), (2, b"err\n"), (1, b"out2\n")):
                    self.wfile.write(bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big"))
                    self.wfile.write(data)
                self.close_connection = True
                return
            status, payload = route if route else (404, {"message": f"no route {self.path}"})
            if callable(payload):
                payload = payload(body)
            raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(path: str) -> Iterator[Routes]:
    """Serve the Engine API at `path` while the context is open; add routes to what it yields."""
    routes = Routes({("GET", "/_ping"): "ping"})
    server = _UnixServer(path, _handler(routes))
    # Poll every 10 ms: shutdown() waits out one poll, 0.5 s by default, per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield routes
    finally:
        server.shutdown()
        server.server_close()
