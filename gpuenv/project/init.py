"""`gpuenv init`: a first, commented matrix.yaml for a project directory.

The choices come from the project's own files, and each is explained in a comment beside
it: the framework and the requirement that names it (requirements.txt, else pyproject.toml's
`[project] dependencies`), its newest catalog release that the requirement allows, the
newest Python that release has wheels for, a Debian base ships, and the project allows
(`requires-python`, `.python-version`), a CPU and a GPU variant, and requirements.txt wired
in as the cells' packages. The file is written only where none exists, and only after the
matrix it holds loads and resolves: `gpuenv run train.py` then needs no other step.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.catalog.compat import FRAMEWORKS, Catalog, FrameworkRelease, catalog
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

REQUIREMENTS = "requirements.txt"
PYPROJECT = "pyproject.toml"
PYTHON_VERSION = ".python-version"
MAX_BYTES = 1_000_000


@dataclass(frozen=True)
class Choice:
    framework: Catalog
    release: FrameworkRelease
    python: str
    suite: str
    asked: str  # the requirement that named the framework, as written
    asked_where: str  # "requirements.txt:3" or "pyproject.toml [project] dependencies"
    python_why: str
    source: str | None  # the requirements file wired in, if any


def init(directory: Path) -> Path:
    """Write `directory`/matrix.yaml; GpuenvError when one exists or nothing fits."""
    target = directory / "matrix.yaml"
    if target.exists() or target.is_symlink():
        raise GpuenvError(f"{target} exists; gpuenv init never overwrites it (edit it instead)")
    from gpuenv.matrix import vcs

    # Reading the project fetches nothing (issue 44, N1); a git reference not fetched yet
    # is left to `gpuenv lock`, which needs the matrix written here.
    with vcs.skipping():
        choice = choose(directory)
        text = render(directory, choice)
        _check(directory, text)
    try:
        with open(target, "x", encoding="utf-8") as fh:  # "x": never over a file made meanwhile
            fh.write(text)
    except FileExistsError:
        raise GpuenvError(f"{target} exists; gpuenv init never overwrites it") from None
    return target


def choose(directory: Path) -> Choice:
    asked, where, source = _framework_requirement(directory)
    name = asked.name.lower()
    cat = catalog(name)
    allowed, python_why = _python_constraint(directory)
    suites = {py: suite for suite, py in sorted(cat.debian_python.items())}
    for row in sorted(cat.releases.values(), key=lambda r: _key(r.version), reverse=True):
        if not asked.specifier.contains(row.version, prereleases=True):
            continue
        pythons = [p for p in row.python if p in suites and allowed.contains(f"{p}.0", True)]
        if pythons:
            python = max(pythons, key=_key)
            return Choice(cat, row, python, suites[python], str(asked), where, python_why, source)
    shipped = ", ".join(sorted(suites, key=_key))
    for row in sorted(cat.releases.values(), key=lambda r: _key(r.version), reverse=True):
        pythons = [p for p in row.python if allowed.contains(f"{p}.0", True)]
        if python_why and pythons and asked.specifier.contains(row.version, prereleases=True):
            # The requirement fits; only the Python the project pins has no Debian base.
            raise GpuenvError(
                f"{python_why}: no Debian base ships that Python (they ship {shipped}), "
                f"though {cat.display} {row.version} satisfies {asked} ({where}) for Python "
                f"{', '.join(pythons)}: allow one of {shipped} there, or write matrix.yaml "
                "by hand with an image base (docs/matrix.md)"
            )
    newest = max(cat.releases.values(), key=lambda r: _key(r.version))
    raise GpuenvError(
        f"{where}: no {cat.display} release in gpuenv's catalog satisfies {asked} with a "
        f"Python that a Debian base ships ({shipped}) and "
        f"{python_why or 'the project'} allows; the newest is {newest.version} "
        f"(Python {', '.join(newest.python)}): relax the requirement, or write matrix.yaml "
        "by hand with an image base (docs/matrix.md)"
    )


def _framework_requirement(directory: Path) -> tuple[Requirement, str, str | None]:
    """The first requirement naming TensorFlow, PyTorch or JAX that applies on Linux, from
    requirements.txt, else pyproject.toml's `[project] dependencies` (each read as a matrix's
    `packages` reads it): (packaging Requirement, where it was written, the requirements
    file to wire in)."""
    from packaging.requirements import Requirement

    from gpuenv.matrix.requirements import RequirementsProblem, read, read_pyproject

    root = directory.resolve()
    for source in (REQUIREMENTS, PYPROJECT):
        if not (directory / source).is_file():
            continue
        try:
            reqs = read(source, directory) if source == REQUIREMENTS else (
                read_pyproject(source, directory, (), ()))  # fmt: skip
        except RequirementsProblem as exc:
            place = f"{exc.path}:{exc.line}" if exc.line else f"{exc.path}"
            raise GpuenvError(f"{place}: {exc.message}") from None
        for line in reqs.lines:
            if line.name in FRAMEWORKS and _on_linux(line.marker):
                where = f"{line.path.relative_to(root)}:{line.number}"
                wired = source if source == REQUIREMENTS else None
                return Requirement(line.requirement), where, wired
    looked = [p for p in (REQUIREMENTS, PYPROJECT) if (directory / p).is_file()]
    raise GpuenvError(
        f"no TensorFlow, PyTorch or JAX requirement in {directory}"
        f" ({', '.join(looked) or f'no {REQUIREMENTS} or {PYPROJECT}'}); gpuenv builds "
        f"environments around one of them: add it (e.g. torch>=2.6) to {REQUIREMENTS}"
    )


def _on_linux(marker: str) -> bool:
    if not marker:
        return True
    from packaging.markers import Marker

    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": "x86_64"}  # fmt: skip
    try:
        return Marker(marker).evaluate(env)
    except Exception:  # a marker on the Python: decided per cell when the matrix loads
        return True


def _python_constraint(directory: Path) -> tuple[SpecifierSet, str]:
    """The Pythons the project allows (a SpecifierSet), and why, for the comment."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    pin = directory / PYTHON_VERSION
    if pin.is_file():
        text = pin.read_text(encoding="utf-8", errors="replace")[:200]
        match = re.search(r"(\d+)\.(\d+)", text)
        if match:
            minor = f"{match.group(1)}.{match.group(2)}"
            return SpecifierSet(f"=={minor}.*"), f"{PYTHON_VERSION} ({minor})"
    requires = (_pyproject(directory).get("project") or {}).get("requires-python")
    if isinstance(requires, str):
        try:
            return SpecifierSet(requires), f"{PYPROJECT} requires-python {requires!r}"
        except InvalidSpecifier:
            raise GpuenvError(
                f"{directory / PYPROJECT}: requires-python {requires!r} is not a version specifier"
            ) from None
    return SpecifierSet(), ""


