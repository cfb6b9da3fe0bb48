"""The wheelhouse's package index: a caching proxy on 127.0.0.1 for the length of a build.

The install steps' pip and uv use `http://127.0.0.1:47812/<key>/simple/` as their only index
(gpuenv/contract.py). For each project page they ask for, the proxy asks the upstream
indexes `<key>` stands for (in uv's order, the first that knows the project answers), keeps
the page (gpuenv/wheelhouse.py) and answers with the same files linked to itself. A file is
fetched upstream once, checked against the index's sha256 on the way in, stored under its
hash, and checked again when this process first serves it. Upstream is reached host side,
through the environment's proxy and the configured CA bundle, with the private indexes'
credentials (gpuenv/credentials.py): none of that reaches the build.

Offline (`gpuenv build --offline`) it never goes upstream: pages and files come from the
wheelhouse alone and a miss is answered 404 and recorded, naming the distribution.

Concurrent builds share the port (gpuenv/loopback.py) when they serve the same wheelhouse
the same way (same store, same offline mode, same credentials): the identity they compare.
Which upstreams a key stands for is in the store, so any of them can answer any key.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import socket
import ssl
import threading
import urllib.error
import urllib.request
import zipfile
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from gpuenv import contract
from gpuenv.credentials import Credentials
from gpuenv.errors import GpuenvError
from gpuenv.loopback import SharedServer
from gpuenv.wheelhouse import (
    HTML_TYPE,
    JSON_TYPE,
    HashMismatch,
    IndexFile,
    Store,
    normalize,
    parse_page,
    render_page,
    uv_wheel,
)

PROBE = "/gpuenv-wheelhouse"
TIMEOUT = 120  # seconds per upstream request
_PAGE = re.compile(r"/([0-9a-f]{16})/simple/([A-Za-z0-9._-]+)/?")
_FILE = re.compile(r"/([0-9a-f]{16})/files/([a-z0-9-]+)/([0-9a-f]{64})/([A-Za-z0-9._+!-]+)")
_UV = re.compile(r"/([0-9a-f]{16})/tools/uv/([0-9][0-9A-Za-z.+-]*)/([a-z0-9_]+)")


class Upstream:
    """Fetches from the upstream indexes: proxies from the environment, the CA bundle, and
    the credentials of the host asked (never carried over a redirect)."""

    def __init__(self, credentials: Credentials, ca_bundle: Path | None) -> None:
        self.credentials = credentials
        context = ssl.create_default_context()
        if ca_bundle is not None:
            context.load_verify_locations(cafile=str(ca_bundle))
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    def open(self, url: str, accept: str | None = None) -> Any:
        request = urllib.request.Request(url, headers={"User-Agent": "gpuenv-wheelhouse"})
        if accept:
            request.add_header("Accept", accept)
        credential = self.credentials.for_url(url)
        if credential is not None:
            request.add_unredirected_header("Authorization", credential.header())
        return self.opener.open(request, timeout=TIMEOUT)


class Proxy:
    """What one gpuenv process answers on the wheelhouse port."""

    def __init__(
        self,
        store: Store,
        *,
        credentials: Credentials,
        ca_bundle: Path | None = None,
        offline: bool = False,
        upstream: Upstream | None = None,
    ) -> None:
        self.store = store
        self.offline = offline
        self.credentials = credentials
        self._ca_bundle = ca_bundle
        self._upstream = upstream
        doc = {"store": str(store.root.resolve()), "offline": offline,
               "credentials": credentials.fingerprint()}  # fmt: skip
        self.identity = (
            hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest().encode()
        )
        self.problems: list[str] = []  # why a page or file could not be given: for the error
        self.fetched = 0  # files downloaded upstream
        self.served = 0  # files served
        self._lock = threading.Lock()

    @property
    def upstream(self) -> Upstream:
        """Made on first use: loading the CA bundle costs tens of milliseconds, and an
        offline build or one whose cells are all cached never asks upstream."""
        with self._lock:
            if self._upstream is None:
                self._upstream = Upstream(self.credentials, self._ca_bundle)
            return self._upstream

    def problem(self, message: str) -> None:
        with self._lock:
            if message not in self.problems:
                self.problems.append(message)

    # ---------------------------------------------------------------- pages

    def page(self, key: str, project: str) -> list[IndexFile] | None:
        """The project's files through the upstreams `key` names; None: no index knows it."""
        project = normalize(project)
        if self.offline:
            files = self.store.page(key, project)
            if files is None:
                self.problem(
                    f"--offline: the wheelhouse has no index page of {project}; build once "
                    "online (or gpuenv cache import FILE) first"
                )
            return files
        urls = self.store.index(key)
        if urls is None:
            return None
        for base in urls:
            url = f"{base}{project}/"
            try:
                with self.upstream.open(
                    url, f"{JSON_TYPE}, {HTML_TYPE};q=0.2, text/html;q=0.1"
                ) as reply:
                    body = reply.read()
                    ctype = reply.headers.get("Content-Type", "text/html")
                    final = reply.geturl()
            except urllib.error.HTTPError as exc:
                if exc.code in (404, 410):
                    continue  # not on this index: ask the next
                if exc.code in (401, 403):
                    self.problem(self._refused(base, exc.code))
                else:
                    self.problem(f"the index {base} answered HTTP {exc.code} for {project}")
                raise _Upstream(exc.code) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                self.problem(f"cannot reach the index {base} (for {project}): {reason}")
                raise _Upstream(502) from None
            files = parse_page(body, ctype, final)
            self.store.save_page(key, project, files, base)
            return files
        return None

    def _refused(self, base: str, code: int) -> str:
        credential = self.credentials.for_url(base)
        if credential is None:
            return (
                f"the index {base} requires credentials (HTTP {code}): put them in ~/.netrc "
                "(machine HOST login USER password PASSWORD) or set GPUENV_INDEX_USERNAME and "
                "GPUENV_INDEX_PASSWORD"
            )
        return (
            f"the index {base} refused the credentials of user {credential.username!r} from "
            f"{credential.source} (HTTP {code}); correct them"
        )

    # ---------------------------------------------------------------- files

    def file(self, key: str, project: str, sha: str, filename: str) -> Path | None:
        """The stored, verified file (fetched first when online and missing)."""
        metadata = filename.endswith(".metadata")
        name = filename.removesuffix(".metadata") if metadata else filename
        files = self.store.page(key, project) or []
        entry = next((f for f in files if f.sha256 == sha and f.filename == name), None)
        if entry is None:
            return None
        want = entry.metadata_sha256 if metadata else sha
        if want is None:
            return None
        path = self.store.verified(want)
        if path is not None:
            return path
        if self.offline:
            self.problem(
                f"--offline: the wheelhouse lacks {filename} ({project}); build once online "
                "(or gpuenv cache import FILE) first"
            )
            return None
        url = entry.url + (".metadata" if metadata else "")
        lock_path = self.store.root / "files" / ".locks" / want
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        # One download per file, even across processes: the others wait, then find it.
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.store.verified(want)
            if path is not None:
                return path
            try:
                with self.upstream.open(url) as reply:
                    self.store.put(want, reply, url)
            except HashMismatch as exc:
                self.problem(exc.message)
                raise _Upstream(502) from None
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):
                    self.problem(self._refused(url, exc.code))
                else:
                    self.problem(f"{url}: HTTP {exc.code}")
                raise _Upstream(502) from None
            except (urllib.error.URLError, OSError) as exc:
                self.problem(f"cannot download {url}: {getattr(exc, 'reason', exc)}")
                raise _Upstream(502) from None
            with self._lock:
                self.fetched += 1
        return self.store.verified(want)

    def uv_executable(self, key: str, version: str, machine: str) -> bytes | None:
        """uv's executable of that release for the build's machine, out of its wheel from
        the indexes `key` names (stored and checked like every file): an install step
        downloads it in a second, where making a venv to pip-install uv took ~5 s."""
        wheel = uv_wheel(self.page(key, "uv") or [], version, machine)
        if wheel is None:
            if self.offline:
                self.problem(f"--offline: the wheelhouse lacks uv {version} for {machine}")
            return None
        stored = self.file(key, "uv", wheel.sha256, wheel.filename)
        if stored is None:
            return None
        try:
            with zipfile.ZipFile(stored) as whl:
                return whl.read(f"uv-{version}.data/scripts/uv")
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            self.problem(f"{wheel.filename}: no uv executable in it ({exc})")
            raise _Upstream(502) from None

    # ---------------------------------------------------------------- HTTP

    def answer(self, conn: socket.socket) -> None:
        """One client connection (a thread of its own; keep-alive)."""
        try:
            _Handler(conn, ("127.0.0.1", 0), self)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()


