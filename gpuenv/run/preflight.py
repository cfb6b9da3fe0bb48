"""The GPU preflight of a run: refuse or warn before the workload starts, never after it
trained on the CPU; the host's driver and GPUs learnt by a probe container, cached per
engine."""

from __future__ import annotations

import os

from gpuenv.engine.client import ContainerSpec, Engine, EngineError
from gpuenv.gpu.cdi import devices_for
from gpuenv.gpu.gpus import GpuInfo, GpuRequest, explain_start_error
from gpuenv.matrix import contract
from gpuenv.run.console import run_error, warn
from gpuenv.run.local import RunOptions, _start_error
from gpuenv.run.target import Target
from gpuenv.store import cache


def gpu_preflight(engine: Engine, target: Target, gpus: GpuRequest | None) -> None:
    """Refuse or warn before the workload starts, never after it trained on the CPU (an
    image and request that disagree were warned of by target.choose)."""
    if gpus is None:
        return
    claims = contract.ImageLabels(target.labels)
    found = probe_gpus(engine, target.image, gpus)
    if not found:
        return
    from gpuenv.gpu.capability import gpu_verdict
    from gpuenv.gpu.gpus import driver_verdict

    verdicts = []
    if claims.cuda:
        verdicts.append(driver_verdict(found[0].driver, claims.cuda))
    if claims.is_gpu and claims.framework:
        verdicts.append(gpu_verdict(found, claims.framework, claims.framework_version))
    for verdict in verdicts:
        if verdict.level == "error":
            raise run_error(verdict.message)
    for verdict in verdicts:
        if verdict.level == "warning":
            warn(verdict.message)


DRIVERS = "drivers.json"  # in gpuenv's cache (gpuenv/store/cache.py)
DRIVER_MAX_AGE = 24 * 3600  # seconds; a driver can be upgraded without a reboot


def _engine_identity(engine: Engine) -> tuple[str, str]:
    """(engine ID, what changes when the engine's host may have a new driver): a reboot
    or new kernel, a daemon restart (its ID stays, its start changes the boot's view)."""
    info = engine.info()
    return str(info.get("ID") or engine.url), str(info.get("KernelVersion") or "")


def cached_gpus(engine: Engine, now: float | None = None) -> list[GpuInfo] | None:
    """The GPUs (driver, name, compute capability) learnt earlier for this engine, unless
    they may be stale: another kernel (a reboot, where driver upgrades take effect), past
    DRIVER_MAX_AGE, or $GPUENV_REPROBE=1 (on demand)."""
    import time

    if os.environ.get("GPUENV_REPROBE") == "1":
        return None
    engine_id, kernel = _engine_identity(engine)
    entry = cache.read_record(DRIVERS).get(engine_id)
    if not isinstance(entry, dict) or entry.get("kernel") != kernel:
        return None  # also an entry from before entries carried their context
    age = (now if now is not None else time.time()) - float(entry.get("at") or 0)
    if not 0 <= age <= DRIVER_MAX_AGE:
        return None
    try:
        return [GpuInfo(str(g["driver"]), str(g["name"]), str(g["compute_cap"]))
                for g in entry["gpus"]] or None  # fmt: skip
    except (KeyError, TypeError):
        return None


def remember_gpus(engine: Engine, gpus: list[GpuInfo]) -> None:
    import time
    from dataclasses import asdict

    engine_id, kernel = _engine_identity(engine)
    entry = {"gpus": [asdict(g) for g in gpus], "kernel": kernel, "at": int(time.time())}
    cache.update_record(DRIVERS, {engine_id: entry})


def probe_gpus(engine: Engine, image: str, gpus: GpuRequest) -> list[GpuInfo] | None:
    """The host's GPUs and driver, learnt by a probe container and cached per engine.

    The Docker API reports neither the driver nor the runtime hook, and a remote engine's
    host is not this machine, so the only honest source is nvidia-smi inside a container
    that got GPUs. The probe also surfaces the toolkit's own errors before the workload.
    """
    from gpuenv.gpu.gpus import parse_nvidia_smi_query

    known = cached_gpus(engine)
    if known is not None:
        return known
    command = ["nvidia-smi", "--query-gpu=driver_version,name,compute_cap",
               "--format=csv,noheader"]  # fmt: skip
    spec = ContainerSpec(image, command, **devices_for(engine, gpus), network="none",
                         labels=contract.container_labels("probe"), init=False)  # fmt: skip
    try:
        cid = engine.create(spec)
    except EngineError as exc:
        raise _start_error(exc, RunOptions(image=image, command=command), engine.url) from None
    try:
        engine.start(cid)
        code = engine.wait(cid, timeout=60)
        output = engine.logs(cid, stderr=True)
    except EngineError as exc:
        explained = explain_start_error(exc.detail, image)
        if explained:
            raise run_error(explained) from None
        warn(f"could not learn the host's NVIDIA driver: {exc.detail.splitlines()[0][:200]}")
        return None
    finally:
        engine.remove_container(cid)
    found = parse_nvidia_smi_query(output) if code == 0 else []
    if not found:
        warn(
            "could not learn the host's NVIDIA driver (nvidia-smi in a probe container "
            f"exited {code}); the driver check is skipped"
        )
        return None
    remember_gpus(engine, found)
    return found
