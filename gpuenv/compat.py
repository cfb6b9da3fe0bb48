"""The compatibility catalog (data/*.yaml) and the resolution of combinations into cells.

Resolution is kept apart from rendering: it decides *what* a cell is (exact framework
version, CUDA/cuDNN pair, pinned wheels, base), or why it cannot be. A product combination
the catalog cannot satisfy is rejected with a reason; an impossible ``include`` or a value
the catalog does not know at all is an error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gpuenv.cell import Base, Cell, cell_name
from gpuenv.matrix import AXES, Combination, DebianBase, LoadedMatrix, expand


@dataclass(frozen=True)
class FrameworkRelease:
    minor: str
    version: str
    python: tuple[str, ...]
    source: str
    gpu_default: tuple[str, str] | None  # (cuda, cudnn) of the tested build configuration
    nccl: str | None
    wheel_requires: dict[str, str]
    gpu_unsupported: str | None


@dataclass(frozen=True)
class Toolkit:
    minor: str
    release: str
    min_driver: str
    wheels: dict[str, str]


@dataclass(frozen=True)
class Catalog:
    framework: str
    short: str
    releases: dict[str, FrameworkRelease]
    toolkits: dict[str, Toolkit]
    pairs: dict[tuple[str, str], str]  # (cuda, cudnn) -> nvidia-cudnn-cu12 release
    driver_floor: dict[str, str]  # CUDA major -> minimum driver
    ga_min_driver: dict[str, str]
    debian_python: dict[str, str]  # suite -> python

    @property
    def pythons(self) -> list[str]:
        found = {p for r in self.releases.values() for p in r.python}
        return sorted(found, key=Version)

    def release(self, requested: str) -> FrameworkRelease | None:
        """A row by major.minor, or by its exact patch release."""
        row = self.releases.get(requested)
        if row is None:
            minor = ".".join(requested.split(".")[:2])
            row = self.releases.get(minor)
            if row is not None and row.version != requested:
                return None
        return row

    def known_releases(self) -> str:
        minors = sorted(self.releases, key=Version)
        return f"{minors[0]} to {minors[-1]}"


def _read(name: str) -> Any:
    return yaml.safe_load(resources.files("gpuenv.data").joinpath(name).read_text("utf-8"))


@functools.cache
def catalog() -> Catalog:
    tf = _read("tensorflow.yaml")
    cuda = _read("cuda.yaml")
    debian = _read("debian.yaml")
    releases = {}
    for row in tf["releases"]:
        gpu = row.get("gpu")
        releases[row["minor"]] = FrameworkRelease(
            minor=row["minor"],
            version=row["version"],
            python=tuple(row["python"]),
            source=row["source"],
            gpu_default=(gpu["cuda"], gpu["cudnn"]) if gpu else None,
            nccl=gpu["nccl"] if gpu else None,
            wheel_requires=dict(row.get("wheel_requires") or {}),
            gpu_unsupported=row.get("gpu_unsupported"),
        )
    return Catalog(
        framework=tf["framework"],
        short=tf["short"],
        releases=releases,
        toolkits={
            k: Toolkit(k, v["release"], v["min_driver"], dict(v["wheels"]))
            for k, v in cuda["toolkits"].items()
        },
        pairs={(p["cuda"], p["cudnn"]): p["cudnn_wheel"] for p in cuda["pairs"]},
        driver_floor=dict(cuda["driver_floor"]),
        ga_min_driver=dict(cuda["ga_min_driver"]),
        debian_python={k: v["python"] for k, v in debian["suites"].items()},
    )


def gpu_wheels(row: FrameworkRelease, cuda: str, cudnn: str) -> dict[str, str]:
    """The exact nvidia-*-cu12 pins of a GPU cell, or ValueError saying why there are none."""
    cat = catalog()
    if (cuda, cudnn) not in cat.pairs:
        known = ", ".join(f"{c}/{d}" for c, d in sorted(cat.pairs, key=lambda p: Version(p[0])))
        raise ValueError(
            f"gpuenv has no pinned wheel set for CUDA {cuda} with cuDNN {cudnn} "
            f"(known CUDA/cuDNN pairs: {known})"
        )
    assert row.nccl is not None
    wheels = dict(cat.toolkits[cuda].wheels)
    wheels["nvidia-cudnn-cu12"] = cat.pairs[(cuda, cudnn)]
    wheels["nvidia-nccl-cu12"] = row.nccl
    for package, spec in sorted(row.wheel_requires.items()):
        pinned = wheels.get(package)
        if pinned is None or Version(pinned) not in SpecifierSet(spec):
            raise ValueError(
                f"TensorFlow {row.version} requires {package}{spec}, but CUDA {cuda} / "
                f"cuDNN {cudnn} pins {package}=={pinned}"
            )
    return dict(sorted(wheels.items()))


# ---------------------------------------------------------------------------- resolution


@dataclass
class Resolution:
    cells: list[Cell] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    default_cpu: Cell | None = None
    default_gpu: Cell | None = None


class _Rejected(Exception):
    pass


def resolve(m: LoadedMatrix) -> Resolution:
    cat = catalog()
    result = Resolution()
    for combo in expand(m):
        try:
            cell = _resolve_one(m, cat, combo)
        except _Rejected as why:
            if combo["_include"] is not None:
                raise m.error(
                    f"include entry {combo['_include'] + 1} cannot be built: {why}",
                    ("matrix", "include", combo["_include"]),
                ) from None
            entry = {k: combo[k] for k in (*AXES, "cuda", "cudnn") if k in combo}
            result.rejected.append({**entry, "reason": str(why)})
            continue
        result.cells.append(cell)
    seen: dict[str, Cell] = {}
    for cell in result.cells:
        if cell.name in seen:
            raise m.error(
                f"two cells are named {cell.name} (they differ only in cuDNN or packages); "
                "drop one of the include entries",
                ("matrix", "include"),
            )
        seen[cell.name] = cell
    if not result.cells:
        reasons = "; ".join(sorted({r["reason"] for r in result.rejected}))
        raise m.error(f"no cell of the matrix can be built: {reasons}", ("matrix",))
    _choose_defaults(m, result)
    return result


def _resolve_one(m: LoadedMatrix, cat: Catalog, combo: Combination) -> Cell:
    inc = combo["_include"]
    where: tuple[str | int, ...] = ("matrix", "include", inc) if inc is not None else ("matrix",)
    requested = combo["tensorflow"]
    row = cat.release(requested)
    if row is None:
        raise m.error(
            f"unknown TensorFlow version {requested}; gpuenv knows {cat.known_releases()} "
            "(see gpuenv/data/tensorflow.yaml)",
            (*where, "tensorflow") if inc is not None else ("matrix", "tensorflow"),
        )
    python = combo["python"]
    if python not in cat.pythons:
        raise m.error(
            f"Python {python} is outside the supported range {cat.pythons[0]} to {cat.pythons[-1]}",
            (*where, "python") if inc is not None else ("matrix", "python"),
        )
    if python not in row.python:
        raise _Rejected(
            f"TensorFlow {row.version} has no wheels for Python {python} "
            f"(it supports {row.python[0]} to {row.python[-1]})"
        )
    variant = combo["variant"]
    cuda = cudnn = release = None
    wheels: dict[str, str] = {}
    if variant == "cpu":
        if combo.get("cuda") or combo.get("cudnn"):
            raise _Rejected("cuda/cudnn are set on a CPU cell; add variant: gpu to the include")
    else:
        if row.gpu_unsupported or row.gpu_default is None:
            raise _Rejected(row.gpu_unsupported or f"no GPU build of TensorFlow {row.version}")
        cuda = combo.get("cuda") or row.gpu_default[0]
        cudnn = combo.get("cudnn") or row.gpu_default[1]
        try:
            wheels = gpu_wheels(row, cuda, cudnn)
        except ValueError as exc:
            raise _Rejected(str(exc)) from None
        release = cat.toolkits[cuda].release
    base = _base(m, cat, python)
    # Requirements files' lines join pip (so the lock, the build and drift see them); the
    # files' digests name an edit in `build --dry-run` (plan.input_digests).
    files = [*m.model.packages.requirements, *combo.get("requirements", ())]
    requirement_lines = m.requirement_lines(files)
    return Cell(
        name=cell_name(cat.short, row.minor, python, variant, cuda),
        repository=m.model.name,
        variant=variant,
        python=python,
        framework=cat.framework,
        framework_minor=row.minor,
        framework_version=row.version,
        base=base,
        cuda=cuda,
        cudnn=cudnn,
        cuda_release=release,
        wheels=wheels,
        pip=tuple(m.model.packages.pip) + tuple(combo.get("pip", ())) + requirement_lines,
        apt=tuple(m.model.packages.apt) + tuple(combo.get("apt", ())),
        requirements={p: m.requirements[p].digest for p in files},
    )


def _base(m: LoadedMatrix, cat: Catalog, python: str) -> Base:
    spec = m.model.bases.get(python)
    if spec is None:
        suites = [s for s, p in cat.debian_python.items() if p == python]
        hint = f"{{debian: {suites[0]}}}" if suites else '{image: "python:<ver>-slim@sha256:..."}'
        raise m.error(f'no base for Python {python}; add bases: "{python}": {hint}', ("bases",))
    if isinstance(spec, DebianBase):
        provides = cat.debian_python.get(spec.debian)
        if provides is None:
            raise m.error(
                f"unknown Debian suite {spec.debian!r}; gpuenv knows "
                f"{', '.join(f'{s} (Python {p})' for s, p in cat.debian_python.items())}",
                ("bases", python, "debian"),
            )
        if provides != python:
            raise m.error(
                f"Debian {spec.debian} provides Python {provides}, not {python}",
                ("bases", python, "debian"),
            )
        return Base("debian", spec.debian, python)
    return Base("image", spec.image, python)


def _choose_defaults(m: LoadedMatrix, result: Resolution) -> None:
    d = m.model.default
    if d is None:
        result.default_cpu = next((c for c in result.cells if not c.is_gpu), None)
        result.default_gpu = next((c for c in result.cells if c.is_gpu), None)
        return
    row = catalog().release(d.tensorflow)

    def wanted(c: Cell) -> bool:
        return row is not None and c.framework_minor == row.minor and c.python == d.python

    matching = [c for c in result.cells if wanted(c)]
    if not matching:
        raise m.error(
            f"default (tensorflow {d.tensorflow}, python {d.python}) is not a cell of the "
            "matrix; pick one that `gpuenv matrix` lists",
            ("default",),
        )
    result.default_cpu = next((c for c in matching if not c.is_gpu), None)
    gpus = [c for c in matching if c.is_gpu]
    # Prefer the framework's own tested CUDA when several GPU cells match.
    gpus.sort(key=lambda c: (row is None or (c.cuda, c.cudnn) != row.gpu_default, c.name))
    result.default_gpu = gpus[0] if gpus else None


def driver_floor(cuda: str) -> str:
    return catalog().driver_floor[cuda.split(".")[0]]
