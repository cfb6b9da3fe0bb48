"""The image contract: what every gpuenv image carries and where things are inside it.

One module owns it so that the renderer that writes it, and the builder, publisher,
validator, doctor and runner that read it, cannot disagree: the label keys (with their emit
and parse) and the in-image layout (the virtualenv, the default user, the NVIDIA library
directories).
Nothing here does I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from gpuenv.matrix.cell import Cell

# ----------------------------------------------------------------------------- labels

OCI = "org.opencontainers.image"
TITLE = f"{OCI}.title"
CELL = "io.gpuenv.cell"
VARIANT = "io.gpuenv.variant"
PYTHON = "io.gpuenv.python"
FRAMEWORK = "io.gpuenv.framework"
FRAMEWORK_VERSION = "io.gpuenv.framework-version"
CUDA = "io.gpuenv.cuda"
CUDNN = "io.gpuenv.cudnn"
# Added by the builder, not the Dockerfile: it is a hash over the Dockerfile itself.
SPEC_HASH = "io.gpuenv.spec-hash"
# Also added by the builder: a digest per input (template, base, packages, lock, CA,
# context), so that `gpuenv build --dry-run` can say which one changed (gpuenv/building/plan.py).
INPUTS = "io.gpuenv.inputs"
# Also added by the builder: the gpuenv that built the image, `VERSION sha256:DIGEST`
# (gpuenv/building/recipe.py): another recipe builds the same inputs into another image.
RECIPE = "io.gpuenv.recipe"
# On bases gpuenv bootstraps (gpuenv/building/base.py): the root filesystem digest the lock pins.
BASE = "io.gpuenv.base"
ROOTFS = "io.gpuenv.rootfs"
SOURCE_DATE_EPOCH = "io.gpuenv.source-date-epoch"

# Labels on the containers gpuenv starts, one per purpose, so that a leftover container
# says who made it (and tests can find orphans).
# The notebook layer (gpuenv/run/jupyter.py): its digest, and the ID of the cell image it
# is built on. It inherits the cell's labels; these say it is not the cell.
NOTEBOOK = "io.gpuenv.notebook"
NOTEBOOK_BASE = "io.gpuenv.notebook-base"
CONTAINER_ROLES = ("run", "sync", "probe", "validate", "diff", "monitor", "export", "sdist")


def container_labels(role: str) -> dict[str, str]:
    assert role in CONTAINER_ROLES, role
    return {f"io.gpuenv.{role}": "1"}


def image_labels(cell: Cell) -> dict[str, str]:
    """Every label the Dockerfile sets (all but SPEC_HASH)."""
    what = f"{cell.framework} {cell.framework_version}, Python {cell.python}, {cell.variant}"
    if cell.is_gpu:
        what += f", CUDA {cell.cuda_release}, cuDNN {cell.cudnn_wheel}"
    return {
        TITLE: cell.image,
        f"{OCI}.description": what,
        f"{OCI}.version": cell.name,
        f"{OCI}.base.name": cell.base.image,
        CELL: cell.name,
        VARIANT: cell.variant,
        PYTHON: cell.python,
        FRAMEWORK: cell.framework,
        FRAMEWORK_VERSION: cell.framework_version,
        CUDA: cell.cuda or "",
        CUDNN: cell.cudnn or "",
    }


class ImageLabels:
    """What an image's labels claim, parsed. A claim, not a proof: validation checks it
    against the catalog (gpuenv/validate/expected.py)."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, str]) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"ImageLabels({self.raw!r})"

    @property
    def is_gpuenv(self) -> bool:
        return CELL in self.raw

    @property
    def cell(self) -> str | None:
        return self.raw.get(CELL)

    @property
    def title(self) -> str:
        return self.raw.get(TITLE) or self.raw.get(CELL) or "?"

    @property
    def variant(self) -> str | None:
        return self.raw.get(VARIANT)

    @property
    def is_gpu(self) -> bool:
        return self.variant == "gpu"

    @property
    def python(self) -> str:
        return self.raw.get(PYTHON, "")

    @property
    def framework(self) -> str | None:
        return self.raw.get(FRAMEWORK)

    @property
    def framework_version(self) -> str:
        return self.raw.get(FRAMEWORK_VERSION, "")

    @property
    def cuda(self) -> str | None:
        return self.raw.get(CUDA) or None

    @property
    def cudnn(self) -> str | None:
        return self.raw.get(CUDNN) or None

    @property
    def spec_hash(self) -> str | None:
        return self.raw.get(SPEC_HASH)

    @property
    def rootfs(self) -> str | None:
        return self.raw.get(ROOTFS)


# ----------------------------------------------------------------------------- layout

VENV = "/opt/venv"
LOCK_DIR = "/opt/gpuenv"  # the locked requirements the image was installed from
USER = "gpuenv"
UID = 1000
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def site_packages(python: str) -> str:
    return f"{VENV}/lib/python{python}/site-packages"


# ----------------------------------------------------------------------------- project files


def lock_path(matrix: Path) -> Path:
    """The lock file beside its matrix: envs.yaml -> envs.lock."""
    return matrix.with_suffix(".lock")
