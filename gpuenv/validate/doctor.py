"""`gpuenv doctor`: can this engine run gpuenv's images, and on the GPU?

`evaluate` is pure: it takes what was gathered (`docker info`, the host's driver and GPUs,
the runtime hook's presence, the built images' labels) and returns findings, each with a
fix, so it is unit-tested on outputs recorded from real hosts. `gather` does the I/O.
"""

from __future__ import annotations

import contextlib
import glob
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.gpu.cdi import GENERATE, GpuPath, path_for
from gpuenv.gpu.gpus import GpuInfo, driver_verdict, parse_nvidia_smi_query
from gpuenv.matrix.contract import NOTEBOOK, TITLE, ImageLabels

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine

BASE_IMAGE = "gpuenv/debian:bookworm"  # what every cell is built on, when no cell is there


@dataclass(frozen=True)
class Finding:
    topic: str
    level: str  # ok | info | warning | error
    message: str
    fix: str | None = None


@dataclass
class Facts:
    engine_error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    local: bool = True
    address: str = ""  # where the engine is, as named (DOCKER_HOST, a context, the socket)
    hook_on_host: bool | None = None  # None: unknown (remote engine)
    cdi_specs: list[str] = field(default_factory=list)  # CDI spec files naming nvidia.com/gpu
    gpus: list[GpuInfo] = field(default_factory=list)
    driver_source: str = "none"
    images: list[dict[str, str]] = field(default_factory=list)  # labels of gpuenv images
    build_path: str | None = None  # how builds reach the engine (Engine.build_path)
    build_error: str | None = None  # why none can
    # Where builds' public wheels come from (gpuenv/building/near.py): True when the engine's
    # host fetches them, with the probe's verdict in `packages_why`.
    packages_near: bool | None = None
    packages_why: str = ""
    # /proc/sys/fs/binfmt_misc/qemu-aarch64 on the engine's host: None when unknown (remote
    # engine), "" when binfmt_misc has no such entry (or is not mounted), else its text.
    binfmt_aarch64: str | None = None
    # Whether the engine sees this directory (gpuenv/run/sync.py), and why; None: unknown.
    workdir_seen: bool | None = None
    workdir_why: str = ""
    podman: bool = False
    gpu_path: GpuPath | None = None  # how `--gpus` reaches this engine (gpuenv.gpu.cdi)
    networks: set[str] = field(default_factory=set)  # the engine's network names


def gpu_path_finding(path: GpuPath) -> Finding:
    """Which way `--gpus` takes on this engine: CDI devices or the runtime hook's request."""
    if path.kind == "none":
        return Finding("gpu path", "error", path.problem)
    return Finding("gpu path", "info", f"--gpus reaches containers as {path.how}")


def podman_gpu_support(facts: Facts) -> Finding:
    """podman gives GPUs as CDI devices only: the spec files on its host decide."""
    if facts.cdi_specs:
        return Finding("gpu support", "ok",
                       f"CDI specs for nvidia.com/gpu, which podman reads: "
                       f"{', '.join(facts.cdi_specs)}")  # fmt: skip
    if not facts.local:
        return Finding("gpu support", "info",
                       "remote podman: its CDI specs are on its host, which this machine cannot "
                       "read; `gpuenv run --gpus all` asks it, and names a missing spec",
                       GENERATE + " (on podman's host)")  # fmt: skip
    return Finding("gpu support", "error" if facts.gpus else "info",
                   "podman gives containers GPUs only as CDI devices, and no CDI spec for "
                   "nvidia.com/gpu is in /etc/cdi or /var/run/cdi", GENERATE)  # fmt: skip


def gpu_support(facts: Facts) -> Finding:
    if facts.podman:
        return podman_gpu_support(facts)
    runtimes = facts.info.get("Runtimes") or {}
    if "nvidia" in runtimes:
        default = facts.info.get("DefaultRuntime")
        note = " (and it is the default runtime)" if default == "nvidia" else ""
        return Finding("gpu support", "ok", f"the nvidia runtime is registered{note}")
    cdi_dirs = facts.info.get("CDISpecDirs") or []
    if facts.cdi_specs:
        if cdi_dirs:
            return Finding(
                "gpu support", "ok", f"CDI specs for nvidia.com/gpu: {', '.join(facts.cdi_specs)}"
            )
        return Finding(
            "gpu support",
            "warning",
            "CDI specs for nvidia.com/gpu exist but this engine does not read CDI specs",
            'enable CDI in /etc/docker/daemon.json ({"features": {"cdi": true}}, Docker '
            ">= 25) or register the runtime: nvidia-ctk runtime configure --runtime=docker; "
            "then restart dockerd",
        )
    if facts.hook_on_host:
        return Finding(
            "gpu support",
            "ok",
            "nvidia-container-runtime-hook is installed: dockerd takes --gpus requests if it "
            "was on dockerd's PATH when dockerd started",
            "if --gpus fails with 'could not select device driver', restart dockerd",
        )
    if facts.hook_on_host is None and not facts.local:
        return Finding(
            "gpu support",
            "info",
            "remote engine without the nvidia runtime or CDI: whether it takes --gpus depends "
            "on its host's hook, which the API does not report; `gpuenv run --gpus all` probes it",
        )
    level = "error" if facts.gpus else "info"
    return Finding(
        "gpu support",
        level,
        "the engine cannot give containers GPUs (no nvidia runtime, no CDI spec, no hook)",
        "install the NVIDIA Container Toolkit (apt-get install nvidia-container-toolkit), run "
        "nvidia-ctk runtime configure --runtime=docker and restart dockerd",
    )


