"""Start one container per image, run the shipped suites against them, always clean up.

pytest runs in a subprocess (its own process state, Ctrl-C ends it cleanly) and always
writes JUnit XML, which is also where the per-image summary comes from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.engine.client import ContainerSpec, Engine, EngineError, ImageInfo
from gpuenv.gpu.cdi import devices_for
from gpuenv.gpu.gpus import GpuRequest, explain_start_error
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run.local import foreign_platform

SUITES = Path(__file__).parent / "suites"
TARGETS_ENV = "GPUENV_VALIDATE_TARGETS"


@dataclass
class Subject:
    id: str  # the cell name (or image reference), used as the pytest parameter id
    image: str
    expected: dict[str, Any]
    baseline_size: int | None = None
    container: str | None = None
    gpu_container: str | None = None
    gpu_error: str | None = None
    info: ImageInfo | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)  # the largest, for the size gate
    # A testinfra backend URL (local://, ssh://, kubectl://, docker://ID) of an environment
    # gpuenv did not start: the suites run there, and no container is started.
    host: str | None = None
    # linux/arm64 on an x86_64 engine: containers run under QEMU user emulation; the CPU
    # suites run there, GPU device checks cannot (no GPU reaches an emulated process).
    emulated: str | None = None

    def to_json(self, gpus: GpuRequest | None) -> dict[str, Any]:
        info = self.info or ImageInfo(id="")
        return {
            "id": self.id,
            "image": self.image,
            "expected": self.expected,
            "host": self.host,
            "image_known": self.info is not None,  # False: no image config behind --host
            "container": self.container,
            "gpu_container": self.gpu_container,
            "gpu_error": self.gpu_error,
            "emulated": self.emulated,
            "gpus": gpus.as_api() if gpus else None,
            "config": {"User": info.user, "Env": list(info.env), "Labels": info.labels},
            "size": info.size,
            "baseline_size": self.baseline_size,
            "layers": self.layers,
        }


@dataclass
class ImageSummary:
    id: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)


def _start(engine: Engine, image: str, gpus: GpuRequest | None, platform: str | None = None) -> str:
    spec = ContainerSpec(
        image,
        # Idle until the suites are done; the image's default user, as users get it.
        ["sleep", "infinity"],
        network="none",
        labels=contract.container_labels("validate"),
        init=True,
        # The hook's device request or CDI devices, as this engine takes GPUs.
        **devices_for(engine, gpus),
        platform=platform,  # the image's own, when the engine's differs (run under QEMU)
    )
    cid = engine.create(spec)
    try:
        engine.start(cid)
    except EngineError:
        engine.remove_container(cid)
        raise
    return cid


def _largest_layers(engine: Engine, image: str, count: int = 5) -> list[dict[str, Any]]:
    """The image's largest layers (size and the step that made them), for the size gate."""
    try:
        history = engine.history(image)
    except EngineError:
        return []
    return sorted(history, key=lambda layer: int(layer["size"]), reverse=True)[:count]


def validate(
    engine: Engine | None,
    targets: list[Subject],
    gpus: GpuRequest | None,
    junitxml: Path | None,
    verbose: bool = False,
) -> list[ImageSummary]:
    """Start a container per image (and, with --gpus, one with the devices for GPU images),
    run the suites, remove every container. A device request the engine refuses is not
    a reason to skip: the suites fail every device check with gpu_error (fail closed)."""
    started: list[str] = []
    if engine is None:  # every target is a --host: no engine needed
        return _run_pytest(targets, gpus, junitxml, verbose)
    try:
        for target in targets:
            if target.host is not None:
                continue  # an environment someone else runs: nothing to start
            target.info = engine.image(target.image)
            if target.info is None:
                raise GpuenvError(f"image {target.image} not found; gpuenv build it first")
            target.layers = _largest_layers(engine, target.image)
            target.emulated = foreign_platform(engine, target.image)
            target.container = _start(engine, target.image, None, target.emulated)
            started.append(target.container)
            # An emulated GPU image gets no device container: its device checks skip.
            if gpus is not None and target.expected.get("variant") == "gpu" and not target.emulated:
                try:
                    target.gpu_container = _start(engine, target.image, gpus)
                    started.append(target.gpu_container)
                except EngineError as exc:
                    explained = explain_start_error(exc.detail, target.image)
                    target.gpu_error = explained or exc.detail.strip()[:300]
                except GpuenvError as exc:  # an engine that gives no GPUs (gpu.cdi)
                    target.gpu_error = exc.message
        return _run_pytest(targets, gpus, junitxml, verbose)
    finally:
        for cid in started:
            engine.remove_container(cid)


def _run_pytest(
    targets: list[Subject], gpus: GpuRequest | None, junitxml: Path | None, verbose: bool
) -> list[ImageSummary]:
    with tempfile.TemporaryDirectory(prefix="gpuenv-validate-") as tmp:
        targets_file = Path(tmp) / "targets.json"
        targets_file.write_text(json.dumps([t.to_json(gpus) for t in targets]))
        xml = junitxml or Path(tmp) / "junit.xml"
        command = [
            sys.executable, "-m", "pytest", str(SUITES),
            "-c", str(SUITES / "pytest.ini"), "--rootdir", str(SUITES),
            "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_family=xunit2",
            "-q" if not verbose else "-v", "-rfs", "--tb=line", "--color=no",
        ]  # fmt: skip
        env = {**os.environ, TARGETS_ENV: str(targets_file)}
        proc = subprocess.run(command, env=env, capture_output=not verbose, text=True, check=False)
        if proc.returncode not in (0, 1) or not xml.exists():
            detail = (proc.stdout or "") + (proc.stderr or "")
            raise GpuenvError(f"the validation suites could not run: {detail.strip()[-500:]}")
        return summarise(xml, [t.id for t in targets])


def summarise(xml: Path, ids: list[str]) -> list[ImageSummary]:
    """Per-image counts from JUnit XML; a test's id is the bracketed parameter."""
    summaries = {i: ImageSummary(i) for i in ids}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        param = name[name.find("[") + 1 : name.rfind("]")] if "[" in name else ""
        summary = summaries.get(param) or next(
            (s for i, s in summaries.items() if param.startswith(i)), None
        )
        if summary is None:
            continue
        test = name.split("[")[0].removeprefix("test_").replace("_", " ")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            summary.failed += 1
            message = (failure.get("message") or "").strip().splitlines()
            summary.failures.append(f"{test}: {message[0] if message else 'failed'}")
        elif skipped is not None:
            summary.skipped += 1
            reason = (skipped.get("message") or "").removeprefix("Skipped: ")
            summary.skips.append(f"{test}: {reason}")
        else:
            summary.passed += 1
    return list(summaries.values())
