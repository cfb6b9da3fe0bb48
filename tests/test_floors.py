"""The lower bounds pyproject.toml declares are true: a fresh virtualenv resolved with
`uv pip install --resolution lowest-direct` (every direct dependency at its floor) runs
`gpuenv matrix`, the unit tests and `gpuenv build --dry-run` (which needs an engine).

One test, about 3 minutes on 2 cores (the unit suite is most of it), so it lives beside
tests/unit rather than in it (the unit suite it runs must not contain it). It needs a
package index: when none answers, it is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _index_problem() -> str | None:
    """Why the index uv resolves against cannot be reached, or None when it answers."""
    index = os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL")
    url = (index or "https://pypi.org/simple").rstrip("/") + "/typer/"
    cafile = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT")
    context = ssl.create_default_context(cafile=cafile if cafile else None)
    try:
        with urllib.request.urlopen(url, timeout=15, context=context) as resp:
            resp.read(1)
    except OSError as exc:  # URLError, timeouts, TLS failures
        return f"{url}: {exc}"
    return None


def _uv() -> str:
    here = Path(sys.executable).parent / "uv"  # gpuenv depends on uv: it is in the venv
    return str(here) if here.exists() else (shutil.which("uv") or "uv")


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_the_lowest_direct_resolution_runs_gpuenv_and_the_unit_tests(tmp_path: Path) -> None:
    problem = _index_problem()
    if problem is not None:
        pytest.skip(f"needs a package index to resolve the floors: {problem}")
    venv = tmp_path / "floors"
    made = _run([_uv(), "venv", "-q", "-p", sys.executable, str(venv)], 120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _run(
        [_uv(), "pip", "install", "-q", "--python", str(python), "--resolution",
         "lowest-direct", "-e", f"{REPO}[test]"],
        600,
    )  # fmt: skip
    assert installed.returncode == 0, f"the floors do not resolve:\n{installed.stderr[-3000:]}"

    gpuenv = str(venv / "bin" / "gpuenv")
    matrix = _run([gpuenv, "matrix", "-f", "matrix.yaml"], 120)
    assert matrix.returncode == 0, matrix.stderr
    assert "tf2.21-py3.11-cpu" in matrix.stdout
    unit = _run(
        [str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/unit"], 1200
    )
    assert unit.returncode == 0, f"unit tests at the floors:\n{unit.stdout[-5000:]}"

    # Last: a dry run asks the engine for its images (CI has one; see scripts/engine.sh).
    plan = _run([gpuenv, "build", "--dry-run", "-f", "matrix.yaml", "--json"], 300)
    if "cannot reach the Docker Engine" in plan.stderr and not os.environ.get(
        "GPUENV_REQUIRE_ENGINE"
    ):
        pytest.skip(f"matrix and unit tests pass at the floors; build --dry-run {plan.stderr}")
    assert plan.returncode == 0, plan.stderr
    assert '"cell": "tf2.21-py3.11-cpu"' in plan.stdout
