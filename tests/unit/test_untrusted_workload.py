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
    synced._unpack(_tar([*SPELLINGS, "out/model.pt"]))
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert written == ["out", "out/model.pt"]
    assert synced.crossed.back == 1
