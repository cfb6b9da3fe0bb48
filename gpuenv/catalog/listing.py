"""What gpuenv's catalog holds, for `gpuenv catalog`: one entry per release row, and the
refresh that regenerates the data files from the index."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuenv.matrix.errors import GpuenvError

ALIASES = {
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "torch": "torch",
    "pytorch": "torch",
    "jax": "jax",
}


def framework_names(framework: str | None) -> tuple[str, ...]:
    from gpuenv.catalog.compat import FRAMEWORKS

    if framework is None:
        return FRAMEWORKS
    name = ALIASES.get(framework.lower())
    if name is None:
        raise GpuenvError(
            f"unknown framework {framework!r} for `gpuenv catalog`; use tensorflow, torch or jax"
        )
    return (name,)


def entries(framework: str | None = None) -> list[dict[str, Any]]:
    """Every release row of the catalog (newest first per framework): release, Pythons,
    CUDA and cuDNN of its GPU cells (or why there are none), source, when refreshed."""
    from gpuenv.catalog import compat

    out = []
    for name in framework_names(framework):
        cat = compat.catalog(name)
        for minor in sorted(
            cat.releases, key=lambda m: tuple(int(p) for p in m.split(".")), reverse=True
        ):
            row = cat.releases[minor]
            gpu = None
            if row.gpu_default is not None and not row.gpu_unsupported:
                cuda, cudnn = row.gpu_default
                wheels = compat.gpu_wheels(row, cuda, cudnn, cat)
                gpu = {
                    "cuda": cuda,
                    "cuda_release": compat.cuda_release(row, cuda, cudnn, cat),
                    "cudnn": cudnn,
                    "cudnn_wheel": next(
                        (v for p, v in wheels.items() if p.startswith("nvidia-cudnn-cu")), None
                    ),
                    "nccl": next(
                        (v for p, v in wheels.items() if p.startswith("nvidia-nccl-cu")), None
                    ),
                }
            out.append(
                {
                    "framework": cat.framework,
                    "minor": row.minor,
                    "version": row.version,
                    "python": list(row.python),
                    "cpu_version": row.cpu_version or row.version,
                    "gpu": gpu,
                    "gpu_unsupported": row.gpu_unsupported,
                    "source": row.source,
                    "refreshed": cat.refreshed,
                    "index": cat.index,
                }
            )
    return out


def refresh_catalog(
    index_url: str | None = None, data: Path | None = None, record: Path | None = None
) -> list[str]:
    """Regenerate the data files from the index (PyPI unless $GPUENV_CATALOG_INDEX or
    ``index_url`` names another), trusting $PIP_CERT's CA; what changed, one line each."""
    from gpuenv.catalog import refresh
    from gpuenv.catalog.index import Index

    url = index_url or os.environ.get("GPUENV_CATALOG_INDEX") or "https://pypi.org/simple/"
    ca = os.environ.get("GPUENV_CA_BUNDLE") or os.environ.get("PIP_CERT")
    index = Index(url, Path(ca) if ca else None)
    result = refresh.refresh(index, data=data or refresh.DATA)
    refresh.write(result, data or refresh.DATA)
    if record is not None and result.changes:
        import datetime

        refresh.record(result, record, datetime.date.today())
    return result.changes
