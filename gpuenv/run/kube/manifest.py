"""The Job `gpuenv kube run` creates, generated from the cell and its pushed image. Pure.

Same inputs, same bytes: `gpuenv kube run --dry-run` prints `to_yaml(job_manifest(...))`,
and a live run creates the same object with a unique suffix on its name.

What every Job gets (docs: docs/kubernetes.md):
- the cell's image (with the working directory as one more layer) by digest, the command as
  `args` (the image's CMD, as `docker run IMAGE CMD` replaces it), working directory
  /workspace;
- non-root: runAsNonRoot with the image's uid/gid 1000 spelt out (the kubelet cannot check a
  user *name*: "container has runAsNonRoot and image has non-numeric user (gpuenv), cannot
  verify user is non-root", pkg/kubelet/kuberuntime/security_context_others.go),
  allowPrivilegeEscalation false, every capability dropped, seccomp RuntimeDefault (the
  Pod Security "restricted" profile), no service account token, fsGroup 1000 so a PVC is
  writable;
- /dev/shm: a memory-backed emptyDir (SHM_PER_GPU per GPU, at least SHM_MIN; it counts
  against the pod's memory);
- GPU runs: limits nvidia.com/gpu, the usual nvidia.com/gpu:NoSchedule toleration, and a
  required node affinity on GPU Feature Discovery's labels, from the rules doctor uses:
  `nvidia.com/cuda.runtime.major` (the CUDA version the *driver* supports, which GFD reads
  with nvmlSystemGetCudaDriverVersion; `nvidia.com/cuda.driver.major` is the driver branch,
  e.g. 535) at least the cell's CUDA major (gpuenv/catalog/compat.py: below the major's floor
  nothing runs), and `nvidia.com/gpu.compute.major/minor` where the framework release has
  SASS or PTX that runs (gpuenv/gpu/capability.py over data/sass.yaml);
- backoffLimit 0 (a training run is not retried behind your back), ttlSecondsAfterFinished,
  activeDeadlineSeconds from --timeout; labels with the cell and the spec hash.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from gpuenv.matrix import contract
from gpuenv.run.kube import KubeError

WORKSPACE = "/workspace"
CONTAINER = "workload"
GPU_RESOURCE = "nvidia.com/gpu"
TTL_SECONDS = 86400  # finished Jobs (and their logs) stay a day for kube attach/logs
SHM_MIN_GI = 2  # as local `gpuenv run` (run.SHM_SIZE)
SHM_PER_GPU_GI = 2  # NCCL and per-GPU input pipelines
MANAGED_BY = "app.kubernetes.io/managed-by"
REQUIRES = "io.gpuenv.requires"  # annotation: the node requirements, in words
IMAGE_ANNOTATION = "io.gpuenv.image"  # annotation: the cell's image, by tag

# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery).
GFD_CUDA_MAJOR = "nvidia.com/cuda.runtime.major"
ARCH_LABEL = "kubernetes.io/arch"  # a well-known label the kubelet sets on every node
GFD_CC_MAJOR = "nvidia.com/gpu.compute.major"
GFD_CC_MINOR = "nvidia.com/gpu.compute.minor"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_QUANTITY = re.compile(r"[1-9][0-9]*(Ki|Mi|Gi|Ti)")
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


@dataclass(frozen=True)
class Pvc:
    claim: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class JobInputs:
    """Everything the manifest depends on; nothing else reaches it."""

    cell: str
    spec_hash: str
    image: str  # REPO@sha256:..., what the pod runs
    command: tuple[str, ...]
    cell_image: str = ""  # the cell's image by tag, for people reading the Job
    gpus: int = 0
    gpu_image: bool = False
    framework: str | None = None
    framework_version: str = ""
    cuda: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    workdir: str = WORKSPACE
    pvcs: tuple[Pvc, ...] = ()
    runtime_class: str | None = None
    deadline: int | None = None  # seconds
    shm_size: str | None = None  # a quantity; default from the GPU count
    namespace: str | None = None
    pull_secrets: tuple[str, ...] = ()
    node_affinity: bool = True
    arch: str = "amd64"  # the image's architecture: kubernetes.io/arch of the node
    ttl: int = TTL_SECONDS
    uid: int = contract.UID
    name: str | None = None  # default: job_name(self)

    def digest(self) -> str:
        data = asdict(self)
        data.pop("name")
        if data["arch"] == "amd64":
            data.pop("arch")  # the digests (Job names) of amd64 runs are what they were
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------ option parsing


def parse_pvc(item: str) -> Pvc:
    """--pvc CLAIM:/PATH[:ro]"""
    parts = item.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise KubeError(f"--pvc {item!r}: expected CLAIM:/PATH[:ro]")
    claim, path = parts[0], parts[1]
    if not _DNS_SUBDOMAIN.fullmatch(claim):
        raise KubeError(f"--pvc {item!r}: {claim!r} is not a PersistentVolumeClaim name")
    if not path.startswith("/") or path.rstrip("/") in ("", WORKSPACE, "/dev/shm", "/dev"):
        raise KubeError(
            f"--pvc {item!r}: mount it at an absolute path other than /, {WORKSPACE} (your "
            "code) and /dev/shm, e.g. /data"
        )
    return Pvc(claim, path.rstrip("/"), len(parts) == 3 and parts[2] == "ro")


def parse_timeout(text: str) -> int:
    """--timeout 90 | 90s | 30m | 2h | 1h30m | 1d -> seconds (activeDeadlineSeconds)."""
    value = text.strip()
    if value.isdigit():
        seconds = int(value)
    else:
        m = _DURATION.fullmatch(value)
        if not value or not m or not any(m.groups()):
            raise KubeError(f"--timeout {text!r}: expected seconds or a duration like 90m, 2h30m")
        d, h, mi, s = (int(g or 0) for g in m.groups())
        seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds <= 0:
        raise KubeError(f"--timeout {text!r}: must be more than 0 seconds")
    return seconds


def parse_shm_size(text: str) -> str:
    if not _QUANTITY.fullmatch(text.strip()):
        raise KubeError(f"--shm-size {text!r}: expected a quantity like 512Mi, 8Gi")
    return text.strip()


def check_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    for key in env:
        if not _ENV_NAME.fullmatch(key):
            raise KubeError(f"-e {key}: not a valid environment variable name for Kubernetes")
    return tuple(sorted(env.items()))


def check_name(value: str, what: str) -> str:
    if not _DNS_LABEL.fullmatch(value):
        raise KubeError(f"{what} {value!r}: expected a lowercase DNS label (a-z, 0-9, '-')")
    return value


# ------------------------------------------------------------------------ naming


def job_name(inputs: JobInputs, suffix: str = "") -> str:
    """gpuenv-<cell>-<8 hex of the inputs>[-suffix]: at most 52 characters, so that the
    pods' names (+6) and the job-name label (63) fit."""
    if inputs.name:
        return inputs.name
    slug = re.sub(r"[^a-z0-9]+", "-", inputs.cell.lower()).strip("-")[:30].strip("-")
    name = f"gpuenv-{slug}-{inputs.digest()[:8]}"
    return f"{name}-{suffix}" if suffix else name


