"""A crafted `cache import` (issue 44, M2a), on the real engine, with no build: an image of
one empty layer (`docker import` of an empty tar) tagged as a cell of the JAX CPU matrix.

The review's reproduction: an export whose `bases/` holds that image, in the file named for
the cell's tag, was loaded ("1 base image(s) loaded"), and `gpuenv run` then ran it. Now the
import loads only the bases the matrix's cells name, and `run` refuses a cell's tag that
does not say gpuenv built it for that cell."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from support.cells import JAX_CPU_CELL, jax_cpu_matrix, test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import docker, has_image

pytestmark = pytest.mark.engine

REPOSITORY = test_repository("planted")
CELL_IMAGE = f"{REPOSITORY}:{JAX_CPU_CELL}"


def plant(tmp_path: Path) -> None:
    """CELL_IMAGE: one empty layer, no labels."""
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    docker("import", str(empty), CELL_IMAGE)


def test_a_crafted_export_cannot_plant_a_cell_and_run_refuses_a_planted_tag(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "matrix.yaml").write_text(jax_cpu_matrix(REPOSITORY))
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    before = set(docker("ps", "-aq", "--filter", f"ancestor={CELL_IMAGE}").stdout.split())
    try:
        plant(tmp_path)
        saved = tmp_path / "planted.tar"
        docker("save", "-o", str(saved), CELL_IMAGE)
        docker("rmi", CELL_IMAGE)
        export = tmp_path / "carry.tar"
        with tarfile.open(export, "w") as tar:  # the file name export gives a base's tag
            tar.add(saved, "bases/" + re.sub(r"[^A-Za-z0-9._-]", "_", CELL_IMAGE) + ".tar")

        proc = gpuenv_cmd("cache", "import", str(export), env=env, cwd=project, check=False)
        assert proc.returncode == 1, output(proc)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {export}: ")
        assert "no base of the matrix's cells" in proc.stderr, output(proc)
        assert not has_image(CELL_IMAGE), "the crafted archive tagged the cell"

        # However the tag got there, run does not start what carries it.
        plant(tmp_path)
        proc = gpuenv_cmd("run", "--", "true", env=env, cwd=project, check=False)
        assert proc.returncode == 125, output(proc)
        assert proc.stderr.strip().splitlines() == [
            f"error: {CELL_IMAGE} is not an image gpuenv built for cell {JAX_CPU_CELL} (its "
            "io.gpuenv.cell and io.gpuenv.spec-hash labels do not say so): remove that tag "
            f"(docker rmi {CELL_IMAGE}) and gpuenv builds the cell, or name the image itself "
            f"(-i {CELL_IMAGE}) to run it as it is"
        ], output(proc)
        after = set(docker("ps", "-aq", "--filter", f"ancestor={CELL_IMAGE}").stdout.split())
        assert after == before, "a container of the planted image was made"
    finally:
        subprocess.run(["docker", "rmi", "-f", CELL_IMAGE], capture_output=True, check=False)
