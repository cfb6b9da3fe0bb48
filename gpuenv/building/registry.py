"""Where images are published: registry names, $GPUENV_REGISTRY, and an image's labels
read from a registry without pulling it (pull before build compares spec hashes first).

`--registry REG` (push, kube run) and $GPUENV_REGISTRY (the registry `gpuenv build`
pulls published images from before building) name HOST[:PORT][/NAMESPACE]; an image of the
matrix `name: acme/tensorflow` goes to REG/tensorflow:<cell>.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.project.project import Project

REGISTRY_ENV = "GPUENV_REGISTRY"  # where `gpuenv build` looks for published images first

# How pull before build vets a published image (issue 35, M1: its spec-hash label is only
# what its author wrote): (REF, the plan's spec hash) -> (REPO@DIGEST to pull, the image ID
# that digest's verified provenance records), or a GpuenvError saying why it is not adopted.
# Given by the verb (gpuenv/publish/attest/verify.py: vetting_from_env), as publishing sits
# above building.
Vet = Callable[[str, str], tuple[str, str]]
_REGISTRY = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*")


def registry_problem(value: str) -> str | None:
    """Why REG is not HOST[:PORT][/NAMESPACE], or None."""
    if _REGISTRY.fullmatch(value):
        return None
    return f"{value!r}: expected HOST[:PORT][/NAMESPACE] (namespace in lowercase)"


def target_repository(name: str, registry: str | None) -> str:
    """`--registry REG` replaces registry and namespace: REG/<last component of name>."""
    if not registry:
        return name
    return f"{registry.rstrip('/')}/{name.rsplit('/', 1)[-1]}"


def pull_repository(project: Project) -> str | None:
    """Where `gpuenv build` looks for published images first: REG/<last part of name>
    with $GPUENV_REGISTRY=REG; None when it is unset."""
    registry = registry_from_env()
    return target_repository(project.settings.name, registry) if registry else None


def registry_from_env() -> str | None:
    """$GPUENV_REGISTRY, checked; None when unset or empty."""
    value = os.environ.get(REGISTRY_ENV, "").strip()
    if not value:
        return None
    why = registry_problem(value)
    if why:
        raise GpuenvError(f"${REGISTRY_ENV}={why}")
    return value


# ------------------------------------------------------------ reading labels remotely

# Media types of what a tag may point at, most specific first (Docker's and OCI's).
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
MAX_MANIFEST = 4 << 20
MAX_CONFIG = 16 << 20
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le"}


class RegistryUnreadable(Exception):
    """The registry could not be asked (auth it needs, a protocol gpuenv does not speak):
    the caller falls back to pulling. `missing` when the registry said there is no such
    tag, `down` when it did not answer at all: then a pull cannot succeed either."""

    def __init__(self, message: str, *, missing: bool = False, down: bool = False) -> None:
        super().__init__(message)
        self.missing = missing
        self.down = down


def split_ref(ref: str) -> tuple[str, str, str]:
    """HOST[:PORT]/REPO:TAG -> (host, repository, tag), as Docker reads a reference (no
    host component: Docker Hub, library/ for one-component names)."""
    name, _, tag = ref.rpartition(":")
    if "/" in tag or not name:  # a port, not a tag
        name, tag = ref, "latest"
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return "registry-1.docker.io", name if "/" in name else f"library/{name}", tag


def is_loopback(host: str) -> bool:
    hostname = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    hostname = hostname.strip("[]")
    return hostname == "localhost" or hostname.startswith("127.") or hostname == "::1"


def remote_labels(ref: str, *, timeout: float = 20) -> dict[str, str]:
    """The image config's labels of `ref`, read over the registry HTTP API v2: the
    manifest (an index resolved to this machine's linux platform), then the config blob
    (checked against its digest). Downloads a few kilobytes, never a layer. Loopback
    registries are spoken to over plain http, as the engine does; others over https.
    Anonymous, or a bearer token the registry's challenge grants anonymously; anything
    else raises RegistryUnreadable (the caller then pulls to compare)."""
    import hashlib
    import json
    import platform

    host, repo, tag = split_ref(ref)
    client = _Client(host, timeout)
    manifest, _ = client.get_json(f"/v2/{repo}/manifests/{tag}", MANIFEST_TYPES, MAX_MANIFEST)
    if "manifests" in manifest:  # an index: this machine's platform
        arch = _ARCH.get(platform.machine(), platform.machine())
        entries = [m for m in manifest.get("manifests") or [] if isinstance(m, dict)]
        chosen = [e for e in entries if (e.get("platform") or {}).get("os") == "linux"
                  and (e.get("platform") or {}).get("architecture") == arch]  # fmt: skip
        if not chosen:
            raise RegistryUnreadable(f"{ref} has no linux/{arch} image", missing=True)
        digest = str(chosen[0].get("digest"))
        manifest, _ = client.get_json(f"/v2/{repo}/manifests/{digest}", MANIFEST_TYPES,
                                      MAX_MANIFEST)  # fmt: skip
    config = manifest.get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise RegistryUnreadable(f"{ref}: the manifest names no config blob")
    raw = client.get(f"/v2/{repo}/blobs/{digest}", ("*/*",), MAX_CONFIG)
    if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
        raise RegistryUnreadable(f"{ref}: the config blob does not match its digest")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise RegistryUnreadable(f"{ref}: the config blob is not JSON") from None
    labels = ((doc.get("config") or {}).get("Labels") or {}) if isinstance(doc, dict) else {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


class _Client:
    """GETs against one registry, with the anonymous bearer-token dance when challenged."""

    def __init__(self, host: str, timeout: float) -> None:
        self.base = f"{'http' if is_loopback(host) else 'https'}://{host}"
        self.timeout = timeout
        self.token: str | None = None

    def get_json(self, path: str, accept: tuple[str, ...], limit: int) -> tuple[Any, bytes]:
        import json

        raw = self.get(path, accept, limit)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise RegistryUnreadable(f"{self.base}{path}: not JSON") from None
        if not isinstance(doc, dict):
            raise RegistryUnreadable(f"{self.base}{path}: not a JSON object")
        return doc, raw

    def get(self, path: str, accept: tuple[str, ...], limit: int) -> bytes:
        import urllib.error
        import urllib.request

        for attempt in (1, 2):
            headers = {"Accept": ", ".join(accept)}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            req = urllib.request.Request(self.base + path, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    data = resp.read(limit + 1)
                    if len(data) > limit:
                        raise RegistryUnreadable(f"{self.base}{path}: larger than {limit} bytes")
                    return bytes(data)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 1 and self._anonymous_token(exc):
                    continue
                if exc.code == 404:
                    raise RegistryUnreadable(
                        f"{self.base}{path}: not found (404)", missing=True
                    ) from None
                raise RegistryUnreadable(f"{self.base}{path}: HTTP {exc.code}") from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                # Refused: nothing listens, so a pull would fail too. Anything else (TLS the
                # engine may be configured to accept, a name only it resolves): let it try.
                down = isinstance(reason, ConnectionRefusedError)
                raise RegistryUnreadable(f"{self.base}: {reason}", down=down) from None
        raise RegistryUnreadable(f"{self.base}{path}: needs credentials")

    def _anonymous_token(self, exc: Any) -> bool:
        """Follow a `Bearer realm=...` challenge anonymously (public images on Docker Hub,
        ghcr.io); False when the challenge is of another kind or grants nothing."""
        import json
        import urllib.parse
        import urllib.request

        challenge = exc.headers.get("WWW-Authenticate", "") if exc.headers else ""
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            return False
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                doc = json.loads(resp.read(1 << 20))
        except (OSError, ValueError):
            return False
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            return False
        self.token = token
        return True