def image_verdict(labels: dict[str, str], facts: Facts, gpu_ok: bool) -> Finding:
    claims = ImageLabels(labels)
    name = claims.title
    if not claims.is_gpu:
        return Finding(name, "ok", "CPU image: runs here")
    if not facts.gpus:
        return Finding(
            name,
            "warning",
            "GPU image, but no NVIDIA GPU/driver found: its framework runs on the CPU",
        )
    if not gpu_ok:
        return Finding(name, "error", "GPU image, but the engine cannot pass GPUs (see above)")
    from gpuenv.gpu.capability import combine, gpu_verdict

    verdicts = [driver_verdict(facts.gpus[0].driver, claims.cuda or "")]
    if claims.framework:
        kernels = gpu_verdict(facts.gpus, claims.framework, claims.framework_version)
        if kernels.level in ("warning", "error"):
            verdicts.append(kernels)
    verdict = combine(verdicts)
    return Finding(name, verdict.level, verdict.message)


def build_finding(facts: Facts) -> Finding:
    """Which build path the engine gets, and why it works wherever the engine is: gpuenv
    fetches the wheels on this machine and sends them in the build context (the public
    ones, when the engine's host reaches the index, are fetched there: packages_finding)."""
    if facts.build_error:
        return Finding("build", "error", facts.build_error)
    where = "this machine's engine" if facts.local else "a remote engine"
    machine = facts.info.get("Architecture", "?")
    return Finding(
        "build",
        "ok",
        f"{facts.build_path}; wheels for {machine} are fetched here and sent with the "
        f"context unless the engine's host fetches the public ones (packages, below); "
        f"credentials, the CA and private indexes' wheels never need {where} to reach an index",
    )


def packages_finding(facts: Facts) -> Finding | None:
    """Where builds on this engine get their public wheels: fetched by the engine's host
    (only the private indexes' wheels are sent), or all sent from this machine."""
    if facts.packages_near is None:
        return None
    if facts.packages_near:
        return Finding("packages", "ok", f"fetched near the engine: {facts.packages_why}")
    return Finding(
        "packages", "info", f"sent from this machine: {facts.packages_why}",
        fix="GPUENV_NEAR_INDEX=URL names an index the engine's host reaches (a mirror "
        "near it); GPUENV_NEAR_FETCH=engine|client forces a path",
    )  # fmt: skip


ENABLE_ARM64 = (
    "apt-get install qemu-user-static binfmt-support; mount -t binfmt_misc binfmt_misc "
    "/proc/sys/fs/binfmt_misc (if not mounted); update-binfmts --enable qemu-aarch64"
)


def arm64_finding(facts: Facts) -> Finding:
    """Whether the engine runs arm64 containers (to build and run -arm64 cells): natively on
    an aarch64 host, else through QEMU registered in binfmt_misc with the F flag (the kernel
    opens the interpreter at registration, so it works inside containers without it)."""
    if facts.info.get("Architecture") in ("aarch64", "arm64"):
        return Finding("arm64", "ok", "the engine runs arm64 containers natively")
    if facts.binfmt_aarch64 is None:
        return Finding("arm64", "info",
                       "the engine is remote: whether it runs arm64 containers is unknown "
                       "here (its host needs QEMU in binfmt_misc with the F flag)",
                       ENABLE_ARM64 + " (on the engine's host)")  # fmt: skip
    lines = facts.binfmt_aarch64.splitlines()
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")),
                 "")  # fmt: skip
    if not lines or lines[0].strip() != "enabled":
        return Finding("arm64", "info",
                       "the engine cannot run arm64 containers (no qemu-aarch64 in "
                       "binfmt_misc): -arm64 cells cannot be built or run here",
                       ENABLE_ARM64)  # fmt: skip
    if "F" not in flags:
        return Finding("arm64", "warning",
                       f"qemu-aarch64 is registered without the F flag (flags: {flags or '-'}): "
                       "containers without QEMU inside fail with exec format error",
                       "update-binfmts --disable qemu-aarch64 and register it from "
                       "qemu-user-static's entry (flags PF), or: " + ENABLE_ARM64)  # fmt: skip
    return Finding("arm64", "ok",
                   f"the engine runs arm64 containers under QEMU (qemu-aarch64, flags {flags}); "
                   "-arm64 cells build and run emulated, several times slower")  # fmt: skip


