"""Fixtures for the `gpuenv validate` integration tests (loaded by test_engine_validate.py).

They live apart from conftest.py, which belongs to the build tests. Everything runs the
installed CLI as a user would (a subprocess), on the real engine.

- ``validate_images``: the shipped matrix's CPU and GPU images of TF 2.21 / Python 3.11,
  built once by `gpuenv build` when missing (when present they are used as they are).
- ``validate_cli``: `gpuenv validate ...` (or any gpuenv verb) -> ``CliResult``.
- ``broken_image``: broken_image(case) -> a small image derived from a shipped one, broken
  in one respect (``BROKEN_CASES``), built once per module with `docker build --network
  host`, tagged ``gpuenv-test/broken:<case>`` and removed when the module ends.
- ``validate_leftovers``: after each test, fails (and cleans up) when a container labelled
  io.gpuenv.validate=1 that was not there before the test is still there.
- ``junit_outcomes``: a JUnit XML file -> {image id: {test function: Outcome}}.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import cleanup
from support.cells import CPU_CELL as CPU_CELL
from support.cells import CPU_IMAGE as CPU_IMAGE
from support.cells import GPU_CELL as GPU_CELL
from support.cells import GPU_IMAGE as GPU_IMAGE
from support.cells import SHIPPED_MATRIX as SHIPPED_MATRIX
from support.cells import test_repository
from support.cli import build_cells, gpuenv_cmd
from support.engine import docker, has_image

BROKEN_REPOSITORY = test_repository("broken")
VALIDATE_LABEL = "io.gpuenv.validate"
# The cuDNN release the broken GPU image gets instead of the cell's 9.3.0.75: the catalog's
# pin for CUDA 12.6 / cuDNN 9.5, so a real wheel (~545 MB).
OTHER_CUDNN = "9.5.1.17"

# The suites' checks, by module (pytest function names, in file order).
IMAGE_CHECKS = (
    "test_python_version",
    "test_machine_is_the_cells_platform",
    "test_framework_version",
    "test_pinned_packages_are_installed",
    "test_packages_match_the_lock",
    "test_no_installer_cache_or_compiler",
    "test_no_ca_beyond_the_distribution_trust_store",
    "test_default_user_is_not_root",
    "test_labels_agree_with_the_contents",
    "test_no_driver_files",
    "test_framework_computes_on_the_cpu",
    "test_size_within_baseline",
)
GPU_CHECKS = (
    "test_cuda_runtime_version",
    "test_cudnn_version",
    "test_cuda_libraries_load_without_a_driver",
    "test_ldd_finds_everything_but_libcuda",
    "test_ptxas_is_found",
    "test_framework_build_info_agrees",
    "test_nvidia_environment",
    "test_library_path_reaches_the_wheels",
)
DEVICE_CHECKS = (
    "test_nvidia_smi_works",
    "test_framework_sees_the_requested_gpus",
    "test_matmul_runs_on_gpu0",
    "test_cudnn_op_runs",
    "test_gpu_compute_capability_runs_the_framework",
    "test_all_reduce_across_the_requested_gpus",
)
PINNED_CHECK = "test_pinned_packages_are_installed"


# --------------------------------------------------------------------------- the CLI


@dataclass
class CliResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def failed_lines(self) -> dict[str, str]:
        """The summary's `    FAILED <check name>: <message>` lines, by check name."""
        found = {}
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("FAILED "):
                name, _, message = line.removeprefix("FAILED ").partition(": ")
                found[name] = message
        return found

    def __str__(self) -> str:
        return (
            f"exit {self.rc}\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-3000:]}"
        )


@pytest.fixture(scope="session")
def validate_cli() -> Callable[..., CliResult]:
    """validate_cli("validate", ..., timeout=600) -> CliResult, run from the repo root."""

    def cli(*args: str, timeout: float = 600) -> CliResult:
        proc = gpuenv_cmd(*args, check=False, timeout=timeout)
        return CliResult(proc.returncode, proc.stdout, proc.stderr)

    return cli


@pytest.fixture(scope="session")
def validate_images() -> tuple[str, str]:
    """The shipped CPU and GPU images (built once by `gpuenv build` when missing)."""
    missing = [cell for cell, ref in ((CPU_CELL, CPU_IMAGE), (GPU_CELL, GPU_IMAGE))
               if not has_image(ref)]  # fmt: skip
    if missing:
        build_cells(*missing)
    return CPU_IMAGE, GPU_IMAGE


# --------------------------------------------------------------------------- JUnit XML


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed, failed, skipped
    message: str = ""


