"""The images a Job runs: the cell's, pushed through gpuenv's push path (so stale or
failed-validation images are refused, never sent), and the code layer on top of it, pushed
beside it. Both are referenced by the digest the registry gave."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.run.kube import KubeError
from gpuenv.run.kube.layer import CodeContext, build_context

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project

CODE_LABEL = "io.gpuenv.code"  # the code layer's content digest


@dataclass(frozen=True)
class Shipped:
    cell_ref: str  # REPO:CELL as pushed
    image: str  # what the pod runs: REPO@sha256:... (the code layer, or the cell's image)
    code: CodeContext | None = None


def ship(
    engine: Engine,
    project: Project,
    cell: Cell,
    registry: str,
    root: Path | None,
    workdir: str,
    say: Callable[[str], None],
) -> Shipped:
    """Push the cell's image, then (with `root`) the code layer built on it."""
    from gpuenv.publish.push import push_cells, push_ref
    from gpuenv.registry.names import target_repository

    results = push_cells(engine, project, [cell], registry=registry, aliases=False)
    pushed = results[0]
    if pushed.status != "pushed" or not pushed.digest:
        raise KubeError(
            f"{pushed.ref} was not pushed ({pushed.status}: {pushed.error}); the cluster can "
            "only run an image gpuenv pushed"
        )
    repo = target_repository(project.settings.name, registry)
    say(f"pushed {pushed.ref} ({pushed.digest})")
    if root is None:
        return Shipped(pushed.ref, f"{repo}@{pushed.digest}")
    ctx = build_context(root, pushed.ref, workdir, base_digest=pushed.digest)
    tag = f"{repo}:{cell.name}-code-{ctx.digest[:16]}"
    if engine.image(tag) is None:
        say(f"building the code layer: {ctx.files} entries, {ctx.size / 1e6:.1f} MB from {root}")
        try:
            image_id = engine.build(
                io.BytesIO(ctx.tar), labels={CODE_LABEL: ctx.digest}, nocache=False,
                on_log=lambda line: None,
            )  # fmt: skip
        except Exception as exc:  # BuildFailed, EngineError
            raise KubeError(f"building the code layer on {pushed.ref} failed: {exc}") from None
        engine.tag(image_id, tag)
    result = push_ref(lambda r, t: engine.push(f"{r}:{t}"), tag)
    if result.status != "pushed" or not result.digest:
        raise KubeError(f"pushing the code layer {tag} failed: {result.error}")
    say(f"pushed {tag} ({result.digest})")
    return Shipped(pushed.ref, f"{repo}@{result.digest}", ctx)
