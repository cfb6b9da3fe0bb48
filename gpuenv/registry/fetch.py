"""An image read from its registry by digest, without an engine: the manifest (from an
index, the one for this machine's platform), its config and its layers, each checked against
the digest that names it (distribution-spec's pull: GET /v2/<name>/manifests/<digest>, then
/blobs/<digest>). Only a reference by digest is taken: a tag names whatever was pushed last.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry.client import (
    DIGEST,
    DOCKER_LIST,
    OCI_INDEX,
    RegistryUnreadable,
    Repository,
    parse_json,
)

# The machine's architecture as images name it (the OCI image index's platform.architecture).
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True)
class Layer:
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True)
class Image:
    """An image manifest found by digest, and the config it names (both checked)."""

    host: str
    name: str
    digest: str  # the image manifest's (from an index: the platform's own)
    config_digest: str  # the image ID
    config: dict[str, Any]
    layers: tuple[Layer, ...]

    @property
    def ref(self) -> str:
        return f"{self.host}/{self.name}@{self.digest}"

    def settings(self) -> dict[str, Any]:
        """The config's `config` (Env, Entrypoint, Cmd, WorkingDir)."""
        found = self.config.get("config")
        return found if isinstance(found, dict) else {}


def pinned(ref: str, option: str) -> str:
    """REF if it names its image by digest; refused with how to pin it otherwise."""
    from gpuenv.registry.client import parse_reference

    _, _, reference = parse_reference(ref)
    if not DIGEST.fullmatch(reference):
        raise GpuenvError(f"{option} {ref}: give the image by digest, REGISTRY/REPO@sha256:... "
                          "(a tag names whatever was pushed last; `gpuenv push` and `gpuenv "
                          "verify REF --key PUB.pem` print the digest)", exit_code=2)  # fmt: skip
    return ref


def architecture() -> str:
    machine = platform.machine()
    return ARCHITECTURES.get(machine, machine)


def resolve(repo: Repository, arch: str | None = None) -> Image:
    """The image manifest REF's digest names, or the one for `arch` (this machine's) in the
    index it names; its config read and checked."""
    found = repo.manifest(repo.reference)  # checked against the digest asked for
    if found is None:
        raise GpuenvError(f"{repo.ref}: no such image in the registry (push it first)")
    data, media = found
    doc = parse_json(data, f"{repo.ref}: the manifest")
    digest = repo.reference
    if (media or doc.get("mediaType")) in (OCI_INDEX, DOCKER_LIST):
        digest = _platform_manifest(repo, doc, arch or architecture())
        found = repo.manifest(digest)
        if found is None:
            raise GpuenvError(f"{repo.ref}: the index names {digest[:19]}, which the registry "
                              "does not have")  # fmt: skip
        doc = parse_json(found[0], f"{repo.ref}: the manifest {digest[:19]}")
    config = repo.config(doc)  # checked against its digest
    layers = []
    for entry in doc.get("layers") or []:
        layer = _layer(entry)
        if layer is None:
            raise RegistryUnreadable(f"{repo.ref}: the manifest names a layer without a "
                                     "sha256 digest and size")  # fmt: skip
        layers.append(layer)
    config_digest = str(doc["config"]["digest"])
    return Image(repo.host, repo.name, digest, config_digest, config, tuple(layers))


def _platform_manifest(repo: Repository, index: dict[str, Any], arch: str) -> str:
    offered = []
    for entry in index.get("manifests") or []:
        if not isinstance(entry, dict):
            continue
        found = entry.get("platform")
        where: dict[str, Any] = found if isinstance(found, dict) else {}
        offered.append(f"{where.get('os')}/{where.get('architecture')}")
        digest = entry.get("digest")
        if (where.get("os"), where.get("architecture")) == ("linux", arch) and isinstance(
            digest, str
        ) and DIGEST.fullmatch(digest):  # fmt: skip
            return digest
    raise GpuenvError(f"{repo.ref}: the index has no linux/{arch} image (it has "
                      f"{', '.join(offered) or 'none'})")  # fmt: skip


def _layer(entry: Any) -> Layer | None:
    if not isinstance(entry, dict):
        return None
    digest, size = entry.get("digest"), entry.get("size")
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest) or not isinstance(size, int):
        return None
    return Layer(digest, size, str(entry.get("mediaType", "")))


def fetch_layers(repo: Repository, image: Image, into: Path) -> list[Path]:
    """Every layer into `into` (a private directory), each checked against its digest
    before the next is asked for: the paths, bottom layer first."""
    paths: list[Path] = []
    for number, layer in enumerate(image.layers, 1):
        path = into / f"layer-{number}"
        why = repo.blob_to(layer.digest, layer.size, path)
        if why is not None:
            raise GpuenvError(f"{image.ref}: layer {number} of {len(image.layers)} "
                              f"({layer.digest[:19]}) is not the blob its manifest names: "
                              f"{why}; refusing the image")  # fmt: skip
        paths.append(path)
    return paths


__all__ = ["Image", "Layer", "architecture", "fetch_layers", "pinned", "resolve"]