def workdir_finding(facts: Facts) -> Finding:
    if facts.workdir_seen is None:
        return Finding("working directory", "info", f"not checked: {facts.workdir_why}")
    if facts.workdir_seen:
        return Finding("working directory", "ok",
                       f"the engine sees this directory ({facts.workdir_why}): `gpuenv run` "
                       "binds it")  # fmt: skip
    return Finding("working directory", "info",
                   f"the engine cannot see this directory ({facts.workdir_why}): `gpuenv run` "
                   "sends it to a volume there and brings back what the workload "
                   "writes")  # fmt: skip


def driver_finding(facts: Facts) -> Finding:
    """The host's NVIDIA driver and GPUs, with their compute capability."""
    if facts.gpus:
        names = "; ".join(f"{g.name} (compute {g.compute_cap})" for g in facts.gpus)
        driver = facts.gpus[0].driver
        return Finding("driver", "ok", f"NVIDIA driver {driver} via {facts.driver_source}: {names}")
    where = "this machine" if facts.local else "this machine (the engine is remote)"
    return Finding("driver", "info", f"no NVIDIA driver or GPU found on {where}")


def notebook_finding(facts: Facts) -> Finding:
    """Where `gpuenv notebook` would listen (gpuenv/run/notebook.py's rule: published from
    a bridge network when the engine has one, else the host's network), and the layers kept."""
    if "bridge" in facts.networks:
        where = "published on 127.0.0.1 from the engine's bridge network"
    else:
        where = "on the host network bound to 127.0.0.1 (the engine has no bridge network)"
    if not facts.local:
        where += "; that is the engine host's loopback: reach it with the ssh -L it prints"
    layers = sum(1 for labels in facts.images if NOTEBOOK in labels)
    kept = f"; {layers} notebook layer(s) kept" if layers else ""
    return Finding("notebook", "ok",
                   f"`gpuenv notebook` serves JupyterLab with a token, {where}{kept}; "
                   "`gpuenv devcontainer` writes .devcontainer/devcontainer.json")  # fmt: skip


def evaluate(facts: Facts) -> list[Finding]:
    if facts.engine_error:
        # No engine (a bare GPU host, dockerd down): the host's driver and GPUs still say
        # what an engine there would get. A remote engine's error (ssh, TLS, a context)
        # says its own fix: starting dockerd here is not it.
        fix = "start dockerd (sudo scripts/engine.sh)" if facts.local else None
        return [Finding("engine", "error", facts.engine_error, fix), driver_finding(facts)]
    info = facts.info
    findings = [
        Finding(
            "engine",
            "ok",
            f"Docker Engine {info.get('ServerVersion', '?')} on {info.get('OperatingSystem', '?')}"
            + ("" if facts.local else f" (remote: {facts.address})"),
        )
    ]
    findings.append(build_finding(facts))
    packages = packages_finding(facts)
    if packages is not None:
        findings.append(packages)
    findings.append(arm64_finding(facts))
    support = gpu_support(facts)
    findings.append(support)
    if facts.gpu_path is not None:
        findings.append(gpu_path_finding(facts.gpu_path))
    findings.append(driver_finding(facts))
    gpu_ok = support.level in ("ok", "info") and (
        facts.gpu_path is None or facts.gpu_path.kind != "none"
    )
    cells = [labels for labels in facts.images if NOTEBOOK not in labels]
    findings.extend(image_verdict(labels, facts, gpu_ok) for labels in cells)
    findings.append(workdir_finding(facts))
    findings.append(notebook_finding(facts))
    return findings


# ---------------------------------------------------------------------------- I/O


