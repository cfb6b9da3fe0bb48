"""JupyterLab as a thin layer on top of a cell's image, built once per cell image.

Jupyter's packages never enter the cell's image, its lock or its validation: they live in
one more image, `FROM <cell image>` plus one install step, tagged
`<cell repository>:<cell>-notebook-<digest>`, the digest over the step's Dockerfile and
its resolution. The resolution is made against what the cell's environment already holds
(`uv pip compile JUPYTERLAB` constrained to the image's installed distributions, read
from the image itself), so the kernel is the cell's own Python and framework, and nothing
the cell installed is replaced; what is left to install is kept, with its hashes, in
gpuenv's cache per cell image ID (a second start resolves, fetches and builds nothing).
The wheels are fetched into the wheelhouse and checked on the client, as a cell's are
(gpuenv/store/fetch.py), and the step installs them `--offline --no-index
--require-hashes --no-deps` from a read-only mount, with network `none`.

BuildKit names its FROM by reference, not by image ID, so the layer is built on the cell's
tag; the cell's image ID is a label of the layer (part of the digest), and the built
layer's filesystem must start with exactly the cell image's layers, or it is removed and
the start refused: adding Jupyter rebuilds nothing of the cell.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.engine.client import BuildInput
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine, ImageInfo
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project
    from gpuenv.store.credentials import Credentials

JUPYTERLAB = "jupyterlab==4.6.6"  # what `gpuenv notebook` serves; its closure is resolved
RESOLUTIONS = "notebook-resolutions.json"  # gpuenv's cache: cell image ID -> resolution
LABEL = contract.NOTEBOOK  # the layer's digest (Dockerfile + resolution)
BASE_LABEL = contract.NOTEBOOK_BASE  # the ID of the cell image it is built on
PART = "jupyter"  # the install step's part of the build context, mounted at /mnt
MOUNT = "/mnt"

# Run by the image's Python: its installed distributions, {name: version}.
_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


@dataclass(frozen=True)
class Layer:
    image: str  # the tag the notebook server runs
    built: bool  # False: an earlier start's layer, reused
    packages: int  # distributions the layer adds to the cell's environment


def ensure(engine: Engine, project: Project, cell: Cell, say: Callable[[str], None]) -> Layer:
    """The cell's notebook layer: found by its digest, else resolved, fetched and built."""
    base = engine.image(cell.image)
    if base is None:
        raise GpuenvError(f"{cell.image} is not in the engine; build it first: gpuenv build")
    resolution = _resolution(engine, project, cell, base)
    text = dockerfile_for(cell.name, cell.image, base)
    digest = hashlib.sha256(f"{text}\0{resolution}".encode()).hexdigest()
    tag = f"{cell.image.rpartition(':')[0]}:{cell.name}-notebook-{digest[:16]}"
    count = len(_requirements(resolution))
    if count == 0:  # the cell has JupyterLab already (its matrix asked for it)
        return Layer(cell.image, False, 0)
    found = engine.image(tag)
    if found is not None and found.labels.get(LABEL) == digest:
        return Layer(tag, False, count)
    say(f"building the notebook layer of {cell.name} ({count} packages: {JUPYTERLAB})")
    image_id = _build(engine, project, cell, base, text, resolution, digest)
    built = engine.image(image_id)
    if built is None or built.layers[: len(base.layers)] != base.layers:
        engine.remove_if_untagged(image_id)
        raise GpuenvError(
            f"{cell.image} changed while its notebook layer was built (the layer is not on "
            "its image); run gpuenv notebook again",
            exit_code=125,
        )
    engine.tag(image_id, tag)
    return Layer(tag, True, count)


def dockerfile_for(cell_name: str, image: str, base: ImageInfo) -> str:
    """One install step on the cell's image, as the cell's own steps install
    (images/partials/macros.j2), then the image's own user again."""
    venv = contract.VENV
    install = (
        f"{MOUNT}/uv pip install --quiet --no-cache --offline --no-index --find-links {MOUNT} "
        f"--require-hashes --no-deps --python {venv}/bin/python -r {MOUNT}/requirements.txt "
        "--compile-bytecode"
    )
    return (
        f"# The notebook layer of {cell_name} (gpuenv/run/jupyter.py): {JUPYTERLAB} on the\n"
        f"# cell's image {base.id}, which it never changes.\n"
        f"FROM {image}\n"
        "USER 0:0\n"
        f"RUN --mount=type=bind,source={PART},target={MOUNT} \\\n"
        "    set -eu; \\\n"
        f"    SOURCE_DATE_EPOCH=0 {install}; \\\n"
        f"    find {venv} -path '*.dist-info/uv_cache.json' -delete; \\\n"
        "    rm -rf /root/.cache\n"
        f"USER {base.user or contract.UID}\n"
    )


