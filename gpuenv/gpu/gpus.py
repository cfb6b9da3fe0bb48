"""GPU requests and driver verdicts: pure functions, unit-tested on real hosts' outputs.

`--gpus` takes Docker's forms and becomes the DeviceRequest Docker itself would send. The
host's driver is judged against the cell's CUDA: below the major version's floor nothing
runs ("CUDA driver version is insufficient"); below the toolkit's own minimum, minor-version
compatibility still runs the code but cannot JIT-compile PTX for GPUs newer than the
binaries target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuenv.matrix.errors import GpuenvError

# An index, a MIG device by GPU:instance index (0:1), a GPU UUID or a MIG UUID; as a CDI name
# each may carry NVIDIA's kind (nvidia.com/gpu=0), and nvidia.com/gpu=all means every GPU.
_DEVICE_ID = re.compile(r"(?:\d+|\d+:\d+|GPU-[0-9a-fA-F-]{8,64}|MIG-[0-9a-zA-Z/-]{8,80})")
CDI_KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class GpuRequest:
    """What --gpus asked for: a count (-1 = all) or explicit device ids."""

    count: int | None = None
    device_ids: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ("gpu",)

    def as_api(self) -> dict[str, Any]:
        """The DeviceRequest JSON the Engine API takes (HostConfig.DeviceRequests[])."""
        body: dict[str, Any] = {
            "Driver": "",
            "Count": self.count if self.count is not None else 0,
            "DeviceIDs": list(self.device_ids) or None,
            "Capabilities": [list(self.capabilities)],
            "Options": {},
        }
        return body

    def describe(self) -> str:
        if self.device_ids:
            return f"GPUs {','.join(self.device_ids)}"
        return "all GPUs" if self.count == -1 else f"{self.count} GPU(s)"


def parse_gpus(spec: str) -> GpuRequest:
    """Docker's --gpus forms: all, N, device=0,2, device=GPU-<uuid>, "count=N", plus
    capabilities=... Unknown forms are an error, not a silent CPU run."""
    text = spec.strip().strip('"')
    if text.startswith(CDI_KIND + "="):  # CDI names alone: --gpus nvidia.com/gpu=0,...
        text = "device=" + text
    if not text:
        raise GpuenvError("--gpus needs a value: all, N, or device=ID[,ID...]", exit_code=125)
    if text == "all":
        return GpuRequest(count=-1)
    if text.isdigit():
        n = int(text)
        if n == 0:
            raise GpuenvError("--gpus 0 asks for no GPU; leave --gpus out instead", exit_code=125)
        return GpuRequest(count=n)
    count: int | None = None
    devices: tuple[str, ...] = ()
    caps: tuple[str, ...] = ("gpu",)
    # Docker's csv form: device=0,1 keeps the commas inside the device list.
    for field in re.split(r",(?=[a-z]+=)", text):
        key, sep, value = field.partition("=")
        if not sep:
            raise GpuenvError(f"--gpus {spec!r}: expected all, N or key=value", exit_code=125)
        if key == "device":
            ids = tuple(_bare(v.strip()) for v in value.split(",") if v.strip())
            bad = [i for i in ids if not (_DEVICE_ID.fullmatch(i) or i == "all")]
            if not ids or bad or ("all" in ids and len(ids) > 1):
                raise GpuenvError(
                    f"--gpus {spec!r}: device ids are indices (0,1), UUIDs (GPU-..., MIG-...), "
                    "MIG devices (0:1) or CDI names (nvidia.com/gpu=0, nvidia.com/gpu=all)",
                    exit_code=125,
                )
            if ids == ("all",):
                count = -1
            else:
                devices = ids
        elif key == "count":
            if value == "all":
                count = -1
            elif value.isdigit() and int(value) > 0:
                count = int(value)
            else:
                raise GpuenvError(f"--gpus {spec!r}: count is all or N > 0", exit_code=125)
        elif key == "capabilities":
            asked = [c for c in value.split(",") if c]
            if not asked or not all(re.fullmatch(r"[a-z0-9_]{1,32}", c) for c in asked):
                raise GpuenvError(
                    f"--gpus {spec!r}: capabilities are names such as compute,utility",
                    exit_code=125,
                )
            caps = tuple(sorted({"gpu", *asked}))
        else:
            raise GpuenvError(f"--gpus {spec!r}: unknown option {key!r}", exit_code=125)
    if "device=" in text and "count=" in text:
        raise GpuenvError(f"--gpus {spec!r}: give count or device, not both", exit_code=125)
    if not devices and count is None:
        count = -1
    return GpuRequest(count=count, device_ids=devices, capabilities=caps)


def _bare(device: str) -> str:
    """A device id without NVIDIA's CDI kind: both paths (hook and CDI) start from it."""
    return device.removeprefix(CDI_KIND + "=")


# ---------------------------------------------------------------------------- drivers


def driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


@dataclass(frozen=True)
class Verdict:
    level: str  # ok | warning | error
    message: str


