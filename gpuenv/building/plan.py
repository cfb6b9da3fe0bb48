"""The build plan: what `gpuenv build` will do for each cell, and why, computed once.

From the project (matrix, catalog, lock read once) and the engine's state, `make_plan`
renders every selected cell, takes its spec hash, and decides: `up-to-date` (the image
carries that spec hash), `pull` (a published image may carry it: $GPUENV_REGISTRY), or
`build`, naming which input changed. The builder (gpuenv/building/builder.py) only executes a plan;
`gpuenv build --dry-run` prints it.

Why a cell rebuilds: each image records a digest per input in the io.gpuenv.inputs label
(template files, base image, packages, lock entry, the rendered context as a whole),
so the plan can compare the inputs one by one rather than only say "the hash differs".
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from pathlib import Path

    from gpuenv.building.pull import Vet
    from gpuenv.building.render import BuildContext
    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.lockfile import CellLock, Lock
    from gpuenv.project.project import Project
    from gpuenv.project.snapshot import Settings

Action = Literal["up-to-date", "pull", "build"]

# The inputs a rebuild can be blamed on, in the order they are reported.
INPUTS = ("template", "base", "apt", "framework", "packages", "requirements", "lock", "context")
REASONS = {
    "template": "template (images/) changed",
    "base": "base image changed",
    "apt": "apt packages changed",
    "framework": "framework, its CUDA wheels or the indexes changed",
    "packages": "packages changed",
    "requirements": "requirements file changed",
    "lock": "lock entry changed",
    "context": "rendered build context changed",
}
# The image's layers, bottom up (images/Dockerfile.j2): an edit rebuilds the first layer it
# touches and every one above it; the engine's cache keeps those below.
LAYERS = ("base", "apt", "framework", "packages")
FIRST_LAYER = {
    "template": "base", "base": "base", "context": "base", "apt": "apt",
    "framework": "framework", "lock": "framework", "packages": "packages",
    "requirements": "packages",
}  # fmt: skip


def spec_hash(context_digest: str, base_id: str) -> str:
    """What the io.gpuenv.spec-hash label holds. The lock reaches it through the context
    (its requirements files are part of it); the empty "lock" key keeps the hashes of
    images built before this was noticed valid."""
    doc = {"context": context_digest, "base": base_id, "lock": ""}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def input_digests(
    ctx: BuildContext, templates: str, base_id: str, lock: CellLock | None, settings: Settings
) -> dict[str, str]:
    """The digest per input (INPUTS) the io.gpuenv.inputs label records; `templates` is
    images/'s digest (render.templates_digest)."""
    cell = ctx.cell
    framework = {
        "framework": cell.framework_requirement,
        "wheels": cell.wheels,
        "index": [settings.index_url, *settings.extra_index_urls, *cell.indexes],
    }
    return {
        "template": templates[:16],
        "base": base_id,
        "apt": _short(json.dumps(list(cell.apt))),
        "framework": _short(json.dumps(framework, sort_keys=True)),
        "packages": _short(json.dumps(list(cell.pip))),
        # path=digest per requirements file, so a rebuild names the file that changed.
        "requirements": ",".join(f"{p}={d[:12]}" for p, d in sorted(cell.requirements.items())),
        "lock": _short(f"{lock.python_env}\0{lock.cuda}") if lock else "",
        "context": ctx.digest[:16],
    }


@dataclass
class CellPlan:
    """One cell's part of the plan. `prepare` fills what the project alone decides (its
    lock entry, indexes, wheelhouse key, rendered context); `make_plan` what the engine's
    state decides (base, existing image, action and why)."""

    cell: Cell
    context: BuildContext
    lock: CellLock | None
    indexes: tuple[str, ...]  # the package indexes its wheels come from, in order
    wheelhouse_key: str  # their name in the wheelhouse (and in the Dockerfile's index key)
    templates: str  # the digest of images/ the context was rendered from
    base_id: str | None = None  # None: the base is missing (the build bootstraps it first)
    spec_hash: str | None = None  # None until the base exists
    inputs: dict[str, str] = field(default_factory=dict)
    existing: ImageInfo | None = None
    action: Action = "build"
    reasons: list[str] = field(default_factory=list)
    pull_ref: str | None = None
    vet: Vet | None = None  # how a pulled image is checked before it is adopted
    rebuilds_from: str | None = None  # the first layer (LAYERS) a rebuild cannot take cached

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.cell.name,
            "image": self.cell.image,
            "action": self.action,
            "reasons": self.reasons,
            "rebuilds_from": self.rebuilds_from,
            "spec_hash": self.spec_hash,
            "base": self.cell.base.image,
            "base_id": self.base_id,
            "locked": self.lock is not None,
            "pull_from": self.pull_ref,
            "existing_image_id": self.existing.id if self.existing else None,
        }


