"""A private package index that requires HTTP basic auth, served by a test on loopback over
HTTPS (a CA of the test's own: support/tls.py; gpuenv sends credentials over https only):
PEP 503 pages for one small wheel the test builds (a zip with its dist-info files), 404 for
every other project, every request checked for the credentials and recorded, its
Authorization header too. And RecordingIndex: a hostile index that only records what it is
sent."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import ssl
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from support.tls import loopback_tls

PACKAGE, VERSION = "gpuenv-private-probe", "1.0"
USER = f"gpuenv-user-{secrets.token_hex(4)}"
PASSWORD = f"pw-{secrets.token_hex(12)}"


def make_wheel() -> tuple[str, bytes]:
    """A minimal pure-Python wheel: a module, METADATA, WHEEL and RECORD."""
    dist = f"{PACKAGE.replace('-', '_')}-{VERSION}"
    files = {
        "gpuenv_private_probe.py": b"ANSWER = 42\n",
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode()
        ),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: gpuenv-test\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return f"{dist}-py3-none-any.whl", buf.getvalue()


JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def serve(
    handler: type[BaseHTTPRequestHandler], tls: tuple[Path, Path] | None
) -> tuple[ThreadingHTTPServer, str]:
    """A server on 127.0.0.1:<free port>, over TLS with (certificate, key) when given;
    returns it and its /simple/ URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    return server, f"{scheme}://127.0.0.1:{server.server_address[1]}/simple/"


class PrivateIndex:
    """Project pages on https://127.0.0.1:<free port>, every request checked for basic auth:
    PEP 691 JSON with PEP 700's upload time (as PyPI serves them), or, with `html_only`, PEP
    503 HTML alone, with no upload time (as a directory behind a web server does).
    `redirects`: path -> URL it answers 302 with (after the credentials are checked).
    `directory`: where its CA and certificate go; `bundle` is what gpuenv must trust."""

    def __init__(self, directory: Path, redirects: dict[str, str] | None = None) -> None:
        self.html_only = False
        self.filename, self.wheel = make_wheel()
        self.sha = hashlib.sha256(self.wheel).hexdigest()
        self.requests: list[tuple[str, int]] = []
        self.authorizations: list[tuple[str, str | None]] = []  # path, header as sent
        self.redirects = dict(redirects or {})
        expected = basic(USER, PASSWORD)
        cert, key, self.bundle = loopback_tls(directory, f"gpuenv-private-{secrets.token_hex(6)}")
        self.tls = (cert, key)  # for another server on 127.0.0.1 the bundle vouches for
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # uv asks before it downloads
                self.answer(send_body=False)

            def do_GET(self) -> None:
                self.answer(send_body=True)

            def answer(self, send_body: bool) -> None:
                index.authorizations.append((self.path, self.headers.get("Authorization")))
                location = index.redirects.get(self.path)
                if self.headers.get("Authorization") != expected:
                    code, body = 401, b"credentials required\n"
                elif location is not None:
                    code, body = 302, b""
                elif self.path == f"/simple/{PACKAGE}/" and index.html_only:
                    code = 200
                    body = (f'<a href="/files/{index.filename}#sha256={index.sha}">'
                            f"{index.filename}</a>").encode()  # fmt: skip
                elif self.path == f"/simple/{PACKAGE}/":
                    code = 200
                    body = json.dumps({
                        "meta": {"api-version": "1.1"}, "name": PACKAGE, "versions": [VERSION],
                        "files": [{"filename": index.filename, "hashes": {"sha256": index.sha},
                                   "url": f"/files/{index.filename}",
                                   "upload-time": "2026-01-01T00:00:00.000000Z"}],
                    }).encode()  # fmt: skip
                elif self.path == f"/files/{index.filename}":
                    code, body = 200, index.wheel
                else:
                    code, body = 404, b"not here\n"
                index.requests.append((self.path, code))
                self.send_response(code)
                if code == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="private"')
                if code == 302:
                    self.send_header("Location", str(location))
                kind = "application/zip"
                if self.path.startswith("/simple/"):
                    kind = "text/html" if index.html_only or code != 200 else JSON_TYPE
                self.send_header("Content-Type", kind)  # uv requires one
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        self.server, self.url = serve(Handler, (cert, key))
        self.origin = self.url.removesuffix("/simple/")
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def netrc(self) -> str:
        """Its netrc entry: the host and its port (a bare host means port 443)."""
        port = self.server.server_address[1]
        return f"machine 127.0.0.1:{port} login {USER} password {PASSWORD}\n"

    def __enter__(self) -> PrivateIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class RecordingIndex:
    """An index someone else runs (a matrix added it): it records every request's path and
    Authorization header, and answers `codes[path]` (404 for the rest). Over TLS with
    (certificate, key) when given, else plain http."""

    def __init__(self, tls: tuple[Path, Path] | None, codes: dict[str, int] | None = None) -> None:
        self.seen: list[tuple[str, str | None]] = []
        codes = dict(codes or {})
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer()

            def do_GET(self) -> None:
                self.answer()

            def answer(self) -> None:
                index.seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(codes.get(self.path, 404))
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server, self.url = serve(Handler, tls)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
