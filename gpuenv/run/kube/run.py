"""`gpuenv kube run`: options checked, images pushed, the Job created and followed.

Exit codes as local `gpuenv run`: the container's, 125 for gpuenv's own failures (no
cluster, refused by the API, a pull the cluster cannot make), 127 for a script that is not
there, 124 when the Job ran past --timeout, 130/143 after Ctrl-C/SIGTERM (which delete the
Job and its pods).
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.matrix import contract
from gpuenv.run.console import say
from gpuenv.run.interrupts import Interrupted, raising_interrupted
from gpuenv.run.kube import KubeError
from gpuenv.run.kube.manifest import (
    CONTAINER,
    GPU_RESOURCE,
    WORKSPACE,
    JobInputs,
    check_env,
    check_name,
    job_manifest,
    job_name,
    parse_pvc,
    parse_shm_size,
    parse_timeout,
    to_yaml,
)


@dataclass
class KubeOptions:
    command: list[str]
    image: str | None = None
    gpus: str | None = None
    env: list[str] = field(default_factory=list)
    workdir: str | None = None
    context: str | None = None
    namespace: str | None = None
    registry: str | None = None
    pvcs: list[str] = field(default_factory=list)
    timeout: str | None = None
    runtime_class: str | None = None
    shm_size: str | None = None
    pull_secrets: list[str] = field(default_factory=list)
    node_affinity: bool = True
    ship_code: bool = True
    detach: bool = False
    dry_run: bool = False
    file: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)


def parse_gpu_count(spec: str | None) -> int:
    """A pod asks for a number of GPUs: --gpus N (or count=N); which devices is the device
    plugin's choice."""
    if spec is None:
        return 0
    text = spec.strip().removeprefix("count=")
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise KubeError(
        f"--gpus {spec!r}: a pod asks for a number of GPUs, --gpus N (the device "
        "plugin picks which; 'all' and device= mean nothing on a cluster)"
    )


def submit(opts: KubeOptions) -> int:
    from gpuenv.engine import client as engine
    from gpuenv.registry.names import registry_from_env, registry_problem
    from gpuenv.run import options, target
    from gpuenv.run.kube import client, images

    if opts.detach and opts.dry_run:
        raise KubeError("--detach and --dry-run: give one")
    gpus = parse_gpu_count(opts.gpus)
    registry = opts.registry or registry_from_env()
    if not registry:
        raise KubeError(
            "kube run needs a registry the cluster can pull from: --registry "
            "HOST[:PORT][/NAMESPACE] or $GPUENV_REGISTRY"
        )
    if registry_problem(registry):
        raise KubeError(f"--registry {registry_problem(registry)}")
    argv = options.command_for(opts.command, opts.cwd)
    env = check_env(options.parse_env(opts.env))
    pvcs = tuple(parse_pvc(p) for p in opts.pvcs)
    deadline = parse_timeout(opts.timeout) if opts.timeout else None
    shm = parse_shm_size(opts.shm_size) if opts.shm_size else None
    for secret in opts.pull_secrets:
        check_name(secret, "--pull-secret")
    if opts.runtime_class:
        check_name(opts.runtime_class, "--runtime-class")
    if opts.namespace:
        check_name(opts.namespace, "--namespace")
    workdir = opts.workdir or WORKSPACE
    if not workdir.startswith("/"):
        raise KubeError(f"--workdir {workdir!r}: an absolute path inside the image")
    if opts.image is not None and any(c in opts.image for c in ":/@"):
        raise KubeError(
            f"-i {opts.image}: kube run runs cells (it pushes them through gpuenv push); give a "
            "cell name"
        )
    # The cluster first: no point pushing gigabytes to find out there is no cluster.
    api = None if opts.dry_run else client.connect(opts.context, opts.namespace)
    namespace = api.where.namespace if api else opts.namespace

    project = target.project_for(opts.image, opts.file)  # once: the target, then the push
    assert project is not None  # a cell name, never an image reference (checked above)
    eng = engine.connect()
    try:
        chosen = target.choose(eng, opts.image, project, "--gpus N", gpus > 0)
        assert chosen.cell is not None  # cells only (checked above)
        claims = contract.ImageLabels(chosen.labels)
        root = opts.cwd if opts.ship_code else None
        shipped = images.ship(eng, project, chosen.cell, registry, root, workdir, say)
    finally:
        eng.close()
    cell = chosen.cell
    inputs = JobInputs(
        cell=cell.name, spec_hash=claims.spec_hash or "", image=shipped.image,
        command=tuple(argv), cell_image=shipped.cell_ref, gpus=gpus, gpu_image=cell.is_gpu,
        framework=cell.framework, framework_version=cell.framework_version, cuda=cell.cuda,
        env=env, workdir=workdir, pvcs=pvcs, runtime_class=opts.runtime_class,
        deadline=deadline, shm_size=shm, namespace=namespace,
        pull_secrets=tuple(opts.pull_secrets), node_affinity=opts.node_affinity,
        arch=cell.arch,
    )  # fmt: skip
    if api is None:
        sys.stdout.write(to_yaml(job_manifest(inputs)))
        return 0
    assert namespace is not None
    body = job_manifest(inputs, suffix=secrets.token_hex(2))
    name = body["metadata"]["name"]
    api.create_job(namespace, body)
    say(f"created Job {name} in namespace {namespace} (context {api.where.context})")
    if opts.detach:
        print(name)
        return 0
    return attach_job(api, namespace, name, gpus)


