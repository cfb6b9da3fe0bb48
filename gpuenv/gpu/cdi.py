"""How a `--gpus` request reaches an engine: CDI devices, or the nvidia runtime hook's
device request. Pure but for `path_for` (which asks the engine) and `spec_devices_in`
(which reads CDI spec files).

Two ways exist (NVIDIA Container Toolkit docs, "Support for Container Device Interface"):

- **the runtime hook**: Docker's `--gpus` DeviceRequest (driver "", capabilities [[gpu]]),
  which dockerd hands to the nvidia runtime or nvidia-container-runtime-hook;
- **CDI**: fully qualified device names (`nvidia.com/gpu=0`, `=all`, `=GPU-<uuid>`, MIG
  `=0:1`) that the engine resolves from spec files (`nvidia-ctk cdi generate`, the default
  since toolkit 1.18; the GPU Operator's default): podman >= 4.1 through its own API (its
  Docker-compatible API drops DeviceRequests and stats CDI names as paths: seen on podman
  4.3), Docker >= 25 as a DeviceRequest with driver "cdi" when CDI is enabled.

`choose_path` decides from what the engine says; `devices` turns a request into the
container's fields for that path. A path that cannot give GPUs is an error before any
container starts, never a run without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuenv.gpu.gpus import GpuRequest
from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import GpuEngineFacts
    from gpuenv.engine.protocol import EngineProtocol

KIND = "nvidia.com/gpu"  # the CDI kind of NVIDIA's specs (nvidia-ctk cdi generate)
PODMAN_CDI_SINCE = (4, 1)  # podman's first release with --device <CDI name>
GENERATE = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


@dataclass(frozen=True)
class GpuPath:
    """How this engine gets GPUs: "cdi", "hook", or "none" (with why, and the fix)."""

    kind: str
    how: str
    problem: str = ""


def cdi_names(request: GpuRequest) -> list[str]:
    """The CDI devices a request names: every GPU (`=all`), the first N (`=0`...`=N-1`, as
    Docker's count picks the first N), or the ids given (an index, a UUID, MIG `0:1`)."""
    if request.device_ids:
        return [f"{KIND}={d}" for d in request.device_ids]
    if request.count == -1 or request.count is None:
        return [f"{KIND}=all"]
    return [f"{KIND}={i}" for i in range(request.count)]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def choose_path(facts: GpuEngineFacts, spec_names: list[str] | None = None) -> GpuPath:
    """Which way this engine takes GPUs. podman: CDI, always (its API has no other way);
    Docker: CDI where it is enabled and names NVIDIA devices (its info's DiscoveredDevices,
    or `spec_names`: those of the spec files in its CDISpecDirs, read on this machine for a
    local engine), else the runtime hook."""
    if facts.podman:
        if _version(facts.version) < PODMAN_CDI_SINCE:
            return GpuPath(
                "none",
                f"podman {facts.version}",
                f"podman {facts.version} cannot give containers GPUs through its API (CDI "
                "devices need podman >= 4.1, and its Docker API drops --gpus device requests): "
                "upgrade podman, then generate a CDI spec on its host: " + GENERATE,
            )
        return GpuPath(
            "cdi",
            f"CDI devices ({KIND}=...), which podman {facts.version} resolves from the CDI "
            "specs on its host (/etc/cdi, /var/run/cdi)",
        )
    known = [n for n in (*facts.cdi_devices, *(spec_names or [])) if n.startswith(KIND + "=")]
    if facts.cdi_spec_dirs and known:
        return GpuPath(
            "cdi",
            f"CDI devices ({', '.join(known[:4])}{', ...' if len(known) > 4 else ''}), "
            'as a device request with driver "cdi"',
        )
    runtime = "the nvidia runtime" if "nvidia" in facts.runtimes else "the NVIDIA runtime hook"
    return GpuPath("hook", f"{runtime}, as a --gpus device request")


def devices(request: GpuRequest | None, path: GpuPath) -> dict[str, Any]:
    """ContainerSpec's device fields for a request on a path: `device_requests` (the hook's
    DeviceRequest) or `cdi_devices`; nothing without a request. A path that gives no GPUs
    is the one error, exit 125, before any container exists."""
    if request is None:
        return {"device_requests": [], "cdi_devices": []}
    if path.kind == "none":
        raise GpuenvError(
            f"--gpus asked for {request.describe()}, but {path.problem}", exit_code=125
        )
    if path.kind == "cdi":
        return {"device_requests": [], "cdi_devices": cdi_names(request)}
    return {"device_requests": [request.as_api()], "cdi_devices": []}


def path_for(engine: EngineProtocol) -> GpuPath:
    """The path of this engine (it answers once; Engine caches what it said). A local
    Docker Engine's spec directories are read here when it reports no devices itself
    (Docker before 28.3 lists none)."""
    facts = engine.gpu_facts()
    names: list[str] = []
    if not facts.podman and facts.local and facts.cdi_spec_dirs and not facts.cdi_devices:
        names = [n for found in spec_devices_in(list(facts.cdi_spec_dirs)).values() for n in found]
    return choose_path(facts, names)


def devices_for(engine: EngineProtocol, request: GpuRequest | None) -> dict[str, Any]:
    """`devices` on this engine's path; the engine is not asked when there is no request."""
    if request is None:
        return devices(None, GpuPath("hook", ""))
    return devices(request, path_for(engine))


# ---------------------------------------------------------------------------- spec files


def spec_devices(text: str) -> list[str]:
    """The qualified names (`nvidia.com/gpu=0`) a CDI spec (YAML or JSON) defines for
    NVIDIA's kind; [] for another kind or a file that is no spec."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        return []
    names = []
    for device in doc.get("devices") or []:
        name = device.get("name") if isinstance(device, dict) else None
        if isinstance(name, (str, int)) and _NAME.fullmatch(str(name)):
            names.append(f"{KIND}={name}")
    return names


def spec_devices_in(directories: list[str]) -> dict[str, list[str]]:
    """Spec file -> the NVIDIA devices it defines, for the spec directories readable here."""
    from pathlib import Path

    found: dict[str, list[str]] = {}
    for directory in directories:
        base = Path(directory)
        try:
            files = sorted(p for p in base.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        except OSError:
            continue
        for path in files:
            try:
                with path.open(encoding="utf-8", errors="replace") as fh:
                    names = spec_devices(fh.read(1 << 20))
            except OSError:
                continue
            if names:
                found[str(path)] = names
    return found
