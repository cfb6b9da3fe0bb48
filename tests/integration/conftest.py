"""Integration tests on a real Docker Engine: fixtures that build, inspect and clean up.

Everything here runs against the engine gpuenv itself would use (DOCKER_HOST, the current
context, or the local socket). When none answers, the whole directory is skipped with the
reason; set GPUENV_REQUIRE_ENGINE=1 (.ci/run does) to make that an error instead.

Cost control: the two shipped cells (tf2.21-py3.11-cpu and its GPU sibling) are built once
per session by the CLI and reused. Test matrices use repositories in TEST_REPOSITORIES,
the same base (bookworm) and the same packages as those cells, so their RUN lines are
byte-identical to the shipped ones and the engine's layer cache turns their builds into a
few metadata steps. Tests that rely on that cache for speed request ``shipped_gpu`` (and
so ``shipped_cpu``) first. The module janitor removes each module's images when it ends;
the session janitor (support/cleanup.py) removes the rest of what the session created
(the session fixtures' images, the session's registries) and fails on gpuenv containers
it left behind.

The helpers themselves live in support/ (one copy each); the *_fixtures.py plugins use the
same ones. Tests take what they share from fixtures, not by importing this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("support")  # before the import: its asserts explain

from support import cleanup  # noqa: E402
from support.cells import (  # noqa: E402
    CPU_CELL,
    EXTRA_PIP,
    GPU_CELL,
    MODULE_REPOSITORIES,
    SHIPPED_MATRIX,
    matrix_text,
)
from support.cli import build_cells, build_json, gpuenv_cmd  # noqa: E402
from support.engine import docker as docker_cmd  # noqa: E402
from support.engine import engine_problem, run_in_image  # noqa: E402
from support.engine import inspect as inspect_image  # noqa: E402

HERE = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- engine or skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    problem = engine_problem()
    if problem is None:
        return
    if os.environ.get("GPUENV_REQUIRE_ENGINE") == "1":
        raise pytest.UsageError(f"GPUENV_REQUIRE_ENGINE=1 but no Docker Engine: {problem}")
    skip = pytest.mark.skip(reason=f"needs a Docker Engine: {problem}")
    for item in mine:
        item.add_marker(skip)


# --------------------------------------------------------------------------- time per module

# Seconds per test module (setup, call and teardown of its tests), printed slowest first at
# the end of the run: where the suite's time goes, so it can be spent where it proves
# something (issue 47, item 6). A session fixture's cost (the shipped cells' builds) counts
# in the first module that asks for it; a janitor's in the module it cleans after (the
# session janitor's in the last module).
_MODULE_SECONDS: dict[str, float] = {}
# And per test (setup, call and teardown together): the slowest tests, where a module's time
# goes; module- and session-scoped fixtures count in the test that first asks for them.
_TEST_SECONDS: dict[str, float] = {}
SLOWEST_TESTS = 15


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    _TEST_SECONDS[report.nodeid] = _TEST_SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _MODULE_SECONDS:
        return
    terminalreporter.section("time per module, slowest first")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    total = sum(_MODULE_SECONDS.values())
    terminalreporter.write_line(f"{total:8.1f} s  in all ({len(_MODULE_SECONDS)} modules)")
    terminalreporter.section(f"the {SLOWEST_TESTS} slowest tests (setup, call and teardown)")
    slowest = sorted(_TEST_SECONDS.items(), key=lambda kv: -kv[1])[:SLOWEST_TESTS]
    for nodeid, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f} s  {nodeid}")


# --------------------------------------------------------------------------- command helpers


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
    """inspect(ref) -> `docker image inspect` of ref, or None."""
    return inspect_image


@pytest.fixture(scope="session")
def in_image() -> Callable[..., str]:
    """in_image(image, *cmd, user=None) -> stdout of CMD in a TrackedContainer (no network)."""
    return run_in_image


@pytest.fixture(scope="session")
def parse_build() -> Callable[[Any], dict[str, dict[str, Any]]]:
    return build_json


@pytest.fixture
def write_test_matrix(tmp_path: Path) -> Callable[..., Path]:
    """write_test_matrix(filename="matrix.yaml", **matrix_text kwargs) -> path."""

    def write(filename: str = "matrix.yaml", **kwargs: Any) -> Path:
        path = tmp_path / filename
        path.write_text(matrix_text(**kwargs), encoding="utf-8")
        return path

    return write


# --------------------------------------------------------------------------- janitor


@pytest.fixture(scope="session", autouse=True)
def image_janitor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Snapshot the engine before the session; afterwards remove what the session created
    and fail on gpuenv containers it left behind (the rule: support/cleanup.py)."""
    if engine_problem() is not None:
        yield
        return
    cleanup.claim_dir(tmp_path_factory.getbasetemp())
    before = cleanup.Snapshot.take()
    try:
        with cleanup.fails_on_leftovers(cleanup.session_containers):
            yield
    finally:
        cleanup.remove_session_containers()
        cleanup.sweep(before)


@pytest.fixture(scope="module", autouse=True)
def module_janitor() -> Iterator[None]:
    """When a module ends, what it created in the test repositories that no session fixture
    shares (support/cleanup.py's rule, sooner): the suite then holds one module's images
    at a time (a framework module alone builds ~11 GB), and the engine's build-cache
    collection can reclaim the layers only images held."""
    if engine_problem() is not None:
        yield
        return
    before = cleanup.Snapshot.take()
    yield
    cleanup.sweep(before, MODULE_REPOSITORIES, registries=False)


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


@pytest.fixture(scope="session")
def shipped_cpu() -> dict[str, Any]:
    """The shipped CPU cell, built (or found up to date) once per session."""
    return build_cells(CPU_CELL)[CPU_CELL]


@pytest.fixture(scope="session")
def shipped_gpu(shipped_cpu: dict[str, Any]) -> dict[str, Any]:
    """The shipped GPU cell, built after its CPU sibling so it reuses its layers."""
    return build_cells(GPU_CELL)[GPU_CELL]