def _job_gpus(job: Any) -> int:
    try:
        container = next(c for c in job.spec.template.spec.containers if c.name == CONTAINER)
        return int(
            ((container.resources and container.resources.limits) or {}).get(GPU_RESOURCE, 0)
        )
    except (StopIteration, AttributeError, ValueError, TypeError):
        return 0


def attach(context: str | None, namespace: str | None, name: str) -> int:
    """`gpuenv kube attach JOB`: follow a Job gpuenv created earlier (Ctrl-C deletes it, as
    in run)."""
    from gpuenv.run.kube import client

    api = client.connect(context, namespace)
    ns = api.where.namespace
    job = _read_gpuenv_job(api, ns, name)
    return attach_job(api, ns, name, _job_gpus(job))


def logs(context: str | None, namespace: str | None, name: str) -> int:
    """`gpuenv kube logs JOB`: print what the Job's pod wrote so far; exit with its code if it ended
    (0 while it still runs). Deletes nothing."""
    from gpuenv.run.kube import client
    from gpuenv.run.kube.follow import _newest, observe

    api = client.connect(context, namespace)
    ns = api.where.namespace
    job = _read_gpuenv_job(api, ns, name)
    pods = api.list_pods(ns, name)
    pod = _newest(pods)
    if pod is None:
        raise KubeError(f"Job {name} has no pod (yet, or any more: finished Jobs are removed)")
    out = sys.stdout.buffer
    for chunk in api.logs(ns, pod.metadata.name, CONTAINER, follow=False):
        out.write(chunk)
    out.flush()
    state = observe(job, pods, api.list_events(ns, pod.metadata.name), _job_gpus(job))
    if state.kind in ("succeeded", "failed") and state.exit_code is not None:
        return state.exit_code
    return 0


def _read_gpuenv_job(api: Any, namespace: str, name: str) -> Any:
    check_name(name, "Job")
    try:
        job = api.read_job(namespace, name)
    except KubeError as exc:
        if "(404)" in exc.message:
            raise KubeError(f"no Job {name} in namespace {namespace}") from None
        raise
    labels = (job.metadata and job.metadata.labels) or {}
    if labels.get("app.kubernetes.io/managed-by") != "gpuenv":
        raise KubeError(f"Job {name} in namespace {namespace} was not created by gpuenv")
    return job


def attach_job(
    api: Any, namespace: str, name: str, gpus: int, *, sleep: Callable[[float], None] | None = None
) -> int:
    """Follow the Job to its exit code. A pod that cannot run, Ctrl-C or SIGTERM delete the
    Job and its pods."""
    from gpuenv.run.kube.follow import follow

    kw: dict[str, Any] = {"sleep": sleep} if sleep else {}
    try:
        with raising_interrupted():
            return follow(api, namespace, name, gpus=gpus, out=sys.stdout.buffer, say=say, **kw)
    except KubeError:
        _delete(api, namespace, name)
        raise
    except (Interrupted, KeyboardInterrupt) as exc:
        _delete(api, namespace, name)
        return exc.code if isinstance(exc, Interrupted) else 130


def _delete(api: Any, namespace: str, name: str) -> None:
    with suppress(KubeError):
        api.delete_job(namespace, name)
        say(f"deleted Job {name} and its pods")


__all__ = ["KubeOptions", "attach", "job_name", "logs", "submit"]
