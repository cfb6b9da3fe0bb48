"""The compatibility catalog (data/*.yaml) and the resolution of combinations into cells.

The framework rows (data/torch.yaml, jax.yaml, tensorflow.yaml) and the CUDA 13 wheel sets
(data/cuda-wheels.yaml) are generated from the frameworks' own metadata by
`gpuenv catalog --refresh` (gpuenv/catalog/refresh.py); the facts no metadata gives (driver
minimums, the CUDA 12 wheel sets, Debian's Pythons) are hand-kept, with sources, in
data/cuda.yaml and data/debian.yaml.

Resolution is kept apart from rendering: it decides *what* a cell is (exact framework
version, CUDA/cuDNN pair, pinned wheels, index, base), or why it cannot be. There is one
Catalog per framework (data/tensorflow.yaml, torch.yaml, jax.yaml); the CUDA and Debian
facts (data/cuda.yaml, debian.yaml) are shared by all of them. A product combination
the catalog cannot satisfy is rejected with a reason; an impossible ``include`` or a value
the catalog does not know at all is an error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gpuenv.catalog import freshness
from gpuenv.matrix.cell import MACHINE, Base, Cell, cell_name
from gpuenv.matrix.errors import MatrixError
from gpuenv.matrix.schema import AXES, Combination, DebianBase, LoadedMatrix, expand

if TYPE_CHECKING:
    from gpuenv.matrix.requirements import Line

FRAMEWORKS = ("tensorflow", "torch", "jax")  # matrix keys, catalog files, package names


@dataclass(frozen=True)
class FrameworkRelease:
    minor: str
    version: str
    python: tuple[str, ...]
    source: str
    gpu_default: tuple[str, str] | None  # (cuda, cudnn) of the tested build configuration
    gpu_pins: dict[str, str]  # GPU wheels outside the toolkit set: NCCL, plugins, ...
    wheel_requires: dict[str, str]
    gpu_unsupported: str | None
    cpu_version: str | None = None  # the CPU build's own version (torch: 2.9.1+cpu)
    # PyTorch pins every CUDA wheel exactly: its default CUDA/cuDNN is exactly these pins
    # (gpu_pins then holds them all), of this CUDA release (cuda-toolkit 13.0.3, ...).
    exact: bool = False
    gpu_release: str | None = None
    # The Pythons with Linux aarch64 wheels (None: no aarch64 build at all), and what the
    # aarch64 wheel requires of CUDA wheels where it says so apart (PyTorch).
    aarch64_python: tuple[str, ...] | None = None
    aarch64_cuda_requires: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Toolkit:
    minor: str
    release: str
    min_driver: str
    wheels: dict[str, str]
    companions: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Catalog:
    framework: str  # the package name, the matrix key and the io.gpuenv.framework label
    short: str
    display: str
    releases: dict[str, FrameworkRelease]
    toolkits: dict[str, Toolkit]
    pairs: dict[tuple[str, str], str]  # (cuda, cudnn) -> nvidia-cudnn-cu<major> release
    driver_floor: dict[str, str]  # CUDA major -> minimum driver
    ga_min_driver: dict[str, str]
    debian_python: dict[str, str]  # suite -> python
    cpu_index: str | None = None  # the index the CPU build lives on, when not PyPI
    cuda_with_framework: bool = False  # the framework's wheel requires its CUDA wheels
    refreshed: str | None = None  # when the rows were generated from the index
    index: str | None = None  # the index they were generated from

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

    def newest(self) -> FrameworkRelease:
        return self.releases[max(self.releases, key=Version)]

    def known_releases(self) -> str:
        """The minors held, as a true statement: "2.9-2.15 (every minor)" only when none is
        missing between the ends, else each one listed."""
        minors = sorted(self.releases, key=Version)
        if len(minors) == 1:
            return minors[0]
        lo, hi = Version(minors[0]), Version(minors[-1])
        every = lo.major == hi.major and len(minors) == hi.minor - lo.minor + 1
        if every:
            return f"{minors[0]}-{minors[-1]} (every minor release)"
        return ", ".join(minors)

    def gpu_minors(self) -> list[str]:
        return [m for m, row in self.releases.items() if row.gpu_default is not None]


@functools.cache
def _read(name: str) -> Any:
    """A hand-kept data file of the package; the generated ones come from `generated()`."""
    return yaml.safe_load(resources.files("gpuenv.data").joinpath(name).read_text("utf-8"))


def generated() -> freshness.Choice:
    """The generated files in use: the package's, or the user's newer refreshed copy."""
    return freshness.current(check_documents)


def check_documents(documents: dict[str, Any]) -> None:
    """Raise unless ``documents`` (the generated files) make a catalog of every framework
    whose every GPU row's wheels pin: what a refreshed copy must pass to be read."""
    for framework in FRAMEWORKS:
        cat = _catalog(framework, documents)
        for row in cat.releases.values():
            if row.gpu_default is not None and not row.gpu_unsupported:
                gpu_wheels(row, *row.gpu_default, cat)


