"""The wheelhouse: a host-side, content-addressed store of the distributions builds install.

Layout under the gpuenv cache directory (gpuenv/store/cache.py), `wheelhouse/`:

- `files/<aa>/<sha256>`: a distribution (or its PEP 658 metadata file), named by the sha256
  of its bytes; written atomically after the bytes were checked against the index's hash,
  checked again when a build takes it. Its access time is its last use (prune keeps recent
  ones); its modification time is fixed (FILE_MTIME), see there.
- `pages/<key>/<project>.json`: the files of a project the upstream indexes `<key>` names
  were last seen to offer, for the releases builds asked for (a build reads only the
  locked release's files of a page; each save adds them to those stored before): what an
  offline build resolves against.
- `indexes/<key>.json`: the upstream URLs a key stands for (never credentials).

The fetcher (gpuenv/store/fetch.py) fills it host side; builds take their wheels from it
(gpuenv/building/sendable.py). This module is the store and the pure parts around it: parsing index
pages (PEP 503 HTML, PEP 691 JSON), hash checks, which wheel of a locked requirement a
target installs, what prune drops, and the export/import tarball.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urldefrag, urljoin

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine

PYPI = "https://pypi.org/simple/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
HTML_TYPE = "application/vnd.pypi.simple.v1+html"
# Every stored file's modification time. uv records a local wheel's mtime in the installed
# distribution (`*.dist-info/uv_cache.json`), so a wheel's download time would otherwise
# reach the layer and make two builds of one lock differ. 1980-01-01, the zip epoch.
FILE_MTIME = 315532800
# The stamps (inode, size, ctime) of stored files as last hashed, at the store's top (not
# exported: another machine's inodes mean nothing). A file's last use is touched at most
# once in USE_EVERY seconds (a touch changes its ctime: it is hashed once more after).
VERIFIED = "verified.json"
USE_EVERY = 6 * 3600
RACY_NS = 2_000_000_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY = re.compile(r"[0-9a-f]{16}")


# ------------------------------------------------------------------------------ indexes


def upstreams(index_url: str | None, extra_index_urls: Iterable[str] = ()) -> tuple[str, ...]:
    """The upstream indexes in the order gpuenv asks them, as uv does: the extra indexes
    first, then the index (PyPI by default); the first that knows a project answers for it
    (no merging across indexes: a public name cannot shadow a private package)."""
    urls = [*extra_index_urls, index_url or PYPI]
    return tuple(u if u.endswith("/") else u + "/" for u in dict.fromkeys(urls))


def index_key(urls: Iterable[str]) -> str:
    """The short name of a set of upstream indexes, in the RUN line's local index URL: a
    change of upstream changes the line (and the spec hash), and nothing else about the
    upstream (its host, never a credential) reaches the image."""
    return hashlib.sha256("\n".join(urls).encode()).hexdigest()[:16]


def normalize(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------ pages


@dataclass(frozen=True)
class IndexFile:
    """One distribution an index offers."""

    filename: str
    url: str  # upstream, absolute, without fragment
    sha256: str
    requires_python: str | None = None
    yanked: bool | str = False
    metadata_sha256: str | None = None  # PEP 658/714: the .metadata file's hash
    upload_time: str | None = None


# Which of a page's files to read, by (file name, sha256): a build needs only the files of
# its locked release (grpcio's page lists 11,282 files of every release, and making each one
# an IndexFile, its URL joined, is most of a cold build's time before the engine).
Wanted = Callable[[str, str], bool]


def parse_page(
    body: bytes, content_type: str, page_url: str, wanted: Wanted | None = None
) -> list[IndexFile]:
    """An upstream project page (PEP 691 JSON or PEP 503 HTML) as files, those `wanted`
    accepts when given. Files the index gives no sha256 for are left out: the wheelhouse
    cannot check them."""
    if content_type.split(";")[0].strip() == JSON_TYPE:
        try:
            doc = json.loads(body)
        except ValueError:
            raise GpuenvError(f"{page_url}: the index sent a page that is not JSON") from None
        return _from_json(doc, page_url, wanted)
    parser = _Links()
    parser.feed(body.decode("utf-8", "replace"))
    found = (_from_link(attrs, page_url) for attrs in parser.links)
    return [f for f in found if f and (wanted is None or wanted(f.filename, f.sha256))]


def _from_json(doc: Any, page_url: str, wanted: Wanted | None = None) -> list[IndexFile]:
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise GpuenvError(f"{page_url}: the index's JSON page has no file list")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str):
            continue
        hashes = f.get("hashes") if isinstance(f.get("hashes"), dict) else {}
        sha = str(hashes.get("sha256", "")).lower()
        if wanted is not None and not wanted(f["filename"], sha):
            continue
        if not _SHA256.fullmatch(sha) or not _safe_filename(f["filename"]):
            continue
        meta = f.get("core-metadata", f.get("dist-info-metadata"))
        meta_sha = None
        if isinstance(meta, dict) and _SHA256.fullmatch(str(meta.get("sha256", "")).lower()):
            meta_sha = str(meta["sha256"]).lower()
        yanked = f.get("yanked", False)
        out.append(
            IndexFile(
                filename=f["filename"],
                url=urldefrag(urljoin(page_url, str(f.get("url", ""))))[0],
                sha256=sha,
                requires_python=f.get("requires-python") or None,
                yanked=yanked if isinstance(yanked, bool | str) else bool(yanked),
                metadata_sha256=meta_sha,
                upload_time=f.get("upload-time") if isinstance(f.get("upload-time"), str) else None,
            )
        )
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links.append(dict(attrs))


def _from_link(attrs: dict[str, str | None], page_url: str) -> IndexFile | None:
    href = attrs.get("href")
    if not href:
        return None
    url, fragment = urldefrag(urljoin(page_url, href))
    name, _, value = fragment.partition("=")
    filename = url.rstrip("/").rsplit("/", 1)[-1]
    if name != "sha256" or not _SHA256.fullmatch(value.lower()) or not _safe_filename(filename):
        return None
    meta = attrs.get("data-core-metadata") or attrs.get("data-dist-info-metadata") or ""
    meta_name, _, meta_value = meta.partition("=")
    meta_sha = (
        meta_value.lower()
        if meta_name == "sha256" and _SHA256.fullmatch(meta_value.lower())
        else None
    )
    yanked: bool | str = False
    if "data-yanked" in attrs:
        yanked = attrs["data-yanked"] or True
    return IndexFile(
        filename=filename,
        url=url,
        sha256=value.lower(),
        requires_python=attrs.get("data-requires-python") or None,
        yanked=yanked,
        metadata_sha256=meta_sha,
    )


def _safe_filename(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+!-]*", name)) and len(name) < 256


# ------------------------------------------------------------------------------ the store


class Readable(Protocol):
    """What a stored file is read from: a download, a temporary file."""

    def read(self, amount: int, /) -> bytes: ...


class HashMismatch(GpuenvError):
    pass


class Store:
    """The wheelhouse directory. Every write is a temporary file renamed into place, so
    concurrent builds (threads or processes) never see half a file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._checked: dict[str, tuple[int, int]] = {}  # sha256 -> (inode, size) verified
        # sha256 -> [inode, size, ctime_ns] of files an earlier process hashed (VERIFIED).
        self._stamps: dict[str, list[int]] | None = None
        self._stamps_lock = threading.Lock()

    @classmethod
    def default(cls) -> Store:
        """<cache>/wheelhouse; for a uid with no cache directory (no HOME), one under the
        temporary directory, per uid, so that builds still work (and share it). That name is
        predictable: it is used only when this uid owns it and no one else may enter it
        (another local user could otherwise make it first and feed builds their wheels)."""
        from gpuenv.store.cache import cache_dir

        root = cache_dir()
        if root is None:
            from gpuenv.store.private import own_directory

            where = "the temporary directory (no HOME; set XDG_CACHE_HOME)"
            root = own_directory(Path(tempfile.gettempdir()), f"gpuenv-{os.getuid()}", where)
        return cls(root / "wheelhouse")

    def make_private(self) -> None:
        """The store's directory, made 0700 before anything is written: which private
        packages a user installs (page names, hashes) is theirs alone, like the files."""
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            if self.root.stat().st_mode & 0o077:  # made by an older gpuenv, the umask's mode
                self.root.chmod(0o700)
        except OSError as exc:  # a read-only home, a file where the directory should be
            raise GpuenvError(
                f"cannot write gpuenv's wheel store {self.root}: {exc.strerror}; "
                "set XDG_CACHE_HOME to a writable directory"
            ) from None

    # files
    def path(self, sha: str) -> Path:
        assert _SHA256.fullmatch(sha), sha
        return self.root / "files" / sha[:2] / sha

    def has(self, sha: str) -> bool:
        return self.path(sha).is_file()

    def put(self, sha: str, stream: Readable, what: str, mode: int = 0o600) -> Path:
        """Store what `stream` gives as `sha`, checking it is: else HashMismatch, nothing
        stored. `mode`: 0o755 for uv's executable, which a build's steps run."""
        target = self.path(sha)
        self.make_private()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{sha[:12]}.")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha:
                raise HashMismatch(
                    f"{what}: the download's sha256 is {digest.hexdigest()}, the index said "
                    f"{sha}; not stored"
                )
            os.utime(tmp, (time.time(), FILE_MTIME))
            if mode != 0o600:
                os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def verified(self, sha: str) -> Path | None:
        """The stored file when its bytes still hash to `sha` (its use recorded); a file
        that does not (a damaged disk, an edit) is removed and None returned. Hashed once:
        uv asks a wheel several times in a process (a HEAD, byte ranges for its metadata,
        then the whole), and every build takes every wheel of its cells again (a TF GPU
        cell's are 3 GB: seconds of hashing per rebuild). A file whose inode, size and
        ctime are those recorded when it was last hashed (VERIFIED) is not hashed again:
        any write to it, or a replacement, changes its ctime, which only the kernel sets
        (as git trusts its index's stat data, with the same care for racy timestamps)."""
        path = self.path(sha)
        try:
            st = path.stat()
        except OSError:
            return None
        if self._checked.get(sha) == (st.st_ino, st.st_size):
            return path
        if time.time() - st.st_atime > USE_EVERY:  # the last use, for prune (in days)
            with contextlib.suppress(OSError):
                os.utime(path, (time.time(), FILE_MTIME))
                st = path.stat()
        stamp = [st.st_ino, st.st_size, st.st_ctime_ns]
        if self._stamp(sha) != stamp:
            try:
                with path.open("rb") as fh:
                    digest = hashlib.file_digest(fh, hashlib.sha256)
            except OSError:
                return None
            if digest.hexdigest() != sha:
                path.unlink(missing_ok=True)
                return None
            # A ctime this recent could be shared by a write still to come (the kernel's
            # clock advances in ticks): not trusted until it is older.
            if time.time_ns() - st.st_ctime_ns > RACY_NS:
                self._remember(sha, stamp)
        self._checked[sha] = (st.st_ino, st.st_size)
        return path

    def _stamp(self, sha: str) -> list[int] | None:
        with self._stamps_lock:
            if self._stamps is None:
                try:
                    data = json.loads((self.root / VERIFIED).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    data = {}
                self._stamps = data if isinstance(data, dict) else {}
            found = self._stamps.get(sha)
        return found if isinstance(found, list) else None

    def _remember(self, sha: str, stamp: list[int]) -> None:
        """Record a file's stamp (VERIFIED, written atomically; a write that fails, or one
        another process's overwrites, only means a hash next time)."""
        with self._stamps_lock:
            stamps = self._stamps if self._stamps is not None else {}
            stamps[sha] = stamp
            self._stamps = stamps
            with contextlib.suppress(OSError):
                _write_atomic(self.root / VERIFIED, json.dumps(stamps, sort_keys=True).encode())

    def entries(self) -> dict[str, tuple[int, float]]:
        """sha256 -> (size, last use) of every stored file."""
        out = {}
        for path in (self.root / "files").glob("??/*"):
            if _SHA256.fullmatch(path.name):
                try:
                    st = path.stat()
                except OSError:
                    continue
                out[path.name] = (st.st_size, st.st_atime)
        return out

    def remove(self, sha: str) -> None:
        self.path(sha).unlink(missing_ok=True)

    # pages and indexes
    def _page_path(self, key: str, project: str) -> Path:
        assert _KEY.fullmatch(key), key
        return self.root / "pages" / key / f"{normalize(project)}.json"

    def page(self, key: str, project: str) -> list[IndexFile] | None:
        answered = self.page_from(key, project)
        return None if answered is None else answered[0]

    def page_from(self, key: str, project: str) -> tuple[list[IndexFile], str] | None:
        """The stored page and the upstream that gave it."""
        try:
            doc = json.loads(self._page_path(key, project).read_text(encoding="utf-8"))
            return [IndexFile(**f) for f in doc["files"]], str(doc.get("upstream") or "")
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save_page(self, key: str, project: str, files: list[IndexFile], upstream: str) -> None:
        """Store what a page offered (`files`: perhaps only a release's), added to the files
        stored for the project before (same name and hash: the new entry wins), so that an
        offline build of an earlier lock still finds its release's. Under a lock per page:
        two builds saving one page both keep theirs (a fetch reads its entry back)."""
        self.make_private()
        path = self._page_path(key, project)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with path.with_name(f".{path.name}.lock").open("w") as lock:  # dot: not exported
            fcntl.flock(lock, fcntl.LOCK_EX)
            before = self.page_from(key, project)
            merged = {(f.filename, f.sha256): f for f in (before[0] if before else [])}
            merged.update({(f.filename, f.sha256): f for f in files})
            doc = {"project": normalize(project), "upstream": upstream,
                   "files": [asdict(f) for f in merged.values()]}  # fmt: skip
            _write_atomic(path, json.dumps(doc).encode())

    def save_index(self, key: str, urls: tuple[str, ...]) -> None:
        path = self.root / "indexes" / f"{key}.json"
        self.make_private()
        if not path.exists():
            _write_atomic(path, json.dumps({"upstreams": list(urls)}).encode())

    def index(self, key: str) -> tuple[str, ...] | None:
        """The upstream indexes `key` names; None when unknown, or when the entry does not
        hash to its own name (one a crafted import wrote would redirect every page fetch
        of that key to another host: issue 35, M2)."""
        if not _KEY.fullmatch(key):
            return None
        try:
            doc = json.loads((self.root / "indexes" / f"{key}.json").read_text(encoding="utf-8"))
            urls = tuple(str(u) for u in doc["upstreams"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return urls if index_key(urls) == key else None


def _write_atomic(path: Path, data: bytes) -> None:
    # Each directory made 0700 (mkdir's parents=True gives the parents the umask's mode).
    for parent in reversed([path.parent, *path.parent.parents]):
        if not parent.is_dir():
            parent.mkdir(mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------ locks


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str  # "" for a direct reference whose file name does not say
    hashes: frozenset[str]
    url: str = ""  # a direct reference's archive (`name @ URL`): fetched from there


def locked_requirements(text: str) -> list[Requirement]:
    """`name==version --hash=sha256:...` and `name @ URL --hash=sha256:...` entries of a
    lock's requirements text (uv pip compile's format, continuation lines joined)."""
    joined = re.sub(r"\\\s*\n", " ", text)
    out = []
    for line in joined.splitlines():
        if line.lstrip().startswith("#"):
            continue
        hashes = frozenset(h.lower() for h in re.findall(r"--hash=sha256:([0-9a-fA-F]{64})", line))
        direct = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*@\s*(\S+)", line)
        if direct:
            url = direct.group(2)
            out.append(Requirement(normalize(direct.group(1)), archive_version(url), hashes, url))
            continue
        line = line.split("#", 1)[0] if not line.lstrip().startswith("--hash") else line
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", line)
        if not m:
            continue
        out.append(Requirement(normalize(m.group(1)), m.group(2), hashes))
    return out


def archive_name(url: str) -> str:
    """The file name a direct reference's URL ends in."""
    from urllib.parse import unquote, urlsplit

    if url.startswith("git+"):  # a VCS reference, kept as its commit's tree's tar
        from gpuenv.matrix.vcs import parse

        return f"{parse(url).name}.tar"
    name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
    if url.startswith("file:") and not name.endswith((".whl", ".tar.gz", ".zip")):
        # A local project directory, kept as its tree's tar (`file:.`: the project itself).
        return f"{name if name not in ('', '.') else 'project'}.tar"
    return name


def archive_version(url: str) -> str:
    """The version a direct reference's archive names (a wheel's or an sdist's file name),
    or "" when its name says none (GitHub's /archive/COMMIT.tar.gz)."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )

    filename = archive_name(url)
    try:
        if filename.endswith(".whl"):
            return str(parse_wheel_filename(filename)[1])
        return str(parse_sdist_filename(filename)[1])
    except (InvalidSdistFilename, InvalidWheelFilename):
        return ""


def locked_hashes(texts: Iterable[str]) -> set[str]:
    return {h for text in texts for r in locked_requirements(text) for h in r.hashes}


UV_MACHINES = ("x86_64", "aarch64")  # os.uname().machine values uv publishes manylinux wheels for


def uv_wheel(files: list[IndexFile], version: str, machine: str) -> IndexFile | None:
    """uv's manylinux wheel of `version` for `machine` among a page's files (the first by
    name when there are several); None when the index offers none. Its executable is what
    an install step runs (gpuenv/store/fetch.py, Fetcher.uv_file)."""
    if machine not in UV_MACHINES:
        return None
    prefix = f"uv-{version}-py3-none-"
    wheels = [
        f for f in files
        if f.filename.startswith(prefix) and f.filename.endswith(f"_{machine}.whl")
        and "manylinux" in f.filename and not f.yanked
    ]  # fmt: skip
    return min(wheels, key=lambda f: f.filename) if wheels else None


# The platforms a manylinux wheel may name, from the oldest glibc a target has to the newest
# (PEP 600: manylinux_2_X runs on glibc >= 2.X; the legacy names are aliases, PEP 600's table).
_LEGACY = {"manylinux1": 5, "manylinux2010": 12, "manylinux2014": 17}


def wheel_rank(filename: str, python: str, machine: str, glibc: tuple[int, int]) -> int | None:
    """How well a wheel suits CPython `python` on linux/`machine` with that glibc: higher
    is better (pip's and uv's order: a more specific interpreter tag, then a newer
    manylinux); None when it cannot install there."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    nodot = python.replace(".", "")
    best = None
    for tag in tags:
        if tag.interpreter == f"cp{nodot}" and tag.abi in (f"cp{nodot}", "abi3", "none"):
            lang = 3 if tag.abi == f"cp{nodot}" else 2
        elif tag.interpreter.startswith("cp3") and tag.abi == "abi3":
            lang = 2 if int(tag.interpreter[3:] or 0) <= int(nodot[1:]) else -1
        elif tag.interpreter in ("py3", f"py{nodot}") and tag.abi == "none":
            lang = 1
        else:
            lang = -1
        if lang < 0:
            continue
        if tag.platform == "any":
            platform = 0
        else:
            m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag.platform)
            legacy = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", tag.platform)
            if m:
                need, arch = (int(m.group(1)), int(m.group(2))), m.group(3)
            elif legacy:
                need, arch = (2, _LEGACY[legacy.group(1)]), legacy.group(2)
            else:
                continue
            if arch != machine or need > glibc:
                continue
            platform = 1 + need[1]
        rank = lang * 1000 + platform
        best = rank if best is None else max(best, rank)
    return best


def pick_wheel(
    files: list[IndexFile], req: Requirement, python: str, machine: str, glibc: tuple[int, int]
) -> IndexFile | None:
    """The wheel a target installs for a locked requirement: among the files whose sha256
    the lock lists, the best-ranked one for the target; None when none fits."""
    ranked = [
        (rank, f.filename, f)
        for f in files
        if f.sha256 in req.hashes
        and (rank := wheel_rank(f.filename, python, machine, glibc)) is not None
    ]
    return max(ranked, key=lambda r: (r[0], r[1]))[2] if ranked else None


def offline_misses(store: Store, key: str, requirements: list[Requirement]) -> list[str]:
    """The locked distributions an offline build could not install from the wheelhouse:
    no stored page for the project through these indexes, or no stored file with one of the
    locked hashes. Pure but for reading the store."""
    missing = []
    for req in requirements:
        if req.url:  # a direct reference: its archive, by the lock's hash
            if not any(store.has(h) for h in req.hashes):
                missing.append(f"{req.name} @ {req.url}")
            continue
        page = store.page(key, req.name)
        offered = {f.sha256 for f in page} if page else set()
        if not any(h in offered and store.has(h) for h in req.hashes):
            missing.append(f"{req.name}=={req.version}")
    return missing


def prune_selection(
    entries: dict[str, tuple[int, float]], keep: set[str], now: float, max_age: float
) -> list[str]:
    """What prune drops: files no lock names and no build used within max_age seconds."""
    return sorted(sha for sha, (_, used) in entries.items()
                  if sha not in keep and now - used > max_age)  # fmt: skip


# ------------------------------------------------------------------------------ the verb


@dataclass
class Summary:
    root: Path
    files: int
    size: int
    pages: int
    indexes: dict[str, tuple[str, ...]]


def summary(store: Store) -> Summary:
    entries = store.entries()
    indexes = {}
    for path in sorted((store.root / "indexes").glob("*.json")):
        urls = store.index(path.stem)
        if urls is not None:
            indexes[path.stem] = urls
    pages = sum(1 for _ in (store.root / "pages").glob("*/*.json"))
    return Summary(store.root, len(entries), sum(s for s, _ in entries.values()), pages, indexes)


def prune(store: Store, lock_texts: list[str], keep_days: float) -> tuple[int, int]:
    """Drop what no lock entry names and no build used for keep_days; (files, bytes)."""
    entries = store.entries()
    drop = prune_selection(entries, locked_hashes(lock_texts), time.time(), keep_days * 86400)
    for sha in drop:
        store.remove(sha)
    return len(drop), sum(entries[s][0] for s in drop)


def export(store: Store, target: Path, engine: Engine | None, bases: list[str],
           say: Callable[[str], None]) -> tuple[int, int]:  # fmt: skip
    """A tarball an air-gapped site can carry: the wheelhouse (files, pages, indexes) and
    the base images (docker save), written atomically. Returns (files, bases).

    The target is a new file or a regular file it replaces: never a directory, a device
    (/dev/full would become a regular file) or a symbolic link (which it would replace,
    not write through)."""
    try:
        st: os.stat_result | None = target.lstat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise GpuenvError(f"cache export {target}: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise GpuenvError(f"cache export {target}: not a regular file (a directory, a device "
                          "or a symbolic link); give the name of a new file")  # fmt: skip
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    count = 0
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for sub in ("indexes", "pages", "files"):
                for path in sorted((store.root / sub).rglob("*")):
                    relative = path.relative_to(store.root)
                    # Not the download locks (files/.locks/) or temporary files.
                    if path.is_file() and not any(p.startswith(".") for p in relative.parts):
                        tar.add(path, f"wheelhouse/{relative}")
                        count += sub == "files"
            if engine is not None:
                with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                    for image in bases:
                        say(f"saving base {image}")
                        saved = Path(scratch) / "base.tar"
                        engine.save(image, str(saved))
                        tar.add(saved, f"bases/{_base_file(image)}")
                        saved.unlink()
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(target)  # tarfile's writes do not say which file failed
        raise
    return count, len(bases) if engine is not None else 0


def _base_file(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", image) + ".tar"


MAX_INDEX_ENTRY = 64 << 10
MAX_ARCHIVE_JSON = 1 << 20  # a docker-archive's manifest.json, repositories, config
CELL_LABELS = (contract.SPEC_HASH, contract.CELL)
IMAGE_NAME_ANNOTATIONS = ("io.containerd.image.name", "org.opencontainers.image.ref.name")


def _index_entry_key(data: bytes) -> str | None:
    """The key an index entry's upstreams hash to; None when it is not one."""
    if len(data) > MAX_INDEX_ENTRY:
        return None
    try:
        urls = json.loads(data)["upstreams"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        return None
    return index_key(urls)


Locked = Mapping[str, Mapping[str, Any] | None]  # a base's reference -> its lock identity


def check_base_archive(archive: Path, file_name: str, where: str, bases: Locked) -> str:
    """The one tag a `docker save` archive loads ("" for none), when it is a base the matrix's
    cells name (`bases`), in the file export wrote it to (_base_file), carrying no cell's
    labels, and, where the matrix's lock records that base, the locked image by content;
    else an error.

    `docker load` tags what the archive's manifest.json says (or, without it, its legacy
    `repositories` file; newer engines also read index.json's names), so each is read. The
    image is checked by what the engine will compute from the archive itself: its ID is
    the sha256 of its config, and each layer's bytes must hash to the config's diff_ids
    (the engine refuses a layer that does not)."""

    def refuse(why: str) -> GpuenvError:
        return GpuenvError(f"{where}: {why}; refusing to load it")

    try:
        with tarfile.open(archive, "r") as tar:
            files = {m.name.removeprefix("./"): m for m in tar if m.isfile()}

            def read_bytes(name: str) -> bytes | None:
                member = files.get(name)
                if member is None:
                    return None
                if member.size > MAX_ARCHIVE_JSON:
                    raise refuse(f"its {name} is larger than {MAX_ARCHIVE_JSON} bytes")
                stream = tar.extractfile(member)
                assert stream is not None
                return stream.read()

            def read_json(name: str) -> Any:
                raw = read_bytes(name)
                return None if raw is None else json.loads(raw)

            manifest = read_json("manifest.json")
            if not (isinstance(manifest, list) and len(manifest) == 1
                    and isinstance(manifest[0], dict)):  # fmt: skip
                raise refuse("not one image in docker save's format")
            tags = manifest[0].get("RepoTags") or []  # none: a base named by digest
            named = isinstance(tags, list) and all(
                isinstance(t, str) and _base_file(t) == file_name for t in tags
            )
            if not named or len(tags) > 1:
                raise refuse(f"it tags {str(tags)[:200]}, not only the base it is named for")
            tag = tags[0] if tags else ""
            base = {_base_file(b): b for b in bases}.get(file_name)
            if base is None or tag not in ("", base):
                names = ", ".join(sorted(bases)[:4]) or "none"
                raise refuse(
                    f"it is no base of the matrix's cells (theirs: {names}): an export "
                    "brings bases, never a cell's image; import it with the matrix it was "
                    "exported for (-f)"
                )
            repo, _, tag_part = tag.rpartition(":")
            repositories = read_json("repositories")
            if repositories and not (
                tag and isinstance(repositories, dict) and list(repositories) == [repo]
                and isinstance(repositories[repo], dict) and list(repositories[repo]) == [tag_part]
            ):  # fmt: skip
                raise refuse("its repositories file names other tags")
            index = read_json("index.json")
            for entry in index.get("manifests") or [] if isinstance(index, dict) else []:
                notes = entry.get("annotations") or {}
                names = {notes.get(k) for k in IMAGE_NAME_ANNOTATIONS} - {None, "", tag, tag_part}
                if names:
                    raise refuse(f"its index.json names {sorted(map(str, names))[:3]}")
            raw_config = read_bytes(str(manifest[0].get("Config", ""))) or b"{}"
            config = json.loads(raw_config)
            labels = ((config or {}).get("config") or {}).get("Labels") or {}
            if not isinstance(labels, dict):
                raise refuse("its config is not an image's")
            forged = [k for k in CELL_LABELS if k in labels]
            if forged:
                raise refuse(f"it carries a cell's label {forged[0]} (a base never does)")
            drift = _locked_drift(bases[base], raw_config, config)
            if drift:
                raise refuse(f"{drift}, not the {base} the matrix's lock records")
            return tag
    except (OSError, tarfile.TarError, ValueError, AttributeError):
        raise refuse("not a docker save archive") from None


def _locked_drift(locked: Mapping[str, Any] | None, raw_config: bytes, config: Any) -> str:
    """How the archive's image differs from the locked base ("" when it is that one, or
    the lock records none), as lockfile.base_drift compares an engine's: a bootstrapped
    base by its one layer's content, any other by its image ID."""
    if not locked:
        return ""
    if locked.get("rootfs"):
        diff_ids = (config.get("rootfs") or {}).get("diff_ids")
        if diff_ids != [locked["rootfs"]]:
            return f"its root filesystem is {str(diff_ids)[:80]}"
        return ""
    image_id = "sha256:" + hashlib.sha256(raw_config).hexdigest()
    return "" if image_id == locked.get("id") else f"its image is {image_id[:19]}"


def import_(store: Store, source: Path, engine: Engine | None, say: Callable[[str], None],
            bases: Locked | None = None) -> tuple[int, int]:  # fmt: skip
    """Bring an export back: every file checked against its name (its sha256) before it
    enters the store, pages and indexes by name only, bases loaded into the engine.
    Returns (files added, bases loaded).

    An index entry must hash to its name (it says where that key's pages come from), and a
    base's archive must load exactly the one base its file is named for, with no cell's
    labels (a crafted export could otherwise tag any image, a cell's with a forged spec
    hash included): issue 35, M2. That base must be one of `bases` (the matrix's cells'
    bases, with their lock identity), and the locked image where the lock records it: an
    archive named for a cell's tag, holding an image with no labels, was loaded, and
    `run` ran it (issue 44, M2a)."""
    added = loaded = 0
    store.make_private()  # before the first write, even if the import aborts (L4)
    try:
        tar = tarfile.open(source, "r")  # noqa: SIM115 - closed by the with below
    except (OSError, tarfile.TarError):
        raise GpuenvError(f"{source}: not a gpuenv cache export (not a tar file)") from None
    with tar, tempfile.TemporaryDirectory() as scratch:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile():
                continue
            stream = tar.extractfile(member)
            assert stream is not None
            if parts[:2] == ["wheelhouse", "files"] and len(parts) == 4:
                sha = parts[3]
                if not _SHA256.fullmatch(sha):
                    raise GpuenvError(f"{source}: unexpected entry {member.name[:200]!r}")
                if not store.has(sha):
                    store.put(sha, stream, f"{source}:{member.name}")
                    added += 1
            elif parts[:2] == ["wheelhouse", "pages"] and len(parts) == 4:
                key, name = parts[2], parts[3]
                if not _KEY.fullmatch(key) or not re.fullmatch(r"[a-z0-9-]+\.json", name):
                    raise GpuenvError(f"{source}: unexpected entry {member.name[:200]!r}")
                _write_atomic(store.root / "pages" / key / name, stream.read())
            elif parts[:2] == ["wheelhouse", "indexes"] and len(parts) == 3:
                if not re.fullmatch(r"[0-9a-f]{16}\.json", parts[2]):
                    raise GpuenvError(f"{source}: unexpected entry {member.name[:200]!r}")
                data = stream.read(MAX_INDEX_ENTRY + 1)
                if _index_entry_key(data) != parts[2].removesuffix(".json"):
                    raise GpuenvError(f"{source}: {member.name} does not name the indexes its "
                                      "name is the key of; refusing the export")  # fmt: skip
                _write_atomic(store.root / "indexes" / parts[2], data)
            elif parts[0] == "bases" and len(parts) == 2 and engine is not None:
                saved = Path(scratch) / "base.tar"
                with saved.open("wb") as out:
                    while chunk := stream.read(1 << 20):
                        out.write(chunk)
                check_base_archive(saved, parts[1], f"{source}: {member.name[:200]}", bases or {})
                for line in engine.load(str(saved)):
                    say(line)
                saved.unlink()
                loaded += 1
            elif parts[0] != "bases":
                raise GpuenvError(f"{source}: unexpected entry {member.name[:200]!r}")
    return added, loaded
