"""`gpuenv notebook [CELL]`: JupyterLab in a cell's environment, on loopback with a token;
`gpuenv devcontainer [CELL]`: .devcontainer/devcontainer.json for the cell."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, user_errors

Cell = Annotated[
    str | None,
    typer.Argument(help="Cell name (or glob matching one) [default: the default cell]",
                   show_default=False),
]  # fmt: skip


def notebook_cmd(
    cell: Cell = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="all, N, device=0,2 or device=GPU-<uuid>")
    ] = None,
    host_network: Annotated[
        bool,
        typer.Option(
            "--host-network",
            help="Serve on the host's network, bound to 127.0.0.1 "
            "[default: where the engine has no bridge network]",
        ),
    ] = False,
    port: Annotated[
        int | None, typer.Option("--port", help="Port on 127.0.0.1 [default: a free one]")
    ] = None,
    file: FileOption = None,
) -> None:
    """JupyterLab in a cell's environment (its Python and framework, from a thin layer of
    its own on the cell's image), the current directory as the notebook root, reachable
    from 127.0.0.1 with a token; Ctrl-C stops it."""
    from gpuenv.run import notebook

    with user_errors(exit_code=125):
        code = notebook.serve(cell, gpus, file, host_network=host_network, port=port)
    raise typer.Exit(code)


def devcontainer_cmd(
    cell: Cell = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="The default GPU cell")] = False,
    file: FileOption = None,
) -> None:
    """Write .devcontainer/devcontainer.json for a cell (VS Code, dev container clients):
    its image, its non-root user, the current directory as the workspace. Never overwrites."""
    from gpuenv.run import devcontainer

    with user_errors():
        path = devcontainer.write(cell, file, gpu)
    print(path)


def register(app: typer.Typer) -> None:
    app.command("notebook")(notebook_cmd)
    app.command("devcontainer")(devcontainer_cmd)
