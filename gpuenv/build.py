"""Building cells into labelled images (render, hash, skip or build, summarise)."""

from __future__ import annotations

from pathlib import Path

from gpuenv.ca import find_bundle
from gpuenv.matrix import LoadedMatrix
from gpuenv.render import RenderOptions


def ca_bundle_for(m: LoadedMatrix, explicit: Path | None) -> Path | None:
    return find_bundle(explicit, m.model.build.ca_bundle, m.dir)


def render_options(m: LoadedMatrix, explicit_ca: Path | None) -> RenderOptions:
    b = m.model.build
    return RenderOptions(
        ca=ca_bundle_for(m, explicit_ca) is not None,
        index_url=b.index_url,
        extra_index_urls=tuple(b.extra_index_urls),
    )
