"""What gpuenv's catalog holds, for `gpuenv catalog`: one entry per release row, and the
refresh that regenerates the data files from the index."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.catalog.index import Index

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


def stale_note() -> str | None:
    """One line when the catalog in use is stale (`freshness.STALE_DAYS`), else None: for the
    verbs that choose framework releases from it."""
    import datetime
    import os

    from gpuenv.catalog import compat, freshness

    today = datetime.datetime.now(datetime.UTC).date()
    return freshness.stale_note(compat.generated(), today, os.environ.get(freshness.MAX_AGE_ENV))


def in_use() -> str:
    """Which catalog is read, for `gpuenv catalog`'s footer."""
    from gpuenv.catalog import compat

    choice = compat.generated()
    if choice.origin == "packaged":
        return "the package's"
    return f"your refreshed copy {choice.origin}"


def refresh_catalog(
    index_url: str | None = None, into: Path | None = None, record: Path | None = None
) -> tuple[list[str], str]:
    """Regenerate the data files from the index (PyPI unless $GPUENV_CATALOG_INDEX or
    ``index_url`` names another), trusting $PIP_CERT's CA: into the user's cache (the catalog
    in use is what changed is measured against), or rewrite the files in ``into`` (a
    checkout's gpuenv/data/). What changed, one line each, and where it went."""
    from gpuenv.catalog.index import Index

    url = index_url or os.environ.get("GPUENV_CATALOG_INDEX") or "https://pypi.org/simple/"
    ca = os.environ.get("GPUENV_CA_BUNDLE") or os.environ.get("PIP_CERT")
    return refresh_from(Index(url, Path(ca) if ca else None), into, record)


def refresh_from(
    index: Index, into: Path | None = None, record: Path | None = None
) -> tuple[list[str], str]:
    """`refresh_catalog` from ``index``. The cache always gets the whole set, dated today
    (its date says when the index was last asked); a folder only the files that changed."""
    import datetime

    from gpuenv.catalog import compat, freshness, refresh

    if into is not None:
        if not all((into / name).is_file() for name in refresh.GENERATED):
            raise GpuenvError(
                f"{into}: --into needs a folder holding the generated catalog files "
                f"({', '.join(refresh.GENERATED)}), as gpuenv/data/ in a checkout does"
            )
        result = refresh.refresh(index, data=into)
        refresh.write(result, into)
        where = str(into)
    else:
        result = refresh.refresh(index, previous=compat.generated().documents)
        where = str(freshness.write_cache(result.documents))
    if record is not None and result.changes:
        refresh.record(result, record, datetime.date.today())
    return result.changes, where
