"""`gpuenv doctor`'s pure evaluation on outputs recorded from real hosts.

Every fixture under tests/unit/recorded/ is verbatim text from a public GitHub issue; the
README there cites each one. No engine is used: `docker info` text becomes the Engine API's
`/info` dict through `info_from_text`, a test helper.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gpuenv.gpu.gpus import (
    GpuInfo,
    explain_start_error,
    parse_nvidia_smi_query,
)
from gpuenv.validate import doctor
from gpuenv.validate.doctor import (
    Facts,
    Finding,
    evaluate,
    gpu_support,
    image_verdict,
    workdir_finding,
)

RECORDED = Path(__file__).parent / "recorded"
TOOLKIT_MISSING = "install the NVIDIA Container Toolkit"

GPU_IMAGE = {
    "io.gpuenv.variant": "gpu",
    "io.gpuenv.cuda": "12.5",
    "org.opencontainers.image.title": "x",
}
CPU_IMAGE = {"io.gpuenv.variant": "cpu", "org.opencontainers.image.title": "x-cpu"}


def recorded(name: str) -> str:
    return (RECORDED / name).read_text(encoding="utf-8")


def recorded_driver(name: str) -> str:
    """The driver version a recorded `nvidia-smi` banner or `nvidia-smi -q` names."""
    m = re.search(r"Driver Version\s*:\s*([\d.]+)", recorded(name))
    assert m is not None
    return m.group(1)


def info_from_text(text: str) -> dict:
    """The fields of `docker info` text that doctor reads, shaped as GET /info returns them:
    Runtimes is a dict keyed by name, DefaultRuntime and ServerVersion strings, CDISpecDirs a
    list, DiscoveredDevices a list of {Source, ID}. Only the lines doctor needs are read; the
    rest of the text is ignored."""
    info: dict = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        value = value.strip()
        if key == "Runtimes":
            info["Runtimes"] = {name: {"path": name} for name in value.split()}
        elif key == "Default Runtime":
            info["DefaultRuntime"] = value
        elif key == "Server Version":
            info["ServerVersion"] = value
        elif key == "CDI spec directories":
            indent = len(line) - len(line.lstrip())
            dirs = []
            for nxt in lines[i + 1 :]:
                if len(nxt) - len(nxt.lstrip()) <= indent or ":" in nxt:
                    break
                dirs.append(nxt.strip())
            info["CDISpecDirs"] = dirs
        elif key == "Discovered Devices":  # Docker >= 28.3: "  cdi: nvidia.com/gpu=0"
            indent = len(line) - len(line.lstrip())
            found = []
            for nxt in lines[i + 1 :]:
                if len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                source, _, device = nxt.strip().partition(": ")
                found.append({"Source": source, "ID": device})
            info["DiscoveredDevices"] = found
    return info


def gpus_from_driver(driver: str) -> list[GpuInfo]:
    return [GpuInfo(driver, "recorded host", "?")]


def text_of(f: Finding) -> str:
    return f"{f.message} {f.fix or ''}"


# ---------------------------------------------------------------------------- the parser


def test_info_from_text_reads_the_recorded_nvidia_runtime_host() -> None:
    info = info_from_text(recorded("docker-info-nvidia-runtime.txt"))
    assert info == {
        "ServerVersion": "29.7.2",
        "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"],
        "DiscoveredDevices": [
            {"Source": "cdi", "ID": "nvidia.com/gpu=0"},
            {"Source": "cdi", "ID": "nvidia.com/gpu=GPU-0008bcf4-cae8-0120-a18f-bc344fb1c710"},
            {"Source": "cdi", "ID": "nvidia.com/gpu=all"},
        ],
        "Runtimes": {
            "io.containerd.runc.v2": {"path": "io.containerd.runc.v2"},
            "nvidia": {"path": "nvidia"},
            "runc": {"path": "runc"},
        },
        "DefaultRuntime": "runc",
    }


def test_info_from_text_reads_the_recorded_hook_only_host() -> None:
    info = info_from_text(recorded("docker-info-hook-only.txt"))
    assert set(info["Runtimes"]) == {"io.containerd.runc.v2", "runc"}
    assert info["DefaultRuntime"] == "runc"
    assert "CDISpecDirs" not in info


# ---------------------------------------------------------------------------- gpu support


@pytest.fixture
def nvidia_runtime_facts() -> Facts:
    # NVIDIA/nvidia-container-toolkit#1967: nvidia runtime registered (CDI dirs too).
    return Facts(
        info=info_from_text(recorded("docker-info-nvidia-runtime.txt")),
        hook_on_host=True,
        gpus=gpus_from_driver("535.183.01"),
        driver_source="nvidia-smi",
    )


@pytest.fixture
def hook_only_facts() -> Facts:
    # NVIDIA/nvidia-container-toolkit#653: toolkit installed, runtimes "io.containerd.runc.v2
    # runc", driver 535.183.01 (nvidia-smi -a from the same issue).
    driver = recorded_driver("nvidia-smi-q-535.txt")
    assert driver is not None
    return Facts(
        info=info_from_text(recorded("docker-info-hook-only.txt")),
        hook_on_host=True,
        gpus=gpus_from_driver(driver),
        driver_source="nvidia-smi",
    )


@pytest.fixture
def cdi_only_facts() -> Facts:
    # Derived, not verbatim: #1967's docker info (CDI spec directories /etc/cdi, /var/run/cdi)
    # with "nvidia" dropped from its Runtimes line, as on a CDI-only Docker >= 25 host; no
    # full public CDI-only `docker info` was found (see recorded/README.md).
    text = recorded("docker-info-nvidia-runtime.txt").replace(
        "Runtimes: io.containerd.runc.v2 nvidia runc", "Runtimes: io.containerd.runc.v2 runc"
    )
    info = info_from_text(text)
    assert "nvidia" not in info["Runtimes"]
    return Facts(
        info=info,
        hook_on_host=False,
        cdi_specs=["/var/run/cdi/nvidia.yaml"],
        gpus=gpus_from_driver("535.183.01"),
        driver_source="NVML",
    )


@pytest.fixture
def nothing_facts() -> Facts:
    # NixOS/nixpkgs#337873's engine: no nvidia runtime, no hook for dockerd, no CDI; GPUs there.
    return Facts(
        info=info_from_text(recorded("docker-info-hook-only.txt")),
        hook_on_host=False,
        gpus=gpus_from_driver("560.35.03"),
        driver_source="nvidia-smi",
    )


def test_nvidia_runtime_host_is_ok(nvidia_runtime_facts: Facts) -> None:
    f = gpu_support(nvidia_runtime_facts)
    assert f.level == "ok"
    assert "nvidia runtime is registered" in f.message
    assert "default runtime" not in f.message  # recorded Default Runtime: runc
    assert f.fix is None


def test_nvidia_runtime_as_default_is_said() -> None:
    text = recorded("docker-info-nvidia-runtime.txt").replace(
        "Default Runtime: runc", "Default Runtime: nvidia"
    )
    f = gpu_support(Facts(info=info_from_text(text)))
    assert f.level == "ok" and "default runtime" in f.message


def test_hook_only_host_is_ok_with_a_restart_hint(hook_only_facts: Facts) -> None:
    f = gpu_support(hook_only_facts)
    assert f.level == "ok"
    assert "nvidia-container-runtime-hook" in f.message
    assert f.fix is not None and "restart dockerd" in f.fix


def test_cdi_only_host_is_ok(cdi_only_facts: Facts) -> None:
    f = gpu_support(cdi_only_facts)
    assert f.level == "ok"
    assert "CDI" in f.message and "/var/run/cdi/nvidia.yaml" in f.message


def test_cdi_specs_on_an_engine_that_reads_none_is_a_warning(cdi_only_facts: Facts) -> None:
    # The same specs with the hook-only host's info (no "CDI spec directories" line).
    cdi_only_facts.info = info_from_text(recorded("docker-info-hook-only.txt"))
    f = gpu_support(cdi_only_facts)
    assert f.level == "warning"
    assert f.fix is not None and '"cdi": true' in f.fix


def test_nothing_with_gpus_present_is_an_error_naming_the_toolkit(nothing_facts: Facts) -> None:
    f = gpu_support(nothing_facts)
    assert f.level == "error"
    assert f.fix is not None and "NVIDIA Container Toolkit" in f.fix
    assert "nvidia-ctk runtime configure --runtime=docker" in f.fix


def test_nothing_without_gpus_is_only_info(nothing_facts: Facts) -> None:
    nothing_facts.gpus = []
    assert gpu_support(nothing_facts).level == "info"


def test_remote_engine_without_runtime_is_info_not_missing() -> None:
    facts = Facts(
        info=info_from_text(recorded("docker-info-hook-only.txt")), local=False, hook_on_host=None
    )
    f = gpu_support(facts)
    assert f.level == "info" and TOOLKIT_MISSING not in text_of(f)


def test_each_host_gets_its_own_finding_and_none_says_toolkit_missing(
    nvidia_runtime_facts: Facts, hook_only_facts: Facts, cdi_only_facts: Facts
) -> None:
    findings = [gpu_support(f) for f in (nvidia_runtime_facts, hook_only_facts, cdi_only_facts)]
    assert len({(f.message, f.fix) for f in findings}) == 3
    for f in findings:
        assert f.level == "ok"
        assert TOOLKIT_MISSING not in text_of(f)


# ---------------------------------------------------------------------------- evaluate


def test_evaluate_reports_engine_support_driver_and_images(hook_only_facts: Facts) -> None:
    hook_only_facts.images = [GPU_IMAGE, CPU_IMAGE]
    findings = evaluate(hook_only_facts)
    assert [f.topic for f in findings] == ["engine", "build", "arm64", "gpu support", "driver", "x",
                                           "x-cpu", "working directory", "notebook"]  # fmt: skip
    assert findings[0].level == "ok"  # the grep'd info has no version: "?" is said, not invented
    assert "Docker Engine ?" in findings[0].message
    assert findings[4].message.startswith("NVIDIA driver 535.183.01 via nvidia-smi")
    assert [f.level for f in findings[5:7]] == ["warning", "ok"]


def test_evaluate_names_the_recorded_server_version(nvidia_runtime_facts: Facts) -> None:
    findings = evaluate(nvidia_runtime_facts)
    assert "Docker Engine 29.7.2" in findings[0].message


def test_evaluate_engine_error_stops_there_but_still_says_the_driver() -> None:
    findings = evaluate(Facts(engine_error="Cannot connect to the Docker daemon"))
    assert [(f.topic, f.level) for f in findings] == [("engine", "error"), ("driver", "info")]
    # A bare GPU host (no engine): doctor still names the driver, the GPUs and their
    # compute capability.
    facts = Facts(engine_error="no engine", gpus=[GpuInfo("580.159.04", "NVIDIA H100", "9.0")],
                  driver_source="NVML")  # fmt: skip
    driver = evaluate(facts)[1]
    assert driver.level == "ok" and "580.159.04" in driver.message
    assert "NVIDIA H100 (compute 9.0)" in driver.message


def test_evaluate_gpu_image_on_an_engine_without_gpu_support_is_an_error(
    nothing_facts: Facts,
) -> None:
    nothing_facts.images = [GPU_IMAGE]
    findings = evaluate(nothing_facts)
    assert findings[3].topic == "gpu support" and findings[3].level == "error"
    assert findings[-3].level == "error" and "cannot pass GPUs" in findings[-3].message


# ---------------------------------------------------------------------------- image verdicts


def driver_535() -> str:
    driver = recorded_driver("nvidia-smi-banner-535-fragment.txt")
    assert driver == "535.104.05"
    return driver


def driver_470() -> str:
    m = re.search(r"v(\d+(?:\.\d+)+)", recorded("nvidia-smi-version-470.txt"))
    assert m is not None
    return m.group(1)


def test_gpu_image_on_recorded_535_is_a_warning_giving_the_toolkit_minimum() -> None:
    facts = Facts(gpus=gpus_from_driver(driver_535()))
    f = image_verdict(GPU_IMAGE, facts, gpu_ok=True)
    assert f.level == "warning"
    assert "535.104.05" in f.message and "555.42.06" in f.message


def test_gpu_image_on_recorded_525_105_is_a_warning_above_the_floor() -> None:
    driver = recorded_driver("nvidia-smi-banner-525.txt")
    assert driver == "525.105.17"
    f = image_verdict(GPU_IMAGE, Facts(gpus=gpus_from_driver(driver)), gpu_ok=True)
    assert f.level == "warning"


def test_gpu_image_on_recorded_470_is_an_error_giving_both_versions() -> None:
    assert driver_470() == "470.182.03"
    f = image_verdict(GPU_IMAGE, Facts(gpus=gpus_from_driver(driver_470())), gpu_ok=True)
    assert f.level == "error"
    assert "470.182.03" in f.message and "525.60.13" in f.message
    assert "CUDA driver version is insufficient" in f.message


def test_gpu_image_on_a_current_driver_is_ok() -> None:
    driver = recorded_driver("nvidia-smi-banner-mismatch.txt")
    assert driver == "580.95.05"
    f = image_verdict(GPU_IMAGE, Facts(gpus=gpus_from_driver(driver)), gpu_ok=True)
    assert f.level == "ok"


def test_cpu_image_is_ok_whatever_the_driver() -> None:
    for gpus in ([], gpus_from_driver(driver_470())):
        f = image_verdict(CPU_IMAGE, Facts(gpus=gpus), gpu_ok=False)
        assert f.level == "ok" and f.topic == "x-cpu"


def test_gpu_image_without_a_driver_warns_of_the_cpu_fallback() -> None:
    f = image_verdict(GPU_IMAGE, Facts(), gpu_ok=True)
    assert f.level == "warning" and "CPU" in f.message


def test_gpu_image_with_unknown_cuda_asks_for_a_rebuild() -> None:
    labels = {**GPU_IMAGE, "io.gpuenv.cuda": "9.9"}
    f = image_verdict(labels, Facts(gpus=gpus_from_driver(driver_535())), gpu_ok=True)
    assert f.level == "warning" and "rebuild" in f.message


# ---------------------------------------------------------------------------- nvidia-smi


def test_query_parser_rejects_rows_in_another_column_order() -> None:
    # triton-inference-server/server#8070: header, then compute_cap first. "7.0" is no driver
    # version (those have a 3-digit branch), so nothing is misread as one.
    assert parse_nvidia_smi_query(recorded("nvidia-smi-query-foreign-order.csv")) == []


def test_query_parser_rejects_the_old_smi_error() -> None:
    assert parse_nvidia_smi_query(recorded("nvidia-smi-no-compute-cap.txt")) == []


def test_nvidia_smi_probe_falls_back_when_compute_cap_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 470 host's nvidia-smi refuses compute_cap (recorded message, exit status 2 as in
    canonical/inference-snaps#128); the probe asks again without it. The second answer is
    synthetic: no public 470 `--query-gpu=driver_version,name` output was found."""
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        if "compute_cap" in cmd[1]:
            return subprocess.CompletedProcess(
                cmd, 2, recorded("nvidia-smi-no-compute-cap.txt"), ""
            )
        return subprocess.CompletedProcess(cmd, 0, f"{driver_470()}, Tesla T4\n", "")

    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(doctor.subprocess, "run", fake_run)
    assert doctor._nvidia_smi() == [GpuInfo("470.182.03", "Tesla T4", "?")]
    assert len(calls) == 2


