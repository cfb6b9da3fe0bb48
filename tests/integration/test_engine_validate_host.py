"""`gpuenv validate --host URL`: the same suites against an environment gpuenv did not
start, through testinfra's backends; and what `validate` says of devices on this engine,
which cannot give containers GPUs (no NVIDIA toolkit).

- docker://ID: a container started by hand (not by gpuenv) from the shipped CPU image;
  what it must hold comes from its image's labels, or from --cell.
- local://: this machine itself, held against a GPU cell's expectations: most checks fail
  here, as they must, each with its reason; nothing is recorded for push.
"""

from __future__ import annotations

import json
import os

import pytest
from support.engine import TrackedContainer, docker

pytestmark = pytest.mark.engine


@pytest.fixture
def running(shipped_cpu):
    """A container of the shipped CPU image that gpuenv did not start."""
    with TrackedContainer(shipped_cpu["image"], "sleep", "infinity") as container:
        docker("start", str(container.id))
        yield container.id


def _report(proc) -> dict:
    return json.loads(proc.stdout)["images"][0]


def test_a_container_gpuenv_did_not_start_validates_from_its_labels(running, gpuenv):
    proc = gpuenv("validate", "--host", f"docker://{running}", "--json", check=False)
    report = _report(proc)
    assert proc.returncode == 0, report["failures"]
    assert report["counts"]["failed"] == 0 and report["counts"]["passed"] >= 8
    assert report["devices"] == "not a GPU image"


def test_a_container_held_against_another_cell_fails_naming_what_differs(
    running, gpuenv, shipped_matrix
):
    proc = gpuenv("validate", "-f", str(shipped_matrix), "--host", f"docker://{running}",
                  "--cell", "tf2.21-py3.11-cuda12.5-gpu", "--json", check=False)  # fmt: skip
    assert proc.returncode == 1
    failures = "\n".join(_report(proc)["failures"])
    assert "cuda runtime version" in failures and "libcudart.so.12" in failures


def test_this_machine_against_a_gpu_cell_fails_with_reasons(gpuenv, shipped_matrix, tmp_path):
    proc = gpuenv("validate", "-f", str(shipped_matrix), "--host", "local://", "--cell",
                  "tf2.21-py3.11-cuda12.5-gpu", "--gpus", "all", check=False)  # fmt: skip
    assert proc.returncode == 1
    assert "FAILED nvidia smi works" in proc.stdout
    assert "skipped default user is not root: no image config to read behind --host" in (
        proc.stdout
    )
    assert proc.stderr.startswith("error: ") and "check(s) failed" in proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--host", "ftp://x"], "--host 'ftp://x': expected one of"),
        (["--host", "local://"], "--host local://: say what it must hold with --cell NAME"),
        (["--host", "local://", "tf2.21-*"], "--host validates one environment"),
        (["--cell", "tf2.21-py3.11-cpu"], "--cell goes with --host"),
        (["--host", "docker://no-such-container-gpuenv"], "no such container"),
    ],
)
def test_host_usage_errors(gpuenv, shipped_matrix, args, needle):
    proc = gpuenv("validate", "-f", str(shipped_matrix), *args, check=False)
    assert proc.returncode in (1, 2) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: ") and needle in proc.stderr


def test_gpus_that_the_engine_cannot_give_fail_validation(shipped_gpu, gpuenv, tmp_path):
    """Fail closed: --gpus asked, the engine has no NVIDIA toolkit: exit 1, the toolkit's
    message, and the image recorded as failed so that push refuses it."""
    cache = tmp_path / "cache"
    proc = gpuenv("validate", shipped_gpu["cell"], "--gpus", "all", check=False,
                  env={**os.environ, "XDG_CACHE_HOME": str(cache)})  # fmt: skip
    assert proc.returncode == 1, proc.stdout
    assert "could not select device driver" in proc.stdout
    assert "install the NVIDIA Container Toolkit" in proc.stdout
    assert "devices: failed:" in proc.stdout
    records = json.loads((cache / "gpuenv" / "validated.json").read_text())
    assert records == {shipped_gpu["image_id"]: False}


def test_a_gpu_image_without_gpus_says_devices_were_not_checked(shipped_gpu, gpuenv, tmp_path):
    proc = gpuenv("validate", shipped_gpu["cell"], "--json", check=False,
                  env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})  # fmt: skip
    report = _report(proc)
    assert report["devices"] == "not checked: no --gpus given"
    assert proc.returncode == 0, report["failures"]
