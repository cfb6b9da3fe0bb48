"""`gpuenv kube run|attach|logs`: `run`'s front-end for a Kubernetes cluster, with its own
options; gpuenv/run/kube/run.py (and the kubernetes client) are imported inside, so that
`gpuenv --help` imports neither."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, user_errors
from gpuenv.cli.run import RUN_SETTINGS, Command, EnvOption

kube_app = typer.Typer(
    help="Run on a Kubernetes cluster: a workload as a Job, and the Jobs gpuenv created.",
    no_args_is_help=True,
)

Context = Annotated[
    str | None, typer.Option("--context", help="kubeconfig context [default: current]")
]
Namespace = Annotated[
    str | None, typer.Option("--namespace", help="Namespace [default: the context's]")
]
Job = Annotated[str, typer.Argument(help="A Job gpuenv kube run created", metavar="JOB")]


@kube_app.command("run", context_settings=RUN_SETTINGS)
def run_cmd(
    command: Command = None,
    image: Annotated[
        str | None,
        typer.Option("-i", "--image", help="Cell name (or glob matching one): it is pushed"),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="N: GPUs for the pod (the device plugin picks)")
    ] = None,
    env: EnvOption = None,
    workdir: Annotated[
        str | None, typer.Option("--workdir", help="Working directory [default: /workspace]")
    ] = None,
    context: Context = None,
    namespace: Namespace = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            help="Registry the cluster pulls from: HOST, HOST:PORT or HOST/NAMESPACE "
            "[default: $GPUENV_REGISTRY]",
            show_default=False,
        ),
    ] = None,
    pvc: Annotated[
        list[str] | None,
        typer.Option("--pvc", help="Mount a PersistentVolumeClaim: CLAIM:/PATH[:ro]"),
    ] = None,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="activeDeadlineSeconds: 3600, 90m, 2h30m")
    ] = None,
    runtime_class: Annotated[
        str | None, typer.Option("--runtime-class", help="runtimeClassName, e.g. nvidia")
    ] = None,
    shm_size: Annotated[
        str | None,
        typer.Option(
            "--shm-size",
            help="/dev/shm size [default: 2Gi per GPU, at least 2Gi]",
            show_default=False,
        ),
    ] = None,
    pull_secret: Annotated[
        list[str] | None, typer.Option("--pull-secret", help="imagePullSecrets entry")
    ] = None,
    node_affinity: Annotated[
        bool,
        typer.Option(
            "--node-affinity/--no-node-affinity",
            help="Require GPU Feature Discovery labels that say the node can run the cell",
        ),
    ] = True,
    code: Annotated[
        bool, typer.Option("--code/--no-code", help="Ship the working directory as a code layer")
    ] = True,
    detach: Annotated[
        bool, typer.Option("--detach", help="Print the Job's name and return")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Push the images, print the Job as YAML, create nothing"),
    ] = False,
    file: FileOption = None,
) -> None:
    """Run a script or command in a cell's image as a Kubernetes Job, the working directory
    shipped as a layer of its own; follow it to its exit code (Ctrl-C deletes it)."""
    from gpuenv.run.kube import run as kube

    with user_errors(exit_code=125):
        exit_code = kube.submit(
            kube.KubeOptions(
                command=command or [], image=image, gpus=gpus, env=env or [], workdir=workdir,
                context=context, namespace=namespace, registry=registry, pvcs=pvc or [],
                timeout=timeout, runtime_class=runtime_class, shm_size=shm_size,
                pull_secrets=pull_secret or [], node_affinity=node_affinity, ship_code=code,
                detach=detach, dry_run=dry_run, file=file,
            )
        )  # fmt: skip
    raise typer.Exit(exit_code)


@kube_app.command("attach")
def attach_cmd(job: Job, context: Context = None, namespace: Namespace = None) -> None:
    """Follow a Job created earlier to its exit code (Ctrl-C deletes it, as in kube run)."""
    from gpuenv.run.kube import run as kube

    with user_errors(exit_code=125):
        code = kube.attach(context, namespace, job)
    raise typer.Exit(code)


@kube_app.command("logs")
def logs_cmd(job: Job, context: Context = None, namespace: Namespace = None) -> None:
    """Print what a Job's pod wrote so far; exit with its code if it ended (0 while it runs)."""
    from gpuenv.run.kube import run as kube

    with user_errors(exit_code=125):
        code = kube.logs(context, namespace, job)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(kube_app, name="kube")
