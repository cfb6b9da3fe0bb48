"""`gpuenv validate` on the real engine: the shipped suites pass on the shipped matrix's CPU
and GPU images, and each check fails on an image broken in that one respect while the other
checks still pass (issue 5). Also the size gate, --record-sizes and `gpuenv build --validate`.

Every test runs the installed CLI in a subprocess and checks that no validation container is
left. The broken images are tiny derived images (``gpuenv-test/broken:<case>``, see
validate_fixtures.py), removed when the module ends. No GPU is used or faked: the device
checks are expected to be reported as skipped with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.register_assert_rewrite("validate_fixtures")

from validate_fixtures import (  # noqa: E402
    BROKEN_CASES,
    CPU_CELL,
    CPU_IMAGE,
    DEVICE_CHECKS,
    GPU_CELL,
    GPU_CHECKS,
    IMAGE_CHECKS,
    PINNED_CHECK,
    SHIPPED_MATRIX,
    Outcome,
)

pytest_plugins = ["validate_fixtures"]

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("validate_leftovers")]

SIZE_CHECK = "test_size_within_baseline"
# Skipped with the reason when there is no lock (the shipped matrix has none; -i images
# are checked against their labels and the catalog).
LOCK_CHECK = "test_packages_match_the_lock"
PLATFORM_CHECK = "test_machine_is_the_cells_platform"  # needs a cell: -i images skip it


def check_name(test: str) -> str:
    """The name the CLI's summary uses for a check function."""
    return test.removeprefix("test_").replace("_", " ")


def image_size(ref: str) -> int:
    out = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", ref],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return int(out.strip())


def matrix_copy(tmp_path: Path) -> Path:
    """The shipped matrix, copied: same cells and images, its own size baseline file."""
    path = tmp_path / "matrix.yaml"
    shutil.copyfile(SHIPPED_MATRIX, path)
    return path


# --------------------------------------------------------------------------- shipped images


def test_the_shipped_cpu_and_gpu_images_pass(
    validate_images, validate_cli, junit_outcomes, tmp_path
) -> None:
    xml = tmp_path / "out" / "junit.xml"
    xml.parent.mkdir()
    result = validate_cli(
        "validate", CPU_CELL, GPU_CELL, "-f", str(SHIPPED_MATRIX), "--junitxml", str(xml)
    )
    assert result.rc == 0, result
    assert xml.is_file(), result
    found = junit_outcomes(xml)
    assert set(found) == {CPU_CELL, GPU_CELL}
    assert set(found[CPU_CELL]) == set(IMAGE_CHECKS)
    assert set(found[GPU_CELL]) == set(IMAGE_CHECKS + GPU_CHECKS + DEVICE_CHECKS)
    for image, tests in found.items():
        for test, outcome in tests.items():
            if test in DEVICE_CHECKS:
                # No --gpus: reported as skipped, with the reason (never faked).
                assert outcome.outcome == "skipped", (image, test, outcome)
                assert "--gpus" in outcome.message, (image, test, outcome)
            elif test == LOCK_CHECK:
                assert outcome.outcome == "skipped" and "lock" in outcome.message, outcome
            elif test == PINNED_CHECK and image == CPU_CELL:
                # A CPU cell of the shipped matrix pins nothing: nothing to check is a skip.
                assert outcome.outcome == "skipped" and outcome.message, outcome
            elif test == SIZE_CHECK:
                # Skipped with the reason when the repository records no baseline yet.
                assert outcome.outcome in ("passed", "skipped"), (image, test, outcome)
                if outcome.outcome == "skipped":
                    assert "baseline" in outcome.message
            else:
                assert outcome.outcome == "passed", (image, test, outcome)
    # The per-image summary.
    assert f"✓ {CPU_CELL}: 8 passed, 0 failed" in result.stdout or (
        f"✓ {CPU_CELL}: 9 passed, 0 failed" in result.stdout
    ), result
    assert f"✓ {GPU_CELL}: " in result.stdout, result
    assert "skipped nvidia smi works: no --gpus given" in result.stdout, result
    assert "FAILED" not in result.stdout, result
    assert f"JUnit XML: {xml}" in result.stdout


def test_device_checks_fail_with_the_reason_when_the_engine_gives_no_gpus(
    validate_images, validate_cli, junit_outcomes, tmp_path
) -> None:
    # `--gpus all` on this engine (no NVIDIA toolkit): the GPU container cannot start. The
    # user asked for the devices, so every device check fails with the engine's reason and
    # the fix (fail closed); everything else still runs and passes.
    xml = tmp_path / "junit.xml"
    result = validate_cli(
        "validate", GPU_CELL, "-f", str(SHIPPED_MATRIX), "--gpus", "all", "--junitxml", str(xml)
    )
    assert result.rc == 1, result
    tests = junit_outcomes(xml)[GPU_CELL]
    for test in DEVICE_CHECKS:
        outcome = tests[test]
        assert outcome.outcome == "failed", (test, outcome)
        assert "--gpus was given but the engine could not start" in outcome.message, outcome
        assert "could not select device driver" in outcome.message, outcome
    failed = {t for t, o in tests.items() if o.outcome == "failed"}
    assert failed == set(DEVICE_CHECKS), result


