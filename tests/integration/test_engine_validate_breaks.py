"""Every validation check shown to fail (GPU truth: validation fails closed).

For each check, a small image derived from a shipped one (one layer on top, built with
``--network none``) is broken in exactly that respect, and `gpuenv validate -i IMAGE` must
fail that check and only that one: every other check has the outcome it has on the shipped
image itself (passed, or skipped with the same reason). The derived images keep the shipped
image's io.gpuenv.* labels, so `-i` rebuilds the same expectations from them. They are
tagged ``gpuenv-test/broken-checks:<case>`` and removed when the module ends.

Also here: `--gpus` on an engine that cannot give GPUs fails the device checks (with the
engine's reason and the fix), and `gpuenv diff` reports a real difference of each kind.

The only downloads are two wheels of CUDA 12.6 (a libcudart and a ptxas of another
release), fetched on the host with pip before the images are built.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cells import test_repository

pytestmark = pytest.mark.engine

CPU_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cpu"
GPU_IMAGE = "gpuenv/tensorflow:tf2.21-py3.11-cuda12.5-gpu"
REPOSITORY = test_repository("broken-checks")
SP = "/opt/venv/lib/python3.11/site-packages"
USER = "USER 1000:1000\n"  # the shipped images' default user, restored after a root step
# Another CUDA release's wheels (the catalog's 12.6 set): real files of another version.
OTHER_CUDA = {
    "nvidia-cuda-runtime-cu12": "12.6.77",
    "nvidia-cuda-nvcc-cu12": "12.6.85",
}
ROGUE_CERT = "gpuenv-test-rogue.crt"


@dataclass(frozen=True)
class Break:
    """An image derived from a shipped one, broken in the respect one check looks at."""

    base: str  # CPU_IMAGE or GPU_IMAGE
    dockerfile: str  # the lines after FROM
    check: str  # the one check function that must fail
    needles: tuple[str, ...]  # what its failure message must name


def _without_cupti(env: list[str]) -> str:
    value = next(e.split("=", 1)[1] for e in env if e.startswith("LD_LIBRARY_PATH="))
    return ":".join(p for p in value.split(":") if "/cuda_cupti/" not in p)


BREAKS: dict[str, Break] = {
    # The interpreter reports another Python (a .pth line run at start-up rewrites
    # sys.version_info: no other Python that can import this TensorFlow is at hand).
    "python-version": Break(
        CPU_IMAGE,
        "USER root\n"
        f'RUN echo "import sys, collections; sys.version_info = collections.namedtuple('
        f"'version_info', 'major minor micro releaselevel serial')(3, 10, 0, 'final', 0)\" "
        f"> {SP}/gpuenv_test_python.pth\n" + USER,
        "test_python_version",
        ("Python 3.10", "expected 3.11"),
    ),
    # An installer cache only root can see (/root is mode 700): found as root.
    "installer-cache": Break(
        CPU_IMAGE,
        "USER root\nRUN mkdir -p /root/.cache/uv && echo x > /root/.cache/uv/wheel\n" + USER,
        "test_no_installer_cache_or_compiler",
        ("/root/.cache",),
    ),
    # A driver library where only root can see it.
    "driver-under-root": Break(
        CPU_IMAGE,
        "USER root\nRUN touch /root/libnvidia-ml.so.1\n" + USER,
        "test_no_driver_files",
        ("/root/libnvidia-ml.so.1",),
    ),
    # A certificate trusted from under /usr/share/ca-certificates but no file of Debian's
    # ca-certificates package (the old check took that directory for the package).
    "ca-outside-the-package": Break(
        CPU_IMAGE,
        "USER root\n"
        f"COPY {ROGUE_CERT} /usr/share/ca-certificates/extra/{ROGUE_CERT}\n"
        f"RUN echo extra/{ROGUE_CERT} >> /etc/ca-certificates.conf && update-ca-certificates\n"
        + USER,
        "test_no_ca_beyond_the_distribution_trust_store",
        (
            "1 trusted certificate(s) not from Debian",
            f"/usr/share/ca-certificates/extra/{ROGUE_CERT}",
        ),
    ),
    # A file of the package replaced by another certificate: dpkg --verify names it.
    "ca-package-file-modified": Break(
        CPU_IMAGE,
        "USER root\n"
        f"COPY {ROGUE_CERT} /usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt\n"
        "RUN update-ca-certificates\n" + USER,
        "test_no_ca_beyond_the_distribution_trust_store",
        ("1 trusted certificate(s) not from Debian", "mozilla/ISRG_Root_X1.crt"),
    ),
    # TensorFlow's core library gone: installed (per its metadata) but cannot compute.
    "tensorflow-cpu": Break(
        CPU_IMAGE,
        f"USER root\nRUN rm {SP}/tensorflow/libtensorflow_framework.so.2\n" + USER,
        "test_framework_computes_on_the_cpu",
        ("libtensorflow_framework.so.2: cannot open shared object file",),
    ),
    # A wheel whose metadata names another release than the cell pins.
    "pinned-package": Break(
        GPU_IMAGE,
        "USER root\n"
        f"RUN sed -i 's/^Version: 2.27.7$/Version: 2.27.8/' "
        f"{SP}/nvidia_nccl_cu12-2.27.7.dist-info/METADATA\n" + USER,
        "test_pinned_packages_are_installed",
        ("nvidia-nccl-cu12", "2.27.7", "2.27.8"),
    ),
    # CUDA 12.6's runtime library in place of 12.5's (the wheel's metadata still says 12.5).
    "cuda-runtime": Break(
        GPU_IMAGE,
        f"COPY libcudart.so.12 {SP}/nvidia/cuda_runtime/lib/libcudart.so.12\n",
        "test_cuda_runtime_version",
        ("CUDA 12.6", "expected 12.5"),
    ),
    # cuRAND under its full version only: no libcurand.so.10 to load by that name (no
    # other library links to it, so ldd still resolves everything).
    "cuda-libraries-load": Break(
        GPU_IMAGE,
        f"USER root\nRUN cd {SP}/nvidia/curand/lib && mv libcurand.so.10 libcurand.so.10.3.6.82\n"
        + USER,
        "test_cuda_libraries_load_without_a_driver",
        ("libcurand.so.10: cannot open shared object file",),
    ),
    # No ldd: the old check found nothing "not found" and passed.
    "ldd": Break(
        GPU_IMAGE,
        "USER root\nRUN rm /usr/bin/ldd\n" + USER,
        "test_ldd_finds_everything_but_libcuda",
        ("ldd is not in the image",),
    ),
    # CUDA 12.6's ptxas in place of 12.5's.
    "ptxas": Break(
        GPU_IMAGE,
        f"COPY ptxas {SP}/nvidia/cuda_nvcc/bin/ptxas\n",
        "test_ptxas_is_found",
        ("release 12.6, V12.6.85", "expected release 12.5, V12.5.82"),
    ),
    # TensorFlow's build info says it is no CUDA build (its cached bytecode removed too).
    "tensorflow-build-info": Break(
        GPU_IMAGE,
        "USER root\n"
        f"RUN cd {SP}/tensorflow/python/platform"
        " && sed -i \"s/('is_cuda_build', True)/('is_cuda_build', False)/\" build_info.py"
        " && rm -f __pycache__/build_info.*.pyc\n" + USER,
        "test_framework_build_info_agrees",
        ("TensorFlow is not a CUDA build",),
    ),
    # GPUs baked in.
    "nvidia-environment": Break(
        GPU_IMAGE,
        "ENV NVIDIA_VISIBLE_DEVICES=all\n",
        "test_nvidia_environment",
        ("GPUs must be asked for, never baked in",),
    ),
    # The CUPTI wheel's directory missing from LD_LIBRARY_PATH (TensorFlow's profiler
    # dlopens libcupti.so.12 by that name).
    "library-path": Break(
        GPU_IMAGE,
        "ENV LD_LIBRARY_PATH={without_cupti}\n",
        "test_library_path_reaches_the_wheels",
        ("LD_LIBRARY_PATH misses", "nvidia/cuda_cupti/lib"),
    ),
}

# The ten checks the issue names, and the case that breaks each (the table in docs/validation.md).
BROKEN_BY = {
    "test_python_version": "python-version",
    "test_no_installer_cache_or_compiler": "installer-cache",
    "test_framework_computes_on_the_cpu": "tensorflow-cpu",
    "test_cuda_runtime_version": "cuda-runtime",
    "test_cuda_libraries_load_without_a_driver": "cuda-libraries-load",
    "test_ldd_finds_everything_but_libcuda": "ldd",
    "test_ptxas_is_found": "ptxas",
    "test_framework_build_info_agrees": "tensorflow-build-info",
    "test_nvidia_environment": "nvidia-environment",
    "test_library_path_reaches_the_wheels": "library-path",
}


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Outcome:
    outcome: str  # passed | failed | skipped
    message: str = ""


def outcomes(xml: Path) -> dict[str, Outcome]:
    """test function -> Outcome, from the suites' JUnit XML (one image per run)."""
    found: dict[str, Outcome] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = case.get("name", "").split("[")[0]
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            found[test] = Outcome("failed", failure.get("message") or "")
        elif skipped is not None:
            found[test] = Outcome("skipped", skipped.get("message") or "")
        else:
            found[test] = Outcome("passed")
    return found


