"""What an image must hold: from the resolved cell, or for `-i IMAGE` from its labels
cross-checked against the catalog. Labels alone are never the reference: a label naming a
framework version the catalog does not pin, or CUDA wheels it does not know, is a finding."""

from __future__ import annotations

import re
from typing import Any

from gpuenv.catalog import compat
from gpuenv.matrix import contract
from gpuenv.matrix.cell import Cell, nvidia_lib_dirs
from gpuenv.matrix.contract import UID, VENV, ImageLabels, image_labels, site_packages
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import CellLock


def from_cell(
    cell: Cell, lock: CellLock | None = None, lock_drift: str | None = None
) -> dict[str, Any]:
    """What the cell's image must hold. `lock_drift` says why the matrix's lock entry for
    the cell no longer matches it: the lock check then fails with that reason."""
    pins = _pins(cell.pip)
    # With a lock, the environment must hold exactly the locked packages.
    locked = locked_versions(lock, cell.is_gpu) if lock else None
    data = cell.to_json()
    data.update(
        uid=UID,
        venv=VENV,
        site_packages=site_packages(cell.python),
        nvidia_lib_dirs=list(cell.nvidia_lib_dirs),
        ptxas_dir=cell.ptxas_dir,
        # The version the framework's own metadata reports (torch's CPU build: 2.9.1+cpu).
        installed_version=cell.framework_requirement.partition("==")[2],
        labels=image_labels(cell),
        pip_pins=pins,
        locked=locked,
        lock_drift=lock_drift,
        source="matrix+lock" if lock else "matrix",
    )
    return data


def locked_versions(lock: CellLock, gpu: bool) -> dict[str, str]:
    """name -> version of every package the lock installs (names normalised as pip does)."""
    found = {}
    for text in (lock.python_env, lock.cuda if gpu else ""):
        for line in text.splitlines():
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
            if m:
                found[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return found


def _pins(requirements: tuple[str, ...] | list[str]) -> dict[str, str]:
    pins = {}
    for req in requirements:
        name, sep, version = req.partition("==")
        if sep and version and not any(c in version for c in ",;<>!~*"):
            pins[name.split("[")[0].strip().lower()] = version.strip()
    return pins


def from_labels(image: str, found: dict[str, str]) -> dict[str, Any]:
    """Rebuild the cell an image claims to be from the catalog, using only the labels'
    framework minor, Python, variant and CUDA/cuDNN; exact versions come from the catalog."""
    claims = ImageLabels(found)
    if not claims.is_gpuenv:
        raise GpuenvError(f"{image} has no io.gpuenv.* labels: it was not built by gpuenv")
    framework = claims.framework or "tensorflow"
    found_cat = compat.catalog_by_label(framework)
    if found_cat is None:
        raise GpuenvError(
            f"{image}: its label {contract.FRAMEWORK}={framework!r} is none of "
            f"{', '.join(compat.FRAMEWORKS)}"
        )
    cat = found_cat
    framework = cat.framework
    claimed = claims.framework_version
    minor = ".".join(claimed.split(".")[:2])
    row = cat.releases.get(minor)
    if row is None:
        raise GpuenvError(
            f"{image}: its label {contract.FRAMEWORK_VERSION}={claimed!r} is no {cat.display} "
            "release the catalog knows"
        )
    variant = claims.variant or "cpu"
    if variant not in ("cpu", "gpu"):
        raise GpuenvError(f"{image}: its label {contract.VARIANT}={variant!r} is not cpu or gpu")
    python = claims.python
    if python not in row.python:
        raise GpuenvError(
            f"{image}: its label {contract.PYTHON}={python!r} contradicts the catalog: "
            f"{cat.display} {row.version} has wheels for Python {', '.join(row.python)}"
        )
    cuda, cudnn = claims.cuda, claims.cudnn
    wheels: dict[str, str] = {}
    release = None
    if variant == "gpu":
        if row.gpu_unsupported or row.gpu_default is None:
            raise GpuenvError(
                f"{image}: a GPU image of {cat.display} {row.version}, which the catalog has as "
                f"CPU-only: {row.gpu_unsupported or 'no GPU wheel set'}"
            )
        if not (cuda and cudnn):
            raise GpuenvError(f"{image}: a GPU image without io.gpuenv.cuda/cudnn labels")
        try:
            wheels = compat.gpu_wheels(row, cuda, cudnn, cat)
        except ValueError as exc:
            raise GpuenvError(f"{image}: its CUDA labels contradict the catalog: {exc}") from None
        release = compat.cuda_release(row, cuda, cudnn, cat)
    elif cuda or cudnn:
        raise GpuenvError(f"{image}: a CPU image with io.gpuenv.cuda/cudnn labels")
    from gpuenv.matrix.cell import cell_name

    installed = row.version
    if variant == "cpu" and row.cpu_version:
        installed = row.cpu_version
    ptxas = None
    if "nvidia-cuda-nvcc-cu12" in wheels:
        ptxas = "cuda_nvcc/bin"
    elif "nvidia-cuda-nvcc" in wheels and cuda:
        ptxas = f"cu{cuda.split('.')[0]}/bin"

    return {
        # The cell its claims describe; the labels check compares io.gpuenv.cell with it.
        "name": cell_name(cat.short, row.minor, python, variant, cuda),
        "image": image,
        "variant": variant,
        "python": python,
        "framework": framework,
        # The catalog's exact release, not the label's: a wrong label must not pass.
        "framework_version": row.version,
        "cuda": cuda,
        "cudnn": cudnn,
        "cuda_release": release,
        "wheels": wheels,
        "pip": [],
        "pip_pins": {},
        "apt": [],
        "uid": UID,
        "venv": VENV,
        "site_packages": site_packages(python),
        "nvidia_lib_dirs": list(nvidia_lib_dirs(wheels)),
        "ptxas_dir": ptxas,
        "installed_version": installed,
        "labels": {},  # nothing to compare the labels with but themselves
        "locked": None,
        "lock_drift": None,
        "source": "labels+catalog",
    }
