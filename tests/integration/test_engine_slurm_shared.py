"""`run --slurm`'s shared directory against another local user of it (the review's H2): the
image gpuenv writes there and reuses by name is the one this user wrote, or gpuenv refuses.

Mallory, a throwaway user, shares a project directory with the test (the victim: root here,
whose checks are by owner, not by what root may write). She knows the image ID (public once
pushed) and plants a SquashFS and an `.env` with `LD_PRELOAD=` where gpuenv would look, as
her own directory or a symbolic link to one. The victim's `image.ensure` (what `run --slurm`
calls before submitting; no Slurm needed) must never hand those files to a job. The image
is the 125 MB base, written once per case by the real engine and tar2sqfs. Needs root (a
throwaway user).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import BASE_IMAGE
from support.cli import GPUENV, output, run

from gpuenv.engine import client as engine_client
from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.image import Shared, ensure, environment_lines, shared_dir

pytestmark = pytest.mark.engine

TROJAN_ENV = b"LD_PRELOAD=/tmp/evil.so\n"


@pytest.fixture(scope="module")
def mallory() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("a second local user needs root to make")
    if shutil.which("tar2sqfs") is None:
        pytest.skip("tar2sqfs is not installed (Debian: squashfs-tools-ng)")
    name = f"gpuenv-ma{os.getpid() % 100000}"
    run(["useradd", "--no-create-home", "--shell", "/bin/sh", name])
    try:
        yield name
    finally:
        run(["userdel", name], check=False)


def as_user(user: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


@pytest.fixture
def project(mallory: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project directory of root and Mallory's group, group-writable and sticky (as
    /scratch-like directories are; without the sticky bit it is refused, below); the
    victim's cache (where gpuenv records what it wrote) is its own."""
    root = Path(tempfile.mkdtemp(prefix="gpuenv-shared-", dir="/tmp"))
    os.chown(root, 0, pwd.getpwnam(mallory).pw_gid)
    root.chmod(0o1770)
    cache = Path(tempfile.mkdtemp(prefix="gpuenv-victim-cache-"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="module")
def base() -> Iterator[tuple[engine_client.Engine, engine_client.ImageInfo]]:
    eng = engine_client.connect()
    info = eng.image(BASE_IMAGE)
    assert info is not None, f"{BASE_IMAGE} is not in the engine"
    try:
        yield eng, info
    finally:
        eng.close()


def plant(user: str, images: Path, hexid: str) -> None:
    """Mallory's files where gpuenv would look for the image: readable by all."""
    script = (f"umask 022; mkdir -p {images} && cd {images} && "
              f"printf 'hsqs trojan root filesystem' > {hexid}.sqfs && "
              f"printf '{TROJAN_ENV.decode().strip()}\\n' > {hexid}.env && "
              f"cp {hexid}.env {hexid}.sh.env")  # fmt: skip
    done = as_user(user, script)
    assert done.returncode == 0, done.stderr


def files_under(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["old-layout", "her-directory", "a-symlink"])
def test_an_image_planted_by_another_user_is_never_used(mallory, project, base, where):
    """She plants where gpuenv looked up to now (DIR/gpuenv/images) and, in two cases,
    where it looks now: a directory of hers under the victim's name, or a symbolic link to
    one. gpuenv either writes its own image in a directory only the victim can enter, or
    refuses with one line; it never returns her files, and never touches them."""
    eng, info = base
    hexid = info.id.removeprefix("sha256:")
    plant(mallory, project / "gpuenv" / "images", hexid)
    own = project / f"gpuenv-{os.getuid()}"
    if where == "her-directory":
        plant(mallory, own / "images", hexid)
    elif where == "a-symlink":
        plant(mallory, project / "hers" / "images", hexid)
        done = as_user(mallory, f"ln -s {project / 'hers'} {own}")
        assert done.returncode == 0, done.stderr
    hers = files_under(project)
    said: list[str] = []
    try:
        files = ensure(eng, BASE_IMAGE, info, Shared(project), said.append, "/home/x")
    except SlurmError as exc:
        assert where != "old-layout", exc.message
        why = "belongs to " + mallory if where == "her-directory" else "is a symbolic link"
        assert f"{own} {why}" in exc.message and "\n" not in exc.message
        assert not any(line.startswith("reusing") for line in said)
    else:
        assert where == "old-layout", said
        assert not any(line.startswith("reusing") for line in said), said
        assert own.lstat().st_uid == os.getuid() and stat.S_IMODE(own.lstat().st_mode) == 0o700
        for path in (files.squashfs, files.env_file, files.shell_env_file):
            st = os.lstat(path)
            assert Path(path).parent == own / "images", path
            assert stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid(), path
            assert stat.S_IMODE(st.st_mode) == 0o600, path  # the review's L12
            assert b"LD_PRELOAD" not in Path(path).read_bytes()[:4096], path
        written = "".join(f"{line}\n" for line in environment_lines(info)).encode()
        assert Path(files.env_file).read_bytes() == written  # the image's ENV
        # Mallory cannot even read it (nor list the directory).
        peek = as_user(mallory, f"ls {own}; cat {files.env_file}")
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, peek
    assert all(path.read_bytes() == data for path, data in hers.items())  # hers, untouched


def test_a_directory_others_may_rename_in_is_refused(mallory, project):
    """Without the sticky bit any group member may rename the victim's directory away and
    put hers in its place, after gpuenv checked it (a pending job reads its image by name
    hours later): refused, as one error line, before anything is written."""
    project.chmod(0o770)
    proc = subprocess.run(
        [*GPUENV, "slurm", "run", "--dry-run", "--shared", str(project), "-i", BASE_IMAGE,
         "--", "true"],
        capture_output=True, text=True, timeout=60, cwd="/tmp",
        env={**os.environ, "PATH": str(project)},  # no Slurm: a dry run needs none
    )  # fmt: skip
    assert proc.returncode == 125, output(proc)
    assert proc.stderr.splitlines() == [
        f"error: --shared {project}: {project} is writable by other users (mode 770) and not "
        "sticky, so another user could replace what gpuenv keeps there; use a directory that "
        "only you (and root) can change, e.g. mkdir -m 700 /scratch/$USER, or make it sticky "
        "(chmod +t) as /tmp is"
    ], output(proc)
    assert list(project.iterdir()) == []
    with pytest.raises(SlurmError, match="not sticky"):
        shared_dir(str(project))


def test_a_changed_image_is_written_again(project, base):
    """Reused only while its three files hash as when they were written (recorded in the
    victim's own cache, not beside them): a changed `.env` is noticed and the image written
    again; an unchanged one is reused."""
    eng, info = base
    said: list[str] = []
    files = ensure(eng, BASE_IMAGE, info, Shared(project), said.append, "/home/x")
    first = {p: Path(p).read_bytes() for p in (files.env_file, files.shell_env_file)}
    sqfs = Path(files.squashfs).read_bytes()
    ensure(eng, BASE_IMAGE, info, Shared(project), said.append, "/home/x")
    assert said[-1] == f"reusing {files.squashfs}", said
    with open(files.env_file, "ab") as fh:  # any writer: the victim's own tool, root
        fh.write(TROJAN_ENV)
    ensure(eng, BASE_IMAGE, info, Shared(project), said.append, "/home/x")
    assert any("is not as gpuenv wrote it" in line for line in said), said
    assert said[-1].startswith("writing "), said
    assert {p: Path(p).read_bytes() for p in first} == first
    assert Path(files.squashfs).read_bytes() == sqfs  # deterministic: the same bytes again


def test_a_shared_directory_it_cannot_write_is_one_error(mallory, project):
    """The review's L2: a user who may not write there got a PermissionError traceback."""
    project.chmod(0o1755)  # root's; Mallory may enter, not write
    code = ("from pathlib import Path; from gpuenv.run.slurm.image import Shared\n"
            "from gpuenv.run.slurm import SlurmError\n"
            f"try:\n    Shared(Path({str(project)!r})).make()\n"
            "except SlurmError as exc:\n    print(exc.message)\n")  # fmt: skip
    # The system's Python (the virtualenv's links into root's home): these modules need
    # nothing outside the standard library.
    repo = Path(__file__).resolve().parents[2]
    done = as_user(mallory, f"PYTHONPATH={repo} python3 -c {shlex.quote(code)}")
    assert done.returncode == 0 and done.stderr == "", done
    assert done.stdout.startswith(f"--shared {project}: cannot make {project}/gpuenv-"), done
    assert "(Permission denied)" in done.stdout, done
