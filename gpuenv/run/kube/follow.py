"""Following a Job: what its pod is doing, in one line, until it ends with an exit code.

`observe()` is pure: it reads the Job, its newest pod and their events as the API returns
them (the client's model objects, or anything with the same attributes) and says what
state the run is in. `follow()` polls an injected API (client.KubeApi, or a fake in the unit
tests), prints each new Pending reason once, streams the logs and returns the container's
exit code.

The scheduler's messages explained here (Kubernetes source, pkg/scheduler):
- framework/types.go, FitError: "0/3 nodes are available: <count reason, ...>." followed
  (1.24+) by " preemption: 0/3 nodes are available: ...";
- plugins/noderesources/fit.go: "Insufficient nvidia.com/gpu" (any resource name);
- plugins/nodeaffinity: "node(s) didn't match Pod's node affinity/selector";
- plugins/tainttoleration: "node(s) had untolerated taint {key: value}" (before 1.25:
  "node(s) had taint {key: value}, that the pod didn't tolerate");
- plugins/volumebinding: "pod has unbound immediate PersistentVolumeClaims";
- plugins/nodeunschedulable: "node(s) were unschedulable".
The kubelet's waiting reasons ErrImagePull, ImagePullBackOff, InvalidImageName
(pkg/kubelet/images/types.go) and CreateContainerConfigError; a container killed by the
kernel's OOM killer ends with reason OOMKilled, exit code 137.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from gpuenv.run.kube import KubeError
from gpuenv.run.kube.manifest import CONTAINER, REQUIRES

PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_FAILURES = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")
DEADLINE_EXIT = 124  # as timeout(1): the Job ran past --timeout

_FIT = re.compile(r"0/(\d+) nodes are available: (.*?)\.?(?: preemption: .*)?$", re.DOTALL)
_REASON = re.compile(r"(\d+) (.+)")
_TAINT = re.compile(r"node\(s\) had (?:untolerated )?taint \{([^:}]+): ?([^}]*)\}")


@dataclass(frozen=True)
class State:
    kind: str  # waiting | pending | starting | running | succeeded | failed | error
    message: str = ""
    exit_code: int | None = None
    pod: str | None = None


def explain_unschedulable(message: str, gpus: int, requires: str) -> str:
    """The scheduler's FitError as one line a person can act on."""
    m = _FIT.match(message.strip())
    if not m:
        return message.strip()
    total = int(m.group(1))
    parts = []
    for item in re.split(r", (?=\d+ )", m.group(2)):
        r = _REASON.fullmatch(item.strip())
        count, reason = (int(r.group(1)), r.group(2)) if r else (total, item.strip())
        parts.append((count, _explain_reason(reason, gpus, requires)))
    parts.sort(key=lambda p: -p[0])
    return "; ".join(f"{text} ({count} of {total} nodes)" for count, text in parts)


def _explain_reason(reason: str, gpus: int, requires: str) -> str:
    if reason.startswith("Insufficient "):
        resource = reason.removeprefix("Insufficient ")
        if resource == "nvidia.com/gpu":
            return f"no node has {gpus or 1} free nvidia.com/gpu"
        return f"no node has enough free {resource}"
    if "didn't match Pod's node affinity/selector" in reason:
        if requires:
            return (
                f"no node matches: {requires} (GPU Feature Discovery labels; "
                "--no-node-affinity drops the rule)"
            )
        return "no node matches the pod's node selector"
    t = _TAINT.search(reason)
    if t:
        value = t.group(2).strip()
        return f"taint {t.group(1)}{'=' + value if value else ''} is not tolerated"
    if "unbound immediate PersistentVolumeClaims" in reason:
        return "a PersistentVolumeClaim is not bound (kubectl get pvc)"
    if "were unschedulable" in reason:
        return "the nodes are cordoned"
    return reason


def _newest(items: list[Any]) -> Any:
    def when(obj: Any) -> Any:
        ts = getattr(obj.metadata, "creation_timestamp", None)
        return (ts is not None, ts.timestamp() if ts else 0.0, obj.metadata.name or "")

    return max(items, key=when) if items else None


def _event_messages(events: list[Any], reason: str) -> list[str]:
    found = [e for e in events if getattr(e, "reason", None) == reason and e.message]
    found.sort(key=lambda e: _event_time(e))
    return [str(e.message) for e in found]


def _event_time(event: Any) -> float:
    for attr in ("last_timestamp", "event_time", "first_timestamp"):
        ts = getattr(event, attr, None)
        if ts is not None:
            return ts.timestamp()
    meta = getattr(event, "metadata", None)
    ts = getattr(meta, "creation_timestamp", None) if meta else None
    return ts.timestamp() if ts else 0.0


def _job_failed(job: Any) -> Any:
    for cond in (job.status and job.status.conditions) or []:
        if cond.type == "Failed" and cond.status == "True":
            return cond
    return None