def junit_outcomes_of(xml: Path) -> dict[str, dict[str, Outcome]]:
    results: dict[str, dict[str, Outcome]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        assert "[" in name, f"a testcase without an image parameter: {name}"
        test, _, rest = name.partition("[")
        image = rest.removesuffix("]")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            outcome = Outcome("failed", failure.get("message") or "")
        elif skipped is not None:
            outcome = Outcome("skipped", skipped.get("message") or "")
        else:
            outcome = Outcome("passed")
        assert test not in results.setdefault(image, {}), f"{name} reported twice"
        results[image][test] = outcome
    return results


@pytest.fixture(scope="session")
def junit_outcomes() -> Callable[[Path], dict[str, dict[str, Outcome]]]:
    return junit_outcomes_of


# --------------------------------------------------------------------------- leftovers


@pytest.fixture
def validate_leftovers() -> Iterator[None]:
    """Fails (and cleans up) when a validation container new since the test started is
    still there afterwards."""

    def found() -> dict[str, str]:
        return {cid: cleanup.describe(c) for cid, c in cleanup.containers([VALIDATE_LABEL]).items()}

    with cleanup.fails_on_leftovers(found):
        yield


# --------------------------------------------------------------------------- broken images


@dataclass(frozen=True)
class BrokenCase:
    """An image derived from a shipped one and broken in one respect."""

    base: str  # the shipped image it starts from
    dockerfile: str  # after the FROM line
    failed: dict[str, tuple[str, ...]]  # check name -> what its failure message must name
    files: dict[str, str] = field(default_factory=dict)  # name -> a _FILES maker


def _self_signed_cert(context: Path, name: str) -> None:
    key = context.parent / f"{name}.key"  # outside the build context
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=gpuenv-test rogue CA", "-keyout", str(key), "-out", str(context / name)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


def _proxy_ca(context: Path, name: str) -> None:
    # The package index may be reached through a TLS-intercepting proxy: the throw-away
    # image's RUN step trusts its CA (copied in by a COPY step, so it stays in that layer of
    # an image that is never published, and that no check of the trust store looks at).
    source = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    shutil.copyfile(source, context / name)


def _empty(context: Path, name: str) -> None:
    (context / name).write_bytes(b"")


_FILES: dict[str, Callable[[Path, str], None]] = {
    "empty": _empty,
    "self-signed-cert": _self_signed_cert,
    "proxy-ca": _proxy_ca,
}

BROKEN_CASES: dict[str, BrokenCase] = {
    # A driver library baked in: it would shadow the host's driver the toolkit mounts.
    "libcuda": BrokenCase(
        base=CPU_IMAGE,
        dockerfile="COPY libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1\n",
        files={"libcuda.so.1": "empty"},
        failed={"no driver files": ("/usr/lib/x86_64-linux-gnu/libcuda.so.1",)},
    ),
    # A TF 2.21 image that claims 2.20.0: the expectations come from the catalog's 2.20 row.
    "tf-label": BrokenCase(
        base=CPU_IMAGE,
        dockerfile="LABEL io.gpuenv.framework-version=2.20.0\n",
        failed={
            "framework version": ("2.21.0", "2.20.0"),
            "labels agree with the contents": ("io.gpuenv.framework-version='2.20.0'", "2.21.0"),
        },
    ),
    # A rogue CA in the system trust store.
    "ca": BrokenCase(
        base=CPU_IMAGE,
        dockerfile=(
            "USER root\n"
            "COPY x.crt /usr/local/share/ca-certificates/x.crt\n"
            "RUN update-ca-certificates\n"
            "USER 1000:1000\n"
        ),
        files={"x.crt": "self-signed-cert"},
        failed={
            "no ca beyond the distribution trust store": (
                "1 trusted certificate(s) not from Debian",
                "/usr/local/share/ca-certificates/x.crt",
            )
        },
    ),
    "root": BrokenCase(
        base=CPU_IMAGE,
        dockerfile="USER root\n",
        failed={"default user is not root": ("image USER is 'root'",)},
    ),
    # cuDNN 9.5 where the cell pins 9.3: really installed (uv from a throw-away venv).
    "cudnn": BrokenCase(
        base=GPU_IMAGE,
        dockerfile=(
            "USER root\n"
            "COPY pip-ca.pem /tmp/pip-ca.pem\n"
            "RUN python3 -m venv /tmp/u \\\n"
            " && /tmp/u/bin/pip install --no-cache-dir --cert /tmp/pip-ca.pem uv \\\n"
            " && SSL_CERT_FILE=/tmp/pip-ca.pem /tmp/u/bin/uv pip install --no-cache --no-deps \\\n"
            f"      --python /opt/venv/bin/python nvidia-cudnn-cu12=={OTHER_CUDNN} \\\n"
            " && rm -rf /tmp/u /tmp/pip-ca.pem\n"
            "USER 1000:1000\n"
        ),
        files={"pip-ca.pem": "proxy-ca"},
        failed={
            "pinned packages are installed": ("nvidia-cudnn-cu12", "9.3.0.75", OTHER_CUDNN),
            "cudnn version": ("cuDNN 9.5", "expected 9.3"),
        },
    ),
}


@pytest.fixture(scope="module")
def broken_image(
    validate_images: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], str]]:
    """broken_image(case) -> the reference of that case's image (built once per module)."""
    built: dict[str, str] = {}

    def build(case: str) -> str:
        if case in built:
            return built[case]
        spec = BROKEN_CASES[case]
        context = tmp_path_factory.mktemp(f"broken-{case}") / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {spec.base}\n{spec.dockerfile}")
        for name, maker in spec.files.items():
            _FILES[maker](context, name)
        ref = f"{BROKEN_REPOSITORY}:{case}"
        built[case] = ref  # removed at teardown even when the build fails half-way
        proc = docker("build", "--network", "host", "-t", ref, str(context),
                       check=False, timeout=1200)  # fmt: skip
        assert proc.returncode == 0, f"building {ref} failed:\n{proc.stdout[-3000:]}{proc.stderr}"
        return ref

    yield build
    for ref in built.values():
        docker("rmi", ref, check=False)
