"""What crosses the engine boundary: gpuenv's errors and the typed values the engine takes
and gives (an image's inspect, a container as gpuenv asks for one, the facts that decide how
an engine takes GPUs). Plain data: importing it imports no engine code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError

LogSink = Callable[[str], None]


class EngineError(GpuenvError):
    """The engine refused or failed; `detail` is its own text, `status` its HTTP status."""

    def __init__(self, message: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(message, exit_code=125)
        self.detail = detail or message
        self.status = status


class BuildFailed(Exception):
    """A build step failed; the message is the engine's."""


class BuildCancelled(BuildFailed):
    """The build was cancelled, not failed by a step: its docker CLI was told to cancel as
    gpuenv ends (Engine.end_builds), or said so itself ("context canceled": a terminal's
    Ctrl-C reaches it too, and it may answer before gpuenv's own interrupt is raised).
    Whether gpuenv is ending decides what it is: the interruption, or else a failure."""


@dataclass(frozen=True)
class ImageInfo:
    """What `docker image inspect` says, in the parts gpuenv reads."""

    id: str
    tags: tuple[str, ...] = ()
    size: int = 0
    created: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    env: tuple[str, ...] = ()  # KEY=VALUE, as in the config
    user: str = ""
    working_dir: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    architecture: str = ""  # amd64, arm64: what the image's config says
    # The layers' diff_ids: digests the engine checked against the layers' own bytes
    # (unlike labels, which say what the image's author wrote).
    layers: tuple[str, ...] = ()

    @property
    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env if "=" in e)

    @property
    def claims(self) -> contract.ImageLabels:
        return contract.ImageLabels(self.labels)

    @classmethod
    def from_inspect(cls, data: dict[str, Any]) -> ImageInfo:
        config = data.get("Config") or {}
        return cls(
            id=str(data["Id"]),
            tags=tuple(data.get("RepoTags") or ()),
            size=int(data.get("Size") or 0),
            created=str(data.get("Created") or ""),
            labels=dict(config.get("Labels") or {}),
            env=tuple(config.get("Env") or ()),
            user=str(config.get("User") or ""),
            working_dir=str(config.get("WorkingDir") or ""),
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            architecture=str(data.get("Architecture") or ""),
            layers=tuple(str(x) for x in (data.get("RootFS") or {}).get("Layers") or ()),
        )


@dataclass(frozen=True)
class BuildInput:
    """What one build hands the engine: the context directory (its Dockerfile mounts parts
    of it: RUN --mount) and how to build it. One value per build, made by its maker
    (gpuenv/building/sendable.py for a cell, run/jupyter.py for the notebook layer)."""

    directory: Path
    labels: dict[str, str] = field(default_factory=dict)
    network: str = "none"  # "host" when a step reaches an index or Debian's archive
    platform: str | None = None  # linux/arm64 on an x86_64 engine: the steps under QEMU
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file, BuildKit only


@dataclass(frozen=True)
class VolumeInfo:
    """A volume, as the engine's disk-usage report gives it."""

    name: str
    labels: dict[str, str]
    size: int  # bytes; -1 where the engine does not say
    in_use: bool  # a container (running or not) has it mounted


@dataclass
class ContainerSpec:
    """A container as gpuenv asks for one; `device_requests` hold the Engine API's
    DeviceRequest bodies (gpuenv.gpu.gpus.GpuRequest.as_api()), `cdi_devices` fully
    qualified CDI device names (nvidia.com/gpu=0): gpuenv.gpu.cdi chooses which."""

    image: str
    command: list[str]
    user: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    binds: list[str] = field(default_factory=list)
    # (source, target, read-only): binds of the engine host's paths, as Docker's --mount
    # makes them: a source that is not there is the engine's error, never an empty
    # directory the engine creates (what `binds` does).
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    ports: dict[str, Any] = field(default_factory=dict)
    tmpfs: dict[str, str] = field(default_factory=dict)
    device_requests: list[dict[str, Any]] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    init: bool = True
    shm_size: str | None = None
    ipc: str | None = None
    network: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tty: bool = False
    stdin: bool = False
    platform: str | None = None  # linux/arm64: an image of another architecture, emulated
    # Confinement, for a container that runs code gpuenv does not trust (the sdist sandbox):
    # capabilities dropped ("ALL"), --security-opt values, and the pids and memory limits.
    cap_drop: list[str] = field(default_factory=list)
    security_opt: list[str] = field(default_factory=list)
    pids_limit: int | None = None
    mem_limit: str | None = None


@dataclass(frozen=True)
class GpuEngineFacts:
    """What an engine says that decides how it takes GPUs (gpuenv.gpu.cdi.choose_path)."""

    podman: bool
    version: str  # the server's (podman's own version on podman)
    runtimes: tuple[str, ...] = ()  # registered OCI runtimes ("nvidia" among them?)
    cdi_spec_dirs: tuple[str, ...] = ()  # Docker >= 25 with CDI enabled lists them
    cdi_devices: tuple[str, ...] = ()  # Docker >= 28.3's DiscoveredDevices from CDI
    local: bool = True

    @classmethod
    def from_info(cls, info: dict[str, Any], podman: bool, local: bool) -> GpuEngineFacts:
        """From the engine's /info (podman's Docker API answers it too)."""
        found = [str(d.get("ID") or "") for d in info.get("DiscoveredDevices") or []
                 if isinstance(d, dict) and d.get("Source") == "cdi"]  # fmt: skip
        return cls(
            podman=podman,
            version=str(info.get("ServerVersion") or ""),
            runtimes=tuple(sorted(info.get("Runtimes") or {})),
            cdi_spec_dirs=tuple(str(d) for d in info.get("CDISpecDirs") or []),
            cdi_devices=tuple(d for d in found if d),
            local=local,
        )
