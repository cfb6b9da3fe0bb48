"""gpuenv.gpu.gpus: --gpus parsing, driver verdicts, nvidia-smi parsing, the toolkit's errors.

The error texts are verbatim: the first as the Docker SDK reported it on this project's
engine (Engine 20.10, no NVIDIA runtime), the others as users posted them in public issues
(cited beside each).
"""

from __future__ import annotations

import pytest

from gpuenv.catalog import compat
from gpuenv.gpu.gpus import (
    GPU_UNAVAILABLE,
    GpuInfo,
    GpuRequest,
    driver_tuple,
    explain_start_error,
    judge_driver,
    parse_gpus,
    parse_nvidia_smi_query,
)
from gpuenv.matrix.errors import GpuenvError

UUID = "GPU-6d5a7e3c-4f1b-2a9d-8c7e-0b1f2a3c4d5e"

# --------------------------------------------------------------------------- --gpus


@pytest.mark.parametrize(
    ("spec", "count", "ids", "caps"),
    [
        ("all", -1, (), ("gpu",)),
        ("1", 1, (), ("gpu",)),
        ("2", 2, (), ("gpu",)),
        ("device=0", None, ("0",), ("gpu",)),
        ("device=0,2", None, ("0", "2"), ("gpu",)),
        ('"device=0,2"', None, ("0", "2"), ("gpu",)),  # Docker's documented quoting
        (f"device={UUID}", None, (UUID,), ("gpu",)),
        (
            f"device={UUID},{UUID.replace('6d', '7e')}",
            None,
            (UUID, UUID.replace("6d", "7e")),
            ("gpu",),
        ),
        (
            "device=MIG-4f2c8d3e-1a2b-5c6d-7e8f-9a0b1c2d3e4f",
            None,
            ("MIG-4f2c8d3e-1a2b-5c6d-7e8f-9a0b1c2d3e4f",),
            ("gpu",),
        ),
        ("count=3", 3, (), ("gpu",)),
        ("count=all", -1, (), ("gpu",)),
        ("capabilities=compute,utility", -1, (), ("compute", "gpu", "utility")),
        ("device=1,capabilities=utility", None, ("1",), ("gpu", "utility")),
        (" all ", -1, (), ("gpu",)),
    ],
)
def test_parse_gpus_forms(spec, count, ids, caps):
    req = parse_gpus(spec)
    assert (req.count, req.device_ids, req.capabilities) == (count, ids, caps)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--gpus needs a value"),
        ("0", "--gpus 0 asks for no GPU"),
        ("none", "expected all, N or key=value"),
        ("-1", "expected all, N or key=value"),
        ("device=", "device ids are indices"),
        ("device=first", "device ids are indices"),
        ("device=0;1", "device ids are indices"),
        ("device=GPU-123", "device ids are indices"),  # too short for a UUID
        ("count=0", "count is all or N > 0"),
        ("count=two", "count is all or N > 0"),
        ("driver=nvidia", "unknown option 'driver'"),
        ("device=0,count=2", "give count or device, not both"),
    ],
)
def test_parse_gpus_errors(spec, message):
    with pytest.raises(GpuenvError) as err:
        parse_gpus(spec)
    assert message in err.value.message
    assert err.value.exit_code == 125  # `gpuenv run` fails as docker run does


