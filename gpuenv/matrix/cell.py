"""A resolved cell: one image gpuenv can build, with every version exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Docker's architecture name -> the machine (uname -m) wheels and markers name.
MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Base:
    """Where a cell's Python comes from: a local Debian bootstrap, or an image reference."""

    kind: Literal["debian", "image"]
    value: str  # suite name, or image reference
    python: str
    arch: str = "amd64"

    @property
    def image(self) -> str:
        """The reference the Dockerfile's FROM line uses: a bootstrapped base is tagged per
        architecture (an engine holds one architecture per tag); an image reference is the
        user's, and must be of the cell's architecture (gpuenv/building/base.py checks)."""
        if self.kind == "image":
            return self.value
        suffix = "" if self.arch == "amd64" else f"-{self.arch}"
        return f"gpuenv/debian:{self.value}{suffix}"

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
    # The framework requirement the environment installs: tensorflow==2.21.0, or for a
    # PyTorch CPU cell torch==2.9.1+cpu from PyTorch's own index. Empty: <framework>==<version>.
    install: str = ""
    # Indexes beside the matrix's own that this cell's packages come from (plain data: the
    # build routes them, the lock resolves against them).
    indexes: tuple[str, ...] = ()
    # The framework's wheel requires its CUDA wheels (PyTorch): a GPU cell installs them with
    # the framework in one layer instead of a CUDA layer over the CPU cell's environment.
    cuda_with_framework: bool = False
    arch: Literal["amd64", "arm64"] = "amd64"

    @property
    def platform(self) -> str:
        """The OCI platform the image is built for and run as."""
        return f"linux/{self.arch}"

    @property
    def machine(self) -> str:
        """uname -m inside the image: what wheels' tags and markers name."""
        return MACHINE[self.arch]

    @property
    def framework_requirement(self) -> str:
        return self.install or f"{self.framework}=={self.framework_version}"

    @property
    def cuda_major(self) -> str | None:
        return self.cuda.split(".")[0] if self.cuda else None

    @property
    def cudnn_wheel(self) -> str | None:
        """The pinned nvidia-cudnn-cu<major> release of a GPU cell."""
        return self.wheels.get(f"nvidia-cudnn-cu{self.cuda_major}") if self.cuda else None

    @property
    def nvidia_lib_dirs(self) -> tuple[str, ...]:
        """Directories under site-packages/nvidia/ holding the pinned wheels' libraries."""
        return nvidia_lib_dirs(self.wheels)

    @property
    def ptxas_dir(self) -> str | None:
        """Where the pinned nvcc wheel puts ptxas (under site-packages/nvidia/), if any."""
        if "nvidia-cuda-nvcc-cu12" in self.wheels:
            return "cuda_nvcc/bin"
        if "nvidia-cuda-nvcc" in self.wheels:
            return f"cu{self.cuda_major}/bin"
        return None

    # Requirements files (as the matrix writes them) -> sha256 of their bytes; their lines
    # are already in `pip`.
    requirements: dict[str, str] = field(default_factory=dict)
    # From the requirements files too: -c constraints (name and specifiers), the lines whose
    # markers are false for this cell ("FILE:LINE: line", recorded in the lock), and
    # --hash values (name, sha256 digests, "FILE:LINE") the lock's pick must be among.
    constraints: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    hashes: tuple[tuple[str, tuple[str, ...], str], ...] = ()

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
            "platform": self.platform,
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
        # Only where they say something, so TensorFlow cells' JSON is what it always was.
        if self.install:
            data["install"] = self.install
        if self.indexes:
            data["indexes"] = list(self.indexes)
        return data


def cell_name(
    short: str, minor: str, python: str, variant: str, cuda: str | None, arch: str = "amd64"
) -> str:
    parts = [f"{short}{minor}", f"py{python}"]
    if variant == "gpu" and cuda:
        parts.append(f"cuda{cuda}")
    parts.append(variant)
    if arch != "amd64":  # amd64 cells keep the names they always had
        parts.append(arch)
    return "-".join(parts)


# nvidia-* wheels that hold no shared library directory of their own (compilers, headers).
_NO_LIBS = {"nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm"}


def nvidia_lib_dirs(wheels: dict[str, str]) -> tuple[str, ...]:
    """The site-packages/nvidia/<dir>/lib directories of the nvidia-* wheels pinned.

    CUDA 12 wheels (nvidia-cublas-cu12) install into nvidia/cublas/; CUDA 13's toolkit wheels
    (nvidia-cublas, no suffix) share nvidia/cu13/; the suffixed CUDA 13 libraries outside the
    toolkit (nvidia-cudnn-cu13, nvidia-nccl-cu13) keep their own directory (nvidia/cudnn/)."""
    dirs = set()
    for name in wheels:
        if not name.startswith("nvidia-") or name in _NO_LIBS:
            continue
        stem, _, suffix = name.removeprefix("nvidia-").rpartition("-cu")
        if stem and suffix.isdigit():
            dirs.add(stem.replace("-", "_"))
        else:
            dirs.add("cu13")
    return tuple(sorted(dirs))
