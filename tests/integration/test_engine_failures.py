"""A cell whose package does not exist fails clearly, leaves no tag, and --keep-going builds
the others. The other cell is the GPU cell of the same TF/Python: with the shipped GPU cell
built first (the ``shipped_gpu`` fixture), its layers come from the engine's cache.

An unlocked cell is resolved on the client when it is built (`uv pip compile`,
gpuenv/building/lock.py), so a package no index has stops that cell there, before anything is
sent to the engine: no build step fails, none is reported, and the error is the resolver's,
naming the package."""

from __future__ import annotations

import pytest
from support.cells import test_repository

pytestmark = pytest.mark.engine

MISSING = "gpuenv-no-such-package-xyz"
CPU = "tf2.21-py3.11-cpu"
GPU = "tf2.21-py3.11-cuda12.5-gpu"
REPOSITORY = test_repository("fail")


@pytest.fixture
def failing_matrix(write_test_matrix, shipped_gpu):
    bad = {"tensorflow": "2.21", "python": "3.11", "variant": "cpu", "pip": [f"{MISSING}==1.0"]}
    return write_test_matrix(name=REPOSITORY, include=[bad])


def test_matrix_puts_the_package_on_one_cell(failing_matrix, gpuenv):
    import json

    cells = json.loads(gpuenv("matrix", "-f", str(failing_matrix), "--json").stdout)["cells"]
    assert {c["name"]: c["pip"] for c in cells} == {CPU: [f"{MISSING}==1.0"], GPU: []}


def test_missing_package_fails_with_its_name_and_no_tag(failing_matrix, gpuenv, inspect):
    proc = gpuenv("build", "-f", str(failing_matrix), check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, proc.stderr
    assert CPU in error_lines[0] and MISSING in error_lines[0], error_lines[0]
    assert "cannot resolve" in error_lines[0], error_lines[0]
    # Without --keep-going the GPU cell is not built either; neither cell is tagged.
    assert f"building {REPOSITORY}:{GPU}" not in proc.stderr
    assert inspect(f"{REPOSITORY}:{CPU}") is None
    assert inspect(f"{REPOSITORY}:{GPU}") is None


def test_keep_going_builds_the_other_cells(failing_matrix, gpuenv, parse_build, inspect):
    proc = gpuenv("build", "-f", str(failing_matrix), "--keep-going", "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    results = parse_build(proc)
    assert results[CPU]["status"] == "failed"
    assert MISSING in results[CPU]["error"] and "cannot resolve" in results[CPU]["error"]
    # Stopped at the resolution, on the client: no build step ran, so none failed.
    assert results[CPU]["failed_step"] is None and results[CPU]["log_tail"] == []
    assert results[CPU]["image_id"] is None
    assert results[GPU]["status"] == "built", results[GPU]
    assert inspect(f"{REPOSITORY}:{CPU}") is None
    gpu = inspect(f"{REPOSITORY}:{GPU}")
    assert gpu is not None and gpu["Id"] == results[GPU]["image_id"]
    assert gpu["Config"]["Labels"]["io.gpuenv.cell"] == GPU
