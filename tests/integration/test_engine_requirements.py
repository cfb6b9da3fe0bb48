"""A requirements file (`packages: {requirements: [...]}`) through a real build.

One CPU cell (TF 2.21, Python 3.11, as the shipped default: the base and apt layers come
from the cache) with a requirements file naming a small pure-Python package outside
TensorFlow's resolution, so the install step is a real one (~1-2 minutes here), behind a
marker that holds for the cell, beside an included file whose line's marker does not. The
package must be importable in the image at the pinned version, the other absent;
`build --dry-run` must leave the cell up to date after a comment-only edit and name the file
after a real one; a requirements path outside the matrix's directory is one error line
and builds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cells import BUILD_TIMEOUT, matrix_text, test_repository

pytestmark = pytest.mark.engine

REPOSITORY = test_repository("reqs")
CELL = "tf2.21-py3.11-cpu"
IMAGE = f"{REPOSITORY}:{CELL}"
PACKAGE, VERSION = "iniconfig", "2.1.0"  # tiny, pure Python, not a TensorFlow dependency


def write_matrix(root: Path, requirements: str) -> Path:
    doc = json.loads(matrix_text(name=REPOSITORY, variants=("cpu",)))
    doc["packages"]["requirements"] = [requirements]
    path = root / "matrix.yaml"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def dry_run(gpuenv, matrix: Path) -> dict:
    proc = gpuenv("build", "-f", str(matrix), "--dry-run", "--json")
    (cell,) = json.loads(proc.stdout)["cells"]
    return cell


def test_a_requirements_file_is_installed_and_its_edits_rebuild(
    gpuenv, parse_build, in_image, inspect, tmp_path
):
    (tmp_path / "requirements").mkdir()
    reqs = tmp_path / "requirements" / "extra.txt"
    # As pip reads it: a marker decided for the cell (true: installed; false: left out)
    # and an included file, relative to the including one.
    lines = f'{PACKAGE}=={VERSION}; sys_platform == "linux"\n-r win.txt\n'
    reqs.write_text(f"# a small package of our own\n{lines}", encoding="utf-8")
    (tmp_path / "requirements" / "win.txt").write_text('pywin32==308; sys_platform == "win32"\n')
    matrix = write_matrix(tmp_path, "requirements/extra.txt")
    assert dry_run(gpuenv, matrix)["action"] == "build"

    result = parse_build(gpuenv("build", "-f", str(matrix), "--json", timeout=BUILD_TIMEOUT))
    assert result[CELL]["status"] == "built", result
    code = f"import importlib.metadata as m, {PACKAGE}; print(m.version({PACKAGE!r}))"
    assert in_image(IMAGE, "python", "-c", code).strip() == VERSION
    absent = "import importlib.util as u; print(u.find_spec('win32api') is None)"
    assert in_image(IMAGE, "python", "-c", absent).strip() == "True"
    # The requirement is part of what the image says it was built from.
    inputs = json.loads(inspect(IMAGE)["Config"]["Labels"]["io.gpuenv.inputs"])
    assert inputs["requirements"].startswith("requirements/extra.txt=")

    reqs.write_text(f"{lines}# comments change nothing installed\n")
    assert dry_run(gpuenv, matrix)["action"] == "up-to-date"
    reqs.write_text(f"{PACKAGE}==2.0.0\n")
    plan = dry_run(gpuenv, matrix)
    assert plan["action"] == "build"
    assert "requirements file requirements/extra.txt changed" in plan["reasons"], plan


def test_a_requirements_path_outside_the_matrix_directory_builds_nothing(gpuenv, inspect, tmp_path):
    inner = tmp_path / "project"
    inner.mkdir()
    (tmp_path / "outside.txt").write_text(f"{PACKAGE}=={VERSION}\n")
    matrix = write_matrix(inner, "../outside.txt")
    before = inspect(IMAGE)
    proc = gpuenv("build", "-f", str(matrix), check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {matrix}:"), proc.stderr
    assert "outside the matrix's directory" in proc.stderr
    after = inspect(IMAGE)
    assert (before or {}).get("Id") == (after or {}).get("Id")
