"""The workload as attacker (issue 44, N2): what it wrote comes back to the user's directory,
and on a case-insensitive client (macOS, Windows, WSL's /mnt/c) `.GIT/hooks/pre-commit` is
`.git/hooks/pre-commit`, run at the user's next commit. Names are compared case-folded and
Unicode-normalised always (gpuenv cannot know how the client's filesystem compares them),
and the spellings Windows and HFS+ take as the same name are folded too."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from gpuenv.run import sync, workdir
from gpuenv.run.workdir import Entry

SPELLINGS = [
    ".git/hooks/pre-commit",
    ".Git/hooks/pre-commit",
    ".GIT/hooks/pre-commit",
    ".gIt/config",
    "sub/.GiT/hooks/post-checkout",  # a repository below the top
    ".HG/hgrc",
    ".Svn/entries",
    ".\u212aube/config",  # KELVIN SIGN: case-folds to k (.kube)
    ".\u017fsh/authorized_keys",  # LATIN SMALL LETTER LONG S: case-folds to s (.ssh)
    ".g\u200cit/hooks/pre-commit",  # a zero-width non-joiner: HFS+ ignores it
    ".git./hooks/pre-commit",  # Windows drops trailing dots and spaces
    ".git /hooks/pre-commit",
    "GIT~1/hooks/pre-commit",  # .git's 8.3 short name on Windows
    ".ENV",
    ".Env.production",
    "PKG/__PYCACHE__/m.cpython-311.pyc",
    ".Aws/credentials",
    ".CONFIG/GCLOUD/application_default_credentials.json",
    "Id_Ed25519",
]


@pytest.mark.parametrize("rel", SPELLINGS)
def test_no_vcs_hook_or_secret_comes_back_under_any_spelling(rel):
    assert workdir.stays_home(rel)
    assert sync.to_bring_back({rel: Entry("f", 1, 5)}, {}) == []


@pytest.mark.parametrize(
    "rel",
    [
        ".gitignore",
        ".github/workflows/ci.yml",
        "digit/x.txt",
        "GIT/notes.md",
        "env.txt",
        "out/Model.PT",
        "caf\u00e9.txt",
    ],
)
def test_look_alikes_that_are_not_blocked_still_come_back(rel):
    assert not workdir.stays_home(rel)


def test_nfc_and_nfd_spellings_are_one_name():
    # A user's pattern with an accent matches the name in either normal form (macOS's
    # HFS+ stores NFD; most Linux tools write NFC).
    assert workdir.ignored("Caf\u00e9/x", ("caf\u00e9",), folded=True)
    assert workdir.ignored("Cafe\u0301/x", ("caf\u00e9",), folded=True)
    assert workdir.ignored("caf\u00e9/x", ("CAFE\u0301",), folded=True)
    assert not workdir.ignored("Caf\u00e9/x", ("caf\u00e9",))  # .dockerignore: as Docker


def _tar(names: list[str]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mode = 3, 0o755
            tar.addfile(info, io.BytesIO(b"#!x"))
    buf.seek(0)
    return buf


def test_the_unpacking_itself_refuses_them_whatever_the_listing_said(tmp_path: Path):
    # The engine side chooses the tar's names: the filter holds where files are written
    # too, not only where they are asked for.
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._unpack(_tar([*SPELLINGS, "out/model.pt"]), {*SPELLINGS, "out/model.pt"})
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert written == ["out", "out/model.pt"]
    assert synced.crossed.back == 1


# -- N3: the copy there is verified by content, not trusted by size and mtime.


def test_a_file_the_quick_check_passes_is_sent_when_its_content_there_differs():
    local = {rel: Entry("f", 3, 5, 0o644) for rel in ("train.py", "same.py", "gone.py", "unread")}
    local["run.sh"] = Entry("f", 3, 5, 0o755)
    staged = {**local, "run.sh": Entry("f", 3, 5, 0o4777)}  # chmod-ed there
    here = {"train.py": "aa", "run.sh": "bb", "same.py": "cc", "gone.py": "dd", "unread": ""}
    there = {"train.py": "ff", "run.sh": "bb", "same.py": "cc", "unread": ""}  # gone.py: none
    stale = sync.not_verified(local, staged, there, here)
    assert stale == ["gone.py", "run.sh", "train.py", "unread"]


def test_what_never_travels_is_removed_there_not_kept():
    # A workload's __pycache__ (or .venv) would run in the next run: the copy there is this
    # directory, nothing more.
    remote = {"__pycache__": Entry("d"), "__pycache__/train.cpython-311.pyc": Entry("f", 1, 1),
              ".venv": Entry("d"), "train.py": Entry("f", 1, 1)}  # fmt: skip
    gone, send, staged = sync.plan_send({"train.py": Entry("f", 1, 1)}, remote)
    assert (gone, send, staged) == ([".venv", "__pycache__"], [], {"train.py": Entry("f", 1, 1)})


# -- N4: the way back is as careful as the way out.


def test_the_way_back_stops_at_the_way_outs_limits(monkeypatch):
    files = {f"out/{i}": Entry("f", 10, 1) for i in range(5)}
    monkeypatch.setattr(workdir, "MAX_FILES", 3)
    assert sync.within_limits(sorted(files), files) == (
        ["out/0", "out/1", "out/2"], [("out/3", 10), ("out/4", 10)])  # fmt: skip
    monkeypatch.setattr(workdir, "MAX_FILES", 100)
    monkeypatch.setattr(workdir, "MAX_BYTES", 25)
    assert sync.within_limits(sorted(files), files)[0] == ["out/0", "out/1"]


def test_what_stayed_there_is_one_line_naming_it():
    left = [(f"out/{i}", 1000) for i in range(3)] + [("evil\x1b[2J.txt", 1)]
    assert sync.past_limits_line(left, "put data in a volume") == (
        "gpuenv: warning: 4 files (3.0 kB) not brought back, past the limits of what gpuenv "
        f"brings back ({workdir.MAX_FILES} files, {workdir.MAX_BYTES >> 20} MiB): out/ (3), "
        "evil\\x1b[2J.txt; "
        "put data in a volume"
    )


def _members(*members: tuple[str, bytes, int]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def _unpacked(tmp_path: Path, *members: tuple[str, bytes, int]) -> sync.Synced:
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._staged = {}
    synced._unpack(_members(*members), {m[0] for m in members})
    return synced


def test_modes_are_the_users_not_the_workloads(tmp_path: Path):
    (tmp_path / "tool.sh").write_text("mine")
    (tmp_path / "tool.sh").chmod(0o750)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "notes.txt").chmod(0o600)
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._new_mode = 0o666 & ~0o027  # what bring_back reads from the umask
    synced._staged = {n: workdir.entry_of((tmp_path / n).lstat(), tmp_path / n)  # type: ignore[misc]
                      for n in ("tool.sh", "notes.txt")}  # fmt: skip
    members = [("world.txt", b"w", 0o666), ("run.sh", b"r", 0o4755), ("tool.sh", b"t", 0o644),
               ("notes.txt", b"n", 0o777)]  # fmt: skip
    synced._unpack(_members(*members), {m[0] for m in members})
    modes = {n: (tmp_path / n).stat().st_mode & 0o7777 for n, _, _ in members}
    assert modes == {"world.txt": 0o640, "run.sh": 0o640, "tool.sh": 0o750, "notes.txt": 0o600}


def test_a_file_directory_swap_both_ways_is_a_warning_and_the_rest_comes_back(tmp_path: Path):
    (tmp_path / "out\x1b[2J").mkdir()  # a directory here, a file there
    (tmp_path / "res").write_text("mine")  # a file here, a directory there
    synced = _unpacked(tmp_path, ("out\x1b[2J", b"x", 0o644), ("res/b.txt", b"x", 0o644),
                       ("zz.txt", b"rest", 0o644))  # fmt: skip
    assert (tmp_path / "zz.txt").read_text() == "rest"
    assert (tmp_path / "res").read_text() == "mine" and (tmp_path / "out\x1b[2J").is_dir()
    assert sync.warnings(synced.crossed) == [
        "gpuenv: warning: out\\x1b[2J not brought back: it is a directory here",
        "gpuenv: warning: res/b.txt not brought back: res is a file here",
    ]


def test_a_hard_link_member_is_never_made_here(tmp_path: Path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("b.bin")
        info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
        tar.addfile(info)
    buf.seek(0)
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._unpack(buf, {"b.bin"})
    assert not (tmp_path / "b.bin").exists()
    assert sync.warnings(synced.crossed) == [
        "gpuenv: warning: b.bin not brought back: it is not a regular file there"
    ]


def test_hard_links_there_come_back_as_files_of_their_own_with_a_warning(tmp_path: Path):
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._linked = {"a.bin", "b.bin"}
    synced._unpack(_members(("a.bin", b"l", 0o644), ("b.bin", b"l", 0o644)), {"a.bin", "b.bin"})
    assert (tmp_path / "b.bin").read_bytes() == b"l"
    assert sync.warnings(synced.crossed) == [
        "gpuenv: warning: a.bin, b.bin were hard links there; each came back as a file of its own"
    ]


def test_only_what_was_asked_for_is_written_and_within_the_byte_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "MAX_BYTES", 5)
    synced = sync.Synced(None, tmp_path, "img", 1000, 1000, None)  # type: ignore[arg-type]
    synced._unpack(_members(("a", b"123", 0o644), ("extra", b"1", 0o644), ("b", b"123", 0o644)),
                   {"a", "b"})  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    assert synced.crossed.past_limits == [("b", 3)]