def _pyproject(directory: Path) -> dict[str, Any]:
    path = directory / PYPROJECT
    if not path.is_file():
        return {}
    from gpuenv.matrix.files import read_regular
    from gpuenv.matrix.requirements import RequirementsProblem, pyproject_document

    try:
        return pyproject_document(read_regular(path, MAX_BYTES), str(path), path)
    except RequirementsProblem as exc:
        raise GpuenvError(exc.message) from None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def repository_name(directory: Path) -> str:
    """local/<the directory's name, as an image repository component>."""
    base = re.sub(r"[^a-z0-9._-]+", "-", directory.resolve().name.lower()).strip("._-")
    return f"local/{base or 'project'}"


def render(directory: Path, c: Choice) -> str:
    cat, row = c.framework, c.release
    minor = row.minor
    gpu = row.gpu_default
    allowed = ", ".join(row.python)
    source = (
        f"  # {c.source} is read as pip reads it, per cell (docs/bring-a-project.md);\n"
        f"  # its {cat.framework} line is checked against each cell's {cat.display}.\n"
        f"  requirements: [{c.source}]\n"
        if c.source
        else _pyproject_source(directory)
    )
    python_why = f", and {c.python_why} allows it" if c.python_why else ""
    gpu_line = (
        f"  # gpu: {cat.display} {row.version}'s tested CUDA {gpu[0]} / cuDNN {gpu[1]} wheels;\n"
        "  # `gpuenv run --gpus all` uses it.\n"
        if gpu
        else f"  # gpu: none ({row.gpu_unsupported or 'no GPU build in the catalog'})\n"
    )
    variants = "[cpu, gpu]" if gpu else "[cpu]"
    cpu_note = (
        f"  # cpu: {cat.display}'s CPU build ({cat.cpu_index}).\n"
        if cat.cpu_index
        else f"  # cpu: {cat.display}'s CPU wheels from PyPI.\n"
    )
    return (
        f"# Written by `gpuenv init` for {directory.resolve().name}/; edit freely\n"
        "# (every key: docs/matrix.md).\n"
        "# `gpuenv matrix` lists the cells; `gpuenv run train.py` builds the default CPU cell\n"
        "# the first time and runs the script in it, with this directory mounted.\n"
        f"name: {repository_name(directory)}   # images are tagged <name>:<cell>\n"
        "matrix:\n"
        f"  # {c.asked_where} asks for {c.asked}: {cat.display} {row.version} is the newest\n"
        "  # release in gpuenv's catalog it allows (`gpuenv catalog` lists them).\n"
        f'  {cat.framework}: ["{minor}"]\n'
        f"  # {cat.display} {minor} has wheels for Python {allowed}; {c.python} is the newest\n"
        f"  # of them a Debian base ships{python_why}.\n"
        f'  python: ["{c.python}"]\n'
        f"{cpu_note}{gpu_line}"
        f"  variant: {variants}\n"
        f"bases:\n"
        f'  "{c.python}": {{debian: {c.suite}}}   # bootstrapped locally from Debian {c.suite}\n'
        "packages:\n"
        f"{source}"
    )


def _pyproject_source(directory: Path) -> str:
    doc = _pyproject(directory)
    extras = sorted((doc.get("project") or {}).get("optional-dependencies") or {})
    groups = sorted(doc.get("dependency-groups") or {})
    offer = []
    if extras:
        offer.append(f"extras: [{', '.join(extras)}]")
    if groups:
        offer.append(f"groups: [{', '.join(groups)}]")
    more = f"  # Add {' and '.join(offer)} to take those too.\n" if offer else ""
    return (
        f"  # {PYPROJECT}'s [project] dependencies, read per cell as requirements files are\n"
        "  # (docs/bring-a-project.md); its framework line is checked against each cell's.\n"
        f"{more}"
        f"  pyproject: {{file: {PYPROJECT}}}\n"
    )


def _check(directory: Path, text: str) -> None:
    """The matrix loads and resolves to at least one cell, before it is written."""
    import tempfile

    from gpuenv.catalog.compat import resolve
    from gpuenv.matrix.errors import MatrixError
    from gpuenv.matrix.schema import load

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".matrix.", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        resolve(load(Path(tmp)))
    except MatrixError as exc:
        # The project's own files are the cause (a requirements line gpuenv refuses, say).
        raise GpuenvError(exc.message.replace(tmp, str(directory / "matrix.yaml"))) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
