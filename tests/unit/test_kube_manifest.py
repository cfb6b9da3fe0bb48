"""The Jobs `gpuenv run --kube` generates: every variant validated offline against the
official OpenAPI schemas of several Kubernetes minor versions (kubernetes-validate ships
them, strict: unknown fields are errors), byte-identical YAML, and node affinity that agrees
with doctor's compute-capability verdicts."""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Iterator

import kubernetes_validate
import pytest
import yaml

from gpuenv.gpu.capability import gpu_verdict
from gpuenv.gpu.gpus import GpuInfo
from gpuenv.run.kube import KubeError
from gpuenv.run.kube.manifest import (
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_CUDA_MAJOR,
    JobInputs,
    Pvc,
    compute_capability_terms,
    job_manifest,
    job_name,
    node_requirements,
    parse_pvc,
    parse_shm_size,
    parse_timeout,
    to_yaml,
)

KUBERNETES_VERSIONS = ["1.29.0", "1.31.0", "1.33.0", "1.35.0"]
DIGEST = "sha256:" + "b" * 64
SPEC = "sha256:" + "a" * 64


def inputs(gpus: int = 0, **kw) -> JobInputs:
    gpu = gpus > 0
    base = dict(
        cell="tf2.21-py3.11-cuda12.5-gpu" if gpu else "tf2.21-py3.11-cpu",
        spec_hash=SPEC,
        image=f"localhost:5001/tensorflow@{DIGEST}",
        command=("python", "train.py", "--epochs", "3"),
        cell_image="localhost:5001/tensorflow:tf2.21-py3.11-cpu",
        gpus=gpus,
        gpu_image=gpu,
        framework="tensorflow",
        framework_version="2.21.0",
        cuda="12.5" if gpu else None,
        env=(("TF_CPP_MIN_LOG_LEVEL", "1"),),
    )
    base.update(kw)
    return JobInputs(**base)


VARIANTS = {
    f"gpus={g}-pvc={p}-runtime={r}-deadline={d}": inputs(
        g,
        pvcs=(Pvc("datasets", "/data", True), Pvc("ckpt", "/ckpt")) if p else (),
        runtime_class="nvidia" if r else None,
        deadline=7200 if d else None,
        namespace="ml" if p else None,
        pull_secrets=("regcred",) if r else (),
    )
    for g, p, r, d in itertools.product([0, 1, 2, 8], [False, True], [False, True], [False, True])
}


@pytest.fixture(scope="module", autouse=True)
def _schemas_read_once() -> Iterator[None]:
    """kubernetes-validate json-loads its schema files (megabytes) at every call: half this
    module's time. The same files, read once for the module."""
    with pytest.MonkeyPatch.context() as patch:
        read = functools.cache(kubernetes_validate.utils.schema_contents)
        patch.setattr(kubernetes_validate.utils, "schema_contents", read)
        yield


@functools.cache
def _printed(name: str) -> dict:
    """A variant's manifest through YAML, as kubectl or a GitOps tool would read the printed
    manifest: once per variant, not again for each Kubernetes version (pure-Python YAML)."""
    return yaml.safe_load(to_yaml(job_manifest(VARIANTS[name], suffix="1a2b")))


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_manifest_is_valid_against_the_kubernetes_openapi_schema(name, version):
    doc = copy.deepcopy(_printed(name))
    assert kubernetes_validate.validate(doc, version, strict=True) == version[:4]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_schema_check_catches_a_broken_manifest(version):
    manifest = job_manifest(inputs(2))
    manifest["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, version, strict=True)
    manifest = job_manifest(inputs(2))
    manifest["spec"]["backoffLimit"] = "none"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, version, strict=True)


def test_the_yaml_is_byte_identical_for_the_same_inputs():
    a = to_yaml(job_manifest(inputs(2, pvcs=(Pvc("d", "/data"),), deadline=60)))
    b = to_yaml(job_manifest(inputs(2, pvcs=(Pvc("d", "/data"),), deadline=60)))
    assert a == b
    assert a != to_yaml(job_manifest(inputs(2, pvcs=(Pvc("d", "/data"),), deadline=61)))


