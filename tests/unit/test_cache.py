"""gpuenv's cache directory (gpuenv/store/cache.py): records the resolved-matrix snapshots (and
the remembered no-op answers of gpuenv before issue 29) leave behind are pruned by age, and
nothing else is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cli_runner import invoke_as_entry_point

from gpuenv.project import snapshot
from gpuenv.store import cache

PREFIXES = (snapshot.PREFIX, "noop-")
DAY = 86400


def _record(root: Path, name: str, age_days: float) -> Path:
    path = root / name
    path.write_text("{}")
    then = time.time() - age_days * DAY
    os.utime(path, (then, then))
    return path


def test_old_answers_are_pruned_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "gpuenv"
    root.mkdir()
    old = [_record(root, "resolved-a.json", 40), _record(root, "noop-b.json", 31)]
    kept = [
        _record(root, "resolved-c.json", 1),  # used lately
        _record(root, "ca-checked.json", 400),  # another kind of record
        _record(root, "noop-d.txt", 400),  # not a record's name
    ]
    (root / "noop-e.json").mkdir()  # not a file: not ours to remove
    os.utime(root / "noop-e.json", (0, 0))
    count, size = cache.prune_records(PREFIXES, 30)
    assert (count, size) == (2, 4)
    assert not any(p.exists() for p in old)
    assert all(p.exists() for p in kept) and (root / "noop-e.json").is_dir()
    assert cache.prune_records(PREFIXES, 0) == (1, 2)  # --keep-days 0: every answer goes


def test_no_cache_directory_is_nothing_to_prune(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "none"))
    assert cache.prune_records(PREFIXES, 30) == (0, 0)


def test_cache_prune_says_how_many_answers_it_dropped(tmp_path, minimal_matrix):
    (tmp_path / "matrix.yaml").write_text(minimal_matrix)
    root = tmp_path / "xdg" / "gpuenv"
    root.mkdir(parents=True)
    _record(root, "resolved-old.json", 90)
    _record(root, "noop-old.json", 90)
    # The entry point in this process (a new interpreter cost 0.5 s of imports).
    result = invoke_as_entry_point(["cache", "prune", "-f", str(tmp_path / "matrix.yaml")],
                                   env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})  # fmt: skip
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "pruned 0 file(s), 0 B; 0 build context(s); 2 cached answer(s)"
    assert not any(root.glob("*old.json"))