def test_nvidia_smi_probe_gives_up_on_other_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            cmd, 9, "NVIDIA-SMI has failed because it couldn't communicate with the driver", ""
        )

    monkeypatch.setattr(doctor.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(doctor.subprocess, "run", fake_run)
    assert doctor._nvidia_smi() is None


# ---------------------------------------------------------------------------- toolkit errors


@pytest.mark.parametrize(
    ("fixture", "expect"),
    [
        ("docker-could-not-select-device-driver.txt", "install the NVIDIA Container Toolkit"),
        ("toolkit-require-cuda12.5.txt", "cuda>=12.5"),
        ("toolkit-legacy-hook-require.txt", "cuda>=12.8"),
        ("toolkit-old-require-spaces.txt", "cuda >= 9.0"),
        ("toolkit-legacy-hook-no-driver.txt", "finds no NVIDIA driver"),
    ],
)
def test_explain_start_error_on_recorded_errors(fixture: str, expect: str) -> None:
    msg = explain_start_error(recorded(fixture), "x")
    assert msg is not None and expect in msg
    assert "\n" not in msg


def test_recorded_toolkit_errors_get_distinct_fixes() -> None:
    unavailable = explain_start_error(recorded("docker-could-not-select-device-driver.txt"), "x")
    too_old = explain_start_error(recorded("toolkit-require-cuda12.5.txt"), "x")
    hook_too_old = explain_start_error(recorded("toolkit-legacy-hook-require.txt"), "x")
    no_driver = explain_start_error(recorded("toolkit-legacy-hook-no-driver.txt"), "x")
    assert None not in (unavailable, too_old, hook_too_old, no_driver)
    assert len({unavailable, too_old, no_driver}) == 3
    # Only the engine that cannot take --gpus at all is told to install the toolkit.
    assert TOOLKIT_MISSING in str(unavailable)
    for msg in (too_old, hook_too_old, no_driver):
        assert TOOLKIT_MISSING not in str(msg)
    assert "upgrade the driver" in str(too_old) and "for x" in str(too_old)
    assert "install the driver" in str(no_driver)


def test_unrelated_start_errors_are_left_alone() -> None:
    # The first error in NixOS/nixpkgs#337873's paste is about --runtime=nvidia, not --gpus.
    first = recorded("docker-could-not-select-device-driver.txt").split("\n\n")[1]
    assert "unknown or invalid runtime name: nvidia" in first
    assert explain_start_error(first, "x") is None


# ---------------------------------------------------------------------------- compute capability


@pytest.mark.parametrize(
    ("gpu", "level", "needle"),
    [
        (GpuInfo("560.35.03", "Tesla K80", "3.7"), "error", "sm_37"),  # no kernel image
        (GpuInfo("570.86.15", "NVIDIA B200", "10.0"), "warning", "PTX JIT"),
        (GpuInfo("560.35.03", "NVIDIA H100 80GB HBM3", "9.0"), "ok", "supports CUDA"),
    ],
)
def test_gpu_image_verdict_includes_the_compute_capability(gpu, level, needle) -> None:
    labels = {**GPU_IMAGE, "io.gpuenv.framework": "tensorflow",
              "io.gpuenv.framework-version": "2.21.0"}  # fmt: skip
    f = image_verdict(labels, Facts(gpus=[gpu]), gpu_ok=True)
    assert (f.level, needle in f.message) == (level, True), f.message


def test_the_build_path_is_named_with_what_the_engine_does_not_need() -> None:
    facts = Facts(info={"Architecture": "aarch64"}, local=False,
                  build_path="BuildKit through `docker buildx build --load`")  # fmt: skip
    finding = doctor.build_finding(facts)
    assert finding.level == "ok"
    assert finding.message.startswith("BuildKit through `docker buildx build --load`")
    assert "wheels for aarch64" in finding.message and "never need a remote engine" in (
        finding.message
    )
    assert any(f.topic == "build" for f in evaluate(facts))


def test_where_the_public_wheels_come_from_is_a_finding_with_the_overrides() -> None:
    near = Facts(packages_near=True, packages_why="the engine's host reaches "
                 "https://pypi.org/simple/ (probe: HTTP 200)")  # fmt: skip
    found = {f.topic: f for f in evaluate(near)}["packages"]
    assert (found.level, found.message) == ("ok", "fetched near the engine: " + near.packages_why)
    sent = Facts(
        packages_near=False,
        packages_why="the engine's host cannot fetch "
        "https://pypi.org/simple/ (SSLCertVerificationError: ...): wheels are sent",
    )
    found = {f.topic: f for f in evaluate(sent)}["packages"]
    assert found.level == "info" and found.message.startswith("sent from this machine: ")
    assert found.fix and "GPUENV_NEAR_INDEX" in found.fix and "GPUENV_NEAR_FETCH" in found.fix
    assert "packages" not in {f.topic for f in evaluate(Facts())}  # not probed: not said


def test_no_build_path_is_an_error_with_the_engine_modules_fix() -> None:
    why = "building needs BuildKit, through a docker CLI with buildx (tried: /usr/bin/docker)"
    finding = doctor.build_finding(Facts(build_error=why))
    assert (finding.topic, finding.level, finding.message) == ("build", "error", why)


# ---------------------------------------------------------------------------- arm64

ENABLED_PF = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\n"


@pytest.mark.parametrize(
    ("machine", "binfmt", "level", "words"),
    [
        ("aarch64", None, "ok", "natively"),
        ("x86_64", ENABLED_PF, "ok", "under QEMU"),
        ("x86_64", "", "info", "cannot run arm64"),
        ("x86_64", ENABLED_PF.replace("PF", "P"), "warning", "without the F flag"),
        ("x86_64", "disabled\nflags: PF\n", "info", "cannot run arm64"),
        ("x86_64", None, "info", "remote"),
    ],
)
def test_doctor_says_whether_arm64_containers_run_and_how_to_enable_them(
    machine, binfmt, level, words
):
    finding = doctor.arm64_finding(Facts(info={"Architecture": machine}, binfmt_aarch64=binfmt))
    assert finding.level == level and words in finding.message
    if level != "ok":
        assert finding.fix and "update-binfmts --enable qemu-aarch64" in finding.fix


@pytest.mark.parametrize(
    ("seen", "why", "level", "says"),
    [
        (True, "a file gpuenv wrote into /p was read back in a container", "ok", "binds it"),
        (False, "the engine's host has no directory /p", "info", "sends it to a volume"),
        (None, "no gpuenv image on the engine to probe with (gpuenv build)", "info", "not checked"),
    ],
)
def test_doctor_says_whether_the_engine_sees_this_directory_and_why(seen, why, level, says):
    finding = workdir_finding(Facts(workdir_seen=seen, workdir_why=why))
    assert finding.topic == "working directory" and finding.level == level
    assert says in finding.message and why in finding.message


def test_doctor_says_where_a_notebook_listens_and_keeps_layers_apart(
    hook_only_facts: Facts,
) -> None:
    layer = {**CPU_IMAGE, "io.gpuenv.notebook": "d" * 64}
    hook_only_facts.images = [CPU_IMAGE, layer]
    findings = evaluate(hook_only_facts)
    assert [f.topic for f in findings].count("x-cpu") == 1  # the layer is not a cell
    said = findings[-1]
    assert said.topic == "notebook" and "host network bound to 127.0.0.1" in said.message
    assert "1 notebook layer(s) kept" in said.message and "gpuenv devcontainer" in said.message
    hook_only_facts.networks, hook_only_facts.local = {"bridge", "host"}, False
    said = evaluate(hook_only_facts)[-1]
    assert "published on 127.0.0.1 from the engine's bridge network" in said.message
    assert "ssh -L" in said.message
