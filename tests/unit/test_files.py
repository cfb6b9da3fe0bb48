"""gpuenv/matrix/files.py: the user's input files are read only when they are regular files, and a
FIFO in their place is refused at once instead of blocking gpuenv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv.matrix.files import open_regular, read_regular

REPO = Path(__file__).resolve().parents[2]


def test_a_regular_file_is_read_up_to_one_byte_past_the_limit(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_bytes(b"x" * 100)
    assert read_regular(f, 1000) == b"x" * 100
    assert len(read_regular(f, 10)) == 11  # the caller sees "larger than the limit"


@pytest.mark.parametrize("kind", ["directory", "device"])
def test_directories_and_devices_are_refused_unread(tmp_path, kind):
    path = tmp_path if kind == "directory" else Path("/dev/zero")
    with pytest.raises(IsADirectoryError):
        read_regular(path, 10)


def test_missing_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "nothing", 10)


def test_a_fifo_as_the_matrix_is_one_error_line_not_a_hang(tmp_path):
    """No writer ever opens the FIFO: an open() without O_NONBLOCK would wait forever."""
    fifo = tmp_path / "matrix.yaml"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for argv in (["matrix", "-f", str(fifo)], ["build", "-f", str(fifo)]):
        proc = subprocess.run([sys.executable, "-m", "gpuenv", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1, proc.stderr
        assert "not a regular file" in errors[0] and str(fifo) in errors[0]


def test_a_file_to_stream_is_opened_only_when_regular(tmp_path):
    """`open_regular`, for what is streamed whole (`base --load`'s archive): the same
    refusals, before a byte is read or a FIFO waited on."""
    (tmp_path / "a.tar").write_bytes(b"tar")
    with open_regular(tmp_path / "a.tar") as fh:
        assert fh.read() == b"tar"
    os.mkfifo(tmp_path / "fifo")
    for path in (tmp_path / "fifo", Path("/dev/zero"), tmp_path):
        with pytest.raises(IsADirectoryError):
            open_regular(path)