@pytest.mark.parametrize(
    ("spec", "body"),
    [
        ("all", {"Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}),
        ("2", {"Count": 2, "DeviceIDs": None, "Capabilities": [["gpu"]]}),
        ("device=0,2", {"Count": 0, "DeviceIDs": ["0", "2"], "Capabilities": [["gpu"]]}),
        (f"device={UUID}", {"Count": 0, "DeviceIDs": [UUID], "Capabilities": [["gpu"]]}),
        (
            "capabilities=utility",
            {"Count": -1, "DeviceIDs": None, "Capabilities": [["gpu", "utility"]]},
        ),
    ],
)
def test_device_request_bodies(spec, body):
    """What Docker's own `--gpus` sends: a count or device ids (never both: the engine
    refuses that), capabilities [["gpu"]], the default driver."""
    assert parse_gpus(spec).as_api() == {"Driver": "", "Options": {}, **body}


def test_describe():
    assert parse_gpus("all").describe() == "all GPUs"
    assert parse_gpus("2").describe() == "2 GPU(s)"
    assert parse_gpus("device=0,2").describe() == "GPUs 0,2"
    assert GpuRequest(count=1).capabilities == ("gpu",)


# --------------------------------------------------------------------------- driver verdicts

FLOOR_12 = "525.60.13"  # any CUDA 12.x under minor-version compatibility
MIN_12_5_1 = "555.42.06"  # CUDA 12.5.1's own minimum (release notes)


@pytest.mark.parametrize(
    ("driver", "level"),
    [
        ("470.256.02", "error"),  # R470: CUDA 11.4 era
        ("525.60.12", "error"),
        ("525.60.13", "warning"),  # exactly the floor runs, without PTX JIT for newer GPUs
        ("535.104.05", "warning"),  # R535 LTS: a common datacenter driver
        ("555.42.02", "warning"),  # 12.5 GA's minimum, below 12.5.1's
        ("555.42.06", "ok"),
        ("560.35.03", "ok"),
        ("560", "ok"),
        ("580.65.06", "ok"),
    ],
)
def test_judge_driver_for_cuda_12_5(driver, level):
    verdict = judge_driver(driver, "12.5", "12.5.1", FLOOR_12, MIN_12_5_1)
    assert verdict.level == level, verdict.message


def test_error_names_both_versions_and_the_fix():
    message = judge_driver("470.256.02", "12.5", "12.5.1", FLOOR_12, MIN_12_5_1).message
    assert "470.256.02" in message and FLOOR_12 in message and "CUDA 12.5" in message
    assert "CUDA driver version is insufficient" in message
    assert f"Upgrade the driver to >= {MIN_12_5_1}" in message


def test_warning_names_what_minor_version_compatibility_lacks():
    message = judge_driver("535.104.05", "12.5", "12.5.1", FLOOR_12, MIN_12_5_1).message
    assert "535.104.05" in message and MIN_12_5_1 in message and "12.5.1" in message
    assert "minor-version compatibility" in message and "PTX" in message


def test_catalog_holds_the_figures_the_verdicts_use():
    cat = compat.catalog()
    assert cat.driver_floor["12"] == FLOOR_12
    assert (cat.toolkits["12.5"].release, cat.toolkits["12.5"].min_driver) == (
        "12.5.1",
        MIN_12_5_1,
    )


def test_driver_tuple_compares_numerically():
    assert driver_tuple("535.104.05") > driver_tuple("535.54.03")  # "104" > "54" as numbers
    assert driver_tuple("560") > driver_tuple("555.42.06")


# --------------------------------------------------------------------------- nvidia-smi

# `nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader` on a
# two-GPU host (the probe's command).
QUERY_OUTPUT = """\
535.104.05, NVIDIA A100-SXM4-80GB, 8.0
535.104.05, NVIDIA A100-SXM4-80GB, 8.0
"""


def test_parse_nvidia_smi_query():
    assert parse_nvidia_smi_query(QUERY_OUTPUT) == [
        GpuInfo("535.104.05", "NVIDIA A100-SXM4-80GB", "8.0"),
        GpuInfo("535.104.05", "NVIDIA A100-SXM4-80GB", "8.0"),
    ]


def test_parse_nvidia_smi_query_mixed_gpus_and_windows_line_ends():
    text = "560.35.03, NVIDIA GeForce RTX 4090, 8.9\r\n560.35.03, Tesla T4, 7.5\r\n"
    gpus = parse_nvidia_smi_query(text)
    assert [(g.name, g.compute_cap) for g in gpus] == [
        ("NVIDIA GeForce RTX 4090", "8.9"),
        ("Tesla T4", "7.5"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "",
        # A driver older than 510 does not know the field:
        'Field "compute_cap" is not a valid field to query.\n',
        # No driver loaded on the host:
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
        "sure that the latest NVIDIA driver is installed and running.\n",
    ],
)
def test_parse_nvidia_smi_query_finds_no_gpu_in_errors(text):
    assert parse_nvidia_smi_query(text) == []


# --------------------------------------------------------------------------- toolkit errors

# Recorded on this project's engine (Docker 20.10, no NVIDIA runtime), as the SDK raised it.
NO_TOOLKIT_SDK = (
    "500 Server Error for http+docker://localhost/v1.41/containers/f7379ddf3c32/start: "
    'Internal Server Error ("could not select device driver "" with capabilities: [[gpu]]")'
)
# docker CLI, e.g. https://github.com/NVlabs/BundleSDF/issues/184
NO_TOOLKIT_CLI = (
    'docker: Error response from daemon: could not select device driver "" with '
    "capabilities: [[gpu]]."
)
# Compose with `driver: nvidia`: https://github.com/infiniflow/ragflow/issues/9573
NO_TOOLKIT_COMPOSE = (
    'Error response from daemon: could not select device driver "nvidia" with capabilities: [[gpu]]'
)
# Recorded on this project's engine with --gpus 'capabilities=compute,utility': gpuenv sends
# the capabilities sorted (the SDK's text), the docker CLI in its own order.
NO_TOOLKIT_CAPS_SDK = (
    "500 Server Error for http+docker://localhost/v1.41/containers/e22725c57c5e/start: "
    'Internal Server Error ("could not select device driver "" with capabilities: '
    '[[compute gpu utility]]")'
)
NO_TOOLKIT_CAPS_CLI = (
    'docker: Error response from daemon: could not select device driver "" with '
    "capabilities: [[compute utility gpu]]."
)
# https://github.com/MauriceNino/dashdot/issues/1226
CUDA_REQUIREMENT = (
    "Error response from daemon: failed to create task for container: failed to create shim "
    "task: OCI runtime create failed: runc create failed: unable to start container process: "
    "error during container init: error running prestart hook #0: exit status 1, stdout: , "
    "stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: requirement error: "
    "unsatisfied condition: cuda>=12.5, please update your driver to a newer version, or use "
    "an earlier cuda container: unknown"
)
# Older toolkits, older wording: https://github.com/NVIDIA/nvidia-docker/issues/536
CUDA_REQUIREMENT_2017 = (
    "nvidia-container-cli: requirement error: unsatisfied condition: cuda >= 9.0\\n"
)
# https://github.com/docker/for-win/issues/13835
NO_DRIVER_LIBRARY = (
    "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
    "cannot open shared object file: no such file or directory: unknown"
)
NO_DRIVER_LOADED = "nvidia-container-cli: initialization error: nvml error: driver not loaded"


@pytest.mark.parametrize(
    "text",
    [NO_TOOLKIT_SDK, NO_TOOLKIT_CLI, NO_TOOLKIT_COMPOSE, NO_TOOLKIT_CAPS_SDK, NO_TOOLKIT_CAPS_CLI],
)
def test_no_toolkit_names_the_toolkit_and_how_to_set_it_up(text):
    message = explain_start_error(text, "acme/tf:gpu")
    assert message is not None
    assert "NVIDIA Container Toolkit" in message
    assert "nvidia-container-toolkit" in message  # the package to install
    assert "nvidia-ctk runtime configure --runtime=docker" in message
    assert "restart dockerd" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "text", [NO_TOOLKIT_SDK, NO_TOOLKIT_CAPS_SDK, NO_TOOLKIT_CAPS_CLI, NO_TOOLKIT_COMPOSE]
)
def test_gpu_unavailable_is_recognised_whatever_capabilities_were_asked(text):
    assert GPU_UNAVAILABLE.search(text)


@pytest.mark.parametrize(
    ("text", "condition"),
    [(CUDA_REQUIREMENT, "cuda>=12.5"), (CUDA_REQUIREMENT_2017, "cuda >= 9.0")],
)
def test_unsatisfied_cuda_requirement_is_an_old_driver(text, condition):
    message = explain_start_error(text, "acme/tf:gpu")
    assert message is not None
    assert "driver is too old for acme/tf:gpu" in message
    assert condition in message
    assert "Toolkit" not in message  # the toolkit works: it is not "toolkit missing"


@pytest.mark.parametrize("text", [NO_DRIVER_LIBRARY, NO_DRIVER_LOADED])
def test_toolkit_without_driver_says_install_the_driver(text):
    message = explain_start_error(text, "acme/tf:gpu")
    assert message is not None
    assert "Toolkit is installed but finds no NVIDIA driver" in message
    assert "nvidia-smi must work on the host" in message
    assert "libnvidia-ml.so.1" in message or "driver not loaded" in message


@pytest.mark.parametrize(
    "text",
    [
        '404 Client Error: Not Found ("No such image: acme/tf:gpu")',
        'OCI runtime create failed: exec: "nvidia-smi": executable file not found in $PATH',
        "",
    ],
)
def test_other_errors_are_not_explained_as_gpu_problems(text):
    assert explain_start_error(text, "acme/tf:gpu") is None