def _registry(image: str) -> str:
    first = image.split("/", 1)[0]
    return (
        first
        if "/" in image and ("." in first or ":" in first or first == "localhost")
        else ("docker.io")
    )


def observe(job: Any, pods: list[Any], events: list[Any], gpus: int) -> State:
    """The run's state from the Job, its pods and the events about them (newest pod)."""
    annotations = (job.metadata.annotations or {}) if job.metadata else {}
    requires = annotations.get(REQUIRES, "")
    failed = _job_failed(job)
    pod = _newest(pods)
    if pod is None:
        if failed is not None:
            return State("failed", _job_failure(failed), _job_exit(failed))
        creates = _event_messages(events, "FailedCreate")
        if creates:
            return State("error", f"the Job cannot create its pod: {creates[-1]}")
        return State("waiting", "waiting for the Job controller to create the pod")
    name = pod.metadata.name
    status = pod.status
    container = next(
        (c for c in (status.container_statuses or []) if c.name == CONTAINER),
        None,
    )
    state = container.state if container else None
    if state is not None and state.terminated is not None:
        t = state.terminated
        code = int(t.exit_code)
        message = "" if t.reason in (None, "Completed", "Error") else str(t.reason)
        if t.reason == "OOMKilled":
            message = (
                "OOMKilled: the container ran out of memory (its limit, or the node's; "
                "/dev/shm counts too)"
            )
        if failed is not None and failed.reason == "DeadlineExceeded":
            return State("failed", _job_failure(failed), DEADLINE_EXIT, name)
        return State("succeeded" if code == 0 else "failed", message, code, name)
    if failed is not None:
        return State("failed", _job_failure(failed), _job_exit(failed), name)
    if status.phase == "Failed":  # evicted, or killed before the container ran
        why = status.message or status.reason or "the pod failed before its container ran"
        return State("failed", str(why), 125 if not status.reason else 137, name)
    if state is not None and state.waiting is not None:
        w = state.waiting
        if w.reason in PULL_FAILURES:
            image = container.image or ""
            return State(
                "error",
                f"the cluster cannot pull {image} from {_registry(image)} ({w.reason}: "
                f"{(w.message or '').strip()}); the nodes must reach that registry (--registry)"
                " and be allowed to pull from it (--pull-secret)",
                pod=name,
            )
        if w.reason in CONFIG_FAILURES:
            return State("error", f"the container cannot start ({w.reason}): {w.message}", pod=name)
    if state is not None and state.running is not None:
        return State("running", pod=name)
    for cond in status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            scheduling = _event_messages(events, "FailedScheduling")
            text = cond.message or (scheduling[-1] if scheduling else "")
            if text:
                return State("pending", explain_unschedulable(text, gpus, requires), pod=name)
            return State("pending", "waiting to be scheduled", pod=name)
    if status.phase == "Pending":
        pulling = [e for e in events if getattr(e, "reason", None) == "Pulling"]
        what = "pulling the image" if pulling else "starting the container"
        return State("starting", what, pod=name)
    return State("running", pod=name)


def _job_failure(cond: Any) -> str:
    if cond.reason == "DeadlineExceeded":
        return f"the Job ran past --timeout and was stopped ({cond.message or cond.reason})"
    return f"the Job failed: {cond.reason}: {cond.message or ''}".rstrip(": ")


def _job_exit(cond: Any) -> int:
    return DEADLINE_EXIT if cond.reason == "DeadlineExceeded" else 125


def follow(
    api: Any,
    namespace: str,
    name: str,
    *,
    gpus: int,
    out: BinaryIO,
    say: Callable[[str], None],
    poll: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Watch Job `name` until its container ends; stream its logs to `out`; return its exit
    code. A pod that cannot run (image pull, container config, the Job cannot create it)
    is a KubeError: the caller deletes the Job."""
    last = None
    streamed = None
    while True:
        job = api.read_job(namespace, name)
        pods = api.list_pods(namespace, name)
        pod = _newest(pods)
        events = api.list_events(namespace, pod.metadata.name if pod else name)
        state = observe(job, pods, events, gpus)
        if state.kind == "error":
            raise KubeError(state.message)
        if state.kind in ("pending", "starting", "waiting") and state.message != last:
            say(f"{name}: {state.kind}: {state.message}")
            last = state.message
        if state.pod and state.kind in ("running", "succeeded", "failed") and streamed != state.pod:
            streamed = state.pod
            for chunk in api.logs(namespace, state.pod, CONTAINER, follow=True):
                out.write(chunk)
                out.flush()
            continue  # the stream ends when the container does: look again at once
        if state.kind in ("succeeded", "failed"):
            if state.message:
                say(f"{name}: {state.message}")
            return state.exit_code if state.exit_code is not None else 125
        sleep(poll)
