"""`gpuenv run --kube`'s options and its one call into gpuenv/run/kube/run.py (imported inside,
so `gpuenv --help` imports neither it nor the kubernetes client)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuenv.cli.common import user_errors

_P = "Kubernetes (--kube)"
KubeFlag = Annotated[
    bool, typer.Option("--kube", help="Run as a Kubernetes Job", rich_help_panel=_P)
]
KubeContext = Annotated[
    str | None,
    typer.Option("--context", help="kubeconfig context [default: current]", rich_help_panel=_P),
]
KubeNamespace = Annotated[
    str | None,
    typer.Option("--namespace", help="Namespace [default: the context's]", rich_help_panel=_P),
]
KubeRegistry = Annotated[
    str | None,
    typer.Option(
        "--registry",
        help="Registry the cluster pulls from: HOST, HOST:PORT or HOST/NAMESPACE "
        "[default: $GPUENV_REGISTRY]",
        rich_help_panel=_P,
        show_default=False,
    ),
]
KubePvc = Annotated[
    list[str] | None,
    typer.Option(
        "--pvc", help="Mount a PersistentVolumeClaim: CLAIM:/PATH[:ro]", rich_help_panel=_P
    ),
]
KubeTimeout = Annotated[
    str | None,
    typer.Option("--timeout", help="activeDeadlineSeconds: 3600, 90m, 2h30m", rich_help_panel=_P),
]
KubeRuntimeClass = Annotated[
    str | None,
    typer.Option("--runtime-class", help="runtimeClassName, e.g. nvidia", rich_help_panel=_P),
]
KubeShmSize = Annotated[
    str | None,
    typer.Option(
        "--shm-size",
        help="/dev/shm size [default: 2Gi per GPU, at least 2Gi]",
        rich_help_panel=_P,
        show_default=False,
    ),
]
KubePullSecret = Annotated[
    list[str] | None,
    typer.Option("--pull-secret", help="imagePullSecrets entry", rich_help_panel=_P),
]
KubeNodeAffinity = Annotated[
    bool,
    typer.Option(
        "--node-affinity/--no-node-affinity",
        help="Require GPU Feature Discovery labels that say the node can run the cell",
        rich_help_panel=_P,
    ),
]
KubeCode = Annotated[
    bool,
    typer.Option(
        "--code/--no-code", help="Ship the working directory as a code layer", rich_help_panel=_P
    ),
]
KubeDetach = Annotated[
    bool,
    typer.Option(
        "--detach",
        help="Print the Job's name (--slurm: the job ID) and return",
        rich_help_panel=_P,
    ),
]
KubeDryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Push the images, print the Job as YAML, create nothing (--slurm: print the "
        "batch script, submit nothing)",
        rich_help_panel=_P,
    ),
]
KubeAttach = Annotated[
    str | None,
    typer.Option(
        "--attach", help="Follow Job JOB created earlier", metavar="JOB", rich_help_panel=_P
    ),
]
KubeLogs = Annotated[
    str | None,
    typer.Option("--logs", help="Print Job JOB's logs so far", metavar="JOB", rich_help_panel=_P),
]


def kube_flags_given(**values: Any) -> list[str]:
    """The --kube options given (to refuse them on a local run)."""
    defaults = {"node_affinity": True, "code": True}
    given = []
    for key, value in values.items():
        if value != defaults.get(key) and value not in ([], False):
            flag = {"node_affinity": "--no-node-affinity", "code": "--no-code"}.get(
                key, "--" + key.replace("_", "-")
            )
            given.append(flag)
    return given


def run_kube(command: list[str], local: dict[str, Any], *, file: Path | None, **kw: Any) -> int:
    """Refuse the local options that mean nothing on a cluster, then submit, attach or show
    logs; gpuenv's own failures are one `error:` line, exit 125."""
    from gpuenv.run.kube import KubeError
    from gpuenv.run.kube import run as kube

    with user_errors(exit_code=125):
        for flag, value in local.items():
            if value:
                raise KubeError(f"{flag} with --kube: {kube.REFUSED[flag]}")
        if kw["attach"] and kw["logs"]:
            raise KubeError("--attach and --logs: give one")
        for which in ("attach", "logs"):
            if kw[which] and command:
                raise KubeError(f"--{which} JOB takes no command")
        if kw["attach"]:
            return kube.attach(kw["context"], kw["namespace"], kw["attach"])
        if kw["logs"]:
            return kube.logs(kw["context"], kw["namespace"], kw["logs"])
        if kw["detach"] and kw["dry_run"]:
            raise KubeError("--detach and --dry-run: give one")
        opts = kube.KubeOptions(
            command=command,
            image=kw["image"],
            gpus=kw["gpus"],
            env=kw["env"],
            workdir=kw["workdir"],
            context=kw["context"],
            namespace=kw["namespace"],
            registry=kw["registry"],
            pvcs=kw["pvc"],
            timeout=kw["timeout"],
            runtime_class=kw["runtime_class"],
            shm_size=kw["shm_size"],
            pull_secrets=kw["pull_secret"],
            node_affinity=kw["node_affinity"],
            ship_code=kw["code"],
            detach=kw["detach"],
            dry_run=kw["dry_run"],
            file=file,
        )
        return kube.submit(opts)
    return 125  # not reached: user_errors raises