def summary_line(test: str) -> str:
    return test.removeprefix("test_").replace("_", " ")


def _fetch_other_cuda(dest: Path) -> dict[str, Path]:
    """libcudart.so.12 and ptxas of CUDA 12.6, out of their wheels (pip, on the host)."""
    wheels = dest / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "-d", str(wheels),
         *(f"{name}=={version}" for name, version in OTHER_CUDA.items())],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    members = {
        "libcudart.so.12": "nvidia/cuda_runtime/lib/libcudart.so.12",
        "ptxas": "nvidia/cuda_nvcc/bin/ptxas",
    }
    out = {}
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for name, member in members.items():
                if member in zf.namelist():
                    out[name] = dest / name
                    out[name].write_bytes(zf.read(member))
                    out[name].chmod(0o755)
    assert set(out) == set(members), f"not in the wheels: {set(members) - set(out)}"
    return out


def _rogue_cert(path: Path) -> None:
    key = path.parent / "rogue.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=gpuenv-test rogue CA", "-keyout", str(key), "-out", str(path)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def derived(
    shipped_gpu: dict[str, Any],
    docker: Callable[..., Any],
    inspect: Callable[[str], dict[str, Any] | None],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str, str], str]]:
    """derived(name, dockerfile_after_from, base) -> the tag of an image one layer on top of
    a shipped one, built with --network none; every such image is removed at the end."""
    gpu = inspect(GPU_IMAGE)
    assert gpu is not None, GPU_IMAGE
    files = tmp_path_factory.mktemp("broken-checks-files")
    _rogue_cert(files / ROGUE_CERT)
    fetched: dict[str, Path] = {}
    built: list[str] = []

    def build(name: str, lines: str, base: str) -> str:
        ref = f"{REPOSITORY}:{name}"
        if ref in built:
            return ref
        context = tmp_path_factory.mktemp(f"broken-{name}")
        lines = lines.replace("{without_cupti}", _without_cupti(gpu["Config"]["Env"]))
        (context / "Dockerfile").write_text(f"FROM {base}\n{lines}")
        for copied in ("libcudart.so.12", "ptxas", ROGUE_CERT):
            if f"COPY {copied} " in lines:
                if copied != ROGUE_CERT and not fetched:
                    fetched.update(_fetch_other_cuda(files))
                source = fetched.get(copied) or files / copied
                (context / copied).write_bytes(source.read_bytes())
                (context / copied).chmod(0o755)
        built.append(ref)  # removed at the end even when the build fails half-way
        docker("build", "--network", "none", "-q", "-t", ref, str(context), timeout=900)
        return ref

    try:
        yield build
    finally:
        for ref in built:
            docker("rmi", ref, check=False)


