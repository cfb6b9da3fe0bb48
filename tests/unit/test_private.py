"""gpuenv/store/private.py: the one way gpuenv writes where other users may write too. A
directory of its own (0700, owned, not a link, in a place no one else can swap it), files
made O_EXCL|O_NOFOLLOW 0600 under random names. What another user would plant is made here
by chown (root) where needed; tests/integration/test_engine_slurm_shared.py has a real
second user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuenv.store import private
from gpuenv.store.private import NotPrivate, new_file, own_directory, sha256_of, write_file

OTHER = 54321  # a uid no one on the machine has
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def test_made_0700_and_found_again(tmp_path):
    made = own_directory(tmp_path, "mine", "--shared")
    assert made == tmp_path.resolve() / "mine"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert own_directory(tmp_path, "mine", "--shared") == made


def test_a_symlink_in_its_place_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "mine").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotPrivate, match=r"mine is a symbolic link; gpuenv uses only"):
        own_directory(tmp_path, "mine", "--shared")


def test_a_wider_mode_is_refused_not_repaired(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine").chmod(0o755)
    with pytest.raises(NotPrivate, match="has mode 755, not 700"):
        own_directory(tmp_path, "mine", "--shared")
    assert stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o755


@needs_root
def test_another_users_directory_is_refused(tmp_path):
    (tmp_path / "mine").mkdir(mode=0o700)
    os.chown(tmp_path / "mine", OTHER, OTHER)
    with pytest.raises(NotPrivate, match=f"mine belongs to uid {OTHER}, not you"):
        own_directory(tmp_path, "mine", "--shared")


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o770, True), (0o1777, False),
                                               (0o755, False)])  # fmt: skip
def test_a_parent_others_may_rename_in_is_refused_unless_sticky(tmp_path, mode, refused):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    if refused:
        with pytest.raises(NotPrivate, match=f"is writable by other users .mode {mode:o}. and not"):
            own_directory(shared, "mine", "--shared")
        assert list(shared.iterdir()) == []
    else:
        assert own_directory(shared, "mine", "--shared").is_dir()


@needs_root
def test_a_parent_of_another_user_is_refused(tmp_path):
    """Its owner may rename entries in it, sticky or not."""
    shared = tmp_path / "theirs"
    shared.mkdir(mode=0o1777)
    os.chown(shared, OTHER, OTHER)
    with pytest.raises(NotPrivate, match=f"theirs belongs to uid {OTHER}"):
        own_directory(shared, "mine", "--shared")


def test_files_are_0600_and_renamed_into_place(tmp_path):
    write_file(tmp_path, "a.env", b"A=1\n")
    path = tmp_path / "a.env"
    assert path.read_bytes() == b"A=1\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.env"]


def test_a_planted_link_is_neither_followed_nor_written_through(tmp_path, monkeypatch):
    """The temporary name is random; even a link planted under the very name chosen is not
    followed (O_EXCL|O_NOFOLLOW), and a link at the final name is replaced, not written
    through."""
    victim = tmp_path / "victims-file"
    victim.write_bytes(b"precious")
    monkeypatch.setattr(private.secrets, "token_hex", lambda n: "f" * (2 * n))
    (tmp_path / f".a.env.{'f' * 16}.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_file(tmp_path, "a.env", b"A=1\n")
    assert victim.read_bytes() == b"precious"
    (tmp_path / f".a.env.{'f' * 16}.tmp").unlink()
    (tmp_path / "a.env").symlink_to(victim)
    write_file(tmp_path, "a.env", b"A=1\n")
    assert victim.read_bytes() == b"precious"
    assert not (tmp_path / "a.env").is_symlink() and (tmp_path / "a.env").read_bytes() == b"A=1\n"


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), new_file(tmp_path, "x") as (fd, _):
        os.close(fd)
        raise RuntimeError("tar2sqfs failed")
    assert list(tmp_path.iterdir()) == []


def test_only_a_regular_file_of_ours_is_hashed(tmp_path):
    (tmp_path / "f").write_bytes(b"")
    assert sha256_of(tmp_path / "f") == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert sha256_of(tmp_path / "link") is None
    assert sha256_of(tmp_path / "missing") is None
    assert sha256_of(Path("/dev/null")) is None
