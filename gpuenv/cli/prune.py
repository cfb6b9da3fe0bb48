"""`gpuenv prune`: what gpuenv left behind on the engine and on a Slurm cluster's shared
directory (here, or over ssh with --login), listed, and the stale part removed
(gpuenv/run/leftovers.py)."""

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
            metavar="DIR",
        ),
    ] = None,
    login: Annotated[
        str | None,
        typer.Option(
            "--login",
            help="Read --shared DIR on the cluster through its login node over your ssh, as "
            "slurm run --login does [default: $GPUENV_SLURM_LOGIN]",
            show_default=False,
            metavar="[USER@]HOST[:PORT]",
        ),
    ] = None,
    everything: Annotated[
        bool, typer.Option("--all", help="Remove all of yours that nothing can be using")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List; remove nothing")] = False,
) -> None:
    """List what gpuenv left behind (working-directory volumes on this engine; job files,
    SquashFS images and --login job directories on a Slurm shared directory), yours only,
    and remove what is stale: a volume or job directory whose directory is gone, a job's
    files once it ended, a SquashFS of an image the engine no longer has."""
    import os

    from gpuenv.engine import client
    from gpuenv.run import leftovers
    from gpuenv.run.slurm import SlurmError
    from gpuenv.run.slurm.cluster_files import ClusterDir
    from gpuenv.run.slurm.image import SHARED_ENV, Shared, shared_dir
    from gpuenv.run.slurm.login import shared_there
    from gpuenv.run.slurm.ssh import login_for

    with user_errors():
        there = login_for(login)
        given = shared or os.environ.get(SHARED_ENV)
        if login and not given:
            raise SlurmError(f"prune --login reads the cluster's shared directory: give it, "
                             f"--shared DIR or ${SHARED_ENV}")  # fmt: skip
        where: Shared | ClusterDir | None = None
        if there and given:
            where = ClusterDir(there, shared_there(shared))
        elif given:
            where = shared_dir(shared)
        with client.connect() as engine:
            lines = leftovers.prune(engine, where, everything=everything, dry_run=dry_run)
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("prune")(prune_cmd)
