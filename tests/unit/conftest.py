"""Shared fixtures for the unit tests: matrix files written to a temporary directory.

Tests take what they share from fixtures, not by importing this module (``import conftest``
would pick whichever conftest.py comes first on sys.path once tests/integration has one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = Path(__file__).resolve().parent
SHIPPED_MATRIX = REPO / "matrix.yaml"

# The smallest matrix that resolves: one TensorFlow, one Python, both variants.
MINIMAL_MATRIX = """\
name: acme/gpuenv
matrix:
  tensorflow: ["2.21"]
  python: ["3.11"]
  variant: [cpu, gpu]
bases:
  "3.11": {debian: bookworm}
"""

WriteMatrix = Callable[..., Path]


@pytest.fixture(autouse=True)
def _catalog_age_not_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite passes on any day: no "the catalog is N days old" line in what the verbs
    print (gpuenv/catalog/freshness.py; its own tests unset this)."""
    monkeypatch.setenv("GPUENV_CATALOG_MAX_AGE", "off")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`pytest tests/unit` runs on every core: pytest-xdist (a dev dependency) with `-n auto`,
    a module's tests on one worker (`--dist loadscope`: its module fixtures run once). Only
    for this directory as a whole: a file or a test alone starts sooner in one process, and
    tests/integration never runs in parallel (its tests share one engine; this conftest is
    not loaded before `pytest tests` parses its options). An explicit -n N (-n 0: one
    process) or --dist wins."""
    if hasattr(config, "workerinput") or getattr(config.option, "numprocesses", 0) is not None:
        return  # an xdist worker, -n given, or no xdist
    here = config.invocation_params.dir
    if config.args and all((here / arg).resolve() == UNIT for arg in config.args):
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "loadscope"


@pytest.fixture
def write_matrix(tmp_path: Path) -> WriteMatrix:
    """write_matrix(text, name="matrix.yaml") -> path of a matrix file holding ``text``."""
    counter = iter(range(1_000_000))

    def write(text: str = MINIMAL_MATRIX, name: str | None = None) -> Path:
        path = tmp_path / (name or f"matrix-{next(counter)}.yaml")
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def fake_socket(tmp_path: Path) -> Iterator[tuple[str, dict[tuple[str, str], Any]]]:
    """(socket path, routes): a tiny Engine API served there (tests/unit/engine_api.py)."""
    from engine_api import serving

    path = str(tmp_path / "engine.sock")
    with serving(path) as routes:
        yield path, routes


@pytest.fixture
def engine_on_fake_api(
    fake_socket: tuple[str, dict[tuple[str, str], Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, dict[tuple[str, str], Any]]:
    """(gpuenv's real Engine, through the Docker SDK, connected to the tiny Engine API of
    `fake_socket` as API 1.41; its routes, paths under /v1.41)."""
    from gpuenv.engine import client as engines

    path, routes = fake_socket
    version = (200, {"ApiVersion": "1.41", "Components": []})
    routes[("GET", "/version")] = routes[("GET", "/v1.41/version")] = version
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    return engines.connect(), routes


@pytest.fixture
def fake_engine() -> type:
    """The FakeEngine class (tests/unit/fake_engine.py): the one stand-in for the engine."""
    from fake_engine import FakeEngine

    return FakeEngine


@pytest.fixture
def minimal_matrix() -> str:
    return MINIMAL_MATRIX


@pytest.fixture
def shipped_matrix() -> Path:
    return SHIPPED_MATRIX


def _line_of(text: str, needle: str) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


@pytest.fixture
def line_of() -> Callable[[str, str], int]:
    """line_of(text, needle) -> the 1-based number of the only line holding ``needle``."""
    return _line_of
