"""Compute capability verdicts: can this GPU run the framework's CUDA kernels? Pure functions.

A wheel carries SASS (cubins, machine code for one architecture) and PTX (virtual ISA that the
driver JIT-compiles). A GPU the wheel has no usable kernels for fails at run time with "no
kernel image is available for execution on the device". The rules (NVIDIA, CUDA C++
Programming Guide, "Binary Compatibility" and "PTX Compatibility"; Blackwell Compatibility
Guide, "Application Compatibility on Blackwell"):

* SASS for sm_XY runs on a GPU of compute capability X.Z for Z >= Y only: same major, same or
  newer minor. sm_80 cubins run on 8.6 and 8.9; sm_89 cubins do not run on 9.0, and sm_90
  cubins run on no Blackwell GPU (10.0, 12.0).
* PTX for compute_XY can be JIT-compiled by the driver for any GPU of compute capability >= X.Y,
  any major; the first start compiles the kernels (cached afterwards in ~/.nv/ComputeCache),
  and only a driver at least as new as the PTX's ISA version can compile it.
* Architecture-specific targets (sm_90a, compute_90a) use features of exactly one
  architecture: they run on that compute capability only, and their PTX is not forward
  compatible. Family-specific targets (sm_100f, CUDA 12.9) run within their major version on
  the same or a newer minor (CUDA Programming Guide, "Family-Specific Features").

The kernels each TensorFlow release carries are recorded in data/sass.yaml, PyTorch's and JAX's
in data/sass-torch.yaml and data/sass-jax.yaml, read from the real wheels (see the comments
there).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from gpuenv.gpu.gpus import GpuInfo, Verdict

# What nvidia-smi / gpuenv print for a compute capability they could not learn: drivers before
# R510 have no compute_cap query field (gpuenv.validate.doctor then records "?").
UNKNOWN = frozenset({"", "?", "n/a", "[n/a]", "unknown", "[unknown error]"})

_CC = re.compile(r"(\d{1,2})\.(\d)")
_ARCH = re.compile(r"(sm|compute)_(\d{1,2})(\d)([af]?)")

FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "tf": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}
# The kernel records: TensorFlow's in sass.yaml, the other frameworks' beside it.
SASS_FILES = ("sass.yaml", "sass-torch.yaml", "sass-jax.yaml")

LEVEL_ORDER = {"ok": 0, "info": 1, "warning": 2, "error": 3}


@dataclass(frozen=True, order=True)
class ComputeCapability:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        """The SASS target name of this GPU, e.g. sm_89 for 8.9 and sm_120 for 12.0."""
        return f"sm_{self.major}{self.minor}"


@dataclass(frozen=True)
class Arch:
    """A CUDA compilation target: sm_XY (SASS) or compute_XY (PTX), variant "", "a" or "f"."""

    kind: str  # sm | compute
    major: int
    minor: int
    variant: str = ""

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.major}{self.minor}{self.variant}"

    @property
    def cc(self) -> ComputeCapability:
        return ComputeCapability(self.major, self.minor)


def parse_compute_capability(text: str) -> ComputeCapability | None:
    """Parse "8.9" or "12.0"; None for unknown ("?", "[N/A]", ""). ValueError otherwise."""
    value = text.strip()
    if value.lower() in UNKNOWN:
        return None
    m = _CC.fullmatch(value)
    if not m:
        raise ValueError(f"compute capability {text!r} is not MAJOR.MINOR (like 8.9 or 12.0)")
    return ComputeCapability(int(m.group(1)), int(m.group(2)))


def parse_arch(text: str) -> Arch:
    """Parse sm_89, compute_90, sm_90a, sm_100f, sm_120. The last digit is the minor."""
    m = _ARCH.fullmatch(text.strip())
    if not m:
        raise ValueError(f"CUDA architecture {text!r} is not sm_XY or compute_XY")
    return Arch(m.group(1), int(m.group(2)), int(m.group(3)), m.group(4))


def sass_runs_on(arch: Arch, cc: ComputeCapability) -> bool:
    """SASS binary compatibility: same major, minor >= the cubin's; "a" only on its own cc."""
    if arch.variant == "a":
        return arch.cc == cc
    return arch.major == cc.major and arch.minor <= cc.minor


def ptx_jits_on(arch: Arch, cc: ComputeCapability) -> bool:
    """PTX compatibility: any GPU with cc >= the PTX's; "a" only its own cc, "f" its family."""
    if arch.variant == "a":
        return arch.cc == cc
    if arch.variant == "f":
        return arch.major == cc.major and arch.minor <= cc.minor
    return arch.cc <= cc


