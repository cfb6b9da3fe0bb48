"""`gpuenv validate`: prove what images hold, and with --gpus that they see the devices."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpuenv.cli.common import FileOption, JsonOption, Patterns, fail, print_json, user_errors

HOST_ALONE = (
    "--host validates one environment: give no PATTERN, -i or --record-sizes with it "
    "(say what it must hold with --cell NAME)"
)
CELL_WITH_HOST = "--cell goes with --host; to validate a cell's image: gpuenv validate CELL"

if TYPE_CHECKING:
    from gpuenv.validate.session import Report


def validate_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    image: Annotated[
        list[str] | None, typer.Option("-i", "--image", help="Validate this image (repeatable)")
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="Also check the devices: all, N, device=...")
    ] = None,
    junitxml: Annotated[
        Path | None, typer.Option("--junitxml", help="Write JUnit XML results here")
    ] = None,
    record_sizes: Annotated[
        bool, typer.Option("--record-sizes", help="Record the images' sizes as the baseline")
    ] = False,
    host: Annotated[
        str | None,
        typer.Option(
            "--host",
            help="Validate a running environment through a testinfra backend instead: "
            "local://, ssh://USER@HOST, kubectl://POD?container=C&namespace=N, docker://ID",
        ),
    ] = None,
    cell: Annotated[
        str | None,
        typer.Option("--cell", help="With --host: the cell whose contents it must hold"),
    ] = None,
    as_json: JsonOption = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Show pytest's output")] = False,
) -> None:
    """Prove what images hold (pytest-testinfra suites against a container of each)."""
    from gpuenv.engine import client as engine
    from gpuenv.gpu.gpus import parse_gpus
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.validate import session

    with user_errors():
        try:
            request = parse_gpus(gpus) if gpus is not None else None
        except GpuenvError as exc:  # a usage error here, not `run`'s 125
            raise GpuenvError(exc.message, exit_code=2) from None
        if host is not None:
            if patterns or image or record_sizes:
                raise fail(HOST_ALONE, 2)
            report = session.validate_host(host, file, cell, request, junitxml, verbose)
        elif cell is not None:
            raise fail(CELL_WITH_HOST, 2)
        else:
            from gpuenv.project.project import open_project

            project = open_project(file) if patterns or not image else None
            cells = project.select(patterns) if project is not None else []
            with engine.connect() as docker:
                report = session.validate(
                    docker, project, cells, image or [], request, junitxml, verbose
                )
            if record_sizes:
                session.record_sizes(report)
    show(report, as_json, junitxml)


def show(report: Report, as_json: bool = False, junitxml: Path | None = None) -> None:
    """A validation's outcome, per image; a failed check exits 1."""
    if as_json:
        print_json({"images": [o.to_json() for o in report.outcomes]})
    else:
        for o in report.outcomes:
            s = o.summary
            mark = "✓" if o.passed else "✗"
            print(f"{mark} {s.id}: {s.passed} passed, {s.failed} failed, {s.skipped} skipped")
            if o.devices != "not a GPU image":
                print(f"    devices: {o.devices}")
            for line in s.failures:
                print(f"    FAILED {line}")
            for line in sorted(set(s.skips)):
                print(f"    skipped {line}")
        if junitxml:
            print(f"JUnit XML: {junitxml}")
        if report.sizes_recorded is not None:
            print(f"recorded {report.sizes_count} size(s) in {report.sizes_recorded}")
    if report.failed_checks:
        raise fail(f"{report.failed_checks} check(s) failed")


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)
