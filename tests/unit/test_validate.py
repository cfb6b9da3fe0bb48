"""What `gpuenv validate` checks against (docs/architecture.md, "What validation checks
against"): the resolved cell, or an image's labels cross-checked with the catalog, never
the labels alone; the per-image summary read back from JUnit XML; the size baseline file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.contract import image_labels as render_labels
from gpuenv.matrix.errors import GpuenvError
from gpuenv.validate import expected, runner, sizes

SHIPPED = Path(__file__).resolve().parents[2] / "matrix.yaml"
CPU_CELL = "tf2.21-py3.11-cpu"
GPU_CELL = "tf2.21-py3.11-cuda12.5-gpu"


def shipped(name: str) -> Cell:
    return next(c for c in compat.resolve(matrix.load(SHIPPED)).cells if c.name == name)


def image_labels(cell: Cell, **changes: str | None) -> dict[str, str]:
    """The labels a gpuenv build puts on the cell's image, with some changed (None drops)."""
    found = {**render_labels(cell), "io.gpuenv.spec-hash": "0" * 64}
    for key, value in changes.items():
        name = "io.gpuenv." + key.replace("_", "-")
        if value is None:
            found.pop(name, None)
        else:
            found[name] = value
    return found


# --------------------------------------------------------------------------- from_cell


def test_from_cell_gpu_holds_the_cells_exact_versions_and_pins() -> None:
    cell = shipped(GPU_CELL)
    exp = expected.from_cell(cell)
    assert exp["source"] == "matrix"
    assert exp["framework_version"] == "2.21.0"
    assert (exp["python"], exp["variant"], exp["cuda"], exp["cudnn"]) == (
        "3.11",
        "gpu",
        "12.5",
        "9.3",
    )
    assert exp["cuda_release"] == "12.5.1"
    assert exp["wheels"]["nvidia-cudnn-cu12"] == "9.3.0.75"
    assert exp["wheels"] == dict(cell.wheels)
    assert exp["site_packages"] == "/opt/venv/lib/python3.11/site-packages"
    assert exp["uid"] == 1000
    assert "cudnn" in exp["nvidia_lib_dirs"]
    # The labels the build must have written: compared one by one by the labels check.
    assert exp["labels"]["io.gpuenv.framework-version"] == "2.21.0"
    assert exp["labels"]["io.gpuenv.cudnn"] == "9.3"
    json.dumps(exp)  # it travels to the suites as JSON


def test_from_cell_cpu_has_no_cuda() -> None:
    exp = expected.from_cell(shipped(CPU_CELL))
    assert exp["variant"] == "cpu"
    assert exp["cuda"] is None and exp["cudnn"] is None and exp["wheels"] == {}
    assert exp["labels"].get("io.gpuenv.cuda", "") == ""


def test_from_cell_pins_only_exact_requirements(write_matrix) -> None:
    path = write_matrix(
        "name: acme/tf\n"
        'matrix: {tensorflow: ["2.21"], python: ["3.11"], variant: [cpu]}\n'
        'bases: {"3.11": {debian: bookworm}}\n'
        "packages:\n"
        '  pip: ["Requests==2.32.3", "rich>=13", "uvicorn[standard]==0.30.1", '
        '"attrs>=23,<25"]\n'
    )
    (cell,) = compat.resolve(matrix.load(path)).cells
    exp = expected.from_cell(cell)
    # Names lower-cased, extras dropped; ranges are not pins.
    assert exp["pip_pins"] == {"requests": "2.32.3", "uvicorn": "0.30.1"}


# --------------------------------------------------------------------------- from_labels


def test_from_labels_rebuilds_the_cell_from_the_catalog() -> None:
    cell = shipped(GPU_CELL)
    exp = expected.from_labels("some/image:tag", image_labels(cell))
    ref = expected.from_cell(cell)
    assert exp["source"] == "labels+catalog"
    assert exp["image"] == "some/image:tag"
    for key in (
        "name", "variant", "python", "framework", "framework_version", "cuda", "cudnn",
        "cuda_release", "wheels", "site_packages", "nvidia_lib_dirs", "uid",
    ):  # fmt: skip
        assert exp[key] == ref[key], key