def shm_size(inputs: JobInputs) -> str:
    return inputs.shm_size or f"{max(SHM_MIN_GI, SHM_PER_GPU_GI * inputs.gpus)}Gi"


# ------------------------------------------------------------------------ node affinity

_MAX_MAJOR = 99  # compute capability majors examined; PTX covers every newer one


def _expr(key: str, op: str, values: list[int]) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": [str(v) for v in values]}


def compute_capability_terms(framework: str, release: str) -> list[list[dict[str, Any]]] | None:
    """Node selector terms (OR of ANDs) matching exactly the compute capabilities on which
    `gpuenv doctor` does not say "cannot run" (SASS natively, or PTX JIT), or None when
    gpuenv has no record of the release's kernels."""
    from gpuenv.gpu.capability import ComputeCapability, kernels_for, kernels_run_on, parse_arch

    row = kernels_for(framework, release)
    if row is None:
        return None
    # parsed once for the ~1000 capabilities below, not once per capability
    sass, ptx = [parse_arch(a) for a in row.sass], [parse_arch(a) for a in row.ptx]

    def runs(major: int, minor: int) -> bool:
        return kernels_run_on(ComputeCapability(major, minor), sass, ptx)

    passing = {m: [n for n in range(10) if runs(m, n)] for m in range(1, _MAX_MAJOR + 1)}
    full = [m for m, minors in passing.items() if len(minors) == 10]
    # the smallest major from which every major runs entirely (PTX reaches them all)
    tail = _MAX_MAJOR + 1
    while tail - 1 in full:
        tail -= 1
    terms: list[list[dict[str, Any]]] = []
    if tail <= _MAX_MAJOR:
        terms.append([_expr(GFD_CC_MAJOR, "Gt", [tail - 1])])
    below = [m for m in full if m < tail]
    if below:
        terms.append([_expr(GFD_CC_MAJOR, "In", below)])
    for major, minors in passing.items():
        if major >= tail or not minors or len(minors) == 10:
            continue
        if minors == list(range(minors[0], 10)):
            minor = _expr(GFD_CC_MINOR, "Gt", [minors[0] - 1])
        else:
            minor = _expr(GFD_CC_MINOR, "In", minors)
        terms.append([_expr(GFD_CC_MAJOR, "In", [major]), minor])
    return terms