def judge_driver(driver: str, cuda: str, cuda_release: str | None, floor: str,
                 toolkit_min: str | None) -> Verdict:  # fmt: skip
    """docs/architecture.md's driver verdicts for one host driver and one cell's CUDA."""
    have = driver_tuple(driver)
    if have < driver_tuple(floor):
        return Verdict(
            "error",
            f"the host's NVIDIA driver {driver} is older than {floor}, the minimum for any "
            f"CUDA {cuda.split('.')[0]}.x (this image uses CUDA {cuda}); the framework would fail "
            f"with 'CUDA driver version is insufficient'. Upgrade the driver to >= "
            f"{toolkit_min or floor}, or use a cell with an older CUDA",
        )
    if toolkit_min and have < driver_tuple(toolkit_min):
        return Verdict(
            "warning",
            f"the host's NVIDIA driver {driver} is older than {toolkit_min}, CUDA "
            f"{cuda_release or cuda}'s own minimum: it runs under minor-version compatibility, "
            "but PTX JIT compilation for GPUs newer than the framework's kernels will fail. "
            f"Upgrade the driver to >= {toolkit_min} to be safe",
        )
    return Verdict("ok", f"driver {driver} supports CUDA {cuda_release or cuda}")


def driver_verdict(driver: str, cuda: str) -> Verdict:
    """The verdict for a host driver and an image's CUDA (major.minor), with the floors
    and toolkit minimums from the catalog: the one place run, doctor and validate ask."""
    from gpuenv.catalog import compat

    cat = compat.catalog()
    floor = cat.driver_floor.get(cuda.split(".")[0])
    if floor is None:
        return Verdict("warning", f"unknown CUDA {cuda!r} in the image's labels; rebuild it")
    toolkit = cat.toolkits.get(cuda)
    return judge_driver(
        driver,
        cuda,
        toolkit.release if toolkit else None,
        floor,
        toolkit.min_driver if toolkit else cat.ga_min_driver.get(cuda),
    )


@dataclass(frozen=True)
class GpuInfo:
    driver: str
    name: str
    compute_cap: str


def parse_nvidia_smi_query(text: str) -> list[GpuInfo]:
    """Rows of `nvidia-smi --query-gpu=driver_version,name,compute_cap --format=csv,noheader`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and re.fullmatch(r"\d{3,}(\.\d+)+", parts[0]):
            gpus.append(GpuInfo(parts[0], ",".join(parts[1:-1]), parts[-1]))
    return gpus


# Whatever capabilities were asked: --gpus all gives [[gpu]], --gpus
# 'capabilities=compute,utility' gives [[compute gpu utility]].
GPU_UNAVAILABLE = re.compile(
    r'could not select device driver "[^"]*" with capabilities: \[\[[^\]]*\]\]'
)
REQUIRE_FAILED = re.compile(r"unsatisfied condition: (cuda\s*>=\s*[\d.]+)")
NO_DRIVER = re.compile(r"nvidia-container-cli: initialization error: (?:load library failed|nvml "
                       r"error: driver not loaded)[^\n]*")  # fmt: skip


# podman ("setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=7") and Docker
# ("failed to inject CDI devices: unresolvable CDI devices nvidia.com/gpu=7") alike.
CDI_UNRESOLVABLE = re.compile(r"unresolvable CDI devices ([^\n\"]+)")
_CDI_NAME = re.compile(r"[a-z0-9.-]+/[a-z0-9_.-]+=[A-Za-z0-9_.:-]*[A-Za-z0-9_]")


def explain_start_error(text: str, image: str) -> str | None:
    """A one-line, actionable message for the NVIDIA toolkit's own errors, else None."""
    m = CDI_UNRESOLVABLE.search(text)
    if m:
        names = ", ".join(_CDI_NAME.findall(m.group(1))) or m.group(1).strip()[:200]
        return (
            f"the engine has no CDI spec for {names}: it takes GPUs as CDI "
            "devices, which its host's spec files define; generate them there "
            "(nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml; `nvidia-ctk cdi list` "
            "names the devices), or ask for a device they list"
        )
    m = GPU_UNAVAILABLE.search(text)
    if m:
        return (
            f"this Docker Engine cannot give containers GPUs ({m.group(0)}): "
            "install the NVIDIA Container Toolkit on the engine's host "
            "(apt-get install nvidia-container-toolkit), run "
            "`nvidia-ctk runtime configure --runtime=docker` and restart dockerd"
        )
    m = REQUIRE_FAILED.search(text)
    if m:
        return (
            f"the host's NVIDIA driver is too old for {image} (toolkit says: unsatisfied "
            f"condition: {m.group(1)}); upgrade the driver or use a cell with an older CUDA"
        )
    m = NO_DRIVER.search(text)
    if m:
        return (
            "the NVIDIA Container Toolkit is installed but finds no NVIDIA driver on the host "
            f"({m.group(0).strip()}); install the driver (nvidia-smi must work on the host)"
        )
    return None
