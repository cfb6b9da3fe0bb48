"""The Job's life, on Kubernetes API objects as the API returns them, built from the official
client's own model classes (kubernetes.client.V1Pod, V1Job, CoreV1Event).

Message texts, and where they come from (Kubernetes source, by file):
- "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are
  available: 3 No preemption victims found for incoming pod.": FitError.Error in
  pkg/scheduler/framework/types.go ("0/%v nodes are available: %v."), the reason from
  pkg/scheduler/framework/plugins/noderesources/fit.go ("Insufficient " + resource name),
  the preemption postfix from pkg/scheduler/framework/preemption/preemption.go;
- "node(s) didn't match Pod's node affinity/selector": ErrReasonPod in
  pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go;
- "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }":
  pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go;
- "pod has unbound immediate PersistentVolumeClaims": ErrReasonBindConflict's neighbour in
  pkg/scheduler/framework/plugins/volumebinding/volume_binding.go;
- ErrImagePull / ImagePullBackOff and 'Back-off pulling image "..."':
  pkg/kubelet/images/types.go and image_manager.go; the pull error text is containerd's
  ('failed to resolve reference ...: not found'), as kubelet wraps it;
- "container has runAsNonRoot and image will run as root": pkg/kubelet/kuberuntime/
  security_context_others.go (verifyRunAsNonRoot), reason CreateContainerConfigError;
- OOMKilled, exit code 137: the container runtime's terminated state (CRI), as kubectl
  describe shows it;
- Job condition Failed, reason DeadlineExceeded, "Job was active longer than specified
  deadline": pkg/controller/job/job_controller.go.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes.client import (
    CoreV1Event,
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1PodCondition,
    V1PodStatus,
)

from gpuenv.run.kube import KubeError
from gpuenv.run.kube import run as kube_run
from gpuenv.run.kube.follow import explain_unschedulable, follow, observe
from gpuenv.run.kube.manifest import REQUIRES

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
IMAGE = "registry.example.com:5000/acme/tensorflow@sha256:" + "c" * 64
REQ = "driver CUDA major >= 12, GPU compute capability >= 6.0"

INSUFFICIENT_GPU = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
    "available: 3 No preemption victims found for incoming pod."
)
AFFINITY = (
    "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
)
MIXED = (
    "0/4 nodes are available: 1 node(s) had untolerated taint "
    "{node-role.kubernetes.io/control-plane: }, 1 node(s) didn't match Pod's node "
    "affinity/selector, 2 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: "
    "2 No preemption victims found for incoming pod, 2 Preemption is not helpful for "
    "scheduling."
)


def job(failed: V1JobCondition | None = None, gpus: int = 2) -> V1Job:
    return V1Job(
        metadata=V1ObjectMeta(
            name="gpuenv-x-1", namespace="ml", annotations={REQUIRES: REQ},
            labels={"app.kubernetes.io/managed-by": "gpuenv"},
        ),
        status=V1JobStatus(conditions=[failed] if failed else None),
    )  # fmt: skip


def pod(phase: str, *, state: V1ContainerState | None = None, conditions=None, name="p-1",
        age: int = 0) -> V1Pod:  # fmt: skip
    statuses = None
    if state is not None:
        statuses = [V1ContainerStatus(
            name="workload", image=IMAGE, image_id="", ready=False, restart_count=0,
            state=state,
        )]  # fmt: skip
    return V1Pod(
        metadata=V1ObjectMeta(name=name, creation_timestamp=T0 + timedelta(seconds=age)),
        status=V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses),
    )


def unschedulable(message: str) -> list[V1PodCondition]:
    return [V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                           message=message)]  # fmt: skip


def event(reason: str, message: str, name: str = "p-1", kind: str = "Pod") -> CoreV1Event:
    return CoreV1Event(
        metadata=V1ObjectMeta(name=f"{name}.1"), reason=reason, message=message, type="Warning",
        involved_object=V1ObjectReference(kind=kind, name=name), last_timestamp=T0,
    )  # fmt: skip


def waiting(reason: str, message: str = "") -> V1ContainerState:
    return V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message))


def terminated(code: int, reason: str) -> V1ContainerState:
    return V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=code, reason=reason))


RUNNING = V1ContainerState(running=V1ContainerStateRunning(started_at=T0))


# ------------------------------------------------------------------- Pending, explained


def test_insufficient_gpus_says_how_many_were_asked_for():
    assert explain_unschedulable(INSUFFICIENT_GPU, 2, REQ) == (
        "no node has 2 free nvidia.com/gpu (3 of 3 nodes)"
    )


def test_affinity_names_the_requirement_and_the_labels():
    text = explain_unschedulable(AFFINITY, 2, REQ)
    assert text.startswith(f"no node matches: {REQ} (GPU Feature Discovery labels")
    assert text.endswith("(2 of 2 nodes)")


def test_mixed_reasons_are_one_line_most_nodes_first():
    text = explain_unschedulable(MIXED, 8, REQ)
    assert "\n" not in text
    assert text.startswith("no node has 8 free nvidia.com/gpu (2 of 4 nodes); ")
    assert "taint node-role.kubernetes.io/control-plane is not tolerated (1 of 4 nodes)" in text
    assert "no node matches: driver CUDA major >= 12" in text


def test_other_scheduler_messages():
    assert explain_unschedulable(
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
        0, "",
    ) == "a PersistentVolumeClaim is not bound (kubectl get pvc) (1 of 1 nodes)"  # fmt: skip
    assert explain_unschedulable("0/2 nodes are available: 2 Insufficient memory.", 0, "") == (
        "no node has enough free memory (2 of 2 nodes)"
    )
    # before 1.25 the taint reason read differently
    old = (
        "0/1 nodes are available: 1 node(s) had taint {dedicated: gpu}, that the pod "
        "didn't tolerate."
    )
    assert (
        explain_unschedulable(old, 0, "") == "taint dedicated=gpu is not tolerated (1 of 1 nodes)"
    )
    assert explain_unschedulable('persistentvolumeclaim "data" not found', 0, "") == (
        'persistentvolumeclaim "data" not found'
    )


def test_pending_pod_from_its_condition():
    s = observe(job(), [pod("Pending", conditions=unschedulable(INSUFFICIENT_GPU))], [], 2)
    assert (s.kind, s.message) == ("pending", "no node has 2 free nvidia.com/gpu (3 of 3 nodes)")


def test_pending_pod_from_the_failed_scheduling_event_when_the_condition_has_no_message():
    cond = [V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable")]
    s = observe(job(), [pod("Pending", conditions=cond)], [event("FailedScheduling", AFFINITY)], 2)
    assert s.kind == "pending" and s.message.startswith(f"no node matches: {REQ}")


def test_no_pod_yet_and_a_pod_the_job_cannot_create():
    assert observe(job(), [], [], 0).kind == "waiting"
    refused = event(
        "FailedCreate",
        'Error creating: pods "gpuenv-x-1-abcde" is forbidden: pod rejected: RuntimeClass '
        '"nvidia" not found',
        name="gpuenv-x-1", kind="Job",
    )  # fmt: skip
    s = observe(job(), [], [refused], 0)
    assert s.kind == "error" and 'RuntimeClass "nvidia" not found' in s.message


# ------------------------------------------------------------------- pulls, starts, ends


@pytest.mark.parametrize("reason, message", [
    ("ErrImagePull", 'failed to pull and unpack image "' + IMAGE + '": failed to resolve '
     "reference: not found"),
    ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
])  # fmt: skip
def test_image_pull_failures_name_the_image_and_the_registry(reason, message):
    s = observe(job(), [pod("Pending", state=waiting(reason, message))], [], 2)
    assert s.kind == "error"
    assert f"cannot pull {IMAGE} from registry.example.com:5000" in s.message
    assert reason in s.message and "--pull-secret" in s.message


def test_container_config_error_is_an_error():
    s = observe(job(), [pod("Pending", state=waiting(
        "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"
    ))], [], 0)  # fmt: skip
    assert s.kind == "error" and "runAsNonRoot" in s.message


def test_running_succeeded_failed_and_oomkilled():
    assert observe(job(), [pod("Running", state=RUNNING)], [], 0).kind == "running"
    ok = observe(job(), [pod("Succeeded", state=terminated(0, "Completed"))], [], 0)
    assert (ok.kind, ok.exit_code, ok.message) == ("succeeded", 0, "")
    bad = observe(job(), [pod("Failed", state=terminated(3, "Error"))], [], 0)
    assert (bad.kind, bad.exit_code) == ("failed", 3)
    oom = observe(job(), [pod("Failed", state=terminated(137, "OOMKilled"))], [], 0)
    assert (oom.kind, oom.exit_code) == ("failed", 137) and oom.message.startswith("OOMKilled")


def test_deadline_exceeded_is_124():
    cond = V1JobCondition(type="Failed", status="True", reason="DeadlineExceeded",
                          message="Job was active longer than specified deadline")  # fmt: skip
    s = observe(job(cond), [], [], 0)
    assert (s.kind, s.exit_code) == ("failed", 124) and "--timeout" in s.message
    s = observe(job(cond), [pod("Failed", state=terminated(143, "Error"))], [], 0)
    assert s.exit_code == 124


def test_the_newest_pod_counts():
    old = pod("Failed", state=terminated(1, "Error"), name="p-old", age=0)
    new = pod("Running", state=RUNNING, name="p-new", age=30)
    assert observe(job(), [new, old], [], 0).pod == "p-new"


# ------------------------------------------------------------------- the follow loop


class FakeApi:
    """What client.KubeApi offers, answering with scripted model objects."""

    def __init__(self, script, logs=b"epoch 1\nepoch 2\n", job_obj=None):
        self.script = list(script)  # one list of pods per poll; the last one repeats
        self.events = {}
        self.log_bytes = logs
        self.job_obj = job_obj or job()
        self.deleted = []
        self.created = []
        self.log_calls = 0

    def read_job(self, ns, name):
        return self.job_obj

    def list_pods(self, ns, name):
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def list_events(self, ns, name):
        return self.events.get(name, [])

    def logs(self, ns, pod, container, *, follow):
        assert container == "workload"
        self.log_calls += 1
        yield self.log_bytes

    def delete_job(self, ns, name):
        self.deleted.append(name)

    def create_job(self, ns, body):
        self.created.append(body)


def test_follow_explains_pending_once_streams_logs_and_returns_the_exit_code():
    pending = [pod("Pending", conditions=unschedulable(INSUFFICIENT_GPU))]
    api = FakeApi([pending, pending, [pod("Running", state=RUNNING)],
                   [pod("Failed", state=terminated(7, "Error"))]])  # fmt: skip
    out, said = io.BytesIO(), []
    code = follow(api, "ml", "gpuenv-x-1", gpus=2, out=out, say=said.append, sleep=lambda s: None)
    assert code == 7
    assert out.getvalue() == b"epoch 1\nepoch 2\n" and api.log_calls == 1
    assert said == ["gpuenv-x-1: pending: no node has 2 free nvidia.com/gpu (3 of 3 nodes)"]


def test_follow_reports_oomkilled():
    api = FakeApi([[pod("Failed", state=terminated(137, "OOMKilled"))]], logs=b"")
    said = []
    assert follow(api, "ml", "j", gpus=0, out=io.BytesIO(), say=said.append,
                  sleep=lambda s: None) == 137  # fmt: skip
    assert said and "OOMKilled" in said[0]


def test_attach_deletes_the_job_when_the_image_cannot_be_pulled():
    api = FakeApi([[pod("Pending", state=waiting("ImagePullBackOff", "Back-off pulling"))]])
    with pytest.raises(KubeError, match="cannot pull"):
        kube_run.attach_job(api, "ml", "gpuenv-x-1", 2, sleep=lambda s: None)
    assert api.deleted == ["gpuenv-x-1"]


@pytest.mark.parametrize("interrupt, code", [
    (KeyboardInterrupt(), 130), (kube_run.Interrupted(143), 143),
])  # fmt: skip
def test_ctrl_c_and_sigterm_delete_the_job_and_its_pods(interrupt, code):
    api = FakeApi([[pod("Running", state=RUNNING)]])

    def logs(*a, **kw):
        raise interrupt
        yield b""

    api.logs = logs
    assert kube_run.attach_job(api, "ml", "gpuenv-x-1", 0, sleep=lambda s: None) == code
    assert api.deleted == ["gpuenv-x-1"]


def test_a_finished_job_is_left_for_its_ttl():
    api = FakeApi([[pod("Succeeded", state=terminated(0, "Completed"))]])
    assert kube_run.attach_job(api, "ml", "j", 0, sleep=lambda s: None) == 0
    assert api.deleted == []


def test_gpu_count_for_kube():
    assert kube_run.parse_gpu_count(None) == 0
    assert kube_run.parse_gpu_count("2") == 2 and kube_run.parse_gpu_count("count=8") == 8
    for spec in ("all", "device=0,1", "0", "count=all"):
        with pytest.raises(KubeError, match="--gpus N"):
            kube_run.parse_gpu_count(spec)