def _describe_cc(terms: list[list[dict[str, Any]]]) -> str:
    parts = []
    for term in terms:
        if len(term) == 1 and term[0]["operator"] == "Gt":
            parts.append(f">= {int(term[0]['values'][0]) + 1}.0")
        elif len(term) == 1:
            parts.append(" or ".join(f"{v}.x" for v in term[0]["values"]))
        else:
            major = term[0]["values"][0]
            if term[1]["operator"] == "Gt":
                parts.append(f"{major}.{int(term[1]['values'][0]) + 1}+")
            else:
                parts.append(" or ".join(f"{major}.{v}" for v in term[1]["values"]))
    return "GPU compute capability " + " or ".join(parts)


def node_requirements(inputs: JobInputs) -> tuple[list[list[dict[str, Any]]], str]:
    """(nodeSelectorTerms, the same in words): the node's architecture (kubernetes.io/arch,
    so an arm64 image lands on a Grace or Graviton node and an amd64 one never does), and for
    a GPU run the driver and compute capability; ([], "") with --no-node-affinity."""
    if not inputs.node_affinity:
        return [], ""
    arch = {"key": ARCH_LABEL, "operator": "In", "values": [inputs.arch]}
    if not inputs.gpus or not inputs.gpu_image:
        return [[arch]], f"{ARCH_LABEL}={inputs.arch}"
    common: list[dict[str, Any]] = [arch]
    words = [f"{ARCH_LABEL}={inputs.arch}"]
    if inputs.cuda:
        major = int(inputs.cuda.split(".")[0])
        common.append(_expr(GFD_CUDA_MAJOR, "Gt", [major - 1]))
        words.append(f"driver CUDA major >= {major}")
    cc_terms = None
    if inputs.framework and inputs.framework_version:
        cc_terms = compute_capability_terms(inputs.framework, inputs.framework_version)
    if cc_terms:
        words.append(_describe_cc(cc_terms))
        terms = [[*common, *t] for t in cc_terms]
    else:
        terms = [common]
    return terms, ", ".join(words)


# ------------------------------------------------------------------------ the manifest


def labels(inputs: JobInputs) -> dict[str, str]:
    return {
        MANAGED_BY: "gpuenv",
        **contract.container_labels("run"),
        contract.CELL: inputs.cell,
        # label values stop at 63 characters; the annotation holds the whole hash
        contract.SPEC_HASH: inputs.spec_hash.removeprefix("sha256:")[:63],
    }


def job_manifest(inputs: JobInputs, suffix: str = "") -> dict[str, Any]:
    """The batch/v1 Job, as a plain dict in a fixed key order."""
    name = job_name(inputs, suffix)
    uid = inputs.uid
    terms, requires = node_requirements(inputs)
    annotations = {contract.SPEC_HASH: inputs.spec_hash}
    if inputs.cell_image:
        annotations[IMAGE_ANNOTATION] = inputs.cell_image
    if requires:
        annotations[REQUIRES] = requires
    metadata: dict[str, Any] = {"name": name}
    if inputs.namespace:
        metadata["namespace"] = inputs.namespace
    metadata["labels"] = labels(inputs)
    metadata["annotations"] = annotations

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": inputs.image,
        "imagePullPolicy": "IfNotPresent",
        "args": list(inputs.command),
        "workingDir": inputs.workdir,
    }
    if inputs.env:
        container["env"] = [{"name": k, "value": v} for k, v in inputs.env]
    if inputs.gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(inputs.gpus)}}
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
    }
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(inputs)}}
    ]
    for i, pvc in enumerate(inputs.pvcs):
        mount: dict[str, Any] = {"name": f"pvc-{i}", "mountPath": pvc.path}
        if pvc.read_only:
            mount["readOnly"] = True
        mounts.append(mount)
        claim: dict[str, Any] = {"claimName": pvc.claim}
        if pvc.read_only:
            claim["readOnly"] = True
        volumes.append({"name": f"pvc-{i}", "persistentVolumeClaim": claim})
    container["volumeMounts"] = mounts

    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if inputs.runtime_class:
        pod["runtimeClassName"] = inputs.runtime_class
    if inputs.pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in inputs.pull_secrets]
    if inputs.gpus:
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if terms:
        pod["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                }
            }
        }
    pod["containers"] = [container]
    pod["volumes"] = volumes

    spec: dict[str, Any] = {"backoffLimit": 0, "ttlSecondsAfterFinished": inputs.ttl}
    if inputs.deadline:
        spec["activeDeadlineSeconds"] = inputs.deadline
    spec["template"] = {"metadata": {"labels": labels(inputs)}, "spec": pod}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def to_yaml(manifest: dict[str, Any]) -> str:
    """Deterministic YAML: the manifest's own key order, no line folding."""
    import yaml

    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False, width=1 << 16)
