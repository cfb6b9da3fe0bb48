"""Integration tests on a real Docker Engine: fixtures that build, inspect and clean up.

Everything here runs against the engine gpuenv itself would use (DOCKER_HOST, the current
context, or the local socket). When none answers, the whole directory is skipped with the
reason; set GPUENV_REQUIRE_ENGINE=1 (CI does not need to: it always starts one) to make
that an error instead.

Cost control: the two shipped cells (tf2.21-py3.11-cpu and its GPU sibling) are built once
per session by the CLI and reused. Test matrices use repositories in TEST_REPOSITORIES,
the same base (bookworm) and the same packages as those cells, so their RUN lines are
byte-identical to the shipped ones and the engine's layer cache turns their builds into a
few metadata steps. Tests that rely on that cache for speed request ``shipped_gpu`` (and
so ``shipped_cpu``) first. The session janitor removes every image the session created.

Tests take what they share from fixtures, not by importing this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED_MATRIX = REPO / "matrix.yaml"
HERE = Path(__file__).resolve().parent
TEST_REPOSITORY_PREFIX = "gpuenv-test"
# The repositories these tests build into (other suites may use other gpuenv-test/* names on
# the same engine at the same time; the janitor leaves those alone).
TEST_REPOSITORIES = frozenset({"gpuenv-test/tf", "gpuenv-test/ca", "gpuenv-test/fail"})
CPU_CELL = "tf2.21-py3.11-cpu"
GPU_CELL = "tf2.21-py3.11-cuda12.5-gpu"
# A package the tests add to one cell. It is already in every TF 2.21 environment (tensorflow
# -> requests -> certifi), so the pin changes the RUN line (and the spec hash) but not what
# is installed; the CA test and the package-change test use the same pin, so whichever
# builds second finds the layer in the engine's cache.
EXTRA_PIP = "certifi==2026.10.18"
BUILD_TIMEOUT = 1800  # seconds; a cold GPU build downloads ~3 GB of wheels


# --------------------------------------------------------------------------- engine or skip


def _engine_problem() -> str | None:
    """None when an engine answers, else why not (gpuenv's own one-line message)."""
    try:
        from gpuenv.engine import connect
        from gpuenv.errors import GpuenvError
    except ImportError as exc:  # pragma: no cover - the project is not installed
        return f"gpuenv is not importable: {exc}"
    try:
        connect()
    except GpuenvError as exc:
        return exc.message
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    problem = _engine_problem()
    if problem is None:
        return
    if os.environ.get("GPUENV_REQUIRE_ENGINE") == "1":
        raise pytest.UsageError(f"GPUENV_REQUIRE_ENGINE=1 but no Docker Engine: {problem}")
    skip = pytest.mark.skip(reason=f"needs a Docker Engine: {problem}")
    for item in mine:
        item.add_marker(skip)


# --------------------------------------------------------------------------- command helpers


def run(args: list[str], *, check: bool = True, timeout: float = 600, **kw: Any) -> Any:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def gpuenv_cmd(*args: str, check: bool = True, timeout: float = BUILD_TIMEOUT) -> Any:
    """Run the CLI as a user would (a subprocess), from the repository root."""
    return run([sys.executable, "-m", "gpuenv", *args], check=check, timeout=timeout, cwd=REPO)


def docker_cmd(*args: str, check: bool = True, timeout: float = 600) -> Any:
    return run(["docker", *args], check=check, timeout=timeout)


@pytest.fixture(scope="session")
def gpuenv() -> Callable[..., Any]:
    """gpuenv("build", ..., check=True) -> CompletedProcess (text)."""
    return gpuenv_cmd


@pytest.fixture(scope="session")
def docker() -> Callable[..., Any]:
    """docker("image", "inspect", ..., check=True) -> CompletedProcess (text)."""
    return docker_cmd


@pytest.fixture(scope="session")
def inspect() -> Callable[[str], dict[str, Any] | None]:
    def inspect(ref: str) -> dict[str, Any] | None:
        proc = docker_cmd("image", "inspect", ref, check=False)
        return json.loads(proc.stdout)[0] if proc.returncode == 0 else None

    return inspect


@pytest.fixture(scope="session")
def in_image() -> Callable[..., str]:
    """in_image(image, *cmd, user=None) -> stdout of `docker run --rm --network none`."""

    def in_image(image: str, *cmd: str, user: str | None = None) -> str:
        args = ["run", "--rm", "--network", "none"]
        if user is not None:
            args += ["--user", user]
        return str(docker_cmd(*args, image, *cmd, timeout=300).stdout)

    return in_image


def build_json(proc: Any) -> dict[str, dict[str, Any]]:
    """`gpuenv build --json`'s results, by cell name."""
    doc = json.loads(proc.stdout)
    return {r["cell"]: r for r in doc["results"]}


@pytest.fixture(scope="session")
def parse_build() -> Callable[[Any], dict[str, dict[str, Any]]]:
    return build_json


# --------------------------------------------------------------------------- test matrices


def matrix_text(
    *,
    name: str = f"{TEST_REPOSITORY_PREFIX}/tf",
    variants: tuple[str, ...] = ("cpu", "gpu"),
    include: list[dict[str, Any]] | None = None,
    pip: list[str] | None = None,
) -> str:
    """A small matrix: TF 2.21 on Python 3.11 (bookworm), as the shipped default cells.

    JSON is YAML; json.dumps keeps version strings quoted ("2.21", not 2.21)."""
    assert name in TEST_REPOSITORIES, f"{name}: add it to TEST_REPOSITORIES (the janitor)"
    doc: dict[str, Any] = {
        "name": name,
        "matrix": {"tensorflow": ["2.21"], "python": ["3.11"], "variant": list(variants)},
        "bases": {"3.11": {"debian": "bookworm"}},
        "packages": {"pip": pip or [], "apt": []},
    }
    if include:
        doc["matrix"]["include"] = include
    return json.dumps(doc, indent=2) + "\n"


@pytest.fixture
def write_test_matrix(tmp_path: Path) -> Callable[..., Path]:
    """write_test_matrix(filename="matrix.yaml", **matrix_text kwargs) -> path."""

    def write(filename: str = "matrix.yaml", **kwargs: Any) -> Path:
        path = tmp_path / filename
        path.write_text(matrix_text(**kwargs), encoding="utf-8")
        return path

    return write


# --------------------------------------------------------------------------- janitor


def _tags() -> set[str]:
    out = docker_cmd("images", "--format", "{{.Repository}}:{{.Tag}}").stdout
    return {line for line in out.split() if "<none>" not in line}


def _image_ids() -> set[str]:
    return set(docker_cmd("images", "-a", "-q", "--no-trunc").stdout.split())


def _title(image_id: str) -> str:
    proc = docker_cmd(
        "image",
        "inspect",
        "--format",
        '{{index .Config.Labels "org.opencontainers.image.title"}}',
        image_id,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


@pytest.fixture(scope="session", autouse=True)
def image_janitor(request: pytest.FixtureRequest) -> Iterator[None]:
    """Record the engine's images before the session; afterwards remove what it created.

    Removed: every tag in TEST_REPOSITORIES; the shipped cells' tags and their base's tag when they
    did not exist before; and new untagged images whose OCI title names one of those
    (superseded builds). Never touched: images that existed before the session, and anything
    without a gpuenv title (another user's work on a shared engine)."""
    if _engine_problem() is not None:
        yield
        return
    tags_before, ids_before = _tags(), _image_ids()
    yield
    shipped = {f"gpuenv/tensorflow:{CPU_CELL}", f"gpuenv/tensorflow:{GPU_CELL}"}
    shipped.add("gpuenv/debian:bookworm")  # the base the session bootstraps if missing
    created = {t for t in _tags() - tags_before if t in shipped}
    created |= {t for t in _tags() if t.split(":")[0] in TEST_REPOSITORIES}
    titles = set(created)
    # Cells before bases: a base is removable only once no cell image uses it.
    for tag in sorted(created, key=lambda t: t.startswith("gpuenv/debian:")):
        docker_cmd("rmi", tag, check=False)
    dangling = set(docker_cmd("images", "-q", "--no-trunc", "-f", "dangling=true").stdout.split())
    for image_id in dangling - ids_before:
        title = _title(image_id)
        if title.split(":")[0] in TEST_REPOSITORIES or title in titles:
            docker_cmd("rmi", image_id, check=False)


# --------------------------------------------------------------------------- shipped cells


@pytest.fixture(scope="session")
def extra_pip() -> str:
    return EXTRA_PIP


@pytest.fixture(scope="session")
def shipped_matrix() -> Path:
    return SHIPPED_MATRIX


@pytest.fixture(scope="session")
def shipped_cells() -> dict[str, dict[str, Any]]:
    """`gpuenv matrix --json` of the shipped matrix, by cell name."""
    doc = json.loads(gpuenv_cmd("matrix", "-f", str(SHIPPED_MATRIX), "--json").stdout)
    return {c["name"]: c for c in doc["cells"]}


def _build_shipped(cell: str) -> dict[str, Any]:
    proc = gpuenv_cmd("build", "-f", str(SHIPPED_MATRIX), cell, "--json")
    result = build_json(proc)[cell]
    assert result["status"] in ("built", "cached"), result
    return result


@pytest.fixture(scope="session")
def shipped_cpu() -> dict[str, Any]:
    """The shipped CPU cell, built (or found up to date) once per session."""
    return _build_shipped(CPU_CELL)


@pytest.fixture(scope="session")
def shipped_gpu(shipped_cpu: dict[str, Any]) -> dict[str, Any]:
    """The shipped GPU cell, built after its CPU sibling so it reuses its layers."""
    return _build_shipped(GPU_CELL)
