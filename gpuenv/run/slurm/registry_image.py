"""`slurm run --from-registry REGISTRY/REPO@sha256:...`: a published image, where no Docker
engine is (a login node with Slurm and Python): verified, then written as a SquashFS from
the registry's layers, or handed by digest to a runtime that pulls it itself.

Verified first, every time, before any SquashFS is written or reused: the image's
attestations (`gpuenv push --attest`: gpuenv/publish/attest/) must verify with the
publisher's public key (--key, else $GPUENV_VERIFY_KEY, as pull before build takes it; no
key: refused), both the SBOM and the provenance, and the provenance must record the spec
hash and the very config (image ID) the registry serves. Then, for charliecloud, the layers
are fetched into a private directory beside the images, each checked against its digest
before the next is asked for, flattened (gpuenv/registry/flatten.py: the OCI spec's
whiteouts) and written through image.py's writer, with the same /etc/environment, /etc/rc
and ENV files: cached by manifest digest as the engine's are by image ID.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpuenv.engine.values import ImageInfo
from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry.fetch import Image
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.image import Filesystem, Shared, ensure_from, rewrite_members
from gpuenv.run.slurm.script import ImageFiles

OPTION = "--from-registry"


@dataclass(frozen=True)
class Published:
    image: Image
    cell: str
    spec_hash: str
    key: Path

    def info(self) -> ImageInfo:
        """The config's settings as image.py reads an engine's (ENV, entrypoint, ...)."""
        settings = self.image.settings()

        def strings(key: str) -> tuple[str, ...]:
            value = settings.get(key)
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        return ImageInfo(id=self.image.config_digest, env=strings("Env"),
                         working_dir=str(settings.get("WorkingDir") or ""),
                         entrypoint=strings("Entrypoint"), cmd=strings("Cmd"),
                         architecture=str(self.image.config.get("architecture", "")))  # fmt: skip


def key_path(option: str | None) -> Path:
    """--key PUB.pem, else $GPUENV_VERIFY_KEY: refused without one (an image nobody checked
    is not run)."""
    from gpuenv.publish.attest import dsse
    from gpuenv.publish.attest.verify import KEY_ENV

    text = option or os.environ.get(KEY_ENV, "").strip()
    if not text:
        raise SlurmError(f"{OPTION} runs only an image whose attestations verify: give the "
                         f"publisher's public key, --key PUB.pem or ${KEY_ENV}")  # fmt: skip
    path = Path(text).expanduser()
    dsse.load_public(path, "--key" if option else f"${KEY_ENV}")  # readable, a P-256 key
    return path


def verified(ref: str, key: Path) -> Published:
    """The image REF names (this machine's platform's, from an index), its attestations
    verified with `key` and its provenance naming its spec hash and config; one error
    otherwise."""
    from gpuenv.publish.attest.oci import Repository
    from gpuenv.publish.attest.verify import verify
    from gpuenv.registry.fetch import pinned, resolve
    from gpuenv.registry.names import registry_problem

    pinned(ref, OPTION)
    host = ref.split("/", 1)[0]
    if registry_problem(host):
        raise SlurmError(f"{OPTION} {ref}: expected REGISTRY/REPO@sha256:...")
    image = resolve(Repository(ref))
    report = verify(image.ref, key)  # both attestations, each signature, for this digest
    prov = report.provenance()
    if prov is None:  # verify refuses that already; said again for the reader
        raise GpuenvError(f"{image.ref}: no provenance verifies with {key}")
    build = prov.predicate.get("buildDefinition") or {}
    spec = str((build.get("internalParameters") or {}).get("specHash") or "")
    cell = str((build.get("externalParameters") or {}).get("cell") or "")
    if not spec:
        raise GpuenvError(f"{image.ref}: its provenance records no spec hash; publish it with "
                          "gpuenv push --attest")  # fmt: skip
    recorded = _image_config(prov.predicate)
    if f"sha256:{recorded}" != image.config_digest:
        raise GpuenvError(f"{image.ref}: its provenance records image sha256:"
                          f"{recorded[:12] or '?'}, the registry serves "
                          f"{image.config_digest[:19]}")  # fmt: skip
    return Published(image, cell, spec, key)


def _image_config(predicate: dict[str, object]) -> str:
    run = predicate.get("runDetails")
    for b in (run.get("byproducts") if isinstance(run, dict) else None) or []:
        if isinstance(b, dict) and b.get("name") == "image-config":
            return str((b.get("digest") or {}).get("sha256", ""))
    return ""


def ensure(published: Published, shared: Shared, say: Callable[[str], None],
           cwd: str) -> ImageFiles:  # fmt: skip
    """The SquashFS of the verified image on shared storage, written from its layers unless
    this user wrote it already (by manifest digest)."""
    from gpuenv.publish.attest.oci import Repository

    image = published.image

    @contextmanager
    def layers() -> Iterator[Filesystem]:
        from gpuenv.registry import flatten
        from gpuenv.registry.fetch import fetch_layers

        # Beside the images: the user's own directory (0700), with room for an image.
        with tempfile.TemporaryDirectory(prefix=".layers-", dir=shared.own) as tmp:
            say(f"fetching {len(image.layers)} layer(s) of {image.ref}")
            paths = fetch_layers(Repository(image.ref), image, Path(tmp))
            names = [f"{image.ref}: layer {n} ({layer.digest[:19]})"
                     for n, layer in enumerate(image.layers, 1)]  # fmt: skip
            final = flatten.plan(paths, names)

            def filesystem(sink: IO[bytes], extra: dict[str, bytes], roots: set[str]) -> None:
                rewrite_members(flatten.members(paths, names, final), sink, extra, roots)

            yield filesystem

    return ensure_from(layers, image.digest, image.ref, published.info(), shared, say, cwd)


__all__ = ["OPTION", "Published", "ensure", "key_path", "verified"]
