"""A resolved cell: one image gpuenv can build, with every version exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Base:
    """Where a cell's Python comes from: a local Debian bootstrap, or an image reference."""

    kind: Literal["debian", "image"]
    value: str  # suite name, or image reference
    python: str

    @property
    def image(self) -> str:
        """The reference the Dockerfile's FROM line uses."""
        return f"gpuenv/debian:{self.value}" if self.kind == "debian" else self.value

    def describe(self) -> str:
        return f"debian:{self.value}" if self.kind == "debian" else self.value


@dataclass(frozen=True)
class Cell:
    name: str
    repository: str
    variant: Literal["cpu", "gpu"]
    python: str
    framework: str
    framework_minor: str
    framework_version: str
    base: Base
    cuda: str | None = None
    cudnn: str | None = None
    cuda_release: str | None = None  # the exact toolkit release the wheels come from
    wheels: dict[str, str] = field(default_factory=dict)  # nvidia-* pins, GPU cells only
    pip: tuple[str, ...] = ()
    apt: tuple[str, ...] = ()
    # Requirements files (as the matrix writes them) -> sha256 of their bytes; their lines
    # are already in `pip`.
    requirements: dict[str, str] = field(default_factory=dict)

    @property
    def image(self) -> str:
        return f"{self.repository}:{self.name}"

    @property
    def is_gpu(self) -> bool:
        return self.variant == "gpu"

    def to_json(self) -> dict[str, Any]:
        """The shape `gpuenv matrix --json` promises (docs/architecture.md), plus the pins."""
        data = {
            "name": self.name,
            "image": self.image,
            "variant": self.variant,
            "python": self.python,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "base": self.base.describe(),
            "base_image": self.base.image,
            "cuda_release": self.cuda_release,
            "wheels": dict(sorted(self.wheels.items())),
            "pip": list(self.pip),
            "apt": list(self.apt),
        }
        return data


def cell_name(short: str, minor: str, python: str, variant: str, cuda: str | None) -> str:
    parts = [f"{short}{minor}", f"py{python}"]
    if variant == "gpu" and cuda:
        parts.append(f"cuda{cuda}")
    parts.append(variant)
    return "-".join(parts)