@dataclass
class BuildPlan:
    cells: list[CellPlan]
    no_cache: bool
    lock: Lock | None

    def to_json(self) -> dict[str, Any]:
        return {"no_cache": self.no_cache, "cells": [p.to_json() for p in self.cells]}


def lock_entries(project: Project, cells: list[Cell]) -> dict[str, CellLock]:
    """The cells' entries of matrix.lock, when there is one; a stale lock is an error."""
    lock, drift = project.lock, project.lock_drift
    if lock is None:
        return {}
    drifted = {c.name: drift[c.name] for c in cells if c.name in drift}
    if drifted:
        why = "; ".join(f"{name}: {reason}" for name, reason in drifted.items())
        raise GpuenvError(f"{lock.path} does not match the matrix ({why}); re-lock: gpuenv lock")
    return {c.name: lock.cells[c.name] for c in cells}


def prepare(project: Project, cells: list[Cell]) -> dict[str, CellPlan]:
    """Every cell's plan as far as the project decides it: its lock entry, its indexes and
    wheelhouse key (computed here, once), its build context. A template error, or a lock
    that no longer matches, stops here, before anything touches the engine."""
    from gpuenv.building.render import BuildContext, render, templates_digest
    from gpuenv.store.wheelhouse import index_key

    settings = project.settings
    locked = lock_entries(project, cells)
    indexes = {c.name: settings.indexes(c) for c in cells}
    keys = {name: index_key(urls) for name, urls in indexes.items()}
    # The snapshot's contexts (gpuenv/project/snapshot.py: its key covers the matrix, lock,
    # catalog and templates); only the cells it lacks are rendered.
    contexts = project.cached_contexts()
    templates = templates_digest()
    fresh = {
        c.name: render(c, keys[c.name], locked.get(c.name)).files
        for c in cells
        if c.name not in contexts
    }
    if fresh:
        project.remember_contexts(fresh)
    contexts = {**contexts, **fresh}
    return {
        c.name: CellPlan(
            c, BuildContext(c, dict(contexts[c.name])), locked.get(c.name), indexes[c.name],
            keys[c.name], templates,
        )
        for c in cells
    }  # fmt: skip


def _why_rebuild(existing: ImageInfo, inputs: dict[str, str]) -> tuple[list[str], str]:
    """Why the image is rebuilt, and the first layer that rebuild cannot take cached."""
    try:
        recorded = json.loads(existing.labels.get(contract.INPUTS, ""))
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        return ["spec hash differs (the image records no inputs: built by an older gpuenv)"], "base"
    if "framework" not in recorded:  # built before layers were split by change frequency
        return [REASONS["template"]], "base"
    changed, blamed = [], []
    for k in INPUTS:
        if k == "context" or recorded.get(k, "" if k == "requirements" else None) == inputs[k]:
            continue
        blamed.append(k)
        if k == "requirements":
            changed.append(_requirements_reason(str(recorded.get(k) or ""), inputs[k]))
        else:
            changed.append(REASONS[k])
    recipe = _recipe_reason(existing)  # said first
    changed = [recipe, *changed] if recipe else changed
    if not blamed:
        return [*changed, REASONS["context"]], "base"
    if "lock" in blamed and {"packages", "requirements"} & set(blamed):
        # The lock was rewritten for the packages edited: their layer, unless the new
        # resolution moved a version the framework needs (then its layer too).
        blamed.remove("lock")
    return changed, min((FIRST_LAYER[k] for k in blamed), key=LAYERS.index)


def _recipe_reason(existing: ImageInfo) -> str | None:
    """Which gpuenv built the image, when another recipe than this one's (gpuenv/building/
    recipe.py). Not an input of the spec hash: a recipe change that does not reach a cell's
    rendered context (a GPU-only template, the normalisation) leaves its image as it is, and
    its label says truly which gpuenv built it."""
    from gpuenv.building.recipe import FIRST, current, from_label

    then, now = from_label(existing.labels.get(contract.RECIPE)), current()
    if then == now:
        return None
    if then is None:
        return f"built by a gpuenv before {FIRST} (it records no recipe); this is {now}"
    return f"built by {then}; this is {now}"


