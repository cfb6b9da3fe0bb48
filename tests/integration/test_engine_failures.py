"""A cell whose package does not exist fails clearly, leaves no tag, and --keep-going builds
the others. The other cell is the GPU cell of the same TF/Python: with the shipped GPU cell
built first (the ``shipped_gpu`` fixture), its layers come from the engine's cache."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.engine

MISSING = "gpuenv-no-such-package-xyz"
CPU = "tf2.21-py3.11-cpu"
GPU = "tf2.21-py3.11-cuda12.5-gpu"
REPOSITORY = "gpuenv-test/fail"


@pytest.fixture
def failing_matrix(write_test_matrix, shipped_gpu):
    bad = {"tensorflow": "2.21", "python": "3.11", "variant": "cpu", "pip": [f"{MISSING}==1.0"]}
    return write_test_matrix(name=REPOSITORY, include=[bad])


def containers(docker) -> set[str]:
    """Stopped build containers of an install step (the step that fails here). Only those:
    the engine may be shared, and other builds' running steps come and go meanwhile."""
    out = docker(
        "ps", "-a", "--no-trunc", "--filter", "status=exited", "--filter", "status=created",
        "--format", "{{.ID}} {{.Command}}",
    ).stdout  # fmt: skip
    return {line.split()[0] for line in out.splitlines() if "/tmp/gpuenv-uv" in line}


def test_matrix_puts_the_package_on_one_cell(failing_matrix, gpuenv):
    import json

    cells = json.loads(gpuenv("matrix", "-f", str(failing_matrix), "--json").stdout)["cells"]
    assert {c["name"]: c["pip"] for c in cells} == {CPU: [f"{MISSING}==1.0"], GPU: []}


def test_missing_package_fails_with_its_name_and_no_tag(failing_matrix, gpuenv, docker, inspect):
    before = containers(docker)
    proc = gpuenv("build", "-f", str(failing_matrix), check=False)
    assert proc.returncode == 1, proc.stderr
    assert MISSING in proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, proc.stderr
    assert CPU in error_lines[0]
    # Without --keep-going the GPU cell is not built either; neither cell is tagged.
    assert inspect(f"{REPOSITORY}:{CPU}") is None
    assert inspect(f"{REPOSITORY}:{GPU}") is None
    assert containers(docker) - before == set(), "the failed build left containers behind"


def test_keep_going_builds_the_other_cells(failing_matrix, gpuenv, parse_build, inspect, docker):
    before = containers(docker)
    proc = gpuenv("build", "-f", str(failing_matrix), "--keep-going", "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    results = parse_build(proc)
    assert results[CPU]["status"] == "failed"
    assert MISSING in results[CPU]["error"]
    assert results[CPU]["failed_step"] and "RUN" in results[CPU]["failed_step"]
    assert results[CPU]["image_id"] is None
    assert results[GPU]["status"] == "built", results[GPU]
    assert inspect(f"{REPOSITORY}:{CPU}") is None
    gpu = inspect(f"{REPOSITORY}:{GPU}")
    assert gpu is not None and gpu["Id"] == results[GPU]["image_id"]
    assert gpu["Config"]["Labels"]["io.gpuenv.cell"] == GPU
    assert containers(docker) - before == set(), "the failed build left containers behind"
