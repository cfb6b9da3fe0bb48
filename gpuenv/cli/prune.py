"""`gpuenv prune`: what gpuenv left behind on the engine and on a Slurm cluster's shared
directory, listed, and the stale part removed (gpuenv/run/leftovers.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuenv.cli.common import user_errors


def prune_cmd(
    shared: Annotated[
        str | None,
        typer.Option(
            "--shared",
            help="A Slurm cluster's shared directory, as slurm run takes it "
            "[default: $GPUENV_SLURM_SHARED, else none]",
            show_default=False,
        ),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Remove all of yours that nothing can be using")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List; remove nothing")] = False,
) -> None:
    """List what gpuenv left behind (working-directory volumes on this engine; job files and
    SquashFS images on a Slurm shared directory), yours only, and remove what is stale: a
    volume whose directory is gone, a job's files once it ended, a SquashFS of an image the
    engine no longer has."""
    import os

    from gpuenv.engine import client
    from gpuenv.run import leftovers
    from gpuenv.run.slurm.image import SHARED_ENV, shared_dir

    with user_errors():
        where = shared_dir(shared) if shared or os.environ.get(SHARED_ENV) else None
        with client.connect() as engine:
            lines = leftovers.prune(engine, where, everything=everything, dry_run=dry_run)
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_cmd)
