"""`gpuenv matrix` and `gpuenv render`: the resolved cells, and their build contexts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import (
    FileOption,
    JsonOption,
    Patterns,
    fail,
    print_json,
    print_table,
    say,
    user_errors,
)


def matrix_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    as_json: JsonOption = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list rejected combinations, with the reason")
    ] = False,
) -> None:
    """List the matrix's resolved cells."""
    from gpuenv.project.project import open_project

    with user_errors():
        project = open_project(file)
        cells = project.select(patterns)
    res = project.resolution
    defaults = (res.default_cpu, res.default_gpu)
    if as_json:
        print_json({
            "cells": [c.to_json() for c in cells],
            "rejected": res.rejected,
            "defaults": {"cpu": res.default_cpu.name if res.default_cpu else None,
                         "gpu": res.default_gpu.name if res.default_gpu else None},
        })  # fmt: skip
        return
    rows = [("CELL", "IMAGE", "PYTHON", "FRAMEWORK", "CUDA", "CUDNN", "BASE")]
    for c in cells:
        rows.append((
            c.name + (" *" if c in defaults else ""), c.image, c.python,
            f"{c.framework} {c.framework_version}", c.cuda_release or "-", c.cudnn_wheel or "-",
            c.base.describe(),
        ))  # fmt: skip
    print_table(rows)
    print("(* default cells used by `gpuenv run`)")
    if show_all and res.rejected:
        print("\nrejected:")
        for entry in res.rejected:
            values = ", ".join(f"{k} {v}" for k, v in entry.items() if k != "reason")
            print(f"  {values}: {entry['reason']}")
    elif res.rejected:
        print(f"({len(res.rejected)} combination(s) rejected; `gpuenv matrix --all` says why)")
    from gpuenv.catalog.listing import stale_note

    if note := stale_note():
        say(note)


def render_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Directory for the build contexts")
    ] = Path("build"),
) -> None:
    """Write each cell's build context (Dockerfile + cell.json) to OUTPUT/<cell>/."""
    from gpuenv.building import plan
    from gpuenv.project.project import open_project

    with user_errors():
        project = open_project(file)
        cells = project.select(patterns)
        prepared = plan.prepare(project, cells)  # all rendered before any write
        for p in prepared.values():
            try:
                target = p.context.write(output)
            except OSError as exc:
                raise fail(f"{output}: cannot write: {exc.strerror}") from None
            print(target)


def register(app: typer.Typer) -> None:
    app.command("matrix")(matrix_cmd)
    app.command("render")(render_cmd)
