"""Reading a package index for the catalog: project pages and wheels' core metadata, never
a whole wheel.

A project page is asked for as PEP 691 JSON (PEP 503 HTML is understood too, see
gpuenv.store.wheelhouse.parse_page). A wheel's METADATA (Requires-Dist, Requires-Python) comes
from the PEP 658 ``.metadata`` file next to the wheel when the index offers one (checked
against the hash the page gives), and otherwise by HTTP range requests: the zip's end
records, its central directory and the one METADATA member, a few kilobytes of a wheel of
hundreds of megabytes (PyPI offers no ``.metadata`` for torch, jax or tensorflow; uv reads
them the same way).

Every request goes through the environment's proxy with the configured CA bundle
($PIP_CERT, as gpuenv.store.fetch does); an index that cannot be reached is one GpuenvError.
"""

from __future__ import annotations

import hashlib
import io
import ssl
import urllib.error
import urllib.request
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from gpuenv.matrix.errors import GpuenvError
from gpuenv.store.wheelhouse import HTML_TYPE, JSON_TYPE, IndexFile, normalize, parse_page

TIMEOUT = 60  # seconds per request
BLOCK = 256 << 10  # a range request reads at least this much: the tail holds most of a zip's
# central directory, so a wheel's METADATA costs two or three requests


class Unreachable(GpuenvError):
    """The index cannot be reached (offline, DNS, TLS, a proxy refusing)."""


class Index:
    """One index (a PEP 503 simple root such as https://pypi.org/simple/)."""

    def __init__(self, url: str, ca_bundle: Path | None = None) -> None:
        self.url = url if url.endswith("/") else url + "/"
        context = ssl.create_default_context()
        if ca_bundle is not None:
            context.load_verify_locations(cafile=str(ca_bundle))
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
        self.requests = 0  # how many requests were made (the tests and --refresh report it)

    def _open(self, url: str, headers: dict[str, str]) -> Any:
        request = urllib.request.Request(url, headers={"User-Agent": "gpuenv-catalog", **headers})
        self.requests += 1
        try:
            return self._opener.open(request, timeout=TIMEOUT)
        except urllib.error.HTTPError as exc:
            raise GpuenvError(f"{url}: the index answered HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(
                f"cannot reach the package index {self.url} ({reason}); `gpuenv catalog "
                "--refresh` needs the index (set $PIP_CERT for a TLS-intercepting proxy)"
            ) from None

    def page(self, project: str) -> list[IndexFile]:
        """The files of a project's page, PEP 691 JSON preferred."""
        url = f"{self.url}{normalize(project)}/"
        accept = f"{JSON_TYPE}, {HTML_TYPE};q=0.1, text/html;q=0.01"
        with self._open(url, {"Accept": accept}) as resp:
            body = resp.read()
            kind = resp.headers.get("Content-Type", "text/html")
        return parse_page(body, kind, url)

    def metadata(self, file: IndexFile) -> str:
        """A wheel's METADATA text: its PEP 658 file, or read out of the wheel by ranges."""
        if file.metadata_sha256:
            with self._open(file.url + ".metadata", {}) as resp:
                data = resp.read()
            if hashlib.sha256(data).hexdigest() != file.metadata_sha256:
                raise GpuenvError(
                    f"{file.url}.metadata does not match the sha256 the index page gives"
                )
            return data.decode("utf-8")
        return self._metadata_by_range(file)

    def _metadata_by_range(self, file: IndexFile) -> str:
        remote = _RangeFile(self, file.url)
        try:
            with zipfile.ZipFile(remote) as wheel:
                names = [
                    n
                    for n in wheel.namelist()
                    if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
                ]
                if len(names) != 1:
                    raise GpuenvError(f"{file.url}: the wheel has no single .dist-info/METADATA")
                return wheel.read(names[0]).decode("utf-8")
        except zipfile.BadZipFile as exc:
            raise GpuenvError(f"{file.url}: not a readable wheel ({exc})") from None


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests, for zipfile: blocks are kept once read."""

    def __init__(self, index: Index, url: str) -> None:
        super().__init__()
        self.index, self.url = index, url
        self.pos = 0
        self.blocks: dict[int, bytes] = {}  # start -> bytes
        self.size = self._probe()

    def _fetch(self, header: str) -> tuple[bytes, str]:
        with self.index._open(self.url, {"Range": header}) as resp:
            if resp.status != 206:
                raise GpuenvError(f"{self.url}: the server does not answer range requests")
            return resp.read(), resp.headers.get("Content-Range", "")

    def _probe(self) -> int:
        data, content_range = self._fetch(f"bytes=-{BLOCK}")
        total = content_range.rpartition("/")[2]
        if not total.isdigit():
            raise GpuenvError(f"{self.url}: no Content-Range size in the answer")
        size = int(total)
        self.blocks[size - len(data)] = data
        return size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:  # IOBase.tell asks it too
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _cached(self, start: int, end: int) -> bytes | None:
        for begin, data in self.blocks.items():
            if begin <= start and end <= begin + len(data):
                return data[start - begin : end - begin]
        return None

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        data = self._cached(self.pos, end)
        if data is None:
            stop = min(self.size, max(end, self.pos + BLOCK))
            block, _ = self._fetch(f"bytes={self.pos}-{stop - 1}")
            self.blocks[self.pos] = block
            data = block[: end - self.pos]
        self.pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def parse_metadata(text: str) -> tuple[list[str], str | None]:
    """Requires-Dist lines and Requires-Python of a METADATA text (RFC 822 headers)."""
    headers = HeaderParser().parsestr(text, headersonly=True)
    return [str(v) for v in headers.get_all("Requires-Dist") or []], headers.get("Requires-Python")