@pytest.fixture(scope="module")
def validate_image(
    gpuenv: Callable[..., Any], docker: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., tuple[Any, dict[str, Outcome]]]:
    """validate_image(ref, *more_args) -> (the CLI's CompletedProcess, its JUnit outcomes);
    also asserts it left no validation container of that image."""

    def validate(ref: str, *args: str) -> tuple[Any, dict[str, Outcome]]:
        def of_image() -> set[str]:
            return set(docker("ps", "-a", "-q", "--filter", "label=io.gpuenv.validate=1",
                              "--filter", f"ancestor={ref}").stdout.split())  # fmt: skip

        before = of_image()  # an earlier, killed session's are not this validation's
        xml = tmp_path_factory.mktemp("junit") / "junit.xml"
        proc = gpuenv("validate", "-i", ref, *args, "--junitxml", str(xml), check=False,
                      timeout=900)  # fmt: skip
        assert xml.is_file(), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        left = sorted(of_image() - before)
        for cid in left:
            docker("rm", "-f", cid, check=False)
        assert not left, f"gpuenv validate left containers of {ref}: {left}"
        return proc, outcomes(xml)

    return validate


@pytest.fixture(scope="module")
def shipped_outcomes(
    shipped_gpu: dict[str, Any], validate_image: Callable[..., Any]
) -> dict[str, dict[str, Outcome]]:
    """The shipped images' own outcomes under `-i`: what every unbroken check must match."""
    found = {}
    for image in (CPU_IMAGE, GPU_IMAGE):
        proc, tests = validate_image(image)
        assert proc.returncode == 0, f"{image}:\n{proc.stdout}\n{proc.stderr}"
        assert not [t for t, o in tests.items() if o.outcome == "failed"], tests
        found[image] = tests
    return found


