"""`gpuenv init`: a first, commented matrix.yaml for the project in a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import say, user_errors


def init_cmd(
    directory: Annotated[
        Path,
        typer.Argument(
            help="The project's directory [default: the current one]", show_default=False
        ),
    ] = Path(),
) -> None:
    """Write matrix.yaml for a project from its requirements.txt or pyproject.toml (never
    over an existing one); each choice is explained in a comment."""
    from gpuenv.project.init import init

    with user_errors():
        path = init(directory)
        print(path)
        from gpuenv.catalog.listing import stale_note

        if note := stale_note():
            say(note)


def register(app: typer.Typer) -> None:
    app.command("init")(init_cmd)
