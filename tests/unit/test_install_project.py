"""`packages: {pyproject: {..., install_project: true}}`: the project itself built into a
wheel and installed into the image, as a local directory's line (`name @ file:.`), locked by
its content digest without the matrix and the locks gpuenv writes beside it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpuenv.building.lock import compile_requirements, tree_hashes
from gpuenv.matrix.localtree import content_digest, project_excludes
from gpuenv.project.project import open_project
from gpuenv.store.credentials import Credentials
from gpuenv.store.fetch import Fetcher
from gpuenv.store.wheelhouse import Store, archive_name, locked_requirements
from tests.unit.test_pyproject_source import refused, write

PYPROJECT = '[project]\nname = "trainer"\nversion = "0.1"\ndependencies = []\n'


def project(root: Path, pyproject: str = PYPROJECT) -> Path:
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("STEP = 1\n")
    (root / "pyproject.toml").write_text(pyproject)
    return write(root, "{install_project: true}")


def test_the_project_joins_the_cell_as_its_own_directory_with_its_digest(tmp_path):
    root = tmp_path.resolve()
    matrix = project(root)
    cell = open_project(matrix).cells[0]
    assert cell.pip[-1] == "trainer @ file:."
    digest = tree_hashes(cell)["trainer"]
    assert digest == content_digest(root, root, project_excludes("matrix.yaml"))
    # The matrix, its lock and pylock files are not part of it: locking changes nothing.
    (root / "matrix.lock").write_text("{}\n")
    (root / "pylock.cpu.toml").write_text("")
    assert tree_hashes(open_project(matrix).cells[0])["trainer"] == digest
    # The code is.
    (root / "trainer" / "__init__.py").write_text("STEP = 2\n")
    assert tree_hashes(open_project(matrix).cells[0])["trainer"] != digest
    # Off (the default): the project is not installed.
    write(root, "{}")
    assert all("trainer" not in p for p in open_project(matrix).cells[0].pip)


def test_a_project_without_a_name_cannot_be_installed(tmp_path):
    matrix = project(tmp_path, "[project]\ndependencies = []\n")
    message = refused(matrix)
    assert "install_project: " in message and "write NAME @ file:" in message, message


def test_the_lock_names_it_file_dot_and_the_build_tars_it_the_same_way(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_OFFLINE", "1")  # no dependencies: no index
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = (tmp_path / "p").resolve()
    cell = open_project(project(root)).cells[0]
    text = compile_requirements(
        ["trainer @ file:."], "3.11", None, None, root=root, trees=tree_hashes(cell)
    )
    assert str(root) not in text
    [req] = locked_requirements(text)
    assert (req.url, req.hashes) == ("file:.", frozenset({tree_hashes(cell)["trainer"]}))
    assert archive_name(req.url) == "project.tar"
    # A lock written since: the build's tar still has the locked digest.
    (root / "matrix.lock").write_text("{}\n")
    fetcher = Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                      project_dir=root, matrix_name="matrix.yaml")  # fmt: skip
    stored = fetcher.url_file("file:.", next(iter(req.hashes)))
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == next(iter(req.hashes))
