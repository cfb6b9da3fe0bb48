"""`gpuenv base` and `gpuenv build`: the bases, then the cells' images."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpuenv.cli.common import (
    CaOption,
    FileOption,
    JsonOption,
    Patterns,
    fail,
    print_json,
    say,
    user_errors,
)

if TYPE_CHECKING:
    from gpuenv.matrix.cell import Cell
    from gpuenv.project.project import Project


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
    pull: Annotated[
        str | None,
        typer.Option(
            "--pull",
            metavar="REGISTRY/REPO",
            help="Pull the bases matrix.lock pins from the repository the cells were pushed "
            "to (gpuenv push puts them there), checked against the lock, then exit",
        ),
    ] = None,
    push: Annotated[
        str | None,
        typer.Option(
            "--push",
            metavar="REGISTRY/REPO",
            help="Push the bases matrix.lock pins into a repository (gpuenv push does, beside "
            "the cells), then exit",
        ),
    ] = None,
) -> None:
    """Make the local Debian base images the selected cells need (mmdebstrap).

    Debian's archive moves on, so keep the base a lock names: --save writes it to a
    tarball, --load brings it back into any engine; gpuenv push puts it beside the
    cells' images, and --pull brings it back from there."""
    from gpuenv.building import base
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project

    with user_errors():
        if load_tar is not None:
            with engine.connect() as docker:
                for line in docker.load(str(load_tar)):
                    print(line)
            return
        project = open_project(file)
        if pull is not None or push is not None:
            _pull_or_push(project, project.select(patterns), pull, push)
            return
        with engine.connect() as docker:
            for image, image_id, saved in base.ensure_all(
                docker, project.select(patterns), save, say
            ):
                print(f"{image}  {image_id[:19]}")
                if saved is not None:
                    print(f"saved {saved}")


def _pull_or_push(project: Project, cells: list[Cell], pull: str | None, push: str | None) -> None:
    """`gpuenv base --pull/--push REGISTRY/REPO`: the locked bases of `cells`, one line each."""
    from gpuenv.building.pull import pull_locked_base
    from gpuenv.engine import client as engine
    from gpuenv.publish.push import push_locked_bases
    from gpuenv.registry.names import registry_problem

    option, repository = ("--pull", pull) if pull is not None else ("--push", push)
    if pull is not None and push is not None:
        raise fail("--pull and --push: one at a time", 2)
    assert repository is not None
    if registry_problem(repository) or "/" not in repository:
        raise fail(f"{option} {repository!r}: expected REGISTRY/REPO, the repository the "
                   "cells are pushed to (say ghcr.io/acme/tensorflow)", 2)  # fmt: skip
    if project.lock is None:
        raise fail(f"{option}: {project.lock_path} does not exist; it moves the bases a "
                   "lock pins (gpuenv lock; or gpuenv base --save/--load a base)", 2)  # fmt: skip
    images = list(dict.fromkeys(c.base.image for c in cells))
    if pull is not None:
        with engine.connect() as docker:
            for image, image_id, where in (
                pull_locked_base(docker, project.lock, i, repository) for i in images
            ):
                print(f"{image}  {image_id[:19]}  {where}")
        return
    with engine.connect() as docker:
        results = push_locked_bases(docker, project.lock, images, repository)
    for r in results:
        print(f"{r.ref}  {r.digest or '-'}  {r.status} (base {r.cell})"
              + (f": {r.error}" if r.error else ""))  # fmt: skip
    if not results:
        raise fail(f"--push: {project.lock_path.name} pins none of the selected cells' bases "
                   "(re-lock: gpuenv lock)")  # fmt: skip
    if any(r.status not in ("pushed", "present") for r in results):
        raise fail(f"{sum(r.status not in ('pushed', 'present') for r in results)} of "
                   f"{len(results)} base(s) not pushed")  # fmt: skip


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
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            metavar="FILE",
            help="Write each image's layers, file by file, to FILE (.gz: gzipped), for "
            "--expect on another day or machine; implies --reproducible",
        ),
    ] = None,
    expect: Annotated[
        Path | None,
        typer.Option(
            "--expect",
            metavar="FILE",
            help="Fail unless each image recorded in FILE (--record) is rebuilt into that "
            "very image; names the first layer and the files that differ; implies "
            "--reproducible",
        ),
    ] = None,
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
    from gpuenv.building import builder, layerfiles, plan
    from gpuenv.engine import client as engine
    from gpuenv.matrix import vcs
    from gpuenv.project.project import open_project
    from gpuenv.publish.attest.verify import pull_source

    with user_errors():
        # Building fetches the git references the requirements name; --dry-run only reads.
        with contextlib.nullcontext() if dry_run else vcs.fetching():
            project = open_project(file, cached=True)  # a snapshot while nothing changed
        cells = project.select(patterns)
        expected = layerfiles.load_record(expect) if expect else None
        reproducible = reproducible or bool(record or expect)
        bundle = project.ca_bundle(ca_bundle)
        pull_from, vet = pull_source(project, offline, say)
        if dry_run:
            with engine.connect() as docker:
                the_plan = plan.make_plan(docker, project, cells, no_cache=no_cache,
                                          pull_from=pull_from, vet=vet)  # fmt: skip
            if as_json:
                print_json(the_plan.to_json())
            else:
                print("\n".join(plan.describe(the_plan)))
            return
        from gpuenv.building.progress import ConsoleReporter
        from gpuenv.building.results import summary

        with engine.connect() as docker:  # one engine for the build and what follows it
            reporter = ConsoleReporter()
            try:
                results = builder.plan_and_build(
                    docker, project, cells, reporter, ca_bundle=bundle, jobs=jobs,
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
            images = {c.name: c.image for c in cells}
            if record is not None:
                layerfiles.write_records(docker, images, record)
            if expected is not None and expect is not None:
                layerfiles.check_records(docker, expected, images, expect)
            if not validate:
                return
            from gpuenv.validate import session

            report = session.validate(docker, project, cells, [], None)
    from gpuenv.cli.validate import show

    show(report)


def register(app: typer.Typer) -> None:
    app.command("base")(base_cmd)
    app.command("build")(build_cmd)