def _release(row: dict[str, Any]) -> FrameworkRelease:
    gpu = row.get("gpu")
    pins = dict((gpu or {}).get("wheels") or {})
    if gpu and "nccl" in gpu:  # tensorflow.yaml's short form
        pins["nvidia-nccl-cu12"] = gpu["nccl"]
    return FrameworkRelease(
        minor=row["minor"],
        version=row["version"],
        python=tuple(row["python"]),
        source=" ".join(str(row["source"]).split()),
        gpu_default=(gpu["cuda"], gpu["cudnn"]) if gpu else None,
        gpu_pins=pins,
        wheel_requires=dict(row.get("wheel_requires") or {}),
        gpu_unsupported=row.get("gpu_unsupported"),
        cpu_version=(row.get("cpu") or {}).get("version"),
        exact=bool((gpu or {}).get("exact", False)),
        gpu_release=(gpu or {}).get("release"),
        aarch64_python=tuple(arm["python"]) if (arm := row.get("aarch64")) else None,
        aarch64_cuda_requires=dict((arm or {}).get("cuda_requires") or {}),
    )


def _toolkit(k: str, v: dict[str, Any]) -> Toolkit:
    return Toolkit(
        k,
        v["release"],
        v["min_driver"],
        dict(v["wheels"]),
        {w: tuple(c) for w, c in (v.get("companions") or {}).items()},
    )


@functools.cache
def catalog(framework: str = "tensorflow") -> Catalog:
    """One framework's catalog (data/<framework>.yaml) with the CUDA and Debian facts all
    frameworks share (data/cuda.yaml, data/debian.yaml)."""
    if framework not in FRAMEWORKS:
        raise KeyError(framework)
    return _catalog(framework, generated().documents)


def _catalog(framework: str, documents: dict[str, Any]) -> Catalog:
    doc = documents[f"{framework}.yaml"]
    wheel_sets = documents["cuda-wheels.yaml"]
    cuda = _read("cuda.yaml")
    debian = _read("debian.yaml")
    # The hand-kept sets (CUDA 12, 13.0) first; generated ones add the minors they lack.
    toolkit_rows = {**(wheel_sets.get("toolkits") or {}), **cuda["toolkits"]}
    pair_rows = [*cuda["pairs"], *(wheel_sets.get("pairs") or [])]
    return Catalog(
        framework=doc["framework"],
        short=doc["short"],
        display=doc.get("display", "TensorFlow"),
        releases={row["minor"]: _release(row) for row in doc["releases"]},
        toolkits={k: _toolkit(k, v) for k, v in toolkit_rows.items()},
        pairs={(p["cuda"], p["cudnn"]): p["cudnn_wheel"] for p in reversed(pair_rows)},
        driver_floor=dict(cuda["driver_floor"]),
        ga_min_driver=dict(cuda["ga_min_driver"]),
        debian_python={k: v["python"] for k, v in debian["suites"].items()},
        cpu_index=doc.get("cpu_index"),
        cuda_with_framework=bool(doc.get("cuda_with_framework", False)),
        refreshed=doc.get("refreshed"),
        index=doc.get("index"),
    )


def catalog_by_label(name: str) -> Catalog | None:
    """The catalog an io.gpuenv.framework label names (package name or short form)."""
    for framework in FRAMEWORKS:
        cat = catalog(framework)
        if name in (cat.framework, cat.short):
            return cat
    return None


def cudnn_package(cuda: str) -> str:
    return f"nvidia-cudnn-cu{cuda.split('.')[0]}"