def test_the_name_is_derived_from_the_inputs_and_fits_the_label_limit():
    name = job_name(inputs(2))
    assert name.startswith("gpuenv-tf2-21-py3-11-cuda12-5-gpu-") and len(name) <= 52
    assert job_name(inputs(2)) == name != job_name(inputs(1))
    assert job_name(inputs(2), "1a2b") == f"{name}-1a2b"
    long = inputs(cell="x" * 80)
    assert len(job_name(long, "ffff")) <= 52


def _pod(manifest):
    return manifest["spec"]["template"]["spec"]


def test_gpu_job_asks_for_the_gpus_tolerates_the_taint_and_sizes_shm():
    m = job_manifest(inputs(8))
    pod = _pod(m)
    container = pod["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert _pod(job_manifest(inputs(1)))["volumes"][0]["emptyDir"]["sizeLimit"] == "2Gi"
    assert _pod(job_manifest(inputs(2)))["volumes"][0]["emptyDir"]["sizeLimit"] == "4Gi"
    assert (
        _pod(job_manifest(inputs(2, shm_size="1Gi")))["volumes"][0]["emptyDir"]["sizeLimit"]
        == "1Gi"
    )


def test_cpu_job_asks_for_no_gpu_and_has_no_gpu_affinity():
    pod = _pod(job_manifest(inputs(0)))
    assert "resources" not in pod["containers"][0]
    assert "tolerations" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [arch]}]
    assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "2Gi"


def test_an_arm64_job_asks_for_arm64_nodes_in_every_term():
    pod = _pod(job_manifest(inputs(2, arch="arm64")))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    arch = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
    assert terms["nodeSelectorTerms"]
    assert all(arch in t["matchExpressions"] for t in terms["nodeSelectorTerms"])


def test_every_job_runs_as_the_images_non_root_user_without_privileges():
    for inp in (inputs(0), inputs(2)):
        m = job_manifest(inp)
        pod = _pod(m)
        ctx = pod["containers"][0]["securityContext"]
        assert ctx == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
        }
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        assert pod["restartPolicy"] == "Never"
        assert m["spec"]["backoffLimit"] == 0
        assert m["spec"]["ttlSecondsAfterFinished"] == 86400


def test_labels_carry_the_cell_and_spec_hash_and_the_deadline_comes_from_timeout():
    m = job_manifest(inputs(2, deadline=5400, runtime_class="nvidia"))
    labels = m["metadata"]["labels"]
    assert labels["io.gpuenv.cell"] == "tf2.21-py3.11-cuda12.5-gpu"
    assert labels["io.gpuenv.spec-hash"] == "a" * 63  # label values stop at 63 characters
    assert m["metadata"]["annotations"]["io.gpuenv.spec-hash"] == SPEC
    assert m["spec"]["template"]["metadata"]["labels"] == labels
    assert m["spec"]["activeDeadlineSeconds"] == 5400
    assert _pod(m)["runtimeClassName"] == "nvidia"
    assert "activeDeadlineSeconds" not in job_manifest(inputs(2))["spec"]


def test_the_image_is_referenced_by_digest_and_the_command_replaces_cmd():
    c = _pod(job_manifest(inputs(1)))["containers"][0]
    assert c["image"].endswith("@" + DIGEST)
    assert c["args"] == ["python", "train.py", "--epochs", "3"] and "command" not in c
    assert c["workingDir"] == "/workspace"
    assert c["env"] == [{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "1"}]


def test_pvcs_are_mounted_read_only_when_asked():
    pod = _pod(job_manifest(inputs(0, pvcs=(Pvc("datasets", "/data", True), Pvc("c", "/c")))))
    mounts = pod["containers"][0]["volumeMounts"]
    assert {"name": "pvc-0", "mountPath": "/data", "readOnly": True} in mounts
    assert {"name": "pvc-1", "mountPath": "/c"} in mounts
    assert {"name": "pvc-0", "persistentVolumeClaim": {"claimName": "datasets",
            "readOnly": True}} in pod["volumes"]  # fmt: skip


# ------------------------------------------------------------------- node affinity