# --------------------------------------------------------------------------- each check


def test_the_ten_checks_each_have_a_break() -> None:
    assert set(BROKEN_BY.values()) <= set(BREAKS)
    for test, case in BROKEN_BY.items():
        assert BREAKS[case].check == test


@pytest.mark.parametrize("case", list(BREAKS))
def test_each_check_fails_alone_on_an_image_broken_in_that_respect(
    case: str,
    derived: Callable[[str, str, str], str],
    validate_image: Callable[..., Any],
    shipped_outcomes: dict[str, dict[str, Outcome]],
) -> None:
    spec = BREAKS[case]
    baseline = shipped_outcomes[spec.base]
    assert baseline[spec.check].outcome == "passed", (spec.check, baseline[spec.check])
    ref = derived(case, spec.dockerfile, spec.base)
    proc, tests = validate_image(ref)
    report = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 1, report
    assert "1 check(s) failed" in proc.stderr, report
    assert set(tests) == set(baseline), report
    failed = {t for t, o in tests.items() if o.outcome == "failed"}
    assert failed == {spec.check}, report
    for test, outcome in tests.items():
        if test != spec.check:
            assert outcome == baseline[test], (test, outcome, baseline[test])
    message = tests[spec.check].message
    line = next(
        line.strip() for line in proc.stdout.splitlines()
        if line.strip().startswith(f"FAILED {summary_line(spec.check)}: ")
    )  # fmt: skip
    for needle in spec.needles:
        assert needle in message, (needle, message)
        assert needle in line, (needle, line)


# --------------------------------------------------------------------------- --gpus