def gpu_wheels(
    row: FrameworkRelease, cuda: str, cudnn: str, cat: Catalog | None = None
) -> dict[str, str]:
    """The exact pins of a GPU cell's CUDA wheels, or ValueError saying why there are none.

    The pins are the toolkit set's wheels the framework requires (with their companions),
    the cuDNN of the pair, and the release's own GPU pins; every requirement the framework
    declares must then be pinned, inside its range."""
    cat = cat or catalog()
    if row.exact and (cuda, cudnn) == row.gpu_default:
        # The framework's own exact pins are the set (PyTorch); checked like any other.
        return _checked(row, dict(row.gpu_pins), cuda, cudnn, cat)
    if (cuda, cudnn) not in cat.pairs:
        known = ", ".join(f"{c}/{d}" for c, d in sorted(cat.pairs, key=lambda p: Version(p[0])))
        raise ValueError(
            f"gpuenv has no pinned wheel set for CUDA {cuda} with cuDNN {cudnn} "
            f"(known CUDA/cuDNN pairs: {known})"
        )
    toolkit = cat.toolkits[cuda]
    wanted = set(row.wheel_requires)
    for package in list(wanted):
        wanted.update(toolkit.companions.get(package, ()))
    wheels = {p: v for p, v in toolkit.wheels.items() if p in wanted}
    wheels[cudnn_package(cuda)] = cat.pairs[(cuda, cudnn)]
    # An exact row's pins of its own CUDA stay out of another CUDA's set: only the wheels
    # outside every toolkit set (NCCL, NVSHMEM, ...) carry over.
    own = row.gpu_pins if not row.exact else {
        p: v for p, v in row.gpu_pins.items()
        if p not in toolkit.wheels and not p.startswith("nvidia-cudnn-cu")
        and not any(p in t.wheels for t in cat.toolkits.values())
    }  # fmt: skip
    wheels.update(own)
    return _checked(row, wheels, cuda, cudnn, cat)


