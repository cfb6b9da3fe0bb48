"""`gpuenv run`: a script or command in a cell's image, as `docker run` would, plus the
GPU preflight. gpuenv's own failures exit 125/126/127, as docker run's do."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpuenv.cli.common import FileOption, user_errors

if TYPE_CHECKING:
    from gpuenv.gpu.monitor import MonitorOptions
from gpuenv.cli.kube import (
    KubeAttach,
    KubeCode,
    KubeContext,
    KubeDetach,
    KubeDryRun,
    KubeFlag,
    KubeLogs,
    KubeNamespace,
    KubeNodeAffinity,
    KubePullSecret,
    KubePvc,
    KubeRegistry,
    KubeRuntimeClass,
    KubeShmSize,
    KubeTimeout,
)
from gpuenv.cli.slurm import (
    SlurmFlag,
    SlurmGpusPerNode,
    SlurmNodes,
    SlurmPartition,
    SlurmRuntime,
    SlurmShared,
    SlurmTime,
)


def run_cmd(
    command: Annotated[
        list[str] | None, typer.Argument(help="SCRIPT.py [ARGS...] or CMD [ARGS...]")
    ] = None,
    image: Annotated[
        str | None,
        typer.Option("-i", "--image", help="Cell name (or glob matching one) or image reference"),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="all, N, device=0,2 or device=GPU-<uuid>")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("-e", "--env", help="KEY=VALUE")] = None,
    volume: Annotated[list[str] | None, typer.Option("-v", "--volume", help="SRC:DST[:ro]")] = None,
    publish: Annotated[
        list[str] | None, typer.Option("-p", "--publish", help="[IP:]HOST:CONTAINER")
    ] = None,
    network: Annotated[
        str | None, typer.Option("--network", help="Network mode [default: the engine's]")
    ] = None,
    workdir: Annotated[str | None, typer.Option("--workdir", help="Working directory")] = None,
    ipc: Annotated[str | None, typer.Option("--ipc", help="IPC mode, e.g. host")] = None,
    monitor: Annotated[
        str | None,
        typer.Option(
            "--monitor",
            help="Sample the container's GPUs every INTERVAL s (--monitor alone: 0.5 s; "
            "--monitor=2) and print a summary at exit",
            metavar="[=INTERVAL]",
        ),
    ] = None,
    monitor_out: Annotated[
        Path | None, typer.Option("--monitor-out", help="Write the samples as CSV")
    ] = None,
    interactive: Annotated[
        bool, typer.Option("--interactive", "-t", help="Interactive terminal (also: -it)")
    ] = False,
    file: FileOption = None,
    kube: KubeFlag = False,
    context: KubeContext = None,
    namespace: KubeNamespace = None,
    registry: KubeRegistry = None,
    pvc: KubePvc = None,
    timeout: KubeTimeout = None,
    runtime_class: KubeRuntimeClass = None,
    shm_size: KubeShmSize = None,
    pull_secret: KubePullSecret = None,
    node_affinity: KubeNodeAffinity = True,
    code: KubeCode = True,
    detach: KubeDetach = False,
    dry_run: KubeDryRun = False,
    attach: KubeAttach = None,
    logs: KubeLogs = None,
    slurm: SlurmFlag = False,
    nodes: SlurmNodes = None,
    gpus_per_node: SlurmGpusPerNode = None,
    partition: SlurmPartition = None,
    time: SlurmTime = None,
    runtime: SlurmRuntime = None,
    shared: SlurmShared = None,
) -> None:
    """Run a script or command in a cell's image, with the current directory mounted;
    --kube runs it as a Kubernetes Job instead, --slurm as a Slurm batch job."""
    from gpuenv.cli.kube import kube_flags_given, run_kube
    from gpuenv.cli.slurm import run_slurm, slurm_flags_given

    local = {"-v/--volume": volume, "-p/--publish": publish, "--network": network,
             "--ipc": ipc, "--interactive/-it": interactive, "--monitor": monitor,
             "--monitor-out": monitor_out}  # fmt: skip
    kube_given = kube_flags_given(
        context=context, namespace=namespace, registry=registry, pvc=pvc, timeout=timeout,
        runtime_class=runtime_class, shm_size=shm_size, pull_secret=pull_secret,
        node_affinity=node_affinity, code=code, detach=detach, dry_run=dry_run,
        attach=attach, logs=logs,
    )  # fmt: skip
    slurm_given = slurm_flags_given(
        nodes=nodes, gpus_per_node=gpus_per_node, partition=partition, time=time,
        runtime=runtime, shared=shared,
    )  # fmt: skip
    if slurm:
        # --detach and --dry-run are both paths' own; the rest of --kube's are refused.
        kube_only = [f for f in kube_given if f not in ("--detach", "--dry-run")]
        if kube or attach or logs:
            kube_only.insert(0, "--kube" if kube else "--attach" if attach else "--logs")
        refused = {**local, "--gpus": gpus, "--workdir": workdir, **dict.fromkeys(kube_only, True)}
        code_ = run_slurm(
            command or [], refused, image=image, env=env or [], nodes=nodes,
            gpus_per_node=gpus_per_node, partition=partition, time=time, runtime=runtime,
            shared=shared, detach=detach, dry_run=dry_run, file=file,
        )  # fmt: skip
        raise typer.Exit(code_)
    if slurm_given:
        from gpuenv.matrix.errors import GpuenvError

        with user_errors(exit_code=125):
            raise GpuenvError(f"{', '.join(slurm_given)}: only with --slurm")
    if kube or attach or logs:
        code_ = run_kube(
            command or [], local, image=image, gpus=gpus, env=env or [], workdir=workdir,
            context=context, namespace=namespace, registry=registry, pvc=pvc or [],
            timeout=timeout, runtime_class=runtime_class, shm_size=shm_size,
            pull_secret=pull_secret or [], node_affinity=node_affinity, code=code,
            detach=detach, dry_run=dry_run, attach=attach, logs=logs, file=file,
        )  # fmt: skip
        raise typer.Exit(code_)
    run_local(command or [], image, gpus, env, volume, publish, network, workdir, ipc,
              interactive, file, kube_given, monitor, monitor_out)  # fmt: skip


def run_local(
    command: list[str], image: str | None, gpus: str | None, env: list[str] | None,
    volume: list[str] | None, publish: list[str] | None, network: str | None,
    workdir: str | None, ipc: str | None, interactive: bool, file: Path | None,
    kube_given: list[str], monitor: str | None, monitor_out: Path | None,
) -> None:  # fmt: skip
    from gpuenv.engine import client as engine
    from gpuenv.gpu.gpus import parse_gpus
    from gpuenv.project.project import looks_like_image, open_project
    from gpuenv.run import local as run

    with user_errors(exit_code=125):
        if kube_given:
            from gpuenv.matrix.errors import GpuenvError

            raise GpuenvError(f"{', '.join(kube_given)}: only with --kube")
        request = parse_gpus(gpus) if gpus is not None else None
        cwd = Path.cwd()
        # Every option is checked before the engine is reached (or a missing cell built).
        run.check_options(env or [], volume or [], publish or [], workdir, cwd)
        argv = run.command_for(command, cwd)
        project = None
        if image is None or not looks_like_image(image):
            # A bad matrix is an error before the engine is reached; an unchanged one comes
            # from its snapshot (gpuenv/project/snapshot.py), without the schema or the catalog.
            project = open_project(file, cached=True)
        eng = engine.connect()
        target = run.target_for(eng, image, request is not None, file, project, request)
        run.gpu_preflight(eng, target, request)
        opts = run.RunOptions(
            image=target.image, command=argv, gpus=request, env=env or [],
            volumes=volume or [], ports=publish or [], network=network, workdir=workdir,
            ipc=ipc, interactive=interactive, cwd=cwd,
            monitor=_monitor_options(monitor, monitor_out),
        )  # fmt: skip
        code = run.run(eng, opts)
    raise typer.Exit(code)


def _monitor_options(monitor: str | None, out: Path | None) -> MonitorOptions | None:
    if monitor is None and out is None:
        return None  # the common case: no sampler, and monitor.py not even imported
    from gpuenv.gpu.monitor import MonitorOptions

    return MonitorOptions.parse(monitor, out)


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(run_cmd)