def test_from_labels_cpu() -> None:
    exp = expected.from_labels("x", image_labels(shipped(CPU_CELL)))
    assert (exp["variant"], exp["framework_version"], exp["wheels"]) == ("cpu", "2.21.0", {})
    assert exp["cuda"] is None and exp["cuda_release"] is None


def test_wrong_version_label_expects_the_catalogs_release_of_that_minor() -> None:
    # A 2.21 image labelled 2.20.0: the expectations are the catalog's 2.20 row, so the
    # installed 2.21.0 is a mismatch the framework-version check reports.
    exp = expected.from_labels("x", image_labels(shipped(CPU_CELL), framework_version="2.20.0"))
    assert exp["framework_version"] == compat.catalog().releases["2.20"].version == "2.20.0"


@pytest.mark.parametrize("claimed", ["2.21.7", "2.21", "2.21.0rc1"])
def test_the_catalogs_exact_version_wins_over_the_label(claimed: str) -> None:
    exp = expected.from_labels("x", image_labels(shipped(CPU_CELL), framework_version=claimed))
    assert exp["framework_version"] == "2.21.0"


@pytest.mark.parametrize("claimed", ["2.99.0", "1.15.5", "", "banana"])
def test_unknown_version_label_is_an_error(claimed: str) -> None:
    found = image_labels(shipped(CPU_CELL), framework_version=claimed)
    with pytest.raises(GpuenvError, match="is no TensorFlow release the catalog knows"):
        expected.from_labels("x", found)


def test_missing_version_label_is_an_error() -> None:
    found = image_labels(shipped(CPU_CELL), framework_version=None)
    with pytest.raises(GpuenvError, match="catalog knows"):
        expected.from_labels("x", found)


def test_an_image_without_gpuenv_labels_is_an_error() -> None:
    with pytest.raises(GpuenvError, match="not built by gpuenv"):
        expected.from_labels("debian:bookworm", {"maintainer": "someone"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cuda": "11.8"}, "contradict the catalog.*no pinned wheel set for CUDA 11.8"),
        ({"cudnn": "8.9"}, "contradict the catalog.*CUDA 12.5 with cuDNN 8.9"),
        ({"cuda": "12.7"}, "contradict the catalog"),
        ({"cudnn": None}, "without io.gpuenv.cuda/cudnn labels"),
        ({"cuda": None}, "without io.gpuenv.cuda/cudnn labels"),
        # TF 2.21 requires cuDNN >= 9.3 and CUDA >= 12.5: 12.3/8.9 is a known pair, not for it.
        ({"cuda": "12.3", "cudnn": "8.9"}, "TensorFlow 2.21.0 requires"),
        # A GPU label on a release the catalog has as CPU-only.
        ({"framework_version": "2.14.1"}, "CPU-only"),
        ({"python": "3.9"}, "io.gpuenv.python='3.9' contradicts the catalog"),
        ({"variant": "tpu"}, "not cpu or gpu"),
        ({"framework": "pytorch"}, "io.gpuenv.framework='pytorch'"),
    ],
)
def test_gpu_labels_contradicting_the_catalog_are_an_error(changes, message) -> None:
    found = image_labels(shipped(GPU_CELL), **changes)
    with pytest.raises(GpuenvError, match=message):
        expected.from_labels("x", found)


def test_cpu_image_with_cuda_labels_is_an_error() -> None:
    found = image_labels(shipped(CPU_CELL), cuda="12.5", cudnn="9.3")
    with pytest.raises(GpuenvError, match=r"CPU image with io\.gpuenv\.cuda/cudnn"):
        expected.from_labels("x", found)