def _resolution(engine: Engine, project: Project, cell: Cell, base: ImageInfo) -> str:
    """What the layer installs, with hashes: kept per cell image, else resolved now."""
    from gpuenv.building import lock as locks
    from gpuenv.project import lockfile
    from gpuenv.store import cache

    key = f"{base.id} {JUPYTERLAB} {lockfile.platform_of(cell)}"
    kept = cache.read_record(RESOLUTIONS).get(key)
    if isinstance(kept, str):
        return kept
    code, out = engine.run_capture(cell.image, ["python", "-c", _INSTALLED])
    try:
        installed = {str(k): str(v) for k, v in json.loads(out).items()} if code == 0 else None
    except (ValueError, AttributeError):
        installed = None
    if installed is None:
        raise GpuenvError(
            f"{cell.image} cannot list its installed packages (python exited {code}); "
            "is it a gpuenv cell image?",
            exit_code=125,
        )
    resolved = locks.compile_requirements(
        [JUPYTERLAB], cell.python, None, *project.settings.resolving(cell),
        credentials=_credentials(), ca_bundle=project.ca_bundle(None),
        platform=lockfile.platform_of(cell),
        constraints=[f"{name}=={version}" for name, version in sorted(installed.items())],
    )  # fmt: skip
    text = missing_from(resolved, installed)
    cache.update_record(RESOLUTIONS, {key: text})
    return text


def missing_from(resolution: str, installed: dict[str, str]) -> str:
    """The resolution's requirements the environment does not already hold, one per
    line with its hashes, in uv's format. The resolution was constrained to the installed
    versions; one that differs anyway would replace a package of the cell: refused."""
    from gpuenv.store.wheelhouse import locked_requirements, normalize

    have = {normalize(name): version for name, version in installed.items()}
    lines = []
    for req in locked_requirements(resolution):
        if have.get(req.name) == req.version:
            continue
        if req.name in have:
            raise GpuenvError(
                f"{JUPYTERLAB} needs {req.name}=={req.version}, but the cell has "
                f"{req.name}=={have[req.name]}; the notebook layer never replaces a package "
                "of the cell: pin a version both accept in matrix.yaml",
                exit_code=125,
            )
        hashes = "".join(f" \\\n    --hash=sha256:{h}" for h in sorted(req.hashes))
        lines.append(f"{req.name}=={req.version}{hashes}\n")
    return "".join(lines)


def _requirements(resolution: str) -> list[str]:
    from gpuenv.store.wheelhouse import locked_requirements

    return [r.name for r in locked_requirements(resolution)]


def _credentials() -> Credentials:
    """The credentials a build would send, each bound to its own origin (store/credentials)."""
    from gpuenv.store import credentials

    return credentials.load()


def _build(
    engine: Engine, project: Project, cell: Cell, base: ImageInfo, text: str, resolution: str,
    digest: str,
) -> str:  # fmt: skip
    """The layer's context (Dockerfile + the part: requirements, checked wheels, uv) in
    gpuenv's cache, built without tagging."""
    from gpuenv.building.context import contexts_root, target_of
    from gpuenv.building.render import UV_VERSION
    from gpuenv.store import fetch, wheelhouse

    store = wheelhouse.Store.default()
    urls = project.settings.indexes(cell)
    key = wheelhouse.index_key(urls)
    store.save_index(key, urls)
    fetcher = fetch.Fetcher(store, credentials=_credentials(),
                            ca_bundle=project.ca_bundle(None))  # fmt: skip
    target = target_of(cell, engine.architecture())
    wheels = fetcher.wheels(key, resolution, target.python, target.machine, target.glibc)
    uv = fetcher.uv_file(key, UV_VERSION, target.machine)
    root = contexts_root(store.root) / "notebook"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    here = root / digest[:16]
    with (root / f".{digest[:16]}.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another start of this layer waits here
        shutil.rmtree(here, ignore_errors=True)
        (here / PART).mkdir(parents=True, mode=0o700)
        (here / "Dockerfile").write_text(text)
        (here / PART / "requirements.txt").write_text(resolution)
        _link(uv, here / PART / "uv")
        for filename, stored in wheels:
            _link(stored, here / PART / filename)
        try:
            build = BuildInput(here, labels={LABEL: digest, BASE_LABEL: base.id})
            return engine.build_directory(build, nocache=False, on_log=lambda line: None)
        except Exception as exc:  # BuildFailed, EngineError
            raise GpuenvError(
                f"building the notebook layer of {cell.name} failed: {exc}", exit_code=125
            ) from None
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(here)


def _link(source: Path, target: Path) -> None:
    """A hard link into the wheelhouse where the filesystem allows, else a copy."""
    try:
        target.hardlink_to(source)
    except OSError:
        shutil.copy2(source, target)
