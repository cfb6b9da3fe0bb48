"""What gpuenv leaves behind, and what `gpuenv prune` removes (issue 46, item 4): only the
user's own, only what is stale unless --all, never what something may be using."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuenv.engine.client import VolumeInfo
from gpuenv.run.leftovers import Leftover, line, own_volumes, shared_files

LABEL = "io.gpuenv.workdir"
HOST = socket.gethostname()


def volume(name: str, owner: str, size: int = 1000, in_use: bool = False) -> VolumeInfo:
    return VolumeInfo(name, {LABEL: owner}, size, in_use)


def test_only_the_users_own_volumes_are_listed_and_only_a_gone_directory_is_stale(tmp_path):
    here = tmp_path / "project"
    here.mkdir()
    found = [
        volume("v-gone", f"{HOST}:1000:{tmp_path / 'deleted'}"),
        volume("v-here", f"{HOST}:1000:{here}"),
        volume("v-mounted", f"{HOST}:1000:{tmp_path / 'also-deleted'}", in_use=True),
        volume("v-other-user", f"{HOST}:1001:{tmp_path / 'deleted'}"),
        volume("v-other-host", f"laptop-2:1000:{tmp_path / 'deleted'}"),
        # A user's path holding the prefix of another's must not pass for it.
        volume("v-prefix", f"{HOST}:10000:{tmp_path / 'deleted'}"),
    ]
    mine, others = own_volumes(found, LABEL, 1000, lambda p: Path(p).is_dir())
    assert others == 3
    verdicts = {v.name: (v.stale, v.in_use, v.removable(False), v.removable(True)) for v in mine}
    assert verdicts == {
        "v-gone": (True, False, True, True),
        "v-here": (False, False, False, True),
        "v-mounted": (False, True, False, False),
    }


def _touch(path: Path, size: int = 10) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


@pytest.mark.parametrize(
    ("states", "engine_has", "removed"),
    [
        # Both jobs ended, the engine no longer has the image: all of it is stale.
        ({"41": True, "42": True}, False, {"gpuenv-41.out", "gpuenv-42.out", "gpuenv-42.failed",
                                          "a1b2.sqfs"}),
        # A job still runs: its files stay, and so does every SquashFS (it may mount it).
        ({"41": True, "42": False}, False, {"gpuenv-41.out"}),
        # The engine has the image: the next run uses the SquashFS.
        ({"41": True, "42": True}, True, {"gpuenv-41.out", "gpuenv-42.out", "gpuenv-42.failed"}),
        # Slurm cannot be asked: nothing is removed.
        ({"41": None, "42": None}, False, set()),
    ],
)  # fmt: skip
def test_shared_files_are_stale_once_their_job_ended_and_their_image_is_gone(
    tmp_path, states, engine_has, removed
):
    jobs, images = tmp_path / "jobs", tmp_path / "images"
    for name in ("gpuenv-41.out", "gpuenv-42.out", "gpuenv-42.failed", "notes.txt"):
        _touch(jobs / name)
    _touch(images / "a1b2.sqfs", 4000)
    _touch(images / "a1b2.env", 5)
    found = shared_files(jobs, images, states.get, lambda image_id: engine_has)
    assert "notes.txt" not in {Path(f.name).name for f in found}  # not gpuenv's
    assert {Path(f.name).name for f in found if f.removable(False)} == removed
    sqfs = next(f for f in found if f.kind == "SquashFS")
    assert (sqfs.mirrors, sqfs.size) == ("sha256:a1b2", 4005)


def test_each_line_says_what_it_copies_why_and_the_verdict():
    stale = Leftover(
        "volume", "gpuenv-workdir-1", 2_500_000, "/home/u/gone", "the directory is gone", True
    )
    kept = Leftover("volume", "gpuenv-workdir-2", -1, "/home/u/p", "the directory is here", False)
    assert line(stale, True, dry_run=True) == (
        "volume gpuenv-workdir-1  2.5 MB  /home/u/gone: the directory is gone; would remove"
    )
    assert line(stale, True, dry_run=False).endswith("; removed")
    assert line(kept, False, dry_run=False).endswith("  -  /home/u/p: the directory is here; "
                                                      "kept (--all removes it)")  # fmt: skip
