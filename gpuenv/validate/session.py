"""One `gpuenv validate`: choose the targets and what each must hold, run the suites,
record the outcome for `push`, and, on request, the sizes as the new baseline.

What each image is checked against (never its labels alone): a cell's resolution from the
matrix and catalog plus its lock entry, where a lock entry that no longer matches the
matrix fails the lock check naming why; for `-i IMAGE`, its labels cross-checked against
the catalog. A GPU image validated without --gpus is reported as "devices not checked",
so a CPU-side pass is never mistaken for proof of device visibility.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from gpuenv.engine.client import Engine
    from gpuenv.gpu.gpus import GpuRequest
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project
    from gpuenv.validate.runner import ImageSummary, Subject


@dataclass
class Outcome:
    summary: ImageSummary
    image: str
    image_id: str
    devices: str  # "checked" | "not checked: ..." | "failed: ..." | "not a GPU image"

    @property
    def passed(self) -> bool:
        return self.summary.failed == 0

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        return {
            "id": s.id,
            "image": self.image,
            "image_id": self.image_id,
            "passed": self.passed,
            "devices": self.devices,
            "counts": {"passed": s.passed, "failed": s.failed, "skipped": s.skipped},
            "failures": s.failures,
            "skips": sorted(set(s.skips)),
        }


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    baseline: Path | None = None  # the project's size baseline (sizes.py), cells validated
    passed_sizes: dict[str, int] = field(default_factory=dict)  # id -> bytes, of those passed
    sizes_recorded: Path | None = None
    sizes_count: int = 0

    @property
    def failed_checks(self) -> int:
        return sum(o.summary.failed for o in self.outcomes)


def _devices(target: Subject, gpus: GpuRequest | None) -> str:
    if target.host is not None and gpus is not None:
        return "checked"  # on the host as it is (failures, if any, are the device checks')
    if target.expected.get("variant") != "gpu":
        return "not a GPU image"
    if target.emulated:
        return f"not checked: {target.emulated} under emulation needs a Grace machine"
    if gpus is None:
        return "not checked: no --gpus given"
    if target.gpu_error:
        return f"failed: {target.gpu_error}"
    return "checked"


def validate(
    engine: Engine,
    project: Project | None,
    cells: list[Cell],
    images: list[str],
    gpus: GpuRequest | None,
    junitxml: Path | None = None,
    verbose: bool = False,
) -> Report:
    """Validate the project's `cells` (their images) and the `images` named by reference."""
    from gpuenv.publish import push as publish
    from gpuenv.validate import expected, runner, sizes

    targets: list[runner.Subject] = []
    baseline_path = None
    if project is not None:
        baseline_path = sizes.baseline_path(project.path)
        baseline = sizes.read_baseline(baseline_path)
        lock = project.lock
        for cell in cells:
            entry = lock.cells.get(cell.name) if lock else None
            drift = project.lock_drift.get(cell.name)
            exp = expected.from_cell(cell, None if drift else entry, drift)
            targets.append(runner.Subject(cell.name, cell.image, exp, baseline.get(cell.name)))
    for ref in images:
        labels = engine.labels(ref)
        if labels is None:
            raise GpuenvError(f"image {ref} not found in the engine")
        targets.append(runner.Subject(ref, ref, expected.from_labels(ref, labels)))
    summaries = {s.id: s for s in runner.validate(engine, targets, gpus, junitxml, verbose)}
    report = Report(baseline=baseline_path)
    for t in targets:
        if t.id in summaries:
            image_id = t.info.id if t.info is not None else ""
            report.outcomes.append(Outcome(summaries[t.id], t.image, image_id, _devices(t, gpus)))
    # push refuses what failed; only a full pass records an image as validated.
    publish.record_validation({o.image_id: o.passed for o in report.outcomes if o.image_id})
    if baseline_path is not None:
        passed = {o.summary.id for o in report.outcomes if o.passed}
        report.passed_sizes = {
            t.id: t.info.size for t in targets if t.id in passed and t.info is not None
        }
    return report


def record_sizes(report: Report) -> None:
    """`validate --record-sizes`: the sizes of the images that passed become the project's
    baseline (nothing without a project: images named by reference alone have none)."""
    from gpuenv.validate import sizes

    if report.baseline is not None:
        sizes.record(report.baseline, report.passed_sizes)
        report.sizes_recorded, report.sizes_count = report.baseline, len(report.passed_sizes)


