"""Host-side fetching into the wheelhouse: what a build's install steps will install.

Before a cell is built, its resolution (the lock's entry, or `uv pip compile` now for an
unlocked cell) is fetched here: for each requirement, the project page of the upstream
indexes `<key>` stands for (in uv's order, the first that knows the project answers), then
the one wheel the target installs among the files with a locked hash
(wheelhouse.pick_wheel). A file is fetched once, checked against its sha256 on the way in,
stored under it, and checked again before a build takes it. Upstream is reached from this
process only, through the environment's proxy and the configured CA bundle, with the
private indexes' credentials (gpuenv/store/credentials.py): the engine never sees any of them,
and nothing listens for it (gpuenv/building/sendable.py sends the wheels in the build context).

Offline (`gpuenv build --offline`) it never goes upstream: pages and files come from the
wheelhouse alone and a miss is recorded, naming the distribution.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ssl
import tempfile
import threading
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urljoin, urlsplit

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.credentials import Credentials
from gpuenv.store.wheelhouse import (
    HTML_TYPE,
    JSON_TYPE,
    HashMismatch,
    IndexFile,
    Requirement,
    Store,
    Wanted,
    locked_requirements,
    normalize,
    parse_page,
    pick_wheel,
    uv_wheel,
    wheel_rank,
)

TIMEOUT = 120  # seconds per upstream request
PARALLEL = 8  # downloads at once (uv's default is 50; 8 fills a link without a storm)

T = TypeVar("T")
R = TypeVar("R")


class Upstream:
    """Fetches from the upstream indexes: proxies from the environment, the CA bundle, and
    the credentials of the host asked (never carried over a redirect).

    Connections are kept and reused (urllib3's pools, a pool per host and proxy, as many
    connections as downloads run at once): a build asks for some 35 pages and files of one
    host, and a connection each cost a DNS lookup and a TLS handshake each (a burst of DNS
    lookups was seen to stall 5 s on a resolver that limits them)."""

    def __init__(self, credentials: Credentials, ca_bundle: Path | None) -> None:
        import urllib3

        self.credentials = credentials
        self.stopped = threading.Event()  # by stop(): every open and read is Stopped
        self._reading: set[Any] = set()  # the urllib3 replies being read, for stop()
        context = ssl.create_default_context()
        if ca_bundle is not None:
            context.load_verify_locations(cafile=str(ca_bundle))
        self._context = context
        self._proxies = urllib.request.getproxies()  # *_proxy, as urllib reads them
        self._direct = urllib3.PoolManager(maxsize=PARALLEL, ssl_context=context)
        self._via: dict[str, urllib3.ProxyManager] = {}
        self._lock = threading.Lock()

    def stop(self) -> None:
        """gpuenv is ending: no request starts, and each reply being read ends now. Its
        socket is shut down (urllib3's HTTPResponse.shutdown), so that a read waiting on a
        stalled link returns too, not after TIMEOUT."""
        with self._lock:
            self.stopped.set()
            reading = list(self._reading)
        for reply in reading:
            # A reply read to its end may have given its connection back already (urllib3
            # then refuses, RuntimeError): nothing of it is left to end.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                reply.shutdown()

    def _done(self, reply: Any) -> None:
        with self._lock:
            self._reading.discard(reply)

    def _manager(self, url: str) -> Any:
        """The pools `url` is reached through: its scheme's proxy, unless no_proxy names
        its host (urllib's rules), else directly."""
        import urllib3

        parts = urlsplit(url)
        proxy = self._proxies.get(parts.scheme)
        if not proxy or urllib.request.proxy_bypass(parts.netloc):
            return self._direct
        with self._lock:
            if proxy not in self._via:
                where = urlsplit(proxy)
                auth = None
                if where.username is not None:
                    user = f"{unquote(where.username)}:{unquote(where.password or '')}"
                    auth = urllib3.make_headers(proxy_basic_auth=user)
                self._via[proxy] = urllib3.ProxyManager(
                    proxy, proxy_headers=auth, maxsize=PARALLEL, ssl_context=self._context
                )
            return self._via[proxy]

    def open(self, url: str, accept: str | None = None) -> Reply:
        """The reply to GET `url`, redirects followed (http and https only); an HTTP error
        is urllib.error.HTTPError, a connection's failure urllib.error.URLError."""
        import urllib3

        headers = {"User-Agent": "gpuenv-wheelhouse"}
        if accept:  # an index page: fresh from the origin, as pip asks for one. A CDN's
            # copy can be minutes older than what the resolver just saw: a release made
            # meanwhile would be missing, and the lock's hash of it "not offered".
            headers["Accept"] = accept
            headers["Cache-Control"] = "max-age=0"
        credential = self.credentials.for_url(url)
        if credential is not None:
            headers["Authorization"] = credential.header()  # this URL's alone
        for _ in range(MAX_REDIRECTS + 1):
            if self.stopped.is_set():
                raise Stopped()
            try:
                reply = self._manager(url).request(
                    "GET", url, headers=headers, redirect=False, retries=_retry(),
                    preload_content=False, timeout=TIMEOUT,
                )  # fmt: skip
            except urllib3.exceptions.HTTPError as exc:
                raise urllib.error.URLError(_reason(exc)) from None
            location = reply.headers.get("Location")
            if reply.status in (301, 302, 303, 307, 308) and location:
                reply.drain_conn()
                reply.release_conn()
                url = urljoin(url, location)
                if urlsplit(url).scheme not in ("http", "https"):
                    raise urllib.error.HTTPError(url, reply.status, "a redirect to another "
                                                 "scheme", reply.headers, None)  # fmt: skip
                headers.pop("Authorization", None)  # never carried over a redirect
                continue
            if reply.status >= 400:
                reply.drain_conn()
                reply.release_conn()
                raise urllib.error.HTTPError(url, reply.status, reply.reason or "",
                                             reply.headers, None)  # fmt: skip
            with self._lock:
                if self.stopped.is_set():
                    reply.close()
                    raise Stopped()
                self._reading.add(reply)
            return Reply(reply, url, self)
        raise urllib.error.HTTPError(url, 310, "too many redirects", {}, None)  # type: ignore[arg-type]


MAX_REDIRECTS = 10  # urllib's own limit


def _retry() -> Any:
    """Once more on a fresh connection when a kept one turns out closed by the server (a
    read error before any answer), never after a failed connect or a redirect."""
    import urllib3

    return urllib3.Retry(total=1, connect=0, read=1, other=0, redirect=False)


def _reason(exc: BaseException) -> str:
    """What failed, without urllib3's wrapping: the innermost error's last part (`[Errno
    111] Connection refused`), said to be the proxy's when it was."""
    import urllib3

    proxy = False
    while True:
        proxy = proxy or isinstance(exc, urllib3.exceptions.ProxyError)
        inner = getattr(exc, "reason", None)
        nested = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        if isinstance(inner, BaseException):
            exc = inner
        elif nested:
            exc = nested[-1]
        else:
            break
    text = str(exc).rpartition("): ")[2] or str(exc)
    return f"the proxy: {text}" if proxy else text


class Stopped(BaseException):
    """gpuenv is ending (Ctrl-C, SIGTERM): the download gives up. A BaseException, as the
    KeyboardInterrupt it carries into the fetching threads is: no `except Exception` on the
    way takes it for a failed download and reports it."""


class Reply:
    """A reply being read (a context manager): its bytes, headers and final URL. Its
    connection goes back to the pool once it has been read to the end, and is closed
    otherwise; a failure while reading is an OSError, as urllib's would be. Once its
    upstream is stopped, a read is Stopped, whatever it got."""

    def __init__(self, reply: Any, url: str, upstream: Upstream) -> None:
        self._reply, self._url, self._upstream = reply, url, upstream
        self.headers = reply.headers
        self.status = reply.status

    def read(self, amount: int | None = None) -> bytes:
        import urllib3

        stopped = self._upstream.stopped
        if stopped.is_set():
            raise Stopped()
        try:
            data = bytes(self._reply.read(amount))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if stopped.is_set():  # its socket was shut down under it
                raise Stopped() from None
            raise OSError(f"reading {self._url}: {_reason(exc)}") from None
        if stopped.is_set():  # what a shut-down socket gave: an end that is none
            raise Stopped()
        return data

    def geturl(self) -> str:
        return self._url

    def __enter__(self) -> Reply:
        return self

    def __exit__(self, *exc: object) -> None:
        self._upstream._done(self._reply)
        if exc[0] is None and self._reply.read(1) == b"":  # read to the end: reusable
            self._reply.release_conn()
        else:
            self._reply.close()
            self._reply.release_conn()


class Fetcher:
    """One gpuenv process's way to the upstream indexes and the wheelhouse."""

    def __init__(
        self,
        store: Store,
        *,
        credentials: Credentials,
        ca_bundle: Path | None = None,
        offline: bool = False,
        upstream: Upstream | None = None,
        project_dir: Path | None = None,
        matrix_name: str | None = None,
    ) -> None:
        self.store = store
        # Where a lock's local files (`name @ file:REL`) are read from (resolved), and the
        # matrix file there: it and its locks are no part of the project's own tree.
        self.project_dir = project_dir
        self.matrix_name = matrix_name
        self.offline = offline
        self.credentials = credentials
        self._ca_bundle = ca_bundle
        self._upstream = upstream
        self.problems: list[str] = []  # why a page or file could not be given: for the error
        self.fetched = 0  # files downloaded upstream
        self._lock = threading.Lock()
        self._uv: dict[tuple[str, str], Future[Path]] = {}  # uv_soon's, by indexes and machine
        self._uv_lock = threading.Lock()
        self._stopped = threading.Event()

    @property
    def ca_bundle(self) -> Path | None:
        return self._ca_bundle

    @property
    def upstream(self) -> Upstream:
        """Made on first use: loading the CA bundle costs tens of milliseconds, and an
        offline build or one whose cells are all cached never asks upstream."""
        with self._lock:
            if self._upstream is None:
                self._upstream = Upstream(self.credentials, self._ca_bundle)
                if self._stopped.is_set():
                    self._upstream.stop()
            return self._upstream

    def stop(self) -> None:
        """gpuenv is ending (Ctrl-C, SIGTERM): each download in flight ends now, and no
        other starts (both are Stopped). Without it the end waited for every queued one:
        the interpreter runs a thread pool's queued work before it exits (31 s of wheels on
        CI's link, while `build -j`'s threads went on to build)."""
        with self._lock:
            self._stopped.set()
            upstream = self._upstream
        if upstream is not None:
            upstream.stop()

    def _parallel(self, one: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`one` of each item, PARALLEL at once, in order. Interrupted here (the main
        thread's Ctrl-C or SIGTERM), the fetcher stops; stopped, none of the queued items
        starts."""

        def unless_stopped(item: T) -> R:
            if self._stopped.is_set():
                raise Stopped()
            return one(item)

        pool = ThreadPoolExecutor(PARALLEL)
        try:
            return list(pool.map(unless_stopped, items))
        except KeyboardInterrupt:
            self.stop()
            raise
        except _Upstream:
            raise GpuenvError(self.problems[0] if self.problems else "upstream failed") from None
        finally:
            pool.shutdown(cancel_futures=self._stopped.is_set())

    def problem(self, message: str) -> None:
        with self._lock:
            if message not in self.problems:
                self.problems.append(message)

    # ---------------------------------------------------------------- pages

    def page(self, key: str, project: str, wanted: Wanted | None = None) -> list[IndexFile] | None:
        """The project's files through the upstreams `key` names (those `wanted` accepts,
        when given); None: no index knows it."""
        answered = self.page_from(key, project, wanted)
        return None if answered is None else answered[0]

    def page_from(
        self, key: str, project: str, wanted: Wanted | None = None
    ) -> tuple[list[IndexFile], str] | None:
        """The project's files (those `wanted` accepts, when given: only they are read out
        of the page and stored) and the upstream index that answered for it (the first of
        `key`'s that knows it); None: no index knows it."""
        project = normalize(project)
        if self.offline:
            answered = self.store.page_from(key, project)
            if answered is None:
                self.problem(
                    f"--offline: the wheelhouse has no index page of {project}; build once "
                    "online (or gpuenv cache import FILE) first"
                )
            return answered
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
            files = parse_page(body, ctype, final, wanted)
            self.store.save_page(key, project, files, base)
            return files, base
        return None

    def _refused(self, base: str, code: int) -> str:
        return refused(base, code, self.credentials)

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

    def url_file(self, url: str, sha: str | None) -> Path:
        """A direct reference's archive (`name @ URL`), stored under its sha256: checked
        against `sha` when the lock gives it, else hashed as it comes (the lock then holds
        that hash). Credentials go to it only where they are bound to its exact origin."""
        if sha is not None:
            path = self.store.verified(sha)
            if path is not None:
                return path
        if url.startswith("file:"):
            return self._local_file(url, sha)
        if url.startswith("git+"):
            return self._checkout(url, sha)
        if self.offline:
            raise GpuenvError(f"--offline: the wheelhouse lacks {url}; build once online first")

        self.store.make_private()
        try:
            with tempfile.TemporaryFile(dir=self.store.root) as tmp:
                digest = hashlib.sha256()
                with self.upstream.open(url) as reply:
                    while chunk := reply.read(1 << 20):
                        digest.update(chunk)
                        tmp.write(chunk)
                tmp.seek(0)
                got = digest.hexdigest()
                if sha is not None and got != sha:
                    raise HashMismatch(
                        f"{url}: its sha256 is {got}, the lock says {sha}; not stored (if the "
                        "archive changed, re-lock: gpuenv lock)"
                    )
                path = self.store.put(got, tmp, url)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise GpuenvError(self._refused(url, exc.code)) from None
            raise GpuenvError(f"{url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise GpuenvError(f"cannot download {url}: {getattr(exc, 'reason', exc)}") from None
        with self._lock:
            self.fetched += 1
        return path

    def _local_file(self, url: str, sha: str | None) -> Path:
        """A local file of the project (`file:REL`, relative to its directory; a directory:
        its tree's tar, gpuenv/matrix/localtree.py) copied into the wheelhouse under its
        sha256, checked against the lock's as a download is; read again inside the project
        only (a symlink swapped in since the lock is refused)."""
        from gpuenv.matrix.files import open_regular
        from gpuenv.matrix.localtree import TreeProblem, project_excludes, write_tar

        root = self.project_dir
        if root is None:
            raise GpuenvError(f"{url}: a project's local file, and no project to read it from")
        path = (root / url.removeprefix("file:")).resolve()
        if not path.is_relative_to(root):
            raise GpuenvError(f"{url}: now outside the project directory {root}; re-lock")
        self.store.make_private()
        try:
            with tempfile.TemporaryFile(dir=self.store.root) as tmp:
                if path.is_dir():  # a project directory: its tree's tar, by its digest
                    matrix = self.matrix_name if path == root else None
                    got = write_tar(path, root, tmp, project_excludes(matrix) if matrix else ())
                else:
                    digest = hashlib.sha256()
                    with open_regular(path) as source:
                        while chunk := source.read(1 << 20):
                            digest.update(chunk)
                            tmp.write(chunk)
                    got = digest.hexdigest()
                tmp.seek(0)
                if sha is not None and got != sha:
                    raise HashMismatch(
                        f"{path}: its sha256 is {got}, the lock says {sha}; not stored (the "
                        "file changed since the lock: gpuenv lock)"
                    )
                return self.store.put(got, tmp, str(path))
        except TreeProblem as exc:
            raise GpuenvError(f"{path}: {exc}") from None
        except OSError as exc:
            raise GpuenvError(f"cannot read {path}: {exc.strerror or exc}") from None

    def _checkout(self, url: str, sha: str | None) -> Path:
        """A VCS reference's commit (`git+URL@COMMIT`, as the lock names it), exported
        with the user's git (gpuenv/matrix/vcs.py) and stored as its tree's tar, checked
        against the lock's content digest."""
        from gpuenv.matrix import vcs
        from gpuenv.matrix.localtree import TreeProblem, write_tar

        try:
            _, tree = vcs.export(vcs.parse(url), offline=self.offline)
            self.store.make_private()
            with tempfile.TemporaryFile(dir=self.store.root) as tmp:
                got = write_tar(tree, tree, tmp)
                tmp.seek(0)
                if sha is not None and got != sha:
                    raise HashMismatch(
                        f"{url}: its tree's digest is {got}, the lock says {sha}; not stored "
                        f"(remove {tree} if it was edited, or re-lock: gpuenv lock)"
                    )
                return self.store.put(got, tmp, url)
        except (vcs.VcsProblem, TreeProblem) as exc:
            raise GpuenvError(str(exc)) from None
        except OSError as exc:
            raise GpuenvError(f"cannot read {url}'s tree: {exc.strerror or exc}") from None

    def uv_file(self, key: str, version: str, machine: str) -> Path:
        """uv's executable for `machine`, the installer every build's steps run (and the
        program that enforces --require-hashes there): taken out of uv's wheel from the
        indexes `key` names (stored and checked like every file) and kept in the store under
        its own sha256, the one the wheel's RECORD gives. Each use checks the kept file
        against that hash (Store.verified: hashed again whenever the file changed), so an
        installer planted in the store, or brought by a restored cache, is never sent."""
        try:
            release = f"uv-{version}-"  # its files alone: uv's page lists every release's
            files = self.page(key, "uv", lambda name, _: name.startswith(release)) or []
            wheel = uv_wheel(files, version, machine)
            stored = None if wheel is None else self.file(key, "uv", wheel.sha256, wheel.filename)
        except _Upstream:
            wheel = stored = None
        if wheel is None or stored is None:
            if self.offline and wheel is None:
                self.problem(f"--offline: the wheelhouse lacks uv {version} for {machine}")
            raise GpuenvError(
                self.problems[-1]
                if self.problems
                else f"uv {version} for {machine} is not on the indexes of this build"
            )
        member = f"uv-{version}.data/scripts/uv"
        try:
            with zipfile.ZipFile(stored) as whl:
                sha = recorded_sha256(whl, member)
                kept = self.store.verified(sha) if sha else None
                if kept is not None:
                    if not kept.stat().st_mode & 0o100:  # `cache import` stores files 0600
                        kept.chmod(0o755)
                    return kept
                executable = whl.read(member)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise GpuenvError(f"{wheel.filename}: no uv executable in it ({exc})") from None
        if sha is None or hashlib.sha256(executable).hexdigest() != sha:
            raise GpuenvError(
                f"{wheel.filename}: its RECORD gives no sha256 of {member}, or not the one of "
                "the file; not used"
            )
        return self.store.put(sha, io.BytesIO(executable), member, mode=0o755)

    def uv_offered(self, key: str, version: str, machine: str) -> tuple[IndexFile, str] | None:
        """uv's wheel of `version` for `machine` as the indexes `key` names offer it (read
        from its page, nothing downloaded), and the upstream that offers it; None when none
        does or the page cannot be read (uv is then sent: `uv_file`)."""
        release = f"uv-{version}-"
        try:
            answered = self.page_from(key, "uv", lambda name, _: name.startswith(release))
        except (_Upstream, GpuenvError):
            return None
        wheel = None if answered is None else uv_wheel(answered[0], version, machine)
        return None if wheel is None or answered is None else (wheel, answered[1])

    def uv_soon(self, key: str, version: str, machine: str) -> Future[Path]:
        """`uv_file` fetched once per indexes and machine, in the background, so that a build
        takes uv (a 17 MB wheel taken apart: about a second on a cold wheelhouse) while its
        resolution is made and its pages are read, not after (its error, if any, comes
        with the result)."""
        with self._uv_lock:
            if (key, machine) not in self._uv:
                fetched: Future[Path] = Future()

                def fetch() -> None:
                    try:
                        fetched.set_result(self.uv_file(key, version, machine))
                    except BaseException as exc:  # the caller's, with the result
                        fetched.set_exception(exc)

                # A daemon thread: Ctrl-C ends the process now, not after the download.
                threading.Thread(target=fetch, name="gpuenv-uv", daemon=True).start()
                self._uv[key, machine] = fetched
            return self._uv[key, machine]

    def pick(
        self, key: str, req: Requirement, python: str, machine: str, glibc: tuple[int, int]
    ) -> tuple[IndexFile, str]:
        """The one wheel a locked requirement installs on the target, and the upstream index
        that offers it, from the project's page (nothing downloaded). A requirement with no
        wheel for the target is an error naming it. A direct reference's file is its
        archive (from its URL, under the lock's hash; "" for the upstream)."""
        if req.url:
            from gpuenv.store.wheelhouse import archive_name

            if len(req.hashes) != 1:
                raise GpuenvError(f"{req.name} @ {req.url}: the lock gives no one hash of it; "
                                  "re-lock: gpuenv lock")  # fmt: skip
            filename = archive_name(req.url)
            if filename.endswith(".whl") and wheel_rank(filename, python, machine, glibc) is None:
                raise GpuenvError(
                    f"{req.name} @ {req.url}: that wheel does not install on CPython {python} "
                    f"on linux/{machine} (glibc {glibc[0]}.{glibc[1]}); name the one that does, "
                    "or its source distribution"
                )
            return IndexFile(filename, req.url, next(iter(req.hashes))), ""

        def locked(_: str, sha: str) -> bool:  # the locked release's files alone
            return sha in req.hashes

        answered = self.page_from(key, req.name, locked)
        if answered is None:
            raise GpuenvError(
                self.problems[-1]
                if self.problems
                else f"{req.name}=={req.version}: not on any index of this build"
            )
        files, upstream = answered
        wheel = pick_wheel(files, req, python, machine, glibc)
        if wheel is None and not any(f.sha256 in req.hashes for f in files):
            # A release minutes old may be missing from one CDN node's copy of the page
            # while the resolver saw it on another's: ask once more before refusing.
            files, upstream = self.page_from(key, req.name, locked) or answered
            wheel = pick_wheel(files, req, python, machine, glibc)
        if wheel is None and not any(f.sha256 in req.hashes for f in files):
            raise GpuenvError(
                f"hash mismatch for {req.name}=={req.version}: the index offers no file "
                "with a hash the resolution lists; if the lock is right, the index serves "
                "other files (else re-lock: gpuenv lock)"
            )
        if wheel is None:
            # A source distribution the lock holds: built into a wheel on the engine
            # (gpuenv/building/sdists.py), never here.
            source = source_of(files, req)
            if source is not None:
                return source, upstream
            raise GpuenvError(
                f"{req.name}=={req.version} has no wheel for CPython {python} on "
                f"linux/{machine} (glibc {glibc[0]}.{glibc[1]}) and no source distribution "
                "among its locked hashes; pin a release that ships one (or re-lock: gpuenv lock)"
            )
        return wheel, upstream

    def wheels(
        self, key: str, text: str, python: str, machine: str, glibc: tuple[int, int]
    ) -> list[tuple[str, Path]]:
        """(filename, stored path) of the wheel each requirement of a resolution installs
        on the target: fetched in parallel, each checked. A requirement with no wheel for
        the target, or one that cannot be fetched, is an error naming it."""
        picked = self.picks(key, text, python, machine, glibc)
        return self.fetch_all(key, [(r, wheel) for r, wheel, _ in picked])

    def picks(
        self, key: str, text: str, python: str, machine: str, glibc: tuple[int, int]
    ) -> list[tuple[Requirement, IndexFile, str]]:
        """Each requirement of a resolution with its wheel for the target and the upstream
        that offers it (`pick`), the pages asked in parallel."""

        def one(req: Requirement) -> tuple[Requirement, IndexFile, str]:
            return (req, *self.pick(key, req, python, machine, glibc))

        return self._parallel(one, locked_requirements(text))

    def fetch_all(
        self, key: str, wanted: list[tuple[Requirement, IndexFile]]
    ) -> list[tuple[str, Path]]:
        """(filename, stored path) of each picked wheel: fetched in parallel, each checked."""

        def one(item: tuple[Requirement, IndexFile]) -> tuple[str, Path]:
            req, wheel = item
            if req.url:
                return wheel.filename, self.url_file(req.url, wheel.sha256)
            stored = self.file(key, req.name, wheel.sha256, wheel.filename)
            if stored is None:
                raise GpuenvError(
                    self.problems[-1] if self.problems else f"{wheel.filename}: not fetched"
                )
            return wheel.filename, stored

        return self._parallel(one, wanted)


def source_of(files: list[IndexFile], req: Requirement) -> IndexFile | None:
    """The source distribution (.tar.gz, then .zip) among a page's files whose sha256 the
    lock lists for the requirement."""
    sources = [f for f in files if f.sha256 in req.hashes
               and f.filename.endswith((".tar.gz", ".zip"))]  # fmt: skip
    return min(sources, key=lambda f: (not f.filename.endswith(".tar.gz"), f.filename),
               default=None)  # fmt: skip


def refused(base: str, code: int, credentials: Credentials) -> str:
    """Why an index answered 401/403, and the fix: whose credentials it refused, from where;
    or why none were sent to it."""
    credential = credentials.for_url(base)
    if credential is None:
        withheld = credentials.withheld(base)
        if withheld is not None:
            return f"the index {base} requires credentials (HTTP {code}): {withheld}"
        return (
            f"the index {base} requires credentials (HTTP {code}): put them in ~/.netrc "
            "(machine HOST[:PORT] login USER password PASSWORD) or set GPUENV_INDEX_USERNAME, "
            "GPUENV_INDEX_PASSWORD and GPUENV_INDEX_ORIGIN (its https://host[:port])"
        )
    return (
        f"the index {base} refused the credentials of user {credential.username!r} from "
        f"{credential.source} (HTTP {code}); correct them"
    )


def recorded_sha256(whl: zipfile.ZipFile, member: str) -> str | None:
    """The sha256 (hex) a wheel's RECORD lists for one of its files; None when it lists none.
    The wheel is checked against its index's hash, so this is as sure as the wheel."""
    import base64
    import csv

    record = next((n for n in whl.namelist() if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        return None
    for row in csv.reader(whl.read(record).decode("utf-8", "replace").splitlines()):
        if len(row) >= 2 and row[0] == member and row[1].startswith("sha256="):
            digest = row[1].removeprefix("sha256=")
            try:
                raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
            except ValueError:
                return None
            return raw.hex() if len(raw) == 32 else None
    return None


class _Upstream(Exception):
    """An upstream failure, already recorded in Fetcher.problems."""

    def __init__(self, code: int) -> None:
        self.code = code
