"""A requirements file (`packages: {requirements: [...]}`) through a real build.

One CPU cell (TF 2.21, Python 3.11, as the shipped default: the base and apt layers come
from the cache) with a requirements file naming a small pure-Python package outside
TensorFlow's resolution, so the install step is a real one (~1-2 minutes here), behind a
marker that holds for the cell, beside an included file whose line's marker does not. The
package must be importable in the image at the pinned version, the other absent;
`build --dry-run` must leave the cell up to date after a comment-only edit and name the file
after a real one; a requirements path outside the matrix's directory is one error line
and builds nothing.

The same file names two packages that publish no wheel, only a source distribution (so the
one install step also shows issue 34's sdists, at no build of its own): jsonpath-rw (pure
Python, the issue's), ply by a direct reference (`ply @ https://…/ply-3.11.tar.gz#sha256=…`)
and crcmod (a C extension of ~600 lines, which compiles in about a
second; without a compiler its setup.py falls back to pure Python, so the test asks for the
extension module). Each is built into a wheel once, in a network-less container of the
cell's base (crcmod in a removed image of it with gcc), and a second build reuses them.
A local wheel of the project (`./dist/localpkg-1.0-py3-none-any.whl`, made here) and a
local project directory (`./mypkg`, built as a tree in the same sandbox) are installed from
the project directory too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.cells import BUILD_TIMEOUT, matrix_text, test_repository

pytestmark = pytest.mark.engine

REPOSITORY = test_repository("reqs")
CELL = "tf2.21-py3.11-cpu"
IMAGE = f"{REPOSITORY}:{CELL}"
PACKAGE, VERSION = "iniconfig", "2.1.0"  # tiny, pure Python, not a TensorFlow dependency
SDISTS = {"jsonpath-rw": "1.4.0", "crcmod": "1.7"}  # no release of either ships a wheel
# A direct reference: jsonpath-rw's dependency ply by the URL of its sdist (its wheel is on
# PyPI too, but a URL names one file), checked by the hash in the fragment, as pip does.
PLY_URL = (
    "https://files.pythonhosted.org/packages/e5/69/882ee5c9d017149285cab114ebeab373308ef0f874"
    "fcdac9beb90e0ac4da/ply-3.11.tar.gz"
    "#sha256=00c7c1aaa88358b9c765b6d3000c6eec0ba42abca5351b095321aef446081da3"
)
SDIST_FILES = {f"{name}-{version}.tar.gz" for name, version in SDISTS.items()}
SDIST_FILES.update({"ply-3.11.tar.gz", "mypkg.tar"})


LOCAL_WHEEL = "localpkg-1.0-py3-none-any.whl"


def local_wheel(path: Path) -> None:
    """A wheel of the project's own, as `python -m build` leaves one in dist/."""
    import zipfile

    path.parent.mkdir(parents=True)
    info = "localpkg-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("localpkg/__init__.py", "X = 7\n")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: localpkg\nVersion: 1.0\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")


def local_project(path: Path) -> None:
    """A project directory with a pyproject.toml (setuptools, which the sandbox fetches)."""
    (path / "mypkg").mkdir(parents=True)
    (path / "pyproject.toml").write_text(
        '[project]\nname = "mypkg"\nversion = "0.3"\n'
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    (path / "mypkg" / "__init__.py").write_text("Y = 5\n")


def forget_built_wheels() -> None:
    """Drop the record of wheels built from SDISTS (a cache record that only spares work),
    so that this session's first build builds them, whatever an earlier session did."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    record = root / "gpuenv" / "built-wheels.json"
    if record.is_file():
        kept = {k: v for k, v in json.loads(record.read_text()).items()
                if v.get("source") not in SDIST_FILES}  # fmt: skip
        record.write_text(json.dumps(kept))


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
    gpuenv, parse_build, in_image, inspect, docker, tmp_path
):
    (tmp_path / "requirements").mkdir()
    reqs = tmp_path / "requirements" / "extra.txt"
    # As pip reads it: a marker decided for the cell (true: installed; false: left out)
    # and an included file, relative to the including one.
    lines = f'{PACKAGE}=={VERSION}; sys_platform == "linux"\n-r win.txt\n'
    lines += "".join(f"{name}=={version}\n" for name, version in SDISTS.items())
    lines += f"ply @ {PLY_URL}\n./dist/{LOCAL_WHEEL}\n./mypkg\n"
    local_wheel(tmp_path / "dist" / LOCAL_WHEEL)
    local_project(tmp_path / "mypkg")
    reqs.write_text(f"# a small package of our own\n{lines}", encoding="utf-8")
    (tmp_path / "requirements" / "win.txt").write_text('pywin32==308; sys_platform == "win32"\n')
    matrix = write_matrix(tmp_path, "requirements/extra.txt")
    assert dry_run(gpuenv, matrix)["action"] == "build"

    forget_built_wheels()
    proc = gpuenv("build", "-f", str(matrix), "--json", timeout=BUILD_TIMEOUT)
    result = parse_build(proc)
    assert result[CELL]["status"] == "built", result
    code = f"import importlib.metadata as m, {PACKAGE}; print(m.version({PACKAGE!r}))"
    assert in_image(IMAGE, "python", "-c", code).strip() == VERSION
    # The sdists: built on the engine (with gcc for crcmod's C), installed as wheels, and
    # no compiler in the image.
    assert (
        "jsonpath-rw-1.4.0.tar.gz: built into jsonpath_rw-1.4.0-py3-none-any.whl (pure "
        "Python, network none" in proc.stderr
    ), proc.stderr
    assert (
        "crcmod-1.7.tar.gz: built into crcmod-1.7-cp311-cp311-linux_x86_64.whl (with "
        "compilers, network none" in proc.stderr
    ), proc.stderr
    assert "ply-3.11.tar.gz: built into ply-3.11-py2.py3-none-any.whl (pure Python" in proc.stderr
    sdist_code = (
        "import importlib.metadata as m, shutil, jsonpath_rw, crcmod._crcfunext as ext; "
        "print(m.version('jsonpath-rw'), m.version('crcmod'), ext.__file__.endswith('.so'), "
        "jsonpath_rw.parse('a.b').find({'a': {'b': 3}})[0].value, shutil.which('gcc'))"
    )
    assert in_image(IMAGE, "python", "-c", sdist_code).split() == \
        ["1.4.0", "1.7", "True", "3", "None"]  # fmt: skip
    assert in_image(IMAGE, "python", "-c", "import localpkg; print(localpkg.X)").strip() == "7"
    assert "mypkg.tar: built into mypkg-0.3-py3-none-any.whl (pure Python" in proc.stderr
    local = "import mypkg, importlib.metadata as m; print(mypkg.Y, m.version('mypkg'))"
    assert in_image(IMAGE, "python", "-c", local).split() == ["5", "0.3"]
    leftovers = docker("ps", "-aq", "--filter", "label=io.gpuenv.sdist").stdout.strip()
    compilers = docker("images", "-q", "--filter", "label=io.gpuenv.sdist-build").stdout.strip()
    assert leftovers == compilers == "", (leftovers, compilers)
    # A second build (the image removed) takes the wheels built before: nothing is built.
    docker("rmi", IMAGE)
    again = gpuenv("build", "-f", str(matrix), "--json", timeout=BUILD_TIMEOUT)
    assert parse_build(again)[CELL]["status"] == "built"
    for filename in sorted(SDIST_FILES):
        assert f"{filename}: its wheel, built before, is reused" in again.stderr, again.stderr
    assert "built into" not in again.stderr and "installing gcc" not in again.stderr
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
