"""gpuenv's one registry client: a repository of a registry, on oras-py (reference parsing,
the bearer-token dance, Docker's credentials) over a requests session. Pull before build
reads labels through it anonymously; publish/ reads and writes with the credential Docker's
~/.docker/config.json holds for the registry's host, as `docker push` does. Loopback over
http and never through a proxy, others over https. That credential goes only to a `Bearer`
challenge's token service, the token only to the registry; requests' ~/.netrc lookup is
off (gpuenv/store/credentials.py). Reads are bounded and checked against their digests.
Not oras-py's `Registry`: it imports jsonschema's format checkers (a second here) and
retries any error for up to two minutes; callers decide about retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from gpuenv.matrix.errors import GpuenvError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)  # what a tag may name
MAX_MANIFEST = 4 << 20
MAX_CONFIG = 16 << 20
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class RegistryUnreadable(GpuenvError):
    """The registry could not be asked, or did not give what was asked (credentials it
    needs, an answer too large or not matching its digest). `missing` when it said there is
    no such thing, `down` when nothing answered: then a pull cannot succeed either."""

    def __init__(self, message: str, *, missing: bool = False, down: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        self.down = down


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_loopback(host: str) -> bool:
    hostname = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    hostname = hostname.strip("[]")
    return hostname == "localhost" or hostname.startswith("127.") or hostname == "::1"


def parse_reference(ref: str) -> tuple[str, str, str]:
    """HOST[:PORT]/NAME[:TAG][@DIGEST] -> (host, repository, the digest, else the tag)."""
    import oras.container
    import oras.defaults

    first, _, rest = ref.partition("/")
    try:
        parsed = (oras.container.Container(rest, registry=first)
                  if first == "localhost" and rest else oras.container.Container(ref))  # fmt: skip
    except ValueError:
        raise GpuenvError(f"{ref!r} is not an image reference (HOST/NAME:TAG)") from None
    host, namespace = parsed.registry, parsed.namespace
    if host == oras.defaults.registry.index_name:  # docker.io: its API host
        host, namespace = oras.defaults.registry.default_v2_registry["host"], namespace or "library"
    name = f"{namespace}/{parsed.repository}" if namespace else parsed.repository
    return host, name, parsed.digest or parsed.tag


def parse_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise RegistryUnreadable(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise RegistryUnreadable(f"{what} is not a JSON object")
    return doc


class Repository:
    """One repository of one registry, as REF names it (`reference`: its digest, else tag)."""

    def __init__(self, ref: str, *, credentials: bool = True, timeout: float = 60) -> None:
        import functools
        from http.cookiejar import DefaultCookiePolicy

        import oras.auth
        import oras.container
        import requests
        import requests.utils

        self.ref = ref
        self.host, self.name, self.reference = parse_reference(ref)
        loopback = is_loopback(self.host)
        self.origin = f"{'http' if loopback else 'https'}://{self.host}"
        self.base = f"{self.origin}/v2/{self.name}"
        ca = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        self.session = requests.Session()
        self.session.trust_env = False  # no ~/.netrc; the proxy, for this host, is set here
        self.session.proxies = {} if loopback else requests.utils.get_environ_proxies(self.base)
        self.session.verify = ca
        self.session.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # as oras-py
        # requests has no session-wide timeout, and oras-py's token requests pass none.
        timed = functools.partial(self.session.request, timeout=timeout)
        self.session.request = timed  # type: ignore[method-assign]
        self.auth = oras.auth.get_auth_backend("token", self.session, loopback, tls_verify=ca)
        if credentials:  # Docker's credential for this exact host (oras-py reads config.json)
            named = oras.container.Container(self.name, registry=self.host)
            named.registry = self.host
            self.auth.load_configs(named)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The response to `base + path` (or a URL the registry gave), answering a `Bearer`
        challenge with oras-py's token dance; its body streamed, to be read bounded."""
        import requests

        url = path if "://" in path else self.base + path
        ours = url.startswith(self.origin + "/")  # a token, a credential: only for this registry
        headers = {**kwargs.pop("headers", {}), **(self.auth.get_auth_header() if ours else {})}
        try:
            resp = self.session.request(method, url, headers=headers, stream=True, **kwargs)
            if resp.status_code in (401, 403) and ours and self._bearer(resp):
                headers, changed = self.auth.authenticate_request(resp, headers)
                if changed:
                    resp = self.session.request(method, url, headers=headers, stream=True, **kwargs)
        except requests.RequestException as exc:  # connection, TLS, timeout
            cause = _innermost(exc)
            down = isinstance(cause, ConnectionRefusedError)
            raise RegistryUnreadable(f"registry {self.host}: {cause}", down=down) from None
        if resp.status_code in (401, 403):
            resp.close()
            raise RegistryUnreadable(f"registry {self.host}: {path}: needs credentials "
                                     f"(HTTP {resp.status_code})")  # fmt: skip
        return resp

    def _bearer(self, resp: Any) -> bool:
        """A `Bearer` challenge whose token service is https (http on loopback); oras-py would
        send the credential to "https://<realm>" of any, a `Basic` one's realm too."""
        challenge = str(resp.headers.get("WWW-Authenticate", ""))
        realm = dict(re.findall(r'(\w+)="([^"]*)"', challenge)).get("realm", "")
        scheme, _, rest = realm.partition("://")
        return challenge.lower().startswith("bearer ") and (
            scheme == "https" or (scheme == "http" and is_loopback(rest.split("/")[0]))
        )

    def failure(self, what: str, resp: Any) -> RegistryUnreadable:
        body = resp.raw.read(200, decode_content=True).decode(errors="replace").replace("\n", " ")
        return RegistryUnreadable(f"registry {self.host}: {what}: HTTP {resp.status_code} {body}")

    def get(self, path: str, accept: str, limit: int) -> tuple[bytes, str] | None:
        """(the body, its media type), at most `limit` bytes; None on a 404."""
        with self.request("GET", path, headers={"Accept": accept}) as resp:
            if resp.status_code == 404:
                return None
            if resp.status_code != 200:
                raise self.failure(path, resp)
            data = resp.raw.read(limit + 1, decode_content=True)
            media = str(resp.headers.get("Content-Type", "")).split(";")[0].strip()
        if len(data) > limit:
            raise RegistryUnreadable(f"registry {self.host}: {path} is larger than {limit} bytes")
        return bytes(data), media

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """(a manifest's bytes, its media type) by tag or digest, checked against a digest
        it was asked by; None when the registry has none."""
        found = self.get(f"/manifests/{reference}", ", ".join(MANIFEST_TYPES), MAX_MANIFEST)
        if found and reference.startswith("sha256:") and sha256(found[0]) != reference:
            raise RegistryUnreadable(f"registry {self.host}: manifest {reference} does not "
                                     "match its digest")  # fmt: skip
        return found

    def blob(self, digest: str, limit: int) -> bytes | None:
        """A blob, checked against its digest; None when missing or it does not match."""
        found = self.get(f"/blobs/{digest}", "*/*", limit)
        return found[0] if found and sha256(found[0]) == digest else None

    def blob_to(self, digest: str, size: int, path: Path) -> str | None:
        """Stream a blob into a new file at `path` (0600, not there before), hashing it on
        the way: why it is not the blob asked for (missing, longer or shorter than `size`,
        another digest), else None. A blob of any size crosses without being held."""
        with self.request("GET", f"/blobs/{digest}") as resp:
            if resp.status_code == 404:
                return "the registry has no such blob"
            if resp.status_code != 200:
                raise self.failure(f"/blobs/{digest}", resp)
            hasher, written = hashlib.sha256(), 0
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                while chunk := resp.raw.read(1 << 20, decode_content=True):
                    written += len(chunk)
                    if written > size:
                        return f"it is longer than the {size} bytes the manifest gives"
                    hasher.update(chunk)
                    out.write(chunk)
        if written != size:
            return f"it is {written} bytes, not the {size} the manifest gives"
        if f"sha256:{hasher.hexdigest()}" != digest:
            return f"its bytes hash to sha256:{hasher.hexdigest()[:12]}, not {digest[:19]}"
        return None

    def config(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """The image config an image manifest names, checked against its digest."""
        config = manifest.get("config")
        digest = config.get("digest") if isinstance(config, dict) else None
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise RegistryUnreadable(f"{self.ref}: the manifest names no config blob")
        raw = self.blob(digest, MAX_CONFIG)
        if raw is None:
            raise RegistryUnreadable(f"{self.ref}: the config blob is missing or does not "
                                     "match its digest")  # fmt: skip
        return parse_json(raw, f"{self.ref}: the config blob")

    def put_blob(self, data: bytes) -> str:
        """Upload `data` unless the registry has it (distribution-spec's monolithic upload:
        POST, then PUT to the Location given); its digest."""
        import urllib.parse

        digest = sha256(data)
        with self.request("HEAD", f"/blobs/{digest}") as resp:
            if resp.status_code == 200:
                return digest
        with self.request("POST", "/blobs/uploads/") as resp:
            if resp.status_code != 202 or not resp.headers.get("Location"):
                raise self.failure("blob upload", resp)
            location = urllib.parse.urljoin(self.base, resp.headers["Location"])
        query = urllib.parse.urlencode({"digest": digest})
        url = f"{location}{'&' if '?' in location else '?'}{query}"
        octets = {"Content-Type": "application/octet-stream"}
        with self.request("PUT", url, data=data, headers=octets) as resp:
            if resp.status_code not in (200, 201, 202):
                raise self.failure("blob upload", resp)
        return digest

    def put_manifest(self, data: bytes, media_type: str, reference: str) -> Any:
        """PUT a manifest under a tag or its digest; the response (its headers)."""
        headers = {"Content-Type": media_type}
        with self.request("PUT", f"/manifests/{reference}", data=data, headers=headers) as resp:
            if resp.status_code not in (200, 201):
                raise self.failure(f"manifest {reference}", resp)
        return resp


def _innermost(exc: BaseException) -> BaseException:
    """The root of requests' wrapped errors: a refused connection, a name, a certificate."""
    while isinstance(inner := exc.__cause__ or getattr(exc, "reason", None)
                     or next(iter(exc.args), None), BaseException):  # fmt: skip
        exc = inner
    return exc