def kernels_run_on(cc: ComputeCapability, sass: Sequence[Arch], ptx: Sequence[Arch]) -> bool:
    """Whether a GPU of ``cc`` runs some kernel: a cubin natively or PTX by JIT (what
    judge_capability calls ok or warning, not error)."""
    return any(sass_runs_on(a, cc) for a in sass) or any(ptx_jits_on(a, cc) for a in ptx)


def _describe_kernels(sass: Sequence[str], ptx: Sequence[str]) -> str:
    parts = []
    if sass:
        parts.append("SASS for " + ", ".join(sass))
    if ptx:
        parts.append("PTX " + ", ".join(ptx))
    return " and ".join(parts) if parts else "no CUDA kernels"


def _gpu(cc: ComputeCapability, gpu_name: str | None) -> str:
    named = f"{gpu_name}, " if gpu_name else ""
    return f"this GPU ({named}compute capability {cc}, {cc.sm})"


def judge_capability(
    cc: str,
    sass: Sequence[str],
    ptx: Sequence[str],
    framework_label: str,
    *,
    gpu_name: str | None = None,
    hint: str | None = None,
) -> Verdict:
    """Can a GPU of compute capability ``cc`` run kernels compiled for ``sass`` and ``ptx``?

    ok: a cubin runs natively; warning: only PTX fits, the driver JIT-compiles it; error: no
    kernel image fits; info: the compute capability is unknown or not understood.
    ``framework_label`` names the kernels' owner ("TensorFlow 2.21"); ``hint`` (what to do
    instead) ends an error's message.
    """
    try:
        have = parse_compute_capability(cc)
    except ValueError:
        return Verdict(
            "info",
            f"compute capability {cc!r} not understood; cannot tell whether {framework_label}'s "
            f"kernels ({_describe_kernels(sass, ptx)}) run on this GPU",
        )
    if have is None:
        return Verdict(
            "info",
            f"the GPU's compute capability is unknown (nvidia-smi before driver R510 does not "
            f"report it); {framework_label} has {_describe_kernels(sass, ptx)}: GPUs older "
            f"than the oldest of them fail with 'no kernel image is available'",
        )
    sass_archs = [parse_arch(a) for a in sass]
    ptx_archs = [parse_arch(a) for a in ptx]
    native = [a for a in sass_archs if sass_runs_on(a, have)]
    if native:
        best = max(native, key=lambda a: (a.cc, a.variant == "a"))
        return Verdict("ok", f"runs natively ({best.name} kernels) on {_gpu(have, gpu_name)}")
    jit = [a for a in ptx_archs if ptx_jits_on(a, have)]
    if jit:
        best = max(jit, key=lambda a: a.cc)
        return Verdict(
            "warning",
            f"{framework_label} has no SASS for {_gpu(have, gpu_name)}: it runs by PTX JIT "
            f"from {best.name}: the first start compiles the kernels (minutes; cached in "
            "~/.nv/ComputeCache afterwards) and needs a driver that supports that PTX "
            "(one at least as new as the image's CUDA)",
        )
    reason = (
        f"{_gpu(have, gpu_name)} is older than all of them"
        if all(a.cc > have for a in (*sass_archs, *ptx_archs))
        else f"SASS runs only on its own major version ({have.major}.x has none here) and "
        f"PTX only on GPUs at least as new as it"
    )
    message = (
        f"cannot run: {framework_label} has {_describe_kernels(sass, ptx)}; {reason}, so CUDA "
        "fails with 'no kernel image is available for execution on the device'"
    )
    return Verdict("error", f"{message}. {hint}" if hint else message)


# ---------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class KnownIssue:
    compute_cap: str
    note: str
    source: str


@dataclass(frozen=True)
class KernelSet:
    """One release's row of data/sass.yaml."""

    framework: str
    minor: str
    version: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    source: str
    known_issues: tuple[KnownIssue, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{FRAMEWORK_NAMES.get(self.framework, self.framework)} {self.minor}"


def _minor(release: str) -> str:
    return ".".join(release.strip().split(".")[:2])


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str], KernelSet]:
    framework = str(doc["framework"])
    issues: dict[str, list[KnownIssue]] = {}
    for item in doc.get("known_issues") or []:
        issue = KnownIssue(str(item["compute_cap"]), str(item["note"]), str(item["source"]))
        for minor in item["minors"]:
            issues.setdefault(str(minor), []).append(issue)
    table = {}
    for row in doc["releases"]:
        minor = str(row["minor"])
        table[(framework, minor)] = KernelSet(
            framework=framework,
            minor=minor,
            version=str(row["version"]),
            sass=tuple(row["sass"]),
            ptx=tuple(row["ptx"]),
            source=" ".join(str(row["source"]).split()),
            known_issues=tuple(issues.get(minor, ())),
        )
    return table