def _requirements_reason(before: str, now: str) -> str:
    """Which requirements files were edited, added or dropped since the image was built."""

    def parse(text: str) -> dict[str, str]:
        return dict(item.rpartition("=")[::2] for item in text.split(",") if "=" in item)

    old, new = parse(before), parse(now)
    edited = [p for p in new if p in old and old[p] != new[p]]
    added = [p for p in new if p not in old]
    dropped = [p for p in old if p not in new]
    parts = [f"requirements file {p} changed" for p in edited]
    parts += [f"requirements file {p} added" for p in added]
    parts += [f"requirements file {p} removed" for p in dropped]
    return "; ".join(parts) or REASONS["requirements"]


def base_drift_error(image: str, lock_path: Path, why: str, pulls_from: str | None) -> str:
    """The one line a build on a base other than the locked one stops with: every way to
    get the locked base back, and the way to leave it. `pulls_from`: $GPUENV_REGISTRY's
    repository, where the cells (and beside them their bases) would be published."""
    where = pulls_from or "REGISTRY/REPO, where the cell was pushed"
    return (
        f"base {image} differs from {lock_path} ({why}): load the saved base (gpuenv base "
        f"--load FILE), pull the locked base from beside the pushed cells (gpuenv base --pull "
        f"{where}), or re-lock on today's base (gpuenv lock; that changes the image)"
    )


def make_plan(
    engine: Engine,
    project: Project,
    cells: list[Cell],
    *,
    no_cache: bool = False,
    pull_from: str | None = None,
    vet: Vet | None = None,
    prepared: dict[str, CellPlan] | None = None,
) -> BuildPlan:
    """Decide per cell what a build would do. `pull_from` is the repository published
    images are pulled from before building ($GPUENV_REGISTRY's, gpuenv/building/pull.py);
    `prepared` is `prepare`'s result when the caller already has it."""
    from gpuenv.project import lockfile

    if prepared is None:
        prepared = prepare(project, cells)
    # What the engine holds: each base and each cell's image (None when missing). A base
    # that drifted from the lock is an error: building on it would not give the locked
    # environment.
    bases = {c.base.image: engine.image(c.base.image) for c in cells}
    images = {c.image: engine.image(c.image) for c in cells}
    lock = project.lock
    for image, info in bases.items():
        why = lockfile.base_drift(lock, image, info) if lock and info else None
        if why:
            raise GpuenvError(base_drift_error(image, project.lock_path, why, pull_from))
    plans = []
    for cell in cells:
        p = prepared[cell.name]
        base = bases[cell.base.image]
        p.base_id = base.id if base else None
        p.spec_hash = spec_hash(p.context.digest, p.base_id) if p.base_id else None
        p.inputs = input_digests(p.context, p.templates, p.base_id or "", p.lock, project.settings)
        p.existing = existing = images[cell.image]
        if p.base_id is None:
            p.reasons = [f"base {cell.base.image} is missing (it is made first)"]
        elif no_cache:
            p.reasons = ["--no-cache"]
        elif existing is None:
            p.reasons = ["image missing"]
        elif existing.labels.get(contract.SPEC_HASH) == p.spec_hash:
            p.action = "up-to-date"
        else:
            p.reasons, p.rebuilds_from = _why_rebuild(existing, p.inputs)
        if p.action == "build" and pull_from and vet and not no_cache and p.base_id:
            p.action, p.pull_ref, p.vet = "pull", f"{pull_from}:{cell.name}", vet
        plans.append(p)
    return BuildPlan(plans, no_cache, project.lock)


def describe(plan: BuildPlan) -> list[str]:
    """The plan as lines for `gpuenv build --dry-run`."""
    lines = []
    for p in plan.cells:
        if p.action == "up-to-date":
            lines.append(f"{p.cell.name}: up to date ({p.cell.image})")
            continue
        why = "; ".join(p.reasons)
        if p.action == "pull":
            lines.append(f"{p.cell.name}: pull {p.pull_ref} if its spec hash matches and its "
                         "provenance verifies, else build")  # fmt: skip
            lines.append(f"    because: {why}")
        else:
            lines.append(f"{p.cell.name}: build ({why})")
        if p.rebuilds_from is not None:
            lines.append(f"    rebuilds: {_rebuilt(p.rebuilds_from)}")
    return lines


def _rebuilt(layer: str) -> str:
    """What a rebuild from `layer` redoes, in words."""
    if layer == "base":
        return "every layer"
    if layer == "packages":
        return (
            "the packages layer and the metadata (the framework's stay cached unless the new "
            "resolution moves a version it needs)"
        )
    return f"the {layer} layer and every layer above it"
