"""Several gpuenv processes on one machine at once (issue 16, "Concurrency"):

- 8 `gpuenv run` of one image at once: each exits with its own container's code, and no
  container of theirs is left;
- two `gpuenv lock` of one matrix at once: the lock is one of the two complete results
  (each process resolves alone, then both together), never a mix; matrix.lock is written
  to a temporary file and renamed into place (gpuenv/project/lockfile.py: write).

Concurrent builds (different cells, and the same cell, from two processes) are in
test_engine_ca_concurrent.py.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import cells
from support.cells import REPO
from support.engine import docker

pytestmark = pytest.mark.engine


def _gpuenv(*args: str, cwd=REPO) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuenv", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _run_containers() -> set[str]:
    return set(docker("ps", "-aq", "--filter", "label=io.gpuenv.run=1").stdout.split())


def test_eight_runs_of_one_image_at_once(shipped_cpu, tmp_path):
    before = _run_containers()
    code = "import sys, time; time.sleep(1); print('run', sys.argv[1]); sys.exit(int(sys.argv[1]))"
    procs = [
        _gpuenv(
            "run",
            "-i",
            shipped_cpu["image"],
            "--network",
            "none",
            "--",
            "python",
            "-c",
            code,
            str(k),
            cwd=tmp_path,
        )
        for k in range(8)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    results = [(p.returncode, *o) for p, o in zip(procs, outputs, strict=True)]
    for k, (rc, out, err) in enumerate(results):
        assert (rc, out.strip()) == (k, f"run {k}"), (k, rc, out, err)
    assert _run_containers() == before  # every one removed


def test_two_locks_of_one_matrix_at_once_leave_one_whole_lock(shipped_cpu, tmp_path):
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(cells.matrix_text(variants=("cpu",)), encoding="utf-8")
    lock = matrix.with_suffix(".lock")
    dates = ("2026-11-01", "2026-11-15")

    def lock_alone(date: str) -> str:
        lock.unlink(missing_ok=True)
        proc = _gpuenv("lock", "-f", str(matrix), "--exclude-newer", date)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        return lock.read_text(encoding="utf-8")

    alone = {date: lock_alone(date) for date in dates}
    assert alone[dates[0]] != alone[dates[1]]  # the premise: two different complete results
    for _ in range(2):
        lock.unlink(missing_ok=True)
        with ThreadPoolExecutor(2) as pool:
            procs = list(pool.map(
                lambda d: _gpuenv("lock", "-f", str(matrix), "--exclude-newer", d), dates
            ))  # fmt: skip
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err
        assert lock.read_text(encoding="utf-8") in alone.values()
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".matrix.lock.")]