@functools.cache
def kernel_table() -> dict[tuple[str, str], KernelSet]:
    """Every row of data/sass*.yaml, keyed by (framework, minor): ("tensorflow", "2.21")."""
    table: dict[tuple[str, str], KernelSet] = {}
    for name in SASS_FILES:
        text = resources.files("gpuenv.data").joinpath(name).read_text("utf-8")
        table.update(_rows(yaml.safe_load(text)))
    return table


def kernels_for(framework: str, release: str) -> KernelSet | None:
    """The kernels of a release ("2.21" or "2.21.0"; framework "tensorflow" or "tf"), or None
    when gpuenv has no record of them."""
    name = "tensorflow" if framework.lower() in ("tensorflow", "tf") else framework.lower()
    return kernel_table().get((name, _minor(release)))


def releases_running_on(
    cc: str, framework: str = "tensorflow", *, native_only: bool = False
) -> list[str]:
    """The recorded minor releases whose kernels run on ``cc``, newest first."""
    have = parse_compute_capability(cc)
    if have is None:
        return []
    found = []
    for (name, minor), row in kernel_table().items():
        if name != framework:
            continue
        if any(sass_runs_on(parse_arch(a), have) for a in row.sass) or (
            not native_only and any(ptx_jits_on(parse_arch(a), have) for a in row.ptx)
        ):
            found.append(minor)
    return sorted(found, key=lambda m: tuple(int(p) for p in m.split(".")), reverse=True)


def _hint(cc: str, row: KernelSet, candidates: Iterable[str] | None) -> str | None:
    try:
        runs = releases_running_on(cc, row.framework)
    except ValueError:
        return None
    allowed = {_minor(c) for c in candidates} if candidates is not None else None
    usable = [m for m in runs if allowed is None or m in allowed]
    name = FRAMEWORK_NAMES.get(row.framework, row.framework)
    if usable:
        return f"Use {name} {usable[0]} instead, the newest release with kernels for it"
    if runs:
        return (
            f"{name} {runs[0]} and older have kernels for it, but gpuenv makes no GPU image of "
            "them; use a newer GPU"
        )
    return f"No {name} release gpuenv knows has kernels for it; use a newer GPU"


def judge_release(
    gpu: GpuInfo,
    framework: str,
    release: str,
    *,
    candidates: Iterable[str] | None = None,
) -> Verdict:
    """One GPU against one release's recorded kernels. ``candidates`` (minor releases gpuenv
    can make GPU images of) limits the release an error suggests instead."""
    row = kernels_for(framework, release)
    name = FRAMEWORK_NAMES.get(framework.lower(), framework)
    if row is None:
        return Verdict(
            "info",
            f"gpuenv has no record of the CUDA kernels in {name} {release}; cannot tell "
            f"whether {gpu.name} (compute capability {gpu.compute_cap}) runs it",
        )
    verdict = judge_capability(
        gpu.compute_cap,
        row.sass,
        row.ptx,
        row.label,
        gpu_name=gpu.name or None,
        hint=_hint(gpu.compute_cap, row, candidates),
    )
    if verdict.level in ("ok", "warning"):
        notes = [i for i in row.known_issues if i.compute_cap == gpu.compute_cap.strip()]
        if notes:
            extra = "; ".join(f"{i.note} ({i.source})" for i in notes)
            return Verdict("warning", f"{verdict.message}. Known problem: {extra}")
    return verdict


def judge_gpus(
    gpus: Sequence[GpuInfo],
    framework: str,
    release: str,
    *,
    candidates: Iterable[str] | None = None,
) -> list[Verdict]:
    """One verdict per GPU, in the order given (see judge_release)."""
    return [judge_release(g, framework, release, candidates=candidates) for g in gpus]


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """One verdict for several GPUs: the worst level; each distinct message once, worst first.
    No GPUs: info."""
    if not verdicts:
        return Verdict("info", "no GPU to judge")
    level = max((v.level for v in verdicts), key=lambda lv: LEVEL_ORDER.get(lv, 1))
    ranked = sorted(verdicts, key=lambda v: -LEVEL_ORDER.get(v.level, 1))
    messages = list(dict.fromkeys(v.message for v in ranked))
    return Verdict(level, "; ".join(messages) if len(messages) > 1 else messages[0])


def gpu_verdict(gpus: Sequence[GpuInfo], framework: str, release: str) -> Verdict:
    """What run's preflight, doctor and validate say of these GPUs for an image of this
    framework release: the worst per-GPU verdict, suggesting only releases gpuenv can make
    GPU images of."""
    from gpuenv.catalog import compat

    cat = compat.catalog_by_label(framework) or compat.catalog()
    return combine(judge_gpus(gpus, framework, release, candidates=cat.gpu_minors()))
