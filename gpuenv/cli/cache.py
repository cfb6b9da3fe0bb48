"""`gpuenv cache`: the wheelhouse's size and entries; prune, export and import it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, JsonOption, print_json, say, user_errors

cache_app = typer.Typer(
    help="The wheelhouse: distributions builds installed, kept by sha256 on this host.",
    no_args_is_help=False,
    invoke_without_command=True,
)


@cache_app.callback()
def cache_cmd(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Show where the wheelhouse is, its size and entries (prune, export, import: below)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpuenv.building.results import human_size
    from gpuenv.store import wheelhouse

    with user_errors():
        info = wheelhouse.summary(wheelhouse.Store.default())
    if as_json:
        print_json({"path": str(info.root), "files": info.files, "bytes": info.size,
                    "pages": info.pages, "indexes": info.indexes})  # fmt: skip
        return
    print(f"wheelhouse  {info.root}")
    print(f"files       {info.files} ({human_size(info.size)})")
    print(f"pages       {info.pages}")
    for key, urls in info.indexes.items():
        print(f"index {key}  {' '.join(urls)}")


@cache_app.command("prune")
def prune_cmd(
    file: FileOption = None,
    keep_days: Annotated[
        float,
        typer.Option("--keep-days", min=0, help="Keep files a build used this recently"),
    ] = 30,
) -> None:
    """Drop the files no entry of the matrix's lock names and no build used recently, and
    the resolved matrices kept for matrices not used as long."""
    from gpuenv.building import context
    from gpuenv.building.results import human_size
    from gpuenv.project import snapshot
    from gpuenv.project.project import open_project
    from gpuenv.store import cache, wheelhouse

    with user_errors():
        project = open_project(file)
        lock = project.lock
        texts = [e.python_env + "\n" + e.cuda for e in lock.cells.values()] if lock else []
        store = wheelhouse.Store.default()
        files, size = wheelhouse.prune(store, texts, keep_days)
        contexts = context.prune(context.contexts_root(store.root))
        context.forget_requires(store)  # a small record: not worth a figure of its own
        # "noop-": the remembered no-op answers of gpuenv before issue 29, still in caches.
        records, _ = cache.prune_records((snapshot.PREFIX, "noop-"), keep_days)
    print(
        f"pruned {files} file(s), {human_size(size)}; {contexts} build context(s); "
        f"{records} cached answer(s)"
    )


@cache_app.command("export")
def export_cmd(
    target: Annotated[Path, typer.Argument(help="Tarball to write")],
    file: FileOption = None,
    no_bases: Annotated[bool, typer.Option("--no-bases", help="Leave the base images out")] = False,
) -> None:
    """Write the wheelhouse and the matrix's base images to one tarball (air-gapped sites)."""
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project
    from gpuenv.store import wheelhouse

    with user_errors():
        bases: list[str] = []
        if not no_bases:
            project = open_project(file)
            bases = sorted({c.base.image for c in project.cells})
        with contextlib.nullcontext() if no_bases else engine.connect() as docker:
            files, saved = wheelhouse.export(wheelhouse.Store.default(), target, docker, bases,
                                             say)  # fmt: skip
    print(f"{target}: {files} file(s), {saved} base image(s)")


@cache_app.command("import")
def import_cmd(
    source: Annotated[Path, typer.Argument(help="Tarball from gpuenv cache export")],
    file: FileOption = None,
    no_bases: Annotated[bool, typer.Option("--no-bases", help="Load no base image")] = False,
) -> None:
    """Add an export's files to the wheelhouse (each checked by its sha256) and load the
    bases the matrix's cells name (the locked ones, where matrix.lock records them)."""
    from gpuenv.engine import client as engine
    from gpuenv.project.project import open_project
    from gpuenv.store import wheelhouse

    with user_errors():
        if not source.is_file():
            from gpuenv.matrix.errors import GpuenvError

            raise GpuenvError(f"{source}: no such file")
        bases: dict[str, dict[str, object] | None] = {}
        if not no_bases:
            project = open_project(file)
            lock = project.lock
            bases = {c.base.image: lock.bases.get(c.base.image) if lock else None
                     for c in project.cells}  # fmt: skip
        with contextlib.nullcontext() if no_bases else engine.connect() as docker:
            files, loaded = wheelhouse.import_(wheelhouse.Store.default(), source, docker, say,
                                               bases)  # fmt: skip
    print(f"{source}: {files} new file(s), {loaded} base image(s) loaded")


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")