def test_other_legal_cuda_pair_comes_from_the_catalog() -> None:
    # TF 2.21 on CUDA 12.8 / cuDNN 9.10 is legal: the wheels are the catalog's for that pair.
    exp = expected.from_labels("x", image_labels(shipped(GPU_CELL), cuda="12.8", cudnn="9.10"))
    cat = compat.catalog()
    assert exp["wheels"]["nvidia-cudnn-cu12"] == cat.pairs[("12.8", "9.10")] == "9.10.2.21"
    assert exp["cuda_release"] == cat.toolkits["12.8"].release


# --------------------------------------------------------------------------- summarise

JUNIT = """\
<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="2" tests="7">
 <testcase classname="check_image" name="test_python_version[tf2.21-py3.11-cpu]" time="0.1"/>
 <testcase classname="check_image" name="test_no_driver_files[tf2.21-py3.11-cpu]" time="0.1">
  <failure message="AssertionError: driver files in the image: ['/usr/lib/libcuda.so.1']&#10;\
assert not [...]">trace</failure>
 </testcase>
 <testcase classname="check_image" name="test_size_within_baseline[tf2.21-py3.11-cpu]">
  <skipped type="pytest.skip" message="no size baseline recorded">reason</skipped>
 </testcase>
 <testcase classname="check_image" name="test_python_version[tf2.21-py3.11-cuda12.5-gpu]"/>
 <testcase classname="check_gpu" name="test_cudnn_version[tf2.21-py3.11-cuda12.5-gpu]">
  <failure message="">trace</failure>
 </testcase>
 <testcase classname="check_devices" name="test_nvidia_smi_works[tf2.21-py3.11-cuda12.5-gpu]">
  <skipped type="pytest.skip" message="Skipped: no --gpus given">reason</skipped>
 </testcase>
 <testcase classname="check_gpu" name="test_ptxas_is_found[tf2.21-py3.11-cuda12.5-gpu]">
  <error message="failed on setup with &quot;docker exec failed&quot;">trace</error>
 </testcase>
 <testcase classname="check_image" name="test_python_version[some-other-image]"/>
 <testcase classname="check_image" name="check_image"/>
</testsuite></testsuites>
"""


