"""`gpuenv push`: tag and push cells' images, with their aliases, and report per tag.

The Docker SDK does not raise when a push fails: the error arrives inside the stream, so
every stream is read to the end and checked. Transient failures (connection resets,
timeouts, 5xx answers) are retried with backoff. Credentials are the user's own Docker
ones (~/.docker/config.json), which the SDK reads. An image is pushed only when its spec
hash is the one the matrix gives now and it did not fail `gpuenv validate`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from gpuenv.building.pull import chunk_error
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry.names import registry_problem, target_repository
from gpuenv.store import cache

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.matrix.schema import LoadedMatrix
    from gpuenv.project.lockfile import Lock
    from gpuenv.project.project import Project

TRANSIENT = (
    "connection reset", "connection refused", "timeout", "timed out", "tls handshake",
    "eof", "500 internal", "502 bad gateway", "503 service", "504 gateway", "broken pipe",
    "temporarily unavailable",
)  # fmt: skip
RETRIES = 3


def aliases_by_cell(m: LoadedMatrix, cells: list[Cell]) -> dict[str, list[str]]:
    """cell name -> its alias tags, from matrix.yaml's `aliases`; each must name one cell."""
    out: dict[str, list[str]] = {}
    for alias, pattern in m.model.aliases.items():
        matches = [c for c in cells if fnmatchcase(c.name, pattern)]
        if len(matches) != 1:
            raise m.error(
                f"alias {alias!r}: {pattern!r} matches {len(matches)} cells; it must match one",
                ("aliases", alias),
            )
        out.setdefault(matches[0].name, []).append(alias)
    return out


# ---------------------------------------------------------------- validation records


VALIDATED = "validated.json"  # in gpuenv's cache (gpuenv/store/cache.py)


def record_validation(results: dict[str, bool]) -> None:
    """image ID -> passed, written by `gpuenv validate` for `gpuenv push` to consult. An
    unwritable cache leaves push treating the images as not validated."""
    cache.update_record(VALIDATED, results)


def validation_of(image_id: str) -> bool | None:
    value = cache.read_record(VALIDATED).get(image_id)
    return bool(value) if value is not None else None


# ---------------------------------------------------------------------- pushing


@dataclass
class TagResult:
    cell: str
    ref: str
    status: str = "pending"  # pushed | failed | refused | present (a base already there)
    digest: str | None = None
    error: str | None = None
    attempts: int = 0
    # A multi-platform tag (gpuenv/publish/multiplatform.py): the platforms its index names.
    platforms: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("cell", "ref", "status", "digest", "error",
                                              "attempts")}  # fmt: skip
        if self.platforms:
            out["platforms"] = list(self.platforms)
        return out


def read_push_stream(stream: Any) -> tuple[str | None, str | None]:
    """(digest, error) from a decoded push stream; the SDK itself raises nothing."""
    digest = error = None
    for chunk in stream:
        if not isinstance(chunk, dict):
            continue
        error = chunk_error(chunk) or error
        aux = chunk.get("aux")
        if isinstance(aux, dict) and aux.get("Digest"):
            digest = str(aux["Digest"])
    if error is None and digest is None:
        error = "the engine ended the push without a digest"
    return digest, error


def is_transient(error: str) -> bool:
    text = error.lower()
    return any(marker in text for marker in TRANSIENT)


def push_ref(
    push: Callable[[str, str], Any], ref: str, sleep: Callable[[float], None] = time.sleep
) -> TagResult:
    """Push one tag, retrying transient failures (1 s, 2 s, 4 s)."""
    repo, _, tag = ref.rpartition(":")
    result = TagResult(cell="", ref=ref)
    for attempt in range(1, RETRIES + 2):
        result.attempts = attempt
        try:
            digest, error = read_push_stream(push(repo, tag))
        except Exception as exc:  # the SDK raises for connection-level failures
            digest, error = None, str(exc).splitlines()[0][:300]
        if error is None:
            result.status, result.digest, result.error = "pushed", digest, None
            return result
        result.status, result.error = "failed", error
        if not is_transient(error) or attempt > RETRIES:
            return result
        sleep(2 ** (attempt - 1))
    return result


def check_pushable(cell: Cell, info: ImageInfo | None, spec_hash: str | None) -> str | None:
    """Why this image must not be pushed, or None."""
    if info is None:
        return f"{cell.image} is not built; gpuenv build {cell.name}"
    if spec_hash is None or info.claims.spec_hash != spec_hash:
        return (
            f"{cell.image} is stale (its spec hash is not the matrix's); gpuenv build {cell.name}"
        )
    if validation_of(info.id) is False:
        return f"{cell.image} failed validation; fix it and run gpuenv validate {cell.name}"
    return None


# ---------------------------------------------------------------------- the push verb