def _matches(node_labels: dict[str, str], terms) -> bool:
    """The scheduler's nodeSelectorTerms semantics: OR of terms, AND of expressions;
    In/Gt over the label's value (Gt: integer comparison, a missing label does not match)."""

    def ok(expr) -> bool:
        value = node_labels.get(expr["key"])
        if value is None:
            return False
        if expr["operator"] == "In":
            return value in expr["values"]
        if expr["operator"] == "Gt":
            return int(value) > int(expr["values"][0])
        raise AssertionError(expr["operator"])

    return any(all(ok(e) for e in term) for term in terms)


GPUS = ["3.5", "3.7", "5.0", "5.2", "6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0",
        "10.0", "12.0"]  # fmt: skip


@pytest.mark.parametrize("release", ["2.12", "2.15", "2.16", "2.17", "2.21"])
@pytest.mark.parametrize("cc", GPUS)
def test_compute_capability_affinity_agrees_with_doctors_verdict(release, cc):
    terms = compute_capability_terms("tensorflow", release)
    major, minor = cc.split(".")
    node = {GFD_CC_MAJOR: major, GFD_CC_MINOR: minor}
    verdict = gpu_verdict([GpuInfo("580.65.06", "GPU", cc)], "tensorflow", release)
    assert _matches(node, terms) == (verdict.level != "error"), verdict.message


def test_gpu_affinity_requires_the_drivers_cuda_major_and_a_capable_gpu():
    terms, words = node_requirements(inputs(2))
    assert (
        words == "kubernetes.io/arch=amd64, driver CUDA major >= 12, GPU compute capability >= 6.0"
    )
    assert terms == [[
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
        {"key": GFD_CUDA_MAJOR, "operator": "Gt", "values": ["11"]},
        {"key": GFD_CC_MAJOR, "operator": "Gt", "values": ["5"]},
    ]]  # fmt: skip
    good = {"kubernetes.io/arch": "amd64", GFD_CUDA_MAJOR: "12", GFD_CC_MAJOR: "8",
            GFD_CC_MINOR: "0"}  # fmt: skip
    assert _matches(good, terms)
    assert not _matches({**good, "kubernetes.io/arch": "arm64"}, terms)
    assert not _matches({**good, GFD_CUDA_MAJOR: "11"}, terms)  # an R470 driver
    assert not _matches({**good, GFD_CC_MAJOR: "5"}, terms)  # Maxwell
    assert not _matches({}, terms)  # a node without GPU Feature Discovery
    assert job_manifest(inputs(2))["metadata"]["annotations"]["io.gpuenv.requires"] == words


def test_no_affinity_when_turned_off_or_unknown():
    assert node_requirements(inputs(2, node_affinity=False)) == ([], "")
    assert "affinity" not in _pod(job_manifest(inputs(2, node_affinity=False)))
    terms, words = node_requirements(inputs(2, framework_version="9.99.0"))
    assert terms == [[{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                      {"key": GFD_CUDA_MAJOR, "operator": "Gt", "values": ["11"]}]]  # fmt: skip
    assert words == "kubernetes.io/arch=amd64, driver CUDA major >= 12"


def test_older_release_with_sm35_gets_a_per_minor_term():
    terms = compute_capability_terms("tensorflow", "2.12")
    assert [{"key": GFD_CC_MAJOR, "operator": "In", "values": ["3"]},
            {"key": GFD_CC_MINOR, "operator": "Gt", "values": ["4"]}] in terms  # fmt: skip


# ------------------------------------------------------------------- option parsing


def test_parse_pvc():
    assert parse_pvc("data:/data") == Pvc("data", "/data")
    assert parse_pvc("data:/data/:ro") == Pvc("data", "/data", True)


@pytest.mark.parametrize(
    "item", ["data", "Data:/d", "data:rel", "data:/", "data:/workspace", "data:/dev/shm",
             "d:/x:rx"],
)  # fmt: skip
def test_parse_pvc_errors(item):
    with pytest.raises(KubeError, match="--pvc"):
        parse_pvc(item)


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400)],
)
def test_parse_timeout(text, seconds):
    assert parse_timeout(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "soon", "1x", "-5", "0s"])
def test_parse_timeout_errors(text):
    with pytest.raises(KubeError, match="--timeout"):
        parse_timeout(text)


def test_parse_shm_size():
    assert parse_shm_size("8Gi") == "8Gi"
    for bad in ("2g", "0Gi", "lots"):
        with pytest.raises(KubeError, match="--shm-size"):
            parse_shm_size(bad)