def _checked(
    row: FrameworkRelease, wheels: dict[str, str], cuda: str, cudnn: str, cat: Catalog
) -> dict[str, str]:
    """``wheels``, once every requirement the framework declares is pinned inside its range."""
    for package, spec in sorted(row.wheel_requires.items()):
        pinned = wheels.get(package)
        if pinned is None:
            raise ValueError(
                f"{cat.display} {row.version} requires {package}{spec}, which gpuenv's "
                f"CUDA {cuda} wheel set does not include"
            )
        if Version(pinned) not in SpecifierSet(spec):
            raise ValueError(
                f"{cat.display} {row.version} requires {package}{spec}, but CUDA {cuda} / "
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


def framework_of(combo: Combination) -> str:
    """The framework a combination is of (matrix.expand gives each exactly one)."""
    return next(f for f in FRAMEWORKS if f in combo)


def resolve(m: LoadedMatrix) -> Resolution:
    result = Resolution()
    for combo in expand(m):
        cat = catalog(framework_of(combo))
        try:
            cell = _resolve_one(m, cat, combo)
        except _Rejected as why:
            if combo["_include"] is not None:
                raise m.error(
                    f"include entry {combo['_include'] + 1} cannot be built: {why}",
                    ("matrix", "include", combo["_include"]),
                ) from None
            entry = {k: combo[k] for k in (*AXES, "cuda", "cudnn") if k in combo}
            if entry.get("arch") == "amd64":
                del entry["arch"]  # named only for the arm64 ones, as cell names do
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
    key = cat.framework
    requested = combo[key]
    row = cat.release(requested)
    if row is None:
        raise m.error(unknown_release(cat, requested),
                      (*where, key) if inc is not None else ("matrix", key))  # fmt: skip
    python = combo["python"]
    if python not in cat.pythons:
        raise m.error(
            f"Python {python} is outside the supported range of {cat.display} releases, "
            f"{cat.pythons[0]} to {cat.pythons[-1]}",
            (*where, "python") if inc is not None else ("matrix", "python"),
        )
    if python not in row.python:
        raise _Rejected(
            f"{cat.display} {row.version} has no wheels for Python {python} "
            f"(it supports {row.python[0]} to {row.python[-1]})"
        )
    variant = combo["variant"]
    arch = combo.get("arch", "amd64")
    if arch == "arm64":
        _check_arm64(cat, row, python, variant)
    cuda = cudnn = release = None
    wheels: dict[str, str] = {}
    install = ""  # <framework>==<version>, unless the CPU build is another one
    indexes: tuple[str, ...] = ()
    if variant == "cpu":
        if combo.get("cuda") or combo.get("cudnn"):
            raise _Rejected("cuda/cudnn are set on a CPU cell; add variant: gpu to the include")
        if row.cpu_version:
            # PyTorch's CPU build is not on PyPI: its own index (or the matrix's mirror).
            install = f"{cat.framework}=={row.cpu_version}"
            mirror = m.model.build.torch_cpu_index if cat.framework == "torch" else None
            indexes = tuple(i for i in (mirror or cat.cpu_index,) if i)
    else:
        if row.gpu_unsupported or row.gpu_default is None:
            raise _Rejected(row.gpu_unsupported or f"no GPU build of {cat.display} {row.version}")
        cuda = combo.get("cuda") or row.gpu_default[0]
        cudnn = combo.get("cudnn") or row.gpu_default[1]
        try:
            wheels = gpu_wheels(row, cuda, cudnn, cat)
        except ValueError as exc:
            raise _Rejected(str(exc)) from None
        release = cuda_release(row, cuda, cudnn, cat)
        if arch == "arm64":
            _check_arm64_pins(cat, row, wheels)
    base = _base(m, cat, python, arch)
    # Requirements files' lines join pip (so the lock, the build and drift see them); the
    # files' digests name an edit in `build --dry-run` (plan.input_digests).
    source = m.model.packages.pyproject
    pinned = m.model.packages.lock
    files = [*([source.file] if source else []), *m.model.packages.requirements,
             *combo.get("requirements", ()), *([pinned] if pinned else [])]  # fmt: skip
    chosen = _requirements_for(m, files, cat, row.version, python, MACHINE[arch])
    return Cell(
        name=cell_name(cat.short, row.minor, python, variant, cuda, arch),
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
        pip=tuple(m.model.packages.pip) + tuple(combo.get("pip", ())) + chosen.pip,
        constraints=chosen.constraints,
        left_out=chosen.left_out,
        hashes=chosen.hashes,
        apt=tuple(m.model.packages.apt) + tuple(combo.get("apt", ())),
        install=install,
        indexes=indexes,
        cuda_with_framework=cat.cuda_with_framework and variant == "gpu",
        requirements={p: m.requirements[p].digest for p in files},
        arch=arch,
    )


@dataclass(frozen=True)
class _Chosen:
    pip: tuple[str, ...]
    constraints: tuple[str, ...]
    left_out: tuple[str, ...]
    hashes: tuple[tuple[str, tuple[str, ...], str], ...]


def _requirements_for(
    m: LoadedMatrix, files: list[str], cat: Catalog, version: str, python: str, machine: str
) -> _Chosen:
    """What a cell takes from its requirements files: the lines whose markers hold for it,
    less those that only restate its framework; one that asks for another release of the
    framework than the cell's is an error naming both."""
    from packaging.requirements import Requirement

    from gpuenv.matrix.requirements import RequirementsProblem, for_cell

    try:
        chosen = for_cell(m.requirement_files(files), python, machine)
    except RequirementsProblem as exc:
        raise MatrixError(exc.path, exc.message, exc.line) from None
    root = m.dir.resolve()

    def where(line: Line) -> str:
        return f"{line.path.relative_to(root)}:{line.number}"

    pip: list[str] = []
    for line in chosen.kept:
        req = Requirement(line.requirement)
        if line.name == cat.framework:
            if not req.specifier.contains(Version(version), prereleases=True):
                raise MatrixError(
                    line.path,
                    f"{line.requirement} asks for another {cat.display} than the cell's "
                    f"{cat.display} {version} (Python {python}); pip would install the "
                    f"version the line asks for: change the line or the matrix's "
                    f"{cat.framework} versions",
                    line.number,
                )
            if not req.extras:
                continue  # the cell installs its framework already
        pip.append(line.requirement)
    for line in chosen.constraints:
        req = Requirement(line.requirement)
        if line.name == cat.framework and not req.specifier.contains(
            Version(version), prereleases=True
        ):
            raise MatrixError(
                line.path,
                f"constraint {line.requirement} excludes the cell's {cat.display} {version}; "
                "change the line or the matrix's versions",
                line.number,
            )
    hashed = [x for x in (*chosen.kept, *chosen.constraints) if x.hashes]
    return _Chosen(
        tuple(pip),
        tuple(c.requirement for c in chosen.constraints if c.name != cat.framework),
        tuple(f"{where(x)}: {x.text}" for x in chosen.left_out),
        tuple((x.name, x.hashes, where(x)) for x in hashed),
    )


def _check_arm64(cat: Catalog, row: FrameworkRelease, python: str, variant: str) -> None:
    """Why an arm64 combination cannot be built (_Rejected), from the wheels the index has."""
    if row.aarch64_python is None:
        raise _Rejected(f"{cat.display} {row.version} has no Linux aarch64 wheels")
    if python not in row.aarch64_python:
        have = ", ".join(row.aarch64_python)
        raise _Rejected(
            f"{cat.display} {row.version} has no aarch64 wheels for Python {python} "
            f"(aarch64: {have})"
        )
    if variant == "gpu" and cat.framework == "tensorflow":
        # TensorFlow's aarch64 wheels are CPU builds, and its and-cuda extra names the CUDA
        # 12 wheels with no aarch64 marker: it would pull x86_64-only CUDA wheels.
        raise _Rejected(
            f"{cat.display} has no GPU build for arm64: its aarch64 wheels are CPU-only "
            "(its and-cuda extra would pull x86_64 CUDA wheels); use variant: cpu, or "
            "PyTorch or JAX for arm64 GPUs"
        )


def _check_arm64_pins(cat: Catalog, row: FrameworkRelease, wheels: dict[str, str]) -> None:
    """The aarch64 wheel's own CUDA requirements (PyTorch's differ in form from the x86_64
    wheel's) must hold for the pins the cell installs."""
    for package, spec in sorted(row.aarch64_cuda_requires.items()):
        pinned = wheels.get(package)
        if pinned is None or (spec and Version(pinned) not in SpecifierSet(spec)):
            raise _Rejected(
                f"{cat.display} {row.version}'s aarch64 wheel requires {package}{spec}, "
                f"which the cell's CUDA wheel set pins as {pinned or 'nothing'}"
            )


def _base(m: LoadedMatrix, cat: Catalog, python: str, arch: str = "amd64") -> Base:
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
        return Base("debian", spec.debian, python, arch)
    chosen = spec.arm64 if arch == "arm64" and spec.arm64 else spec.image
    return Base("image", chosen, python, arch)


def _choose_defaults(m: LoadedMatrix, result: Resolution) -> None:
    d = m.model.default
    if d is None:
        result.default_cpu = next((c for c in result.cells if not c.is_gpu), None)
        result.default_gpu = next((c for c in result.cells if c.is_gpu), None)
        return
    framework, version = d.framework()
    row = catalog(framework).release(version)

    def wanted(c: Cell) -> bool:
        return (
            row is not None
            and c.framework == framework
            and c.framework_minor == row.minor
            and c.python == d.python
        )

    matching = [c for c in result.cells if wanted(c)]
    if not matching:
        raise m.error(
            f"default ({framework} {version}, python {d.python}) is not a cell of the "
            "matrix; pick one that `gpuenv matrix` lists",
            ("default",),
        )
    result.default_cpu = next((c for c in matching if not c.is_gpu), None)
    gpus = [c for c in matching if c.is_gpu]
    # Prefer the framework's own tested CUDA when several GPU cells match.
    gpus.sort(key=lambda c: (row is None or (c.cuda, c.cudnn) != row.gpu_default, c.name))
    result.default_gpu = gpus[0] if gpus else None


def cuda_release(row: FrameworkRelease, cuda: str, cudnn: str, cat: Catalog) -> str | None:
    """The exact CUDA release a GPU cell's wheels are: an exact row's own (cuda-toolkit
    13.0.3 for PyTorch 2.13), else the toolkit set's."""
    if row.exact and (cuda, cudnn) == row.gpu_default and row.gpu_release:
        return row.gpu_release
    toolkit = cat.toolkits.get(cuda)
    return toolkit.release if toolkit else None


def unknown_release(cat: Catalog, requested: str) -> str:
    """The error for a release the catalog does not hold: what it holds, and the newest."""
    newest = cat.newest()
    when = f", refreshed {cat.refreshed}" if cat.refreshed else ""
    return (
        f"unknown {cat.display} version {requested}; gpuenv's catalog holds "
        f"{cat.known_releases()}, the newest {newest.minor} ({newest.version}{when}); "
        "a newer release: run `gpuenv catalog --refresh`"
    )


def driver_floor(cuda: str) -> str:
    return catalog().driver_floor[cuda.split(".")[0]]