def push_cells(
    engine: Engine,
    project: Project,
    cells: list[Cell],
    *,
    registry: str | None,
    aliases: bool,
    on_result: Callable[[TagResult], None] = lambda result: None,
) -> list[TagResult]:
    """Tag and push each cell's image under its name and aliases; one result per tag, then
    one per multi-platform index (a cell pushed with its -arm64 sibling: <cell>-multiarch).
    Stale, unbuilt or failed-validation images are refused, not pushed."""
    from gpuenv.building.plan import make_plan

    if registry is not None and registry_problem(registry):
        raise GpuenvError(f"--registry {registry_problem(registry)}", exit_code=2)
    alias_tags = aliases_by_cell(project.matrix, project.cells) if aliases else {}
    plan = make_plan(engine, project, cells)
    repo = target_repository(project.settings.name, registry)
    results: list[TagResult] = []
    for p in plan.cells:
        cell, info = p.cell, p.existing
        refused = check_pushable(cell, info, p.spec_hash)
        for tag in [cell.name, *alias_tags.get(cell.name, [])]:
            ref = f"{repo}:{tag}"
            if refused or info is None:
                result = TagResult(cell.name, ref, "refused", error=refused)
            else:
                result = _tag_and_push(engine, cell.name, info.id, ref)
            results.append(result)
            on_result(result)
    for result in _multiplatform(cells, results, repo):
        results.append(result)
        on_result(result)
    return results


def _multiplatform(cells: list[Cell], results: list[TagResult], repo: str) -> list[TagResult]:
    """One index tag per cell pushed with its -arm64 sibling in the same push: <cell>-
    multiarch (the bare name stays the amd64 image; docs/architecture.md says why)."""
    from gpuenv.publish.multiplatform import index_tag, push_index

    by_tag = {r.ref: r for r in results}
    names = {c.name for c in cells}
    out = []
    for cell in cells:
        sibling = f"{cell.name}-arm64"
        if cell.arch != "amd64" or sibling not in names:
            continue
        pair = [by_tag[f"{repo}:{cell.name}"], by_tag[f"{repo}:{sibling}"]]
        result = TagResult(cell.name, f"{repo}:{index_tag(cell.name)}", attempts=1)
        if any(r.status != "pushed" or not r.digest for r in pair):
            result.status = "refused"
            result.error = "the index needs both platforms pushed: " + ", ".join(
                f"{r.ref} {r.status}" for r in pair if r.status != "pushed" or not r.digest
            )
        else:
            try:
                result.digest, result.platforms = push_index(
                    repo, index_tag(cell.name), [str(r.digest) for r in pair]
                )
                result.status = "pushed"
            except GpuenvError as exc:
                result.status, result.error = "failed", exc.message
        out.append(result)
    return out


def _tag_and_push(engine: Engine, name: str, image_id: str, ref: str) -> TagResult:
    """`name`: the cell's (or, for a base, the base's) name its result carries."""
    try:
        engine.tag(image_id, ref)
    except GpuenvError as exc:  # e.g. a reference the engine refuses
        why = str(getattr(exc, "detail", exc.message)).strip().splitlines()[0][:300]
        return TagResult(name, ref, "failed", error=f"tag: {why}")
    result = push_ref(lambda r, t: engine.push(f"{r}:{t}"), ref)
    result.cell = name
    return result


# ------------------------------------------------------------- the bases a lock pins


def push_locked_bases(
    engine: Engine,
    lock: Lock,
    images: list[str],
    repository: str,
    on_result: Callable[[TagResult], None] = lambda result: None,
) -> list[TagResult]:
    """Push each base `lock` pins among `images` into `repository` (the cells' own) under
    base.published_tag, so that a lock's base is obtainable after Debian's archive moved
    on: `gpuenv base --pull REPOSITORY` brings it back. Beside the cells, the registry
    already holds a base's layers unless a --reproducible build rewrote them. A tag the
    registry already has for this image is not pushed again (status `present`); a base that
    is not the locked one is refused. One result per base; `cell` is the base's name."""
    from gpuenv.building.base import published_tag
    from gpuenv.project.lockfile import base_drift

    results = []
    for image in dict.fromkeys(images):
        locked = lock.bases.get(image)
        if locked is None:
            continue  # nothing pins it: nothing could check it when it is pulled back
        ref = f"{repository}:{published_tag(image, locked)}"
        info = engine.image(image)
        why = base_drift(lock, image, info) if info else "not in the engine"
        if info is None or why:
            result = TagResult(image, ref, "refused", error=f"base {image}: {why}; it is not "
                               f"the one {lock.path.name} pins")  # fmt: skip
        elif (digest := _registry_holds(engine, ref, info.id)) is not None:
            result = TagResult(image, ref, "present", digest=digest)
        else:
            result = _tag_and_push(engine, image, info.id, ref)
        results.append(result)
        on_result(result)
    return results


def _registry_holds(engine: Engine, ref: str, image_id: str) -> str | None:
    """The manifest digest of `ref` when the registry holds this very image there (its
    config, whose digest is the image ID, or a manifest of that digest), else None. Read
    from this machine, so only for a local engine (a remote one reaches registries from its
    own host); where it cannot be read, the push decides (it uploads no layer twice)."""
    from gpuenv.registry.client import RegistryUnreadable, Repository, parse_json, sha256

    if not engine.is_local:
        return None
    try:
        repo = Repository(ref)
        found = repo.manifest(repo.reference)
        if found is None:
            return None
        digest = sha256(found[0])
        config = parse_json(found[0], f"{ref}: the manifest").get("config")
    except (RegistryUnreadable, GpuenvError):
        return None
    config_digest = config.get("digest") if isinstance(config, dict) else None
    return digest if image_id in (config_digest, digest) else None
