"""Local project directories in requirements files (`./mypkg`, `mypkg @ file:mypkg`): named
by their pyproject.toml, inside the project directory only, locked by a content digest
(the sha256 of a deterministic tar that leaves out VCS and cache directories), kept in the
wheelhouse as that tar, and built as a tree in the sdist sandbox."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from gpuenv.building import sdists
from gpuenv.building.lock import compile_requirements, tree_hashes
from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.localtree import content_digest
from gpuenv.project.project import open_project
from gpuenv.store.credentials import Credentials
from gpuenv.store.fetch import Fetcher
from gpuenv.store.wheelhouse import IndexFile, Requirement, Store, index_key, locked_requirements
from tests.unit.test_requirements import rejected, write
from tests.unit.test_sdists import SANDBOX, _Engine

PYPROJECT = '[project]\nname = "mypkg"\nversion = "0.3"\n'


def make_tree(directory: Path, body: str = "Y = 1\n", pyproject: str = PYPROJECT) -> Path:
    (directory / "mypkg").mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(pyproject)
    (directory / "mypkg" / "__init__.py").write_text(body)
    return directory


def test_a_directory_reaches_the_cell_named_by_its_pyproject_with_its_content_digest(tmp_path):
    root = tmp_path.resolve()
    make_tree(root / "mypkg")
    (root / "reqs.txt").write_text("./mypkg\n")
    cell = open_project(write(root)).cells[0]
    assert cell.pip == ("rich", "mypkg @ file:mypkg")
    digest = content_digest(root / "mypkg", root)
    assert [(name, hashes) for name, hashes, _ in cell.hashes] == [("mypkg", (digest,))]
    (root / "reqs.txt").write_text("MyPkg[extra] @ file:mypkg\n")
    assert open_project(write(root)).cells[0].pip == ("rich", "MyPkg[extra] @ file:mypkg")


def test_the_content_digest_is_the_tree_s_alone(tmp_path):
    one = make_tree(tmp_path / "a" / "mypkg")
    before = content_digest(one, tmp_path)
    # The same tree elsewhere, written later: the same digest (no path, no mtime in it).
    two = make_tree(tmp_path / "b" / "mypkg")
    assert content_digest(two, tmp_path) == before
    # VCS and caches are left out.
    (one / ".git").mkdir()
    (one / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (one / "mypkg" / "__pycache__").mkdir()
    (one / "mypkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert content_digest(one, tmp_path) == before
    # A source edit, a new file, the execute bit: another digest.
    (one / "mypkg" / "__init__.py").write_text("Y = 2\n")
    edited = content_digest(one, tmp_path)
    assert edited != before
    (one / "mypkg" / "__init__.py").write_text("Y = 1\n")
    (one / "mypkg" / "__init__.py").chmod(0o755)
    assert content_digest(one, tmp_path) not in (before, edited)


@pytest.mark.parametrize(
    ("line", "setup", "says"),
    [
        (".", None, "is the project itself"),
        ("./", None, "is the project itself"),
        ("-e ./mypkg", "tree", "-e: pip would install that project in development mode"),
        ("./mypkg --hash=sha256:" + "0" * 64, "tree", "refuses --hash for it"),
        ("./empty/", "empty", "has neither pyproject.toml nor setup.py"),
        ("./legacy", "setup.py", "write NAME @ file:./legacy"),
        ("other @ file:mypkg", "tree", "that directory's project is mypkg"),
        ("./mypkg", "symlink-out", "is a symlink out of the project directory"),
        ("./mypkg", "symlinked-dir", "is a symlinked directory"),
        ("../elsewhere", "outside", "is outside the project directory"),
    ],
)
def test_directories_gpuenv_cannot_take_are_refused_at_their_line(tmp_path, line, setup, says):
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text(PYPROJECT)
    if setup in ("tree", "symlink-out", "symlinked-dir"):
        make_tree(root / "mypkg")
    if setup == "empty":
        (root / "empty").mkdir()
    elif setup == "setup.py":
        (root / "legacy").mkdir()
        (root / "legacy" / "setup.py").write_text("from setuptools import setup; setup()\n")
    elif setup == "symlink-out":
        (tmp_path / "secret").write_text("s3cret\n")
        (root / "mypkg" / "leak.txt").symlink_to(tmp_path / "secret")
    elif setup == "symlinked-dir":
        (root / "mypkg" / "more").symlink_to(tmp_path)
    elif setup == "outside":
        make_tree(tmp_path / "elsewhere")
    (root / "reqs.txt").write_text("six\n\n" + line + "\n")
    message = rejected(write(root))
    assert message.startswith(f"error: {root.resolve() / 'reqs.txt'}:3: "), message
    assert says in message
    assert "s3cret" not in message


def test_the_lock_holds_the_directory_relatively_with_its_content_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("UV_OFFLINE", "1")  # a project with no dependencies needs no index
    root = tmp_path.resolve()
    make_tree(root / "mypkg")
    (root / "reqs.txt").write_text("./mypkg\n")
    cell = open_project(write(root)).cells[0]
    text = compile_requirements(
        ["mypkg @ file:mypkg"], "3.12", None, None, root=root, trees=tree_hashes(cell)
    )
    assert str(root) not in text
    [req] = locked_requirements(text)
    assert (req.name, req.url, req.hashes) == (
        "mypkg",
        "file:mypkg",
        frozenset({content_digest(root / "mypkg", root)}),
    )


def test_the_build_keeps_its_tar_and_builds_the_tree_in_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "project"
    make_tree(root / "mypkg")
    digest = content_digest(root / "mypkg", root)
    store = Store(tmp_path / "wheelhouse")
    fetcher = Fetcher(store, credentials=Credentials({}), project_dir=root)
    stored = fetcher.url_file("file:mypkg", digest)
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest

    uv = tmp_path / "uv"
    uv.write_bytes(b"#!uv")
    engine = _Engine("mypkg-0.3-py3-none-any.whl")
    key = index_key(["https://pypi.example/simple/"])
    builder = sdists.WheelBuilder(engine, fetcher, key, lambda *_: "", lambda _: uv)  # type: ignore[arg-type]
    source = IndexFile("mypkg.tar", "file:mypkg", digest)
    wheel, _ = builder.wheel(Requirement("mypkg", "", frozenset({digest}), "file:mypkg"), source,
                             SANDBOX)  # fmt: skip
    assert wheel.filename == "mypkg-0.3-py3-none-any.whl"
    (run,) = engine.runs
    assert set(run["files"]) == {
        "/gpuenv-build/uv", "/gpuenv-build/src/mypkg/pyproject.toml",
        "/gpuenv-build/src/mypkg/mypkg/__init__.py",
    }  # fmt: skip
    assert run["command"][-1].endswith(" /gpuenv-build/src/mypkg")

    # Edited since the lock: refused, not stored.
    (root / "mypkg" / "mypkg" / "__init__.py").write_text("Y = 2\n")
    shutil.rmtree(tmp_path / "wheelhouse")
    with pytest.raises(GpuenvError, match="the lock says"):
        Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                project_dir=root).url_file("file:mypkg", digest)  # fmt: skip


def test_a_directory_whose_metadata_is_dynamic_is_built_first_for_it(tmp_path, monkeypatch):
    # A setup.py project: uv cannot read its dependencies statically and asks for them
    # (gpuenv/building/lock.py); the wheel is built in the sandbox and its METADATA read.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = (tmp_path / "project").resolve()
    (root / "legacy").mkdir(parents=True)
    (root / "legacy" / "setup.py").write_text("from setuptools import setup; setup()\n")
    uv = tmp_path / "uv"
    uv.write_bytes(b"#!uv")
    engine = _Engine("jp-1.4.0-py3-none-any.whl")  # the stand-in builds "jp"
    fetcher = Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                      project_dir=root)  # fmt: skip
    key = index_key(["https://pypi.example/simple/"])
    builder = sdists.WheelBuilder(engine, fetcher, key, lambda *_: "", lambda _: uv)  # type: ignore[arg-type]
    url = (root / "legacy").as_uri()  # what uv was given
    got = builder.metadata("jp", [f"jp @ {url}"], SANDBOX, None)
    assert (got.name, got.requires_dist) == ("jp", ("ply",))
    assert (got.url, got.sha256) == (url, content_digest(root / "legacy", root))
    (run,) = engine.runs
    assert "/gpuenv-build/src/legacy/setup.py" in run["files"]
