"""`gpuenv run`: a script or command in a cell's image, as `docker run` would, plus the
GPU preflight. gpuenv's own failures exit 125/126/127, as docker run's do."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, user_errors


def run_cmd(
    command: Annotated[list[str], typer.Argument(help="SCRIPT.py [ARGS...] or CMD [ARGS...]")],
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
    interactive: Annotated[
        bool, typer.Option("--interactive", "-t", help="Interactive terminal (also: -it)")
    ] = False,
    file: FileOption = None,
) -> None:
    """Run a script or command in a cell's image, with the current directory mounted."""
    from gpuenv import engine, run
    from gpuenv.gpus import parse_gpus
    from gpuenv.project import looks_like_image, open_project

    with user_errors(exit_code=125):
        request = parse_gpus(gpus) if gpus is not None else None
        cwd = Path.cwd()
        # Every option is checked before the engine is reached (or a missing cell built).
        run.check_options(env or [], volume or [], publish or [], workdir, cwd)
        argv = run.command_for(command, cwd)
        if image is None or not looks_like_image(image):
            open_project(file)  # a bad matrix is an error before the engine is reached
        eng = engine.connect()
        target = run.target_for(eng, image, request is not None, file)
        run.gpu_preflight(eng, target, request)
        opts = run.RunOptions(
            image=target.image, command=argv, gpus=request, env=env or [],
            volumes=volume or [], ports=publish or [], network=network, workdir=workdir,
            ipc=ipc, interactive=interactive, cwd=cwd,
        )  # fmt: skip
        code = run.run(eng, opts)
    raise typer.Exit(code)


# Options of `run` that take a value: the word after them is not the command.
_VALUED = {"-i", "--image", "--gpus", "-e", "--env", "-v", "--volume", "-p", "--publish",
           "--network", "--workdir", "--ipc", "-f", "--file"}  # fmt: skip


def normalise_argv(args: list[str]) -> list[str]:
    """`-it` (docker's spelling) would parse as `-i t`, because -i takes the image."""
    args = list(args)
    if args[:1] == ["run"]:
        for i, arg in enumerate(args):
            if arg == "--" or (i > 0 and not arg.startswith("-") and args[i - 1] not in _VALUED):
                break
            if arg in ("-it", "-ti"):
                args[i] = "--interactive"
    return args


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(run_cmd)