def validate_host(
    url: str,
    file: Path | None,
    cell_name: str | None,
    gpus: GpuRequest | None,
    junitxml: Path | None = None,
    verbose: bool = False,
) -> Report:
    """`gpuenv validate --host URL`: the same suites through a pytest-testinfra backend,
    against an environment gpuenv did not start (a GPU VM, a pod). What it must hold comes
    from `--cell NAME`, or, for docker://ID, from the labels of the container's image.
    Nothing is recorded for push: no image of ours was proven."""
    from gpuenv.validate import expected, runner

    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in HOST_SCHEMES:
        raise GpuenvError(
            f"--host {url!r}: expected one of {', '.join(s + '://' for s in HOST_SCHEMES)} "
            "(e.g. local://, ssh://user@gpu-vm, kubectl://POD?container=C&namespace=N, "
            "docker://CONTAINER)",
            exit_code=2,
        )
    info = None
    if scheme == "docker":
        from gpuenv.engine import client as engine

        with engine.connect() as docker:
            info = docker.container_image(url.split("://", 1)[1].split("@")[-1])
        if info is None:
            raise GpuenvError(f"--host {url}: no such container in the engine")
    if cell_name is not None:
        from gpuenv.project.project import open_project

        cell = open_project(file).one_cell(cell_name, "--cell")
        exp = expected.from_cell(cell)
        image = cell.image
    elif info is not None:
        image = info.tags[0] if info.tags else info.id
        exp = expected.from_labels(image, info.labels)
    elif gpus is not None:
        targets = host_framework_targets(url)
        summaries = runner.validate(None, targets, gpus, junitxml, verbose)
        return Report([Outcome(s, t.image, "", _devices(t, gpus))
                       for s, t in zip(summaries, targets, strict=True)])  # fmt: skip
    else:
        raise GpuenvError(
            f"--host {url}: say what it must hold with --cell NAME (only a docker:// host has "
            "image labels to read), or check its devices with its own frameworks: --gpus all",
            exit_code=2,
        )
    target = runner.Subject(url, image, exp, host=url, info=info)
    summaries = runner.validate(None, [target], gpus, junitxml, verbose)
    return Report([Outcome(summaries[0], image, "", _devices(target, gpus))])


CONTENTS_UNKNOWN = (
    "no cell named (--cell NAME): what the environment must hold is unknown, so only its "
    "devices are checked, with the frameworks it has"
)
_INSTALLED = (
    "import json, importlib.metadata as m\nfound = {}\n"
    "for name in ('tensorflow', 'torch', 'jax'):\n"
    "    try: found[name] = m.version(name)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps(found))"
)


def host_framework_targets(url: str) -> list[Any]:
    """`validate --host URL --gpus ...` without --cell: the device checks against each
    framework the host's `python` has (a GPU VM's own PyTorch and JAX), one target each;
    the checks of an image's contents skip, saying why (nothing says what it must hold)."""
    import json

    import testinfra

    from gpuenv.validate import runner

    result = testinfra.get_host(url).run("python -c %s", _INSTALLED)
    try:
        found = dict(json.loads(result.stdout.strip().splitlines()[-1])) if result.rc == 0 else {}
    except (ValueError, IndexError):
        found = {}
    if not found:
        raise GpuenvError(
            f"--host {url}: its `python` has none of TensorFlow, PyTorch or JAX "
            f"({result.stderr.strip()[:200] if result.rc else 'none installed'}); put the "
            "environment's python first on PATH, or say what it must hold with --cell NAME",
            exit_code=2,
        )
    targets = []
    for name, version in found.items():
        expect = {"name": f"{name}@{url}", "variant": "gpu", "framework": name,
                  "framework_version": str(version).split("+")[0],
                  "contents_unknown": CONTENTS_UNKNOWN}  # fmt: skip
        targets.append(runner.Subject(f"{name}@{url}", f"{name} {version} on {url}", expect,
                                     host=url))  # fmt: skip
    return targets


HOST_SCHEMES = ("local", "ssh", "paramiko", "kubectl", "docker", "podman", "ansible")
