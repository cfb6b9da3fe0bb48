"""Local wheels in requirements files (`./dist/x-1.0-py3-none-any.whl`, `x @ file:...`):
taken from inside the project directory only, locked by their sha256 under a path relative
to the matrix (no path of this machine), resolved by uv at their absolute path, and copied
into the wheelhouse by the build under the lock's hash."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from gpuenv.building.lock import compile_requirements
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.project import open_project
from gpuenv.project.snapshot import depends_of
from gpuenv.store.credentials import Credentials
from gpuenv.store.fetch import Fetcher
from gpuenv.store.wheelhouse import Store, locked_requirements
from tests.unit.test_requirements import rejected, write

WHEEL = "localpkg-1.0-py3-none-any.whl"


def make_wheel(path: Path, name: str = "localpkg", body: str = "X = 1\n") -> str:
    """A minimal wheel with no dependencies; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", body)
        info = f"{name}-1.0.dist-info"
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        tags = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        zf.writestr(f"{info}/WHEEL", tags)
        zf.writestr(f"{info}/RECORD", "")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "line",
    [
        f"./dist/{WHEEL}",
        f"dist/{WHEEL}",
        f"localpkg @ file:dist/{WHEEL}",
        "localpkg @ file://{root}/dist/" + WHEEL,  # absolute, inside the project
        "localpkg @ file://${{GPUENV_TEST_ROOT}}/dist/" + WHEEL,  # as pip expands it
    ],
)
def test_a_local_wheel_reaches_the_cell_relative_to_the_matrix_with_its_hash(
    tmp_path, monkeypatch, line
):
    root = tmp_path.resolve()
    sha = make_wheel(root / "dist" / WHEEL)
    monkeypatch.setenv("GPUENV_TEST_ROOT", str(root))
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "GPUENV_TEST_ROOT")  # filled only when named
    (root / "reqs.txt").write_text(line.format(root=root) + "\n")
    matrix = write(root)
    cell = open_project(matrix).cells[0]
    assert cell.pip == ("rich", f"localpkg @ file:dist/{WHEEL}")
    assert [(name, hashes) for name, hashes, _ in cell.hashes] == [("localpkg", (sha,))]
    # What the lock's inputs digest covers names no path of this machine.
    assert str(root) not in repr(lockfile.env_requirements(cell))
    # Its bytes are an input: a new wheel under the same name drifts the lock.
    before = lockfile.inputs_digest(cell, None)
    make_wheel(root / "dist" / WHEEL, body="X = 2\n")
    # A cached reading of the matrix (gpuenv/project/snapshot.py) misses on that edit too.
    assert str(root / "dist" / WHEEL) in depends_of(open_project(matrix).matrix)
    assert lockfile.inputs_digest(open_project(matrix).cells[0], None) != before


@pytest.mark.parametrize(
    ("line", "setup", "says"),
    [
        (f"../{WHEEL}", "outside", "is outside the project directory"),
        (f"./link/{WHEEL}", "symlink-out", "is outside the project directory"),
        (f"localpkg @ file:link/{WHEEL}", "symlink-out", "is outside the project directory"),
        (f"~/{WHEEL}", None, "pip would install it from the home directory"),
        (f"./dist/{WHEEL}", None, "does not exist (pip would stop here too)"),
        ("./dist/localpkg-1.0.tar.gz", "sdist", "gpuenv takes local wheels (.whl) only"),
        (f"other @ file:dist/{WHEEL}", "wheel", "that wheel is localpkg's"),
        ("./dist/not-a-wheel.whl", "badname", "not a wheel's file name"),
        (f"./dist/{WHEEL} --hash=sha256:{'0' * 64}", "wheel", "none of the line's --hash"),
        (f"localpkg @ file://host.example/dist/{WHEEL}", None, "with no host"),
        (f"localpkg @ ./dist/{WHEEL}", "wheel", "write localpkg @ file:PATH"),
        (f"./my dist/{WHEEL}", "space", "gpuenv takes local paths of letters"),
    ],
)
def test_local_paths_gpuenv_cannot_take_are_refused_at_their_line(tmp_path, line, setup, says):
    root = tmp_path / "project"
    root.mkdir()
    if setup == "outside":
        make_wheel(tmp_path / WHEEL)
    elif setup == "symlink-out":
        make_wheel(tmp_path / "elsewhere" / WHEEL)
        (root / "link").symlink_to(tmp_path / "elsewhere")
    elif setup == "sdist":
        (root / "dist").mkdir()
        (root / "dist" / "localpkg-1.0.tar.gz").write_bytes(b"")
    elif setup == "wheel":
        make_wheel(root / "dist" / WHEEL)
    elif setup == "space":
        make_wheel(root / "my dist" / WHEEL)
    elif setup == "badname":
        make_wheel(root / "dist" / "not-a-wheel.whl")
    (root / "reqs.txt").write_text("six\n\n" + line + "\n")
    message = rejected(write(root))
    assert message.startswith(f"error: {root.resolve() / 'reqs.txt'}:3: "), message
    assert says in message


def test_uv_resolves_it_at_its_absolute_path_and_the_resolution_names_it_relatively(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("UV_OFFLINE", "1")  # a wheel with no dependencies needs no index
    root = tmp_path.resolve()
    sha = make_wheel(root / "dist" / WHEEL)
    text = compile_requirements([f"localpkg @ file:dist/{WHEEL}"], "3.12", None, None, root=root)
    assert str(root) not in text
    [req] = locked_requirements(text)
    assert (req.name, req.version, req.url, req.hashes) == (
        "localpkg",
        "1.0",
        f"file:dist/{WHEEL}",
        frozenset({sha}),
    )


def test_the_build_copies_it_into_the_wheelhouse_under_the_locks_hash(tmp_path):
    root = tmp_path / "project"
    sha = make_wheel(root / "dist" / WHEEL)
    store = Store(tmp_path / "wheelhouse")
    # Offline too: the file is the project's, no index is asked.
    fetcher = Fetcher(store, credentials=Credentials({}), offline=True, project_dir=root)
    stored = fetcher.url_file(f"file:dist/{WHEEL}", sha)
    assert stored.read_bytes() == (root / "dist" / WHEEL).read_bytes()
    assert store.verified(sha) == stored

    # Changed since the lock: refused, not stored.
    make_wheel(root / "dist" / WHEEL, body="X = 2\n")
    fresh = Fetcher(Store(tmp_path / "other"), credentials=Credentials({}), project_dir=root)
    with pytest.raises(GpuenvError, match="the lock says"):
        fresh.url_file(f"file:dist/{WHEEL}", sha)
    # A symlink swapped in since the lock, leading outside: refused.
    os.replace(root / "dist", tmp_path / "moved")
    (root / "dist").symlink_to(tmp_path / "moved")
    with pytest.raises(GpuenvError, match="outside the project directory"):
        fresh.url_file(f"file:dist/{WHEEL}", None)