def _nvml() -> list[GpuInfo] | None:
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(GpuInfo(str(driver), str(pynvml.nvmlDeviceGetName(handle)),
                                f"{major}.{minor}"))  # fmt: skip
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _query_gpus(fields: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None


def _nvidia_smi() -> list[GpuInfo] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = _query_gpus("driver_version,name,compute_cap")
    if out is None:
        return None
    if out.returncode == 0:
        return parse_nvidia_smi_query(out.stdout)
    # nvidia-smi before R510 (470.x) has no compute_cap field and fails the whole query with
    # 'Field "compute_cap" is not a valid field to query.': those are the hosts whose driver
    # matters most, so ask again without it rather than report "no driver".
    if "compute_cap" not in out.stdout + out.stderr:
        return None
    out = _query_gpus("driver_version,name")
    if out is None or out.returncode != 0:
        return None
    return parse_nvidia_smi_query(
        "\n".join(f"{line.strip()}, ?" for line in out.stdout.splitlines() if line.strip())
    )


def _cdi_specs() -> list[str]:
    found = []
    for path in sorted(glob.glob("/etc/cdi/*") + glob.glob("/var/run/cdi/*")):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                if "nvidia.com/gpu" in fh.read(65536):
                    found.append(path)
        except OSError:
            continue
    return found


def gather() -> Facts:
    with contextlib.ExitStack() as opened:  # the engine it asks, closed once all is gathered
        return _gather(opened)


def _gather(opened: contextlib.ExitStack[bool | None]) -> Facts:
    from gpuenv.engine import client as engines
    from gpuenv.matrix.errors import GpuenvError

    facts = Facts()
    try:
        eng = opened.enter_context(engines.connect())
        facts.info = eng.info()
        facts.local, facts.address = eng.is_local, eng.url
        facts.images = eng.gpuenv_images()
        facts.podman = eng.is_podman
        facts.gpu_path = path_for(eng)
        facts.networks = eng.network_names()
        try:
            facts.build_path = eng.build_path()
        except engines.EngineError as exc:
            facts.build_error = exc.message
    except GpuenvError as exc:
        facts.engine_error = exc.message
        facts.address = engines.named_address()
        facts.local = facts.address.startswith("unix://")
        facts.gpus, facts.driver_source = _host_gpus()
        return facts
    _gather_workdir(eng, facts)
    if facts.local:
        facts.hook_on_host = shutil.which("nvidia-container-runtime-hook") is not None
        facts.cdi_specs = _cdi_specs()
        entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
        try:
            facts.binfmt_aarch64 = entry.read_text()
        except OSError:
            facts.binfmt_aarch64 = ""
        facts.gpus, facts.driver_source = _host_gpus()
    return facts


def _gather_packages(engine: Engine, facts: Facts, image: str) -> None:
    """Where builds' public wheels come from, probed anew (PyPI, or $GPUENV_NEAR_INDEX)."""
    import os

    from gpuenv.building import near
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.store.credentials import Credentials
    from gpuenv.store.wheelhouse import PYPI

    bundle = os.environ.get("GPUENV_CA_BUNDLE") or os.environ.get("PIP_CERT")
    ca = Path(bundle) if bundle and Path(bundle).is_file() else None
    try:
        decided = near.decide(engine, PYPI, image=image, ca_bundle=ca, credentials=Credentials({}),
                              offline=False, fresh=True)  # fmt: skip
    except GpuenvError as exc:
        facts.packages_near, facts.packages_why = False, exc.message
        return
    facts.packages_near, facts.packages_why = decided.index is not None, decided.why


def _gather_workdir(engine: Engine, facts: Facts) -> None:
    """Whether the engine sees the current directory, probed with an image it has."""
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.run import sync

    titles = [ImageLabels(labels).raw.get(TITLE) for labels in facts.images]
    candidates = [t for t in titles if t] + [BASE_IMAGE]
    image = next((ref for ref in candidates if engine.image(ref) is not None), None)
    if image is None:
        facts.workdir_why = "no gpuenv image on the engine to probe with (gpuenv build)"
        return
    _gather_packages(engine, facts, image)
    try:
        verdict = sync.visibility(engine, Path.cwd(), image)
    except GpuenvError as exc:
        facts.workdir_why = exc.message
        return
    facts.workdir_seen, facts.workdir_why = verdict.sees, verdict.why


def _host_gpus() -> tuple[list[GpuInfo], str]:
    """This machine's GPUs and where they were learnt: NVML, else nvidia-smi."""
    for source, probe in (("NVML", _nvml), ("nvidia-smi", _nvidia_smi)):
        gpus = probe()
        if gpus:
            return gpus, source
    return [], "none"


def matrix_findings(facts: Facts, file: Path | None) -> list[Finding]:
    """What the matrix adds: cells not built yet, or a matrix that does not load."""
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.project.project import matrix_file, open_project

    path = matrix_file(file)
    if not path.exists() or facts.engine_error:
        return []
    try:
        project = open_project(file)
    except GpuenvError as exc:
        return [Finding("matrix", "error", exc.message)]
    built = {ImageLabels(labels).raw.get(TITLE) for labels in facts.images}
    missing = [c.name for c in project.cells if c.image not in built]
    if not missing:
        return []
    return [
        Finding("matrix", "info", f"{path}: not built yet: {', '.join(missing)}", "gpuenv build")
    ]


def check(file: Path | None) -> list[Finding]:
    """`gpuenv doctor`: gather, evaluate, and add what the matrix says."""
    facts = gather()
    return evaluate(facts) + matrix_findings(facts, file)


def as_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]
