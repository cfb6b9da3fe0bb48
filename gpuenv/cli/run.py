"""`gpuenv run`: a script or command in a cell's image on this engine, as `docker run` would,
plus the GPU preflight. gpuenv's own failures exit 125/126/127, as docker run's do.

Its front-ends for clusters own their options: `gpuenv kube run` (cli/kube.py) and
`gpuenv slurm run` (cli/slurm.py); `gpuenv run --kube/--slurm ...`, the spelling from before
they had their own verbs, reaches them (cli/argv.py:forwarded)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand

from gpuenv.cli.common import FileOption, user_errors
from gpuenv.cli.verbs import PlainValues

if TYPE_CHECKING:
    from gpuenv.gpu.monitor import MonitorOptions

# What every front-end of `run` shares: the command, its image and environment.
Command = Annotated[list[str] | None, typer.Argument(help="SCRIPT.py [ARGS...] or CMD [ARGS...]")]
ImageOption = Annotated[
    str | None,
    typer.Option("-i", "--image", help="Cell name (or glob matching one) or image reference"),
]
EnvOption = Annotated[list[str] | None, typer.Option("-e", "--env", help="KEY=VALUE")]
# The options come first, the command's own after it (`gpuenv run python -c ...`).
RUN_SETTINGS: dict[str, Any] = {"allow_interspersed_args": False}


def run_cmd(
    command: Command = None,
    image: ImageOption = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="all, N, device=0,2 or device=GPU-<uuid>")
    ] = None,
    env: EnvOption = None,
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
) -> None:
    """Run a script or command in a cell's image on this engine, with the current directory
    mounted (on a cluster: gpuenv kube run, gpuenv slurm run)."""
    from gpuenv.engine import client
    from gpuenv.gpu.gpus import parse_gpus
    from gpuenv.run import local, options, preflight, target

    with user_errors(exit_code=125):
        request = parse_gpus(gpus) if gpus is not None else None
        cwd = Path.cwd()
        # Every option is checked before the engine is reached (or a missing cell built).
        options.check_options(env or [], volume or [], publish or [], workdir, cwd)
        argv = options.command_for(command or [], cwd)
        project = target.project_for(image, file)
        with client.connect() as engine:
            chosen = target.choose(engine, image, project, "--gpus all", request is not None,
                                   request)  # fmt: skip
            preflight.gpu_preflight(engine, chosen, request)
            opts = local.RunOptions(
                image=chosen.image, command=argv, gpus=request, env=env or [],
                volumes=volume or [], ports=publish or [], network=network, workdir=workdir,
                ipc=ipc, interactive=interactive, cwd=cwd,
                monitor=_monitor_options(monitor, monitor_out),
                architecture=chosen.architecture,
            )  # fmt: skip
            code = local.run(engine, opts)
    raise typer.Exit(code)


def _monitor_options(monitor: str | None, out: Path | None) -> MonitorOptions | None:
    if monitor is None and out is None:
        return None  # the common case: no sampler, and monitor.py not even imported
    from gpuenv.gpu.monitor import MonitorOptions

    return MonitorOptions.parse(monitor, out)


class _RunCommand(PlainValues, TyperCommand):
    """run's command, its values coerced without pydantic where none is needed (verbs.py's
    plain_values: 60-85 ms of CPU of every `gpuenv run`, issue 48)."""


def register(app: typer.Typer) -> None:
    # An unknown option before the command is the command's error here (command_for).
    settings = {**RUN_SETTINGS, "ignore_unknown_options": True}
    app.command("run", cls=_RunCommand, context_settings=settings)(run_cmd)
