"""Pull before build: an image a registry already holds for a cell's spec hash is pulled
instead of built ($GPUENV_REGISTRY's repository, gpuenv/building/registry.py).

The spec hash is read from the registry's manifest and config first (a few KB), so a
mismatch costs no pull; where it cannot be read here the image is pulled and compared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine


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


def pull_matching(engine: Engine, ref: str, spec: str, keep_as: str) -> tuple[str | None, str]:
    """Pull `ref` when its spec hash is `spec`; tag it `keep_as` and return its image ID.

    The spec hash is read from the registry first (manifest and config blob, a few KB):
    another hash, or no such image, returns None and why without pulling gigabytes. Where
    the registry cannot be read here, the image is pulled and compared as before. Nothing
    the pull added is left behind; a tag `ref` that was already there stays where it was."""
    remote, why = peek_spec_hash(engine, ref)
    if remote is None:
        return None, why
    if remote != "?" and remote != spec:
        return None, f"{ref} has another spec hash (read from the registry; not pulled)"
    before = engine.image(ref)
    try:
        for chunk in engine.pull(ref):
            error = chunk_error(chunk) if isinstance(chunk, dict) else None
            if error:
                return None, f"pull {ref}: {error.splitlines()[0][:300]}"
    except GpuenvError as exc:  # a missing tag, a refused login, an unreachable registry
        detail = getattr(exc, "detail", exc.message)
        text = str(detail).strip().splitlines()
        return None, f"pull {ref}: {text[0][:300] if text else exc.message}"
    info = engine.image(ref)
    if info is None:
        return None, f"pull {ref}: the engine has no such image after pulling"
    if info.claims.spec_hash != spec:
        if before is None:
            engine.remove_image(ref)  # the tag, and the image unless something else uses it
        elif before.id != info.id:
            engine.tag(before.id, ref)  # the tag back where it was
            engine.remove_image(info.id)  # and what the pull brought
        return None, f"{ref} has another spec hash (built from another matrix or base)"
    engine.tag(info.id, keep_as)
    if before is None:
        engine.remove_image(ref)  # untags only: keep_as holds the image
    return info.id, ""
