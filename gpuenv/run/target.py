"""The image a run uses: -i IMAGE as it is, else a cell of the matrix, built first when it is
missing (after asking the engine whether it gives containers GPUs at all). `choose` is the
one step every run front-end (this engine, Kubernetes, Slurm) takes: the image, and the
warnings when it and the GPU request disagree."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.engine.client import ContainerSpec, Engine, EngineError
from gpuenv.gpu.cdi import devices_for
from gpuenv.gpu.gpus import GpuRequest, explain_start_error
from gpuenv.matrix import contract
from gpuenv.run.console import run_error, say, warn

if TYPE_CHECKING:
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project


@dataclass
class Target:
    image: str
    labels: dict[str, str]
    cell: Cell | None = None  # when chosen from the matrix
    architecture: str | None = None  # amd64, arm64: the image's config, read with its labels


def project_for(image: str | None, file: Path | None) -> Project | None:
    """The matrix a run reads, opened once by its front-end (from its snapshot when it is
    unchanged, without the schema or the catalog), so that a bad one is an error before the
    engine is reached; None for -i IMAGE, an image reference, which needs no matrix."""
    from gpuenv.project.project import looks_like_image, open_project

    if image is not None and looks_like_image(image):
        return None
    return open_project(file, cached=True)


def choose(
    engine: Engine,
    image: str | None,
    project: Project | None,
    option: str,
    asked: bool,
    gpus: GpuRequest | None = None,
) -> Target:
    """The image a run uses (target_for), and the one warning when it and the GPU request
    disagree. `option` is the front-end's GPU option as a user would add it (`--gpus all`,
    `--gpus N`, `--gpus-per-node N`), `asked` whether it was given."""
    chosen = target_for(engine, image, asked, project, gpus)
    claims = contract.ImageLabels(chosen.labels)
    flag = option.split()[0]
    if claims.is_gpu and not asked:
        warn(
            f"{chosen.image} is a GPU image but no {flag} was given: its framework will fall "
            f"back to the CPU (add {option})"
        )
    if asked and claims.variant == "cpu":
        warn(
            f"{chosen.image} is a CPU image: the framework in it cannot use the GPUs; {flag} "
            "passes them anyway (for nvidia-smi and the like). Use a GPU cell to train on them"
        )
    return chosen


def target_for(
    engine: Engine,
    image: str | None,
    want_gpu: bool,
    project: Project | None,
    gpus: GpuRequest | None = None,
) -> Target:
    """The image a run uses: -i IMAGE as is when there is no `project` (project_for), else a
    cell (the default CPU or GPU cell without -i), built first if it is missing. `gpus`: the
    workload's request on this engine, checked before a missing cell is built."""
    if project is None:
        assert image is not None  # project_for opens the matrix for everything but a reference
        labels, arch = _inspected(engine, image)
        if labels is None:
            raise run_error(f"image {image} not found in the engine")
        return Target(image, labels, architecture=arch)
    cell = project.default_cell(want_gpu) if image is None else project.one_cell(image, "-i")
    labels, arch = _inspected(engine, cell.image)
    if labels is None:
        _build_for_run(engine, project, cell, gpus)
        built, arch = _inspected(engine, cell.image)
        labels = built or {}
    else:
        check_built_for(cell, labels)  # what was there; not what this run just built
    return Target(cell.image, labels, cell, arch)


def _inspected(engine: Engine, ref: str) -> tuple[dict[str, str] | None, str | None]:
    """(labels, architecture) of an image, from one inspect (the run reads both: issue 48);
    (None, None) when the engine has no such image."""
    info = engine.image(ref)
    return (None, None) if info is None else (dict(info.labels), info.architecture)


def check_built_for(cell: Cell, labels: dict[str, str]) -> None:
    """The image carrying a cell's tag must say gpuenv built it for that cell: its cell
    label names the cell and it has a spec hash (the builder's label). A claim, not a
    proof (labels are copied as easily as tags): it keeps `run` from starting whatever
    else was tagged with the cell's name (issue 44, M2a: a crafted `cache import` did
    that with an image of no labels; import now loads bases only)."""
    claims = contract.ImageLabels(labels)
    if claims.cell == cell.name and re.fullmatch(r"[0-9a-f]{64}", claims.spec_hash or ""):
        return
    raise run_error(
        f"{cell.image} is not an image gpuenv built for cell {cell.name} (its "
        f"{contract.CELL} and {contract.SPEC_HASH} labels do not say so): remove that tag "
        f"(docker rmi {cell.image}) and gpuenv builds the cell, or name the image itself "
        f"(-i {cell.image}) to run it as it is"
    )


def check_engine_gives_gpus(engine: Engine, cell: Cell, gpus: GpuRequest) -> None:
    """Before building a cell (a GPU cell is gigabytes) for `run --gpus`: does this engine
    give containers GPUs at all? Asked of the engine itself, by starting a container with
    the request from an image it already has (the cell's base): the API reports no NVIDIA
    hook, and dockerd finds one on its own PATH, not gpuenv's (doctor's host-side checks
    cannot see that, nor a remote engine's host). An engine without the runtime, CDI or
    hook refuses the start at once: that refusal, explained, is the one error, and nothing
    is built. Anything else (the start works, no base to ask with yet, another error) is
    left to the driver probe after the build (gpu_preflight)."""
    image = cell.base.image
    if engine.image(image) is None:
        return
    spec = ContainerSpec(image, ["true"], **devices_for(engine, gpus), network="none",
                         labels=contract.container_labels("probe"), init=False)  # fmt: skip
    cid = engine.create(spec)
    try:
        engine.start(cid)
    except EngineError as exc:
        explained = explain_start_error(exc.detail, cell.image)
        if explained:
            raise run_error(explained) from None
    finally:
        engine.remove_container(cid)


def _build_for_run(engine: Engine, project: Project, cell: Cell, gpus: GpuRequest | None) -> None:
    """Build the missing cell as `gpuenv build` would, pulling a published image first
    when $GPUENV_REGISTRY names one whose signed provenance verifies; for `gpus`, only once
    the engine was seen to give containers GPUs at all."""
    from gpuenv.building import builder
    from gpuenv.building.progress import ConsoleReporter
    from gpuenv.publish.attest.verify import pull_source

    if gpus is not None:
        check_engine_gives_gpus(engine, cell, gpus)
    say(f"{cell.image} is not built yet; building it first")
    pull_from, vet = pull_source(project, False, say)
    reporter = ConsoleReporter()
    try:
        results = builder.plan_and_build(engine, project, [cell], reporter,
                                         ca_bundle=project.ca_bundle(None),
                                         pull_from=pull_from, vet=vet)  # fmt: skip
    finally:
        reporter.close()
    if results[0].status == "failed":
        raise run_error(f"building {cell.image} failed: {results[0].error}")
