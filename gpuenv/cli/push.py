"""`gpuenv push`: tag and push the cells' images and aliases; a result per tag."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpuenv.cli.common import (
    CaOption,
    FileOption,
    JsonOption,
    Patterns,
    fail,
    print_json,
    user_errors,
)


def push_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    registry: Annotated[
        str | None,
        typer.Option("--registry", help="Push to REG/<last part of name>:<tag> instead"),
    ] = None,
    aliases: Annotated[
        bool, typer.Option("--aliases/--no-aliases", help="Also push the matrix's aliases")
    ] = True,
    as_json: JsonOption = False,
    ca_bundle: CaOption = None,
) -> None:
    """Tag and push the cells' images (and their aliases); report the digest per tag."""
    from gpuenv import engine, publish
    from gpuenv.project import open_project
    from gpuenv.registry import registry_problem

    def progress(r: publish.TagResult) -> None:
        if not as_json:
            shown = r.digest if r.status == "pushed" else r.error
            print(f"{r.status:7} {r.ref}  {shown}", file=sys.stderr)

    with user_errors():
        if registry is not None and registry_problem(registry):
            raise fail(f"--registry {registry_problem(registry)}", 2)
        project = open_project(file)
        results = publish.push_cells(
            engine.connect(), project, project.select(patterns), registry=registry,
            aliases=aliases, ca_bundle=project.ca_bundle(ca_bundle),
            on_result=progress,
        )  # fmt: skip
    if as_json:
        print_json({"results": [r.to_json() for r in results]})
    else:
        for r in results:
            print(f"{r.ref}  {r.digest or '-'}  {r.status}" + (f": {r.error}" if r.error else ""))
    bad = [r for r in results if r.status != "pushed"]
    if bad:
        raise fail(f"{len(bad)} of {len(results)} tag(s) not pushed")


def register(app: typer.Typer) -> None:
    app.command("push")(push_cmd)