class _Upstream(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: Proxy  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the build's own log says what was installed

    head_only = False

    def do_HEAD(self) -> None:
        # uv asks HEAD of a wheel whose index gives no metadata file, to see whether it can
        # read the metadata with range requests; the answer (no Accept-Ranges) says it
        # cannot, so it downloads the wheel, which the wheelhouse keeps anyway.
        self.head_only = True
        try:
            self._serve()
        finally:
            self.head_only = False  # the connection's next request may be a GET

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        proxy = self.server
        path = self.path.split("?", 1)[0]
        if path == PROBE:
            self._send(200, "text/plain", proxy.identity)
            return
        try:
            m = _PAGE.fullmatch(path)
            if m:
                key, project = m.groups()
                files = proxy.page(key, project)
                if files is None:
                    self._send(404, "text/plain", f"{project}: not on any index\n".encode())
                    return
                as_json = JSON_TYPE in (self.headers.get("Accept") or "")
                body = render_page(key, normalize(project), files, as_json)
                self._send(200, JSON_TYPE if as_json else "text/html", body)
                return
            m = _FILE.fullmatch(path)
            if m:
                stored = proxy.file(*m.groups())
                if stored is None:
                    self._send(404, "text/plain", f"{m.group(4)}: not in the wheelhouse\n".encode())
                    return
                self._send_file(stored)
                if not self.head_only:
                    with proxy._lock:
                        proxy.served += 1
                return
            m = _UV.fullmatch(path)
            if m:
                executable = proxy.uv_executable(*m.groups())
                if executable is None:
                    self._send(404, "text/plain", f"uv {m.group(2)}: not on any index\n".encode())
                    return
                self._send(200, "application/octet-stream", executable)
                return
        except _Upstream:
            # 502, never the upstream's 401: pip would then prompt for a password, and the
            # build's installers have no credentials to give (gpuenv's error says why).
            self._send(502, "text/plain", b"upstream index failed; gpuenv's build error says why\n")
            return
        except GpuenvError as exc:
            proxy.problem(exc.message)
            self._send(502, "text/plain", b"upstream index failed\n")
            return
        self._send(404, "text/plain", b"not found\n")

    def _send(self, code: int, ctype: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not self.head_only:
            self.wfile.write(body)

    def _send_file(self, path: Path) -> None:
        """The file, or the one byte range asked for: uv reads a wheel's metadata from its
        end with range requests instead of reading the whole wheel."""
        with path.open("rb") as fh:
            size = path.stat().st_size
            span = byte_range(self.headers.get("Range"), size)
            start, count = span if span else (0, size)
            self.send_response(206 if span else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(count))
            if span:
                self.send_header("Content-Range", f"bytes {start}-{start + count - 1}/{size}")
            self.end_headers()
            if not self.head_only and count:
                self.wfile.flush()
                self.connection.sendfile(fh, start, count)


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, count) of a single `Range: bytes=...` within size; None: the whole file (no
    header, several ranges, or one that does not fit, which a full answer serves too)."""
    m = re.fullmatch(r"bytes=(\d*)-(\d*)", (header or "").strip())
    if not m or not (m.group(1) or m.group(2)) or size == 0:
        return None
    if not m.group(1):  # the last N bytes
        count = min(int(m.group(2)), size)
        return (size - count, count) if count else None
    start = int(m.group(1))
    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    return (start, end - start + 1) if start <= end else None


class WheelhouseServer(SharedServer):
    """The proxy on the fixed wheelhouse port while the context is open."""

    def __init__(self, proxy: Proxy, say: Any = None, port: int = contract.WHEELHOUSE_PORT) -> None:
        self.proxy = proxy
        super().__init__(
            port, proxy.identity, proxy.answer, probe=PROBE, what="wheelhouse", say=say
        )
