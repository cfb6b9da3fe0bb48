"""`gpuenv init`, then `gpuenv run train.py` with no other step (issue 34).

The project is tests/projects/keras_mnist (tensorflow>=2.16 and numpy, a train.py that fits
one epoch on synthetic data), given a `.python-version` of 3.11 so that init chooses the
shipped CPU cell's TensorFlow and Python: the base and framework layers then come from the
engine's cache (`shipped_cpu`), and the run builds only the packages step. Only the matrix's
`name:` line is changed after init, so that this session's janitor owns the image.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from support.cells import BUILD_TIMEOUT, CPU_CELL, test_repository

pytestmark = pytest.mark.engine

PROJECT = Path(__file__).resolve().parents[1] / "projects" / "keras_mnist"
REPOSITORY = test_repository("init")


def test_init_then_run_trains_with_no_other_step(gpuenv, shipped_cpu, inspect, tmp_path):
    root = tmp_path / "keras_mnist"
    shutil.copytree(PROJECT, root)
    (root / ".python-version").write_text("3.11\n")
    gpuenv("init", cwd=root)
    matrix = root / "matrix.yaml"
    text = matrix.read_text()
    assert 'tensorflow: ["2.21"]' in text and 'python: ["3.11"]' in text, text
    assert "requirements: [requirements.txt]" in text
    matrix.write_text(re.sub(r"^name: .*$", f"name: {REPOSITORY}", text, flags=re.M))

    proc = gpuenv("run", "train.py", cwd=root, timeout=BUILD_TIMEOUT)
    assert re.search(r"trained 1 epoch on CPU: accuracy \d\.\d{3}", proc.stdout), proc.stdout
    assert "is not built yet; building it first" in proc.stderr
    assert inspect(f"{REPOSITORY}:{CPU_CELL}") is not None
