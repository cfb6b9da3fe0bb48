"""Issue 35, L10: the umask is read, never set: os.umask(0)-then-restore is process-global,
and a thread creating a file in between got mode 0666."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuenv.matrix.umask import current_umask
from gpuenv.validate import sizes


def test_the_umask_is_read_from_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o027)
    try:
        assert current_umask() == 0o027
    finally:
        os.umask(old)


def test_files_get_the_umasks_mode_without_setting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = os.umask(0o027)
    try:

        def refuse(_mask: int) -> int:
            raise AssertionError("os.umask called: it changes the mask for every thread")

        monkeypatch.setattr(os, "umask", refuse)
        baseline = tmp_path / "sizes.json"
        sizes.record(baseline, {"cell": 1})
        assert baseline.stat().st_mode & 0o777 == 0o640
    finally:
        monkeypatch.undo()
        os.umask(old)
