"""`gpuenv diff A B`: what differs between two environments; exit 1 when they differ."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, JsonOption, print_json, user_errors


def diff_cmd(
    a: Annotated[str, typer.Argument(help="Image reference or cell name")],
    b: Annotated[str, typer.Argument(help="Image reference or cell name")],
    file: FileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show what differs between two environments; exit 1 when they differ (like diff)."""
    from gpuenv.engine import client as engine
    from gpuenv.validate import diff

    with user_errors():
        refs = [_image_for(x, file) for x in (a, b)]
        with engine.connect() as docker:
            left, right, result = diff.diff_images(docker, *refs)
    if as_json:
        print_json({"a": left.ref, "b": right.ref, "identical": not result, **result})
    else:
        print(diff.render_text(left, right, result))
    raise typer.Exit(1 if result else 0)


def _image_for(name: str, file: Path | None) -> str:
    """A cell name (or glob matching one) becomes its image; anything else is an image."""
    from gpuenv.project.project import looks_like_image, matrix_file, open_project

    if looks_like_image(name) or not matrix_file(file).exists():
        return name
    return open_project(file).one_cell(name, "diff").image


def register(app: typer.Typer) -> None:
    app.command("diff")(diff_cmd)
