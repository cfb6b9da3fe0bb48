"""Pull before build: an image a registry already holds for a cell's spec hash is pulled
instead of built ($GPUENV_REGISTRY's repository, gpuenv/registry/names.py).

The spec hash is read from the registry's manifest and config first (a few KB), so a
mismatch costs no pull; where the engine's view of the registry may differ (a remote
engine), the attestations decide alone.

A label is only what the image's author wrote, and the spec hash is computable by anyone
with the public matrix (issue 35, M1). So an image is adopted only when its signed
provenance verifies with $GPUENV_VERIFY_KEY and records this spec hash (the verb's `vet`),
it is pulled by the digest that verified, and the pulled image's ID must be the one the
provenance records. It is remembered as pulled: `push --attest` signs no provenance for an
image this machine did not build.

The bases a lock pins come back the same way, from beside the cells' images where `gpuenv
push` put them (`gpuenv base --pull`), and are kept only when they are the locked ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.project.lockfile import Lock

PULLED_RECORD = "pulled"  # image ID -> REPO@DIGEST it was pulled from (gpuenv's cache)
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le"}

# How a published image is vetted (issue 35, M1: its spec-hash label is only what its
# author wrote): (REF, the plan's spec hash) -> (REPO@DIGEST to pull, the image ID that
# digest's verified provenance records), or a GpuenvError saying why it is not adopted.
# Given by the verb (gpuenv/publish/attest/verify.py: vetting_from_env), as publishing sits
# above building.
Vet = Callable[[str, str], tuple[str, str]]


def remote_labels(ref: str, *, timeout: float = 20) -> dict[str, str]:
    """The image config's labels of `ref`, read anonymously (an anonymous bearer token where
    the registry's challenge grants one): the manifest (an index resolved to this machine's
    linux platform), then the config blob. A few kilobytes, never a layer. Raises
    RegistryUnreadable: the caller then pulls to compare, unless it is `missing` or `down`."""
    import platform

    from gpuenv.registry.client import RegistryUnreadable, Repository, parse_json

    repo = Repository(ref, credentials=False, timeout=timeout)
    reference = repo.reference
    for _ in range(2):  # a tag, then the manifest an index names for this platform
        found = repo.manifest(reference)
        if found is None:
            raise RegistryUnreadable(f"{ref}: not found (404)", missing=True)
        manifest = parse_json(found[0], f"{ref}: the manifest")
        if "manifests" not in manifest:
            break
        arch = _ARCH.get(platform.machine(), platform.machine())
        entries = [m for m in manifest.get("manifests") or [] if isinstance(m, dict)]
        chosen = [e for e in entries if (e.get("platform") or {}).get("os") == "linux"
                  and (e.get("platform") or {}).get("architecture") == arch]  # fmt: skip
        if not chosen:
            raise RegistryUnreadable(f"{ref} has no linux/{arch} image", missing=True)
        reference = str(chosen[0].get("digest"))
    labels = (repo.config(manifest).get("config") or {}).get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


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
    from gpuenv.matrix.contract import SPEC_HASH
    from gpuenv.registry.client import RegistryUnreadable

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


# ------------------------------------------------------------- the bases a lock pins


def pull_locked_base(
    engine: Engine, lock: Lock, image: str, repository: str
) -> tuple[str, str, str]:
    """Bring back the base `lock` pins for `image` from `repository`, where `gpuenv push`
    put it beside the cells' images (base.published_tag): (image, image ID, where from).

    A tag is only what the registry's writer last put there; the lock is the proof. The
    pulled image must be the locked one by the build's own rule (lockfile.base_drift: the
    root filesystem, as the engine hashed it, else the image ID) before it is tagged
    `image`; another image leaves nothing tagged, and the pulled reference is undone."""
    from gpuenv.building.base import published_tag
    from gpuenv.project.lockfile import base_drift

    locked = lock.bases.get(image)
    if locked is None:
        raise GpuenvError(f"{lock.path} pins no base {image} (the matrix changed its base, or "
                          "the lock predates pinned bases); re-lock: gpuenv lock")  # fmt: skip
    current = engine.image(image)
    if current is not None and base_drift(lock, image, current) is None:
        return image, current.id, "already in the engine"
    ref = f"{repository}:{published_tag(image, locked)}"
    before = engine.image(ref)  # a tag this engine already had there is put back on refusal
    try:
        for chunk in engine.pull(ref):
            error = chunk_error(chunk) if isinstance(chunk, dict) else None
            if error:
                raise GpuenvError(error)
    except GpuenvError as exc:
        detail = str(getattr(exc, "detail", "") or exc.message).strip().splitlines() or ["?"]
        _undo(engine, ref, before)
        raise GpuenvError(
            f"gpuenv base --pull: cannot pull {ref}: {detail[0][:300]} (a locked cell pushed "
            f"with gpuenv push has its base there; check the repository, or load the saved "
            f"base: gpuenv base --load FILE)"
        ) from None
    info = engine.image(ref)
    why = base_drift(lock, image, info) if info else "the engine has no such image after pulling"
    if info is None or why:
        _undo(engine, ref, before)
        raise GpuenvError(
            f"{ref} is not the base {lock.path.name} pins for {image} ({why}); nothing was "
            "tagged. Load the saved base (gpuenv base --load FILE) or re-lock (gpuenv lock)"
        )
    engine.tag(info.id, image)
    return image, info.id, f"pulled from {ref}"


def _undo(engine: Engine, ref: str, before: ImageInfo | None) -> None:
    """Leave `ref` as it was before the pull: removed when the pull made it (the image too,
    unless another reference holds it; never by force), else on the image it named."""
    after = engine.image(ref)
    if after is None or (before is not None and after.id == before.id):
        return
    if before is None:
        engine.remove_image(ref)
    else:
        engine.tag(before.id, ref)
