"""The working directory's way to an engine that cannot see it, and back: what travels,
what is removed there, what comes back (gpuenv/run/sync.py, gpuenv/run/workdir.py). The
engine's side is tests/integration/test_engine_another_host.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.engine.client import ContainerSpec
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import local, sync, workdir
from gpuenv.run.workdir import Entry

F = Entry("f", 10, 100)


def test_quick_check_compares_kind_size_and_whole_second_mtime():
    assert F.same(Entry("f", 10, 100, mode=0o755))  # a mode alone is not a change
    assert not F.same(Entry("f", 11, 100))
    assert not F.same(Entry("f", 10, 101))
    assert not F.same(Entry("d"))
    assert not F.same(None)
    assert Entry("d", mtime=5).same(Entry("d", mtime=9))  # a directory is there, or not
    assert not Entry("l", link="a").same(Entry("l", link="b"))


def test_the_copy_there_becomes_this_directory_caches_included():
    local = {"train.py": F, "data": Entry("d"), "data/x.csv": Entry("f", 3, 1)}
    remote = {
        "train.py": Entry("f", 10, 99),  # edited here since
        "data": Entry("d"),
        "data/x.csv": Entry("f", 3, 1),  # unchanged
        "old": Entry("d"),  # gone here: removed there, with what it holds
        "old/a.pt": Entry("f", 1, 1),
        "__pycache__": Entry("d"),  # never travels: removed there too (issue 44, N3)
        "__pycache__/t.pyc": Entry("f", 1, 1),
        "outputs": Entry("f", 1, 1),  # a directory here: replaced
    }
    local["outputs"] = Entry("d")
    gone, send, staged = sync.plan_send(local, remote)
    assert gone == ["__pycache__", "old", "outputs"]
    assert send == ["train.py", "outputs"]
    assert staged == {"train.py": F, "data": Entry("d"), "data/x.csv": Entry("f", 3, 1),
                      "outputs": Entry("d")}  # fmt: skip


def test_an_unchanged_directory_sends_nothing():
    local = {"a.py": F, "pkg": Entry("d"), "pkg/m.py": Entry("f", 1, 2)}
    assert sync.plan_send(local, dict(local))[:2] == ([], [])


def test_what_comes_back_is_what_the_workload_created_or_changed():
    staged = {"train.py": F, "log.txt": Entry("f", 1, 1)}
    after = {
        "train.py": F,  # untouched
        "log.txt": Entry("f", 2, 5),  # appended to
        "ckpt": Entry("d"),
        "ckpt/model.pt": Entry("f", 9, 5),  # created
        "link": Entry("l", link="/etc/passwd"),  # symlinks never come back
        "__pycache__/m.cpython-311.pyc": Entry("f", 1, 5),  # caches, VCS, secrets neither
        ".git/index": Entry("f", 1, 5),
        ".env": Entry("f", 1, 5),
    }
    assert sync.to_bring_back(after, staged) == ["ckpt/model.pt", "log.txt"]


def test_secrets_caches_and_dockerignore_stay_home(tmp_path: Path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".dockerignore").write_text("data\n")
    for rel in (".env", ".netrc", ".ssh/id_ed25519", "data/big.bin", "pkg/__pycache__/m.pyc",
                ".aws/credentials", "pkg/m.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert sorted(workdir.listing(tmp_path, "x")) == [".dockerignore", "pkg", "pkg/m.py",
                                                      "train.py"]  # fmt: skip


def test_past_the_limits_is_one_error_naming_where_data_goes(tmp_path, monkeypatch):
    (tmp_path / "a.bin").write_bytes(b"\0" * 100)
    monkeypatch.setattr(workdir, "MAX_BYTES", 50)
    with pytest.raises(GpuenvError, match=r"more than 0 MiB.*\(-v NAME:/data\)") as raised:
        workdir.listing(tmp_path, sync.WHERE_DATA_GOES)
    assert raised.value.exit_code == 125


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", "."])
def test_a_path_from_the_engine_never_leaves_the_directory(name):
    assert not sync._safe(name)


def test_nothing_is_written_through_a_symlink_here(tmp_path: Path):
    (tmp_path / "out").symlink_to("/tmp")
    (tmp_path / "real").mkdir()
    assert sync.in_the_way(tmp_path, "out/x") == "a symlink is on its way here"
    assert sync.in_the_way(tmp_path, "out") == "a symlink is on its way here"
    assert sync.in_the_way(tmp_path, "real/x") is None


def test_binds_on_an_engine_that_cannot_see_this_machine():
    spec = ContainerSpec("img", ["true"], binds=["/p:/p", "/data:/data:ro", "cache:/cache",
                                                "/scratch:/s"])  # fmt: skip
    moved = local.engine_host_binds(spec)
    assert moved.binds == ["/p:/p", "cache:/cache"]  # the workdir's bind and named volumes
    assert moved.mounts == [("/data", "/data", True), ("/scratch", "/s", False)]


def test_a_source_the_engine_host_lacks_is_one_error_with_the_fix(tmp_path):
    text = 'invalid mount config for type "bind": bind source path does not exist: ' + str(tmp_path)
    opts = local.RunOptions(image="img", command=["python", "t.py"], cwd=tmp_path)
    error = local._start_error(RuntimeError(text), opts, "ssh://gpu-box")
    assert error.exit_code == 125
    assert error.message.startswith(f"-v {tmp_path}: no such path on the engine's host")
    assert "this machine has it" in error.message and "-v NAME:/data" in error.message


def test_the_crossing_is_one_line():
    crossed = sync.Crossed(sent=1, sent_bytes=1500, removed=2, back=3, back_bytes=2_500_000)
    assert crossed.line("ssh://gpu-box") == (
        "gpuenv: working directory via ssh://gpu-box: sent 1 file (1.5 kB), removed 2 there, "
        "brought back 3 files (2.5 MB)"
    )
