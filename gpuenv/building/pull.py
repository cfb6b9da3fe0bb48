"""Pull before build: an image a registry already holds for a cell's spec hash is pulled
instead of built ($GPUENV_REGISTRY's repository, gpuenv/building/registry.py).

The spec hash is read from the registry's manifest and config first (a few KB), so a
mismatch costs no pull; where the engine's view of the registry may differ (a remote
engine), the attestations decide alone.

A label is only what the image's author wrote, and the spec hash is computable by anyone
with the public matrix (issue 35, M1). So an image is adopted only when its signed
provenance verifies with $GPUENV_VERIFY_KEY and records this spec hash (the verb's `vet`),
it is pulled by the digest that verified, and the pulled image's ID must be the one the
provenance records. It is remembered as pulled: `push --attest` signs no provenance for an
image this machine did not build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuenv.building.registry import Vet
    from gpuenv.engine.client import Engine
    from gpuenv.project.project import Project

PULLED_RECORD = "pulled"  # image ID -> REPO@DIGEST it was pulled from (gpuenv's cache)


def wanted(offline: bool) -> bool:
    """Whether a build looks for published images first: $GPUENV_REGISTRY is set (and
    well-formed: a malformed one is an error here, before the engine) and it is online."""
    from gpuenv.building.registry import registry_from_env

    return bool(registry_from_env()) and not offline


def source(
    project: Project, offline: bool, vet: Vet | None, say: Callable[[str], None]
) -> str | None:
    """The repository a build pulls published images from, or None: offline, no
    $GPUENV_REGISTRY, or no key to verify their provenance with (`say` says so)."""
    from gpuenv.building.registry import pull_repository

    repository = None if offline else pull_repository(project)
    if repository and vet is None:
        say(f"not pulling from {repository}: set $GPUENV_VERIFY_KEY to the publisher's "
            "public key, which a published image's provenance must verify with")  # fmt: skip
        return None
    return repository


def chunk_error(chunk: dict[str, Any]) -> str | None:
    """The error a decoded push or pull stream carries in one chunk, if any: the SDK raises none."""
    if chunk.get("error") or chunk.get("errorDetail"):
        detail = chunk.get("errorDetail") or {}
        return str(detail.get("message") or chunk.get("error")).strip()
    return None


def peek_spec_hash(engine: Engine, ref: str) -> tuple[str | None, str]:
    """(the spec hash `ref` carries in the registry, "") read without pulling; (None, why)
    when the registry says there is no such image or cannot be reached (a pull would fail
    too); ("?", why) when it cannot be read here (credentials the engine holds, a remote
    engine whose view of the registry differs): then the caller pulls to find out."""
    from gpuenv.building.registry import RegistryUnreadable, remote_labels
    from gpuenv.matrix.contract import SPEC_HASH

    if not engine.is_local:
        return "?", "a remote engine reaches registries from its own host"
    try:
        labels = remote_labels(ref)
    except RegistryUnreadable as exc:
        if exc.missing or exc.down:
            return None, f"{ref}: {exc}"
        return "?", str(exc)
    return labels.get(SPEC_HASH, ""), ""


def pull_matching(
    engine: Engine, ref: str, spec: str, keep_as: str, vet: Vet
) -> tuple[str | None, str]:
    """Pull `ref` when its spec hash is `spec` and `vet` adopts it; tag it `keep_as` and
    return its image ID.

    The spec hash is read from the registry first (manifest and config blob, a few KB):
    another hash, or no such image, returns None and why without pulling gigabytes. Then
    `vet` verifies its attestations (or says why not), and the digest it verified is pulled:
    a tag moved meanwhile changes nothing. Nothing the pull added is left behind when the
    image is not the one the provenance records."""
    from gpuenv.store.cache import update_record

    remote, why = peek_spec_hash(engine, ref)
    if remote is None:
        return None, why
    if remote != "?" and remote != spec:
        return None, f"{ref} has another spec hash (read from the registry; not pulled)"
    try:
        pinned, image_id = vet(ref, spec)
    except GpuenvError as exc:
        return None, f"{ref}: not adopted: {exc.message}"
    try:
        for chunk in engine.pull(pinned):
            error = chunk_error(chunk) if isinstance(chunk, dict) else None
            if error:
                return None, f"pull {pinned}: {error.splitlines()[0][:300]}"
    except GpuenvError as exc:  # a missing tag, a refused login, an unreachable registry
        detail = getattr(exc, "detail", exc.message)
        text = str(detail).strip().splitlines()
        return None, f"pull {pinned}: {text[0][:300] if text else exc.message}"
    info = engine.image(pinned)
    if info is None:
        return None, f"pull {pinned}: the engine has no such image after pulling"
    if info.id != image_id or info.claims.spec_hash != spec:
        # The digest's reference; the image too unless a tag of the engine's still names it.
        engine.remove_image(pinned)
        return None, (f"{pinned} is image {info.id[:19]}, not the {image_id[:19]} its "
                      "provenance records")  # fmt: skip
    engine.tag(info.id, keep_as)
    update_record(PULLED_RECORD, {info.id: pinned})
    return info.id, ""