def test_summarise_counts_per_image(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(JUNIT, encoding="utf-8")
    cpu, gpu = runner.summarise(xml, [CPU_CELL, GPU_CELL])
    assert (cpu.id, cpu.passed, cpu.failed, cpu.skipped) == (CPU_CELL, 1, 1, 1)
    # The first line of the message only, the test's name in words.
    assert cpu.failures == [
        "no driver files: AssertionError: driver files in the image: ['/usr/lib/libcuda.so.1']"
    ]
    assert cpu.skips == ["size within baseline: no size baseline recorded"]
    assert (gpu.passed, gpu.failed, gpu.skipped) == (1, 2, 1)
    assert gpu.failures == [
        "cudnn version: failed",
        'ptxas is found: failed on setup with "docker exec failed"',
    ]
    assert gpu.skips == ["nvidia smi works: no --gpus given"]


def test_summarise_image_reference_ids_and_duplicates(tmp_path: Path) -> None:
    # pytest makes duplicate parameter ids unique by appending 0, 1, ...
    xml = tmp_path / "junit.xml"
    xml.write_text(
        "<testsuites><testsuite>"
        '<testcase name="test_a[gpuenv-test/broken:root0]"/>'
        '<testcase name="test_a[gpuenv-test/broken:root1]"><failure message="x"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    (summary,) = runner.summarise(xml, ["gpuenv-test/broken:root"])
    assert (summary.passed, summary.failed) == (1, 1)


# --------------------------------------------------------------------------- sizes


def test_baseline_path_is_next_to_the_matrix() -> None:
    assert sizes.baseline_path(Path("/a/b/matrix.yaml")) == Path("/a/b/matrix.sizes.json")
    assert sizes.baseline_path(Path("ci.yml")) == Path("ci.sizes.json")


def test_sizes_load_missing_is_empty(tmp_path: Path) -> None:
    assert sizes.read_baseline(tmp_path / "matrix.sizes.json") == {}


def test_sizes_record_and_load(tmp_path: Path) -> None:
    path = tmp_path / "matrix.sizes.json"
    sizes.record(path, {"b-cell": 200, "a-cell": 100})
    assert sizes.read_baseline(path) == {"a-cell": 100, "b-cell": 200}
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.index("a-cell") < text.index("b-cell")  # sorted
    # Recording merges: other cells keep their sizes, recorded ones are replaced.
    sizes.record(path, {"b-cell": 250, "c-cell": 300})
    assert sizes.read_baseline(path) == {"a-cell": 100, "b-cell": 250, "c-cell": 300}


def test_sizes_load_ignores_non_integer_entries(tmp_path: Path) -> None:
    path = tmp_path / "m.sizes.json"
    path.write_text('{"a": 1, "b": "big", "c": 2.5, "d": true, "e": null}', encoding="utf-8")
    assert sizes.read_baseline(path) == {"a": 1}


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"x"'])
def test_sizes_load_broken_file_is_an_error(tmp_path: Path, text: str) -> None:
    # A broken baseline must not switch the size gate off silently.
    path = tmp_path / "matrix.sizes.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(GpuenvError, match=r"matrix\.sizes\.json"):
        sizes.read_baseline(path)


# --------------------------------------------------------------------------- the suites
# The suites' verdicts that need no container: they are decided before any command runs
# in it (the fixtures' skips and failures, checks with nothing to compare). pytest runs the
# suites as `gpuenv validate` does, on a targets file naming a container that does not exist.


def run_suites(
    tmp_path: Path, exp: dict, module: str, select: str, **target: object
) -> dict[str, tuple[str, str]]:
    """test name -> (outcome, message) for one target, from the suites' JUnit XML."""
    import os
    import subprocess
    import sys
    import xml.etree.ElementTree as ET

    doc = {"id": "t", "image": "x", "expected": exp, "container": "no-such-container",
           "gpu_container": None, "gpu_error": None, "gpus": None,
           "config": {"User": "1000:1000", "Env": [], "Labels": {}}, "size": 0,
           "baseline_size": None, "layers": [], **target}  # fmt: skip
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([doc]))
    xml = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(runner.SUITES / module), "-k", select,
         "-c", str(runner.SUITES / "pytest.ini"), "--rootdir", str(runner.SUITES),
         "-p", "no:cacheprovider", f"--junitxml={xml}", "-q"],
        env={**os.environ, runner.TARGETS_ENV: str(targets)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert xml.exists(), proc.stdout + proc.stderr
    found = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        node = next(iter(case), None)
        outcome = "passed" if node is None else node.tag
        found[case.get("name", "").split("[")[0]] = (
            outcome,
            (node.get("message") or "") if node is not None else "",
        )
    return found


GPU_DENIED = (
    'this Docker Engine cannot give containers GPUs (could not select device driver "" '
    "with capabilities: [[compute gpu utility]]): install the NVIDIA Container Toolkit"
)


def test_device_checks_fail_when_gpus_were_asked_for_but_not_given(tmp_path: Path) -> None:
    exp = expected.from_cell(shipped(GPU_CELL))
    request = {"Driver": "", "Count": -1, "DeviceIDs": None,
               "Capabilities": [["compute", "gpu", "utility"]], "Options": {}}  # fmt: skip
    found = run_suites(tmp_path, exp, "check_devices.py", "test_", gpus=request,
                       gpu_error=GPU_DENIED)  # fmt: skip
    assert len(found) == 6  # five device checks + the all-reduce
    for test, (outcome, message) in found.items():
        # A fixture's pytest.fail is an error on setup: the summary counts it as failed.
        assert outcome == "error", (test, outcome, message)
        assert "--gpus was given but the engine could not start" in message
        assert "could not select device driver" in message
        assert "install the NVIDIA Container Toolkit" in message  # the fix


def test_device_checks_are_skipped_without_gpus(tmp_path: Path) -> None:
    found = run_suites(tmp_path, expected.from_cell(shipped(GPU_CELL)), "check_devices.py", "test_")
    assert len(found) == 6
    assert {o for o, _ in found.values()} == {"skipped"}
    assert all("no --gpus given" in m for _, m in found.values())


def test_device_checks_of_an_emulated_arm64_image_are_skipped_never_passed(tmp_path: Path) -> None:
    """Even with --gpus: under QEMU no GPU reaches the process; a Grace machine is needed."""
    request = {"Driver": "", "Count": -1, "DeviceIDs": None,
               "Capabilities": [["compute", "gpu", "utility"]], "Options": {}}  # fmt: skip
    found = run_suites(tmp_path, expected.from_cell(shipped(GPU_CELL)), "check_devices.py",
                       "test_", gpus=request, emulated="linux/arm64")  # fmt: skip
    assert len(found) == 6
    assert {o for o, _ in found.values()} == {"skipped"}
    assert all("need a Grace machine" in m and "linux/arm64" in m for _, m in found.values())


def test_the_machine_check_needs_an_expected_platform(tmp_path: Path) -> None:
    exp = {k: v for k, v in expected.from_cell(shipped(CPU_CELL)).items() if k != "platform"}
    found = run_suites(tmp_path, exp, "check_image.py", "machine")
    outcome, message = found["test_machine_is_the_cells_platform"]
    assert outcome == "skipped" and "no platform expected" in message


def test_a_check_with_nothing_to_check_is_skipped_not_passed(tmp_path: Path) -> None:
    exp = expected.from_cell(shipped(CPU_CELL))  # no pip pins, no CUDA wheels
    found = run_suites(tmp_path, exp, "check_image.py", "pinned_packages")
    outcome, message = found["test_pinned_packages_are_installed"]
    assert outcome == "skipped" and "nothing to check" in message, found


def test_a_drifted_lock_entry_fails_the_lock_check(tmp_path: Path) -> None:
    exp = {**expected.from_cell(shipped(CPU_CELL)), "lock_drift": "packages.pip changed"}
    found = run_suites(tmp_path, exp, "check_image.py", "match_the_lock")
    outcome, message = found["test_packages_match_the_lock"]
    assert outcome == "failure", found
    assert "drifted: packages.pip changed" in message and "gpuenv lock" in message
    # Without a lock (and no drift) it is skipped with the reason, as before.
    found = run_suites(tmp_path, expected.from_cell(shipped(CPU_CELL)), "check_image.py",
                       "match_the_lock")  # fmt: skip
    assert found["test_packages_match_the_lock"][0] == "skipped"


def _fake_python(where, printed: str, code: int = 0) -> None:
    script = where / "python"
    script.write_text(f"#!/bin/sh\necho '{printed}'\nexit {code}\n")
    script.chmod(0o755)


def test_the_hosts_own_frameworks_become_device_targets(tmp_path, monkeypatch):
    """`validate --host local:// --gpus all` without --cell: one target per framework the
    host's `python` has (as a GPU VM's own PyTorch 2.11 and JAX 0.11 report themselves),
    the checks of contents marked to skip with the reason."""
    from gpuenv.validate import session

    _fake_python(tmp_path, '{"torch": "2.11.0+cu130", "jax": "0.11.2"}')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    targets = session.host_framework_targets("local://")
    assert [t.id for t in targets] == ["torch@local://", "jax@local://"]
    torch = targets[0].expected
    assert (torch["framework"], torch["framework_version"], torch["variant"]) == (
        "torch", "2.11.0", "gpu")  # fmt: skip
    assert torch["contents_unknown"] == session.CONTENTS_UNKNOWN
    assert all(t.host == "local://" for t in targets)


@pytest.mark.parametrize(("printed", "code"), [("{}", 0), ("Traceback: boom", 1)])
def test_a_host_without_a_framework_is_one_error(tmp_path, monkeypatch, printed, code):
    from gpuenv.validate import session

    _fake_python(tmp_path, printed, code)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(GpuenvError) as exc:
        session.host_framework_targets("local://")
    assert exc.value.exit_code == 2
    assert "has none of TensorFlow, PyTorch or JAX" in exc.value.message