# --------------------------------------------------------------------------- broken images


@pytest.mark.parametrize("case", list(BROKEN_CASES))
def test_each_check_fails_on_an_image_broken_in_that_respect(
    case, broken_image, validate_cli, junit_outcomes, tmp_path
) -> None:
    spec = BROKEN_CASES[case]
    ref = broken_image(case)
    xml = tmp_path / "junit.xml"
    result = validate_cli("validate", "-i", ref, "--junitxml", str(xml))
    assert result.rc == 1, result
    assert "check(s) failed" in result.stderr, result

    tests = junit_outcomes(xml)[ref]
    gpu = spec.base != CPU_IMAGE
    assert set(tests) == set(IMAGE_CHECKS + (GPU_CHECKS + DEVICE_CHECKS if gpu else ()))
    failed = {check_name(t) for t, o in tests.items() if o.outcome == "failed"}
    assert failed == set(spec.failed), result
    # Every other check still passes; only the device checks (no --gpus), the size gate (an
    # -i image has no baseline) and the platform check (an -i image names no cell, so no
    # platform is expected) are skipped.
    for test, outcome in tests.items():
        if check_name(test) in spec.failed:
            continue
        # -i of a CPU image has no pins: nothing to check is a skip, with the reason.
        unpinned = test == PINNED_CHECK and not gpu
        if test in DEVICE_CHECKS or test in (SIZE_CHECK, LOCK_CHECK, PLATFORM_CHECK) or unpinned:
            assert outcome.outcome == "skipped" and outcome.message, (test, outcome)
        else:
            assert outcome == Outcome("passed"), (test, outcome)

    # The failure names the problem, in the JUnit file and in the CLI's summary.
    lines = result.failed_lines
    assert set(lines) == set(spec.failed), result
    for name, needles in spec.failed.items():
        message = next(o.message for t, o in tests.items() if check_name(t) == name)
        for needle in needles:
            assert needle in message, (name, needle, message)
            assert needle in lines[name], (name, needle, lines[name])
    assert f"✗ {ref}: " in result.stdout and f"{len(spec.failed)} failed" in result.stdout


# --------------------------------------------------------------------------- size gate


def test_record_sizes_writes_the_baseline_and_the_gate_then_passes(
    validate_images, validate_cli, junit_outcomes, tmp_path
) -> None:
    matrix = matrix_copy(tmp_path)
    baseline = tmp_path / "matrix.sizes.json"
    assert not baseline.exists()
    result = validate_cli("validate", CPU_CELL, "-f", str(matrix), "--record-sizes")
    assert result.rc == 0, result
    assert "skipped size within baseline: no size baseline recorded" in result.stdout, result
    assert f"recorded 1 size(s) in {baseline}" in result.stdout, result
    assert json.loads(baseline.read_text()) == {CPU_CELL: image_size(CPU_IMAGE)}

    xml = tmp_path / "junit.xml"
    result = validate_cli("validate", CPU_CELL, "-f", str(matrix), "--junitxml", str(xml))
    assert result.rc == 0, result
    assert junit_outcomes(xml)[CPU_CELL][SIZE_CHECK] == Outcome("passed")


def test_size_gate_fails_an_image_that_grew_and_names_the_largest_packages(
    validate_images, validate_cli, tmp_path
) -> None:
    matrix = matrix_copy(tmp_path)
    baseline = tmp_path / "matrix.sizes.json"
    size = image_size(CPU_IMAGE)
    recorded = {CPU_CELL: size // 2, "some-other-cell": 12345}
    baseline.write_text(json.dumps(recorded))
    result = validate_cli("validate", CPU_CELL, "-f", str(matrix), "--record-sizes")
    assert result.rc == 1, result
    lines = result.failed_lines
    assert set(lines) == {"size within baseline"}, result
    message = lines["size within baseline"]
    assert "2.00x its baseline" in message and "limit 1.2x" in message, message
    assert "largest packages" in message, message
    assert "site-packages/tensorflow" in message, message  # by far the largest package
    assert "largest layers" in message, message
    # A failed image's size is not recorded: the baseline is left as it was.
    assert json.loads(baseline.read_text()) == recorded


# --------------------------------------------------------------------------- build --validate


def test_build_validate_runs_the_suites_after_building(
    validate_images, validate_cli, tmp_path
) -> None:
    # The shipped CPU cell is built already: the build is a no-op and validation follows.
    result = validate_cli("build", CPU_CELL, "-f", str(matrix_copy(tmp_path)), "--validate")
    assert result.rc == 0, result
    assert "cached" in result.stdout, result
    assert f"✓ {CPU_CELL}: " in result.stdout, result
    assert "0 failed" in result.stdout, result
    # Its verdict is the command's: an image past its size baseline fails the build command.
    (tmp_path / "matrix.sizes.json").write_text(json.dumps({CPU_CELL: image_size(CPU_IMAGE) // 2}))
    result = validate_cli("build", CPU_CELL, "-f", str(tmp_path / "matrix.yaml"), "--validate")
    assert result.rc == 1, result
    assert set(result.failed_lines) == {"size within baseline"}, result
