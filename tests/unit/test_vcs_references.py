"""VCS direct references in requirements files (`name @ git+https://HOST/REPO.git@REV`):
fetched with the user's git, REV resolved to its commit (which the cell and lock name),
the commit's tree exported into gpuenv's cache and taken as a local directory from there.
The repository is served here by a "dumb HTTP" server on 127.0.0.1 (a bare repository
after `git update-server-info`): no network beyond loopback, no engine."""

from __future__ import annotations

import functools
import hashlib
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.building import sdists
from gpuenv.building.lock import compile_requirements, tree_hashes
from gpuenv.matrix import vcs
from gpuenv.matrix.errors import GpuenvError
from gpuenv.matrix.localtree import content_digest
from gpuenv.project.project import open_project
from gpuenv.store.credentials import Credentials
from gpuenv.store.fetch import Fetcher
from gpuenv.store.wheelhouse import IndexFile, Requirement, Store, index_key, locked_requirements
from tests.unit.test_local_directories import PYPROJECT
from tests.unit.test_requirements import rejected, write
from tests.unit.test_sdists import SANDBOX, _Engine

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c",
       "init.defaultBranch=main", "-c", "commit.gpgsign=false"]  # fmt: skip


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, Path]]:
    """(The repository's git+http URL on loopback, its commit, the working copy.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    work = tmp_path / "work"
    (work / "mypkg").mkdir(parents=True)
    (work / "pyproject.toml").write_text(PYPROJECT)
    (work / "mypkg" / "__init__.py").write_text("Y = 1\n")
    # What pip checks out has every file, unsubstituted, whatever git archive would do.
    (work / ".gitattributes").write_text("NOTES export-ignore\nmypkg/v.py export-subst\n")
    (work / "NOTES").write_text("kept\n")
    (work / "mypkg" / "v.py").write_text("V = '$Format:%d$'\n")
    _git("init", "--quiet", cwd=work)
    _git("add", ".", cwd=work)
    _git("commit", "--quiet", "-m", "one", cwd=work)
    _git("tag", "v0.3", cwd=work)
    public = tmp_path / "public"
    public.mkdir()
    _git("clone", "--quiet", "--bare", str(work), str(public / "mypkg.git"), cwd=tmp_path)
    _git("update-server-info", cwd=public / "mypkg.git")
    handler = functools.partial(_Quiet, directory=str(public))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        url = f"git+http://127.0.0.1:{server.server_address[1]}/mypkg.git"
        # These tests read the project as the fetching step does (`gpuenv lock`, `build`);
        # tests/unit/test_untrusted_project.py: reading alone fetches nothing.
        with vcs.fetching():
            yield url, _git("rev-parse", "HEAD", cwd=work), work
    finally:
        server.shutdown()
        server.server_close()


def test_a_branch_or_tag_reaches_the_cell_as_its_commit_with_the_tree_s_digest(tmp_path, served):
    url, commit, _ = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    for rev in ("main", "v0.3", commit):
        (root / "reqs.txt").write_text(f"mypkg[extra] @ {url}@{rev}\n")
        cell = open_project(write(root)).cells[0]
        assert cell.pip == ("rich", f"mypkg[extra] @ {url}@{commit}")
        [(name, (digest,), _)] = cell.hashes
        tree = tmp_path / "cache" / "gpuenv" / "vcs"
        [exported] = tree.glob(f"*/{commit}/mypkg")
        assert not (exported / ".git").exists()
        assert (exported / "mypkg" / "__init__.py").read_text() == "Y = 1\n"
        assert (exported / "NOTES").is_file()
        assert (exported / "mypkg" / "v.py").read_text() == "V = '$Format:%d$'\n"
        assert (name, digest) == ("mypkg", content_digest(exported, exported))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("mypkg @ {url}", "no revision; pip would check out the default branch"),
        ("mypkg @ {url}@", "no revision"),
        ("mypkg @ {url}@nosuch", "'nosuch' is no branch, tag or commit of that repository"),
        ("mypkg @ {url}@main#egg=mypkg", "remove the fragment"),
        ("mypkg @ {url}@main#subdirectory=sub", "subdirectory= builds a subdirectory"),
        ("mypkg @ git+ssh://example.com/x/mypkg.git@main", "pip would run ssh"),
        ("mypkg @ git+http://example.com/x/mypkg.git@main", "over https only (plain http"),
        ("mypkg @ git+file:///tmp/mypkg.git@main", "over https only"),
        ("mypkg @ {url}@-main", "is not a branch, tag or commit name"),
        ("other @ {url}@main", "that repository's project is mypkg"),
        ("mypkg @ {url}@main --hash=sha256:" + "0" * 64, "remove the --hash"),
        ("mypkg @ hg+https://example.com/x/mypkg@1", "gpuenv checks out git repositories only"),
    ],
)
def test_references_gpuenv_cannot_take_are_refused_at_their_line(tmp_path, served, line, says):
    url, _, _ = served
    root = tmp_path / "project"
    root.mkdir()
    (root / "reqs.txt").write_text("six\n\n" + line.format(url=url) + "\n")
    message = rejected(write(root))
    assert message.startswith(f"error: {root.resolve() / 'reqs.txt'}:3: "), message
    assert says in message


def test_the_lock_names_the_commit_with_the_tree_s_digest(tmp_path, served, monkeypatch):
    monkeypatch.setenv("UV_OFFLINE", "1")  # a project with no dependencies needs no index
    url, commit, _ = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@main\n")
    cell = open_project(write(root)).cells[0]
    text = compile_requirements(
        [f"mypkg @ {url}@{commit}"], "3.12", None, None, root=root, trees=tree_hashes(cell)
    )
    assert str(tmp_path) not in text
    [req] = locked_requirements(text)
    assert (req.name, req.url, req.hashes) == ("mypkg", f"{url}@{commit}",
                                               frozenset(cell.hashes[0][1]))  # fmt: skip


def test_the_build_keeps_the_commit_s_tar_and_builds_it_in_the_sandbox(tmp_path, served):
    url, commit, work = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@v0.3\n")
    [(_, (digest,), _)] = open_project(write(root)).cells[0].hashes
    pinned = f"{url}@{commit}"
    # Another machine: nothing exported yet, so the build fetches the commit itself.
    shutil.rmtree(tmp_path / "cache" / "gpuenv" / "vcs")
    fetcher = Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                      project_dir=root)  # fmt: skip
    stored = fetcher.url_file(pinned, digest)
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == digest

    uv = tmp_path / "uv"
    uv.write_bytes(b"#!uv")
    engine = _Engine("mypkg-0.3-py3-none-any.whl")
    key = index_key(["https://pypi.example/simple/"])
    builder = sdists.WheelBuilder(engine, fetcher, key, lambda *_: "", lambda _: uv)  # type: ignore[arg-type]
    source = IndexFile("mypkg.tar", pinned, digest)
    wheel, _ = builder.wheel(Requirement("mypkg", "", frozenset({digest}), pinned), source,
                             SANDBOX)  # fmt: skip
    assert wheel.filename == "mypkg-0.3-py3-none-any.whl"
    (run,) = engine.runs
    assert set(run["files"]) == {
        "/gpuenv-build/uv", "/gpuenv-build/src/mypkg/pyproject.toml",
        "/gpuenv-build/src/mypkg/mypkg/__init__.py", "/gpuenv-build/src/mypkg/mypkg/v.py",
        "/gpuenv-build/src/mypkg/NOTES", "/gpuenv-build/src/mypkg/.gitattributes",
    }  # fmt: skip

    # The tag moved to another commit: the lock's commit is still the one fetched.
    (work / "mypkg" / "__init__.py").write_text("Y = 2\n")
    _git("commit", "--quiet", "-am", "two", cwd=work)
    shutil.rmtree(tmp_path / "wheelhouse")
    again = Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                    project_dir=root).url_file(pinned, digest)  # fmt: skip
    assert hashlib.sha256(again.read_bytes()).hexdigest() == digest
    # An exported tree edited since: refused, not stored.
    [exported] = (tmp_path / "cache" / "gpuenv" / "vcs").glob(f"*/{commit}/mypkg")
    (exported / "mypkg" / "__init__.py").write_text("Y = 3\n")
    shutil.rmtree(tmp_path / "wheelhouse")
    with pytest.raises(GpuenvError, match="the lock says"):
        Fetcher(Store(tmp_path / "wheelhouse"), credentials=Credentials({}),
                project_dir=root).url_file(pinned, digest)  # fmt: skip


def test_a_repository_whose_metadata_is_dynamic_is_asked_for_by_its_git_url(
    tmp_path, served, monkeypatch
):
    # A setup.py project: uv cannot read its metadata and asks for it (`sources`: the
    # sandbox build of gpuenv/building/sdists.py), by the pinned git URL, not the cache's path.
    monkeypatch.setenv("UV_OFFLINE", "1")
    url, _, work = served
    (work / "pyproject.toml").unlink()
    (work / "setup.py").write_text("from setuptools import setup; setup(name='mypkg')\n")
    _git("add", "-A", cwd=work)
    _git("commit", "--quiet", "-m", "legacy", cwd=work)
    public = tmp_path / "public" / "mypkg.git"
    _git("push", "--quiet", str(public), "main", cwd=work)
    _git("update-server-info", cwd=public)
    commit = _git("rev-parse", "HEAD", cwd=work)
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@main\n")
    cell = open_project(write(root)).cells[0]
    [(_, (digest,), _)] = cell.hashes
    asked: list[tuple[str, list[str]]] = []

    def sources(name: str, requirements: list[str]) -> sdists.Metadata:
        asked.append((name, requirements))
        return sdists.Metadata("mypkg", "0.3", (), url=f"{url}@{commit}", sha256=digest)

    text = compile_requirements([f"mypkg @ {url}@{commit}"], "3.12", None, None, root=root,
                                trees=tree_hashes(cell), sources=sources)  # fmt: skip
    assert asked == [("mypkg", [f"mypkg @ {url}@{commit}"])]
    [req] = locked_requirements(text)
    assert (req.url, req.hashes) == (f"{url}@{commit}", frozenset({digest}))


def test_a_branch_that_moves_is_resolved_again_a_commit_reading_is_kept(tmp_path, served):
    url, first, work = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@main\n")
    matrix = write(root)
    assert open_project(matrix, cached=True).cells[0].pip[-1].endswith(f"@{first}")
    (work / "mypkg" / "__init__.py").write_text("Y = 2\n")
    _git("commit", "--quiet", "-am", "two", cwd=work)
    public = tmp_path / "public" / "mypkg.git"
    _git("push", "--quiet", str(public), "main", cwd=work)
    _git("update-server-info", cwd=public)
    second = _git("rev-parse", "HEAD", cwd=work)
    # The matrix and the requirements file are unchanged; the branch is not.
    again = open_project(matrix, cached=True)
    assert again._matrix is not None  # read again, not the reading kept
    assert again.cells[0].pip[-1].endswith(f"@{second}")
    # A full commit names one tree for good: the reading is kept.
    (root / "reqs.txt").write_text(f"mypkg @ {url}@{second}\n")
    assert open_project(matrix, cached=True).snapshot is not None
    assert open_project(matrix, cached=True)._matrix is None


def test_reading_takes_the_commit_the_last_fetch_left(tmp_path, served):
    # Reading alone (`gpuenv matrix`: a fresh context, outside vcs.fetching()) fetches
    # nothing (issue 44, N1): a branch names the commit the last `gpuenv lock` fetched,
    # even after the branch moved on the host.
    import contextvars

    url, first, work = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@main\n")
    matrix = write(root)
    assert open_project(matrix).cells[0].pip[-1].endswith(f"@{first}")  # the fetch
    (work / "mypkg" / "__init__.py").write_text("Y = 2\n")
    _git("commit", "--quiet", "-am", "two", cwd=work)
    public = tmp_path / "public" / "mypkg.git"
    _git("push", "--quiet", str(public), "main", cwd=work)
    _git("update-server-info", cwd=public)
    assert vcs.may_fetch() and not contextvars.Context().run(vcs.may_fetch)
    read = contextvars.Context().run(open_project, matrix)
    assert read.cells[0].pip[-1].endswith(f"@{first}")
    second = _git("rev-parse", "HEAD", cwd=work)
    assert open_project(matrix).cells[0].pip[-1].endswith(f"@{second}")  # fetched again


def test_the_tree_exports_on_a_python_without_extractall_s_filter(tmp_path, served, monkeypatch):
    # Debian bookworm's own Python (3.11.2) has no `filter=` (issue 44, item 5).
    import tarfile

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):  # type: ignore[no-untyped-def]
        raise TypeError("TarFile.extractall() got an unexpected keyword argument 'filter'")

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    url, commit, _ = served
    root = (tmp_path / "project").resolve()
    root.mkdir()
    (root / "reqs.txt").write_text(f"mypkg @ {url}@main\n")
    assert open_project(write(root)).cells[0].pip[-1] == f"mypkg @ {url}@{commit}"
