"""`gpuenv base` and `gpuenv build`: the bases, then the cells' images."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import (
    CaOption,
    FileOption,
    JsonOption,
    Patterns,
    print_json,
    say,
    user_errors,
)


def base_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    save: Annotated[
        Path | None, typer.Option("--save", help="Also save each base as DIR/<name>.tar")
    ] = None,
    load_tar: Annotated[
        Path | None,
        typer.Option("--load", help="Load a saved base tarball into the engine, then exit"),
    ] = None,
) -> None:
    """Make the local Debian base images the selected cells need (mmdebstrap).

    Debian's archive moves on, so keep the base a lock names: --save writes it to a
    tarball, --load brings it back into any engine."""
    from gpuenv.building import base
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project

    with user_errors():
        if load_tar is not None:
            for line in engine.connect().load(str(load_tar)):
                print(line)
            return
        project = open_project(file)
        for image, image_id, saved in base.ensure_all(
            engine.connect(), project.select(patterns), save, say
        ):
            print(f"{image}  {image_id[:19]}")
            if saved is not None:
                print(f"saved {saved}")


def build_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    jobs: Annotated[
        int, typer.Option("-j", "--jobs", min=1, max=64, help="Cells built at once")
    ] = 1,
    keep_going: Annotated[
        bool, typer.Option("--keep-going", help="Build the other cells when one fails")
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Rebuild even up-to-date cells, without the cache")
    ] = False,
    validate: Annotated[
        bool, typer.Option("--validate", help="Validate the images after building")
    ] = False,
    reproducible: Annotated[
        bool,
        typer.Option(
            "--reproducible",
            help="Normalise the built images (timestamps, build traces) so that the same "
            "inputs give the same image ID",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print what would be built, pulled or left, and why; build nothing"
        ),
    ] = False,
    as_json: JsonOption = False,
    ca_bundle: CaOption = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="Build locked cells from the wheelhouse and the bases in the engine alone; "
            "never reach a package index",
        ),
    ] = False,
) -> None:
    """Build the selected cells (all by default) into labelled images."""
    from gpuenv.building import builder, plan
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project
    from gpuenv.publish.attest.verify import pull_source

    with user_errors():
        project = open_project(file, cached=True)  # a snapshot while nothing changed
        cells = project.select(patterns)
        bundle = project.ca_bundle(ca_bundle)
        pull_from, vet = pull_source(project, offline, say)
        if dry_run:
            the_plan = plan.make_plan(engine.connect(), project, cells, no_cache=no_cache,
                                      pull_from=pull_from, vet=vet)  # fmt: skip
            if as_json:
                print_json(the_plan.to_json())
            else:
                print("\n".join(plan.describe(the_plan)))
            return
        from gpuenv.building.progress import ConsoleReporter
        from gpuenv.building.results import summary

        reporter = ConsoleReporter()
        try:
            results = builder.plan_and_build(
                engine.connect(), project, cells, reporter, ca_bundle=bundle, jobs=jobs,
                keep_going=keep_going, no_cache=no_cache, reproducible=reproducible,
                offline=offline, pull_from=pull_from, vet=vet,
            )  # fmt: skip
        finally:
            reporter.close()
        if as_json:
            print_json({"results": [r.to_json() for r in results]})
        else:
            summary(results)
        builder.ensure_no_failures(results)
        if not validate:
            return
        from gpuenv.validate import session

        report = session.validate(engine.connect(), project, cells, [], None)
    from gpuenv.cli.validate import show

    show(report)


def register(app: typer.Typer) -> None:
    app.command("base")(base_cmd)
    app.command("build")(build_cmd)