# `--gpus all` is test_engine_validate.py's (the same refusal, the cell named through the
# matrix); here the other form, capabilities, on the image named with -i.
@pytest.mark.parametrize("gpus", ["capabilities=compute,utility"])
def test_device_checks_fail_when_the_engine_cannot_give_the_requested_gpus(
    gpus: str,
    validate_image: Callable[..., Any],
    shipped_outcomes: dict[str, dict[str, Outcome]],
) -> None:
    # This engine has no NVIDIA toolkit: --gpus was asked for and cannot be honoured, so the
    # device checks fail (never skip) with the engine's reason and the fix.
    proc, tests = validate_image(GPU_IMAGE, "--gpus", gpus)
    report = f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 1, report
    devices = {t for t, o in shipped_outcomes[GPU_IMAGE].items() if "no --gpus given" in o.message}
    assert len(devices) == 6, shipped_outcomes[GPU_IMAGE]
    for test, outcome in tests.items():
        if test in devices:
            assert outcome.outcome == "failed", (test, outcome)
            assert "--gpus was given but the engine could not start" in outcome.message
            assert "could not select device driver" in outcome.message, outcome
            assert "install the NVIDIA Container Toolkit" in outcome.message, outcome
        else:
            assert outcome == shipped_outcomes[GPU_IMAGE][test], (test, outcome)
    assert f"{len(devices)} check(s) failed" in proc.stderr, report


# --------------------------------------------------------------------------- gpuenv diff


def test_diff_reports_each_kind_of_difference(
    derived: Callable[[str, str, str], str], gpuenv: Callable[..., Any]
) -> None:
    ref = derived(
        "diff",
        "USER root\n"
        # A pip package changed (its metadata's version) and one added.
        f"RUN sed -i 's/^Version: .*/Version: 1.0.0/' {SP}/certifi-*.dist-info/METADATA"
        f" && mkdir {SP}/gpuenv_test_diff-0.1.dist-info"
        f" && printf 'Metadata-Version: 2.1\\nName: gpuenv-test-diff\\nVersion: 0.1\\n'"
        f" > {SP}/gpuenv_test_diff-0.1.dist-info/METADATA"
        # A file added and one changed.
        " && echo x > /etc/gpuenv-test-diff && echo '# gpuenv-test' >> /etc/bash.bashrc\n"
        "ENV GPUENV_TEST_DIFF=1\n"
        "LABEL io.gpuenv.test-diff=1\n" + USER,
        CPU_IMAGE,
    )
    proc = gpuenv("diff", CPU_IMAGE, ref, "--json", check=False, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["identical"] is False
    certifi = next(c for c in doc["pip"]["changed"] if c[0] == "certifi")
    assert certifi[2] == "1.0.0" and certifi[1] != "1.0.0", doc["pip"]
    assert doc["pip"]["only_b"] == ["gpuenv-test-diff"], doc["pip"]
    assert doc["env"]["only_b"] == ["GPUENV_TEST_DIFF"] and not doc["env"]["changed"], doc["env"]
    assert doc["labels"]["only_b"] == ["io.gpuenv.test-diff"], doc["labels"]
    assert "/etc/gpuenv-test-diff" in doc["files"]["only_b"], doc["files"]["only_b"]
    changed = {c[0] for c in doc["files"]["changed"]}
    assert "/etc/bash.bashrc" in changed, sorted(changed)[:20]
    assert any(p.startswith(f"{SP}/certifi-") and p.endswith("/METADATA") for p in changed)
    assert "apt" not in doc, doc["apt"]  # sections without differences are left out
    # The text report names them too, and the same comparison the other way round mirrors
    # it: one run shows both (each run takes an inventory of two TF images: 20-40 s).
    back = gpuenv("diff", ref, CPU_IMAGE, check=False, timeout=900)
    assert back.returncode == 1, back.stdout + back.stderr
    lines = back.stdout.splitlines()
    assert lines[0].startswith(f"--- {ref} ") and lines[1].startswith(f"+++ {CPU_IMAGE} ")
    for needle in ("- gpuenv-test-diff", "- GPUENV_TEST_DIFF", "- io.gpuenv.test-diff",
                   "- /etc/gpuenv-test-diff"):  # fmt: skip
        assert f"  {needle}" in lines, (needle, back.stdout)
    for needle in (f"~ certifi: 1.0.0 -> {certifi[1]}", "~ /etc/bash.bashrc:"):
        assert any(line.startswith(f"  {needle}") for line in lines), (needle, back.stdout)
    # "identical:" and exit 0 where nothing differs: test_engine_lock.py's two builds of one
    # locked cell (two images, not one against itself).
