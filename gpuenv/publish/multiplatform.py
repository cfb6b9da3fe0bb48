"""One multi-platform tag per cell pair: an image index (a Docker manifest list, or an OCI
image index) naming the amd64 cell's and the arm64 cell's manifests, put in the registry.

The Docker Engine 20.10 this runs on has no buildx and its API cannot push a list, so the
index is written through the registry's HTTP API (distribution-spec "Pushing Manifests"):
both images are pushed first by the engine; their manifests are read back by digest, and
each one's platform is taken from its own config blob (what the image is, not what the
cell's name says); the index is PUT under its tag. Nothing is uploaded but the index.

Formats: https://github.com/opencontainers/image-spec/blob/v1.1.0/image-index.md and
https://distribution.github.io/distribution/spec/manifest-v2-2/ (manifest list). Docker's
engine pushes Docker v2 manifests, so their index is a Docker manifest list (what `docker
manifest push` and buildx write for them); OCI manifests get an OCI index.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry.client import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST

INDEX_SUFFIX = "-multiarch"  # <cell>-multiarch: see docs/architecture.md for why not <cell>


def index_tag(amd64_cell: str) -> str:
    return f"{amd64_cell}{INDEX_SUFFIX}"


@dataclass(frozen=True)
class Member:
    digest: str  # the manifest's, as the registry holds it
    media_type: str
    size: int
    platform: dict[str, str]  # {"architecture": "arm64", "os": "linux", "variant": "v8"}

    @property
    def name(self) -> str:
        return "/".join(
            v for v in (self.platform["os"], self.platform["architecture"],
                        self.platform.get("variant", "")) if v
        )  # fmt: skip

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                "platform": dict(self.platform)}  # fmt: skip


def platform_of(config: dict[str, Any]) -> dict[str, str]:
    """The index's platform entry from an image config. arm64 images say variant v8 where
    the config omits it (as containerd normalises linux/arm64)."""
    arch, os_name = str(config.get("architecture") or ""), str(config.get("os") or "")
    if not arch or not os_name:
        raise GpuenvError("the image config names no architecture or os")
    platform = {"architecture": arch, "os": os_name}
    variant = str(config.get("variant") or ("v8" if arch == "arm64" else ""))
    if variant:
        platform["variant"] = variant
    return platform


def index_document(members: list[Member]) -> tuple[bytes, str]:
    """(the index's bytes, its media type): a Docker manifest list when every member is a
    Docker v2 manifest, else an OCI image index. Members sorted by platform, so pushing the
    same pair twice gives the same digest."""
    if len({m.name for m in members}) != len(members):
        raise GpuenvError(
            f"the images are all {members[0].name}: an index needs one image per platform"
        )
    docker = all(m.media_type == DOCKER_MANIFEST for m in members)
    media = DOCKER_LIST if docker else OCI_INDEX
    doc = {
        "schemaVersion": 2,
        "mediaType": media,
        "manifests": [m.descriptor() for m in sorted(members, key=lambda m: m.name)],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), media


def member(repository: Any, digest: str) -> Member:
    """The pushed manifest `digest` of `repository` (gpuenv.registry.client.Repository), with
    the platform its config blob records."""
    found = repository.manifest(digest)
    if found is None:
        raise GpuenvError(f"{repository.host}/{repository.name}@{digest} is not in the registry")
    data, media = found
    doc = json.loads(data)
    media = media or str(doc.get("mediaType") or "")
    if media not in (DOCKER_MANIFEST, OCI_MANIFEST):
        raise GpuenvError(f"{digest} is a {media or 'manifest of no media type'}, not an image")
    return Member(digest, media, len(data), platform_of(repository.config(doc)))


def push_index(repo: str, tag: str, digests: list[str]) -> tuple[str, list[str]]:
    """Put the index of the manifests `digests` (already in `repo`) under `repo:tag`;
    returns (its digest, the platforms it names). Credentials are the user's Docker ones,
    as for attestations."""
    from gpuenv.registry.client import Repository, sha256

    repository = Repository(f"{repo}:{tag}")
    members = [member(repository, d) for d in digests]
    data, media = index_document(members)
    repository.put_manifest(data, media, tag)
    return sha256(data), sorted(m.name for m in members)
