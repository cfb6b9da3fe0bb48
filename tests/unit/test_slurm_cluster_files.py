"""`gpuenv prune --login`'s parts without ssh (issue 46, item 4): the listing script and the
removal script of run/slurm/cluster_files.py run here by `sh` on a directory laid out as
slurm run leaves it, their output parsed, and the rules run/leftovers.py applies to it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.cli import app
from gpuenv.run.leftovers import cluster_leftovers
from gpuenv.run.slurm import cluster_files
from gpuenv.run.slurm.cluster_files import ClusterFiles, parse_listing

HEX = "ab" * 32
KEY = "0123456789abcdef"


def _sh(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    # PATH without squeue: the listing says Slurm is unreachable.
    return subprocess.run(["sh", "-c", script, "gpuenv-test", *argv], capture_output=True,
                          text=True, check=False, env={"PATH": "/usr/bin:/bin"})  # fmt: skip


def _lay_out(root: Path) -> Path:
    own = root / f"gpuenv-{os.getuid()}"
    for sub in ("jobs", "images", f"work/{KEY}/sub"):
        (own / sub).mkdir(parents=True)
    (own / "jobs" / "gpuenv-41.out").write_bytes(b"x" * 10)
    (own / "jobs" / "gpuenv-41.failed").write_bytes(b"3\n")
    (own / "jobs" / "notes.txt").write_text("not gpuenv's\n")
    (own / "images" / f"{HEX}.sqfs").write_bytes(b"s" * 4000)
    (own / "images" / f"{HEX}.env").write_bytes(b"e" * 5)
    (own / "work" / KEY / "sub" / "model.ckpt").write_bytes(b"m" * 9000)
    (own / "work" / f"{KEY}.from").write_text("laptop:/home/ada/my project\n")
    (own / "work" / "odd\nwork 9 x").mkdir()  # a name with a newline: skipped
    return own


def test_the_listing_script_finds_gpuenvs_files_and_is_parsed(tmp_path):
    own = _lay_out(tmp_path)
    proc = _sh(cluster_files._LIST, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    found = parse_listing(proc.stdout, str(tmp_path) + "/")
    assert found.own == str(own)
    assert sorted(found.jobs) == [("jobs/gpuenv-41.failed", 2), ("jobs/gpuenv-41.out", 10)]
    assert found.images == [(f"images/{HEX}.sqfs", 4005)]
    ((path, size, record),) = found.work
    assert (path, record) == (f"work/{KEY}", "laptop:/home/ada/my project")
    assert size >= 9000  # du's KiB, in bytes
    assert found.queue is None and found.job_ended("41") is None  # no squeue here


def test_the_listing_of_a_directory_gpuenv_never_wrote_is_empty_and_a_foreign_one_refused(
    tmp_path,
):
    proc = _sh(cluster_files._LIST, str(tmp_path))
    assert proc.returncode == 0 and proc.stdout == f"uid {os.getuid()}\n", proc.stderr
    (tmp_path / f"gpuenv-{os.getuid()}").symlink_to(tmp_path)
    assert _sh(cluster_files._LIST, str(tmp_path)).returncode == 4
    assert _sh(cluster_files._LIST, str(tmp_path / "nowhere")).returncode == 3


def test_squeues_lines_say_which_jobs_slurm_still_has():
    text = (f"uid 1000\njob 10 jobs/gpuenv-41.out\njob 7 jobs/gpuenv-42.out\njob 1 jobs/x.out\n"
            f"image 12 images/{HEX}.sqfs\nimage 1 images/../x.sqfs\nwork 3 work/{KEY}\n"
            "work 3 work/../../etc\nslurm ok\nqueued 42 RUNNING\n")  # fmt: skip
    found = parse_listing(text, "/scratch/ada")
    assert found.own == "/scratch/ada/gpuenv-1000"
    assert [p for p, _ in found.jobs] == ["jobs/gpuenv-41.out", "jobs/gpuenv-42.out"]
    assert found.images == [(f"images/{HEX}.sqfs", 12)]
    assert found.work == [(f"work/{KEY}", 3072, "")]
    assert (found.job_ended("41"), found.job_ended("42")) == (True, False)


def test_the_removal_script_removes_only_what_gpuenv_names(tmp_path):
    own = _lay_out(tmp_path)
    (own / "work" / KEY / "sub").chmod(0o500)  # a job's read-only directory
    outside = tmp_path / "precious"
    outside.write_text("not gpuenv's\n")
    paths = ["jobs/gpuenv-41.out", f"images/{HEX}.sqfs", f"work/{KEY}", "work/../../precious",
             "jobs/../../precious", "../precious"]  # fmt: skip
    proc = _sh(cluster_files._REMOVE, str(tmp_path), *paths)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:-1] == [f"gone {p}" for p in paths[:3]]
    assert outside.exists()
    assert sorted(p.name for p in (own / "jobs").iterdir()) == ["gpuenv-41.failed", "notes.txt"]
    assert list((own / "images").iterdir()) == []  # the SquashFS and its .env files
    assert [p.name for p in (own / "work").iterdir()] == ["odd\nwork 9 x"]


def _files(queue: dict[str, str] | None) -> ClusterFiles:
    return ClusterFiles(
        "/scratch/ada/gpuenv-1000",
        jobs=[("jobs/gpuenv-41.out", 10), ("jobs/gpuenv-42.out", 10)],
        images=[(f"images/{HEX}.sqfs", 4005)],
        work=[
            ("work/a", 1, "laptop:/gone"),
            ("work/b", 1, "laptop:/here"),
            ("work/c", 1, "desktop:/gone"),
            ("work/d", 1, ""),
        ],
        queue=queue,
    )


@pytest.mark.parametrize(
    ("queue", "removed"),
    [
        # Nothing queued: ended jobs' files, the image gone, the directory gone.
        ({}, {"jobs/gpuenv-41.out", "jobs/gpuenv-42.out", f"images/{HEX}.sqfs", "work/a"}),
        # A job still runs: its files, every SquashFS and every job directory stay.
        ({"42": "RUNNING"}, {"jobs/gpuenv-41.out"}),
        # Slurm not answering: nothing.
        (None, set()),
    ],
)
def test_job_directories_are_stale_when_this_hosts_directory_is_gone_and_nothing_runs(
    queue, removed
):
    found = cluster_leftovers(_files(queue), "ada@login1", lambda image_id: False, "laptop",
                              lambda path: path == "/here")  # fmt: skip
    assert {f.there for f in found if f.removable(False)} == removed
    work = {f.there: f for f in found if f.kind == "job directory"}
    assert work["work/a"].name == "ada@login1:/scratch/ada/gpuenv-1000/work/a"
    assert work["work/a"].mirrors == "laptop:/gone"
    if queue == {}:
        assert "gone" in work["work/a"].why and "here" in work["work/b"].why
        assert "desktop's directory" in work["work/c"].why  # another host's: cannot tell here
        assert work["work/d"].mirrors == "an unknown directory"
        everything = {f.there for f in found if f.removable(True)}
        assert {"work/b", "work/c", "work/d"} <= everything


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--login", "login1"], "error: prune --login reads the cluster's shared directory: "
                                "give it, --shared DIR or $GPUENV_SLURM_SHARED"),
        (["--login", "-oProxyCommand=x", "--shared", "/scratch"], "error: --login "),
        (["--login", "login1", "--shared", "scratch"], "must be absolute"),
    ],
)  # fmt: skip
def test_prune_login_is_refused_in_one_line_before_anything_is_reached(monkeypatch, args, message):
    monkeypatch.delenv("GPUENV_SLURM_SHARED", raising=False)
    monkeypatch.delenv("GPUENV_SLURM_LOGIN", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # never reached
    result = CliRunner().invoke(app, ["prune", *args])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
