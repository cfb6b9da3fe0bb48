"""`gpuenv slurm run`: `run`'s front-end for a Slurm cluster, with its own options;
gpuenv/run/slurm/run.py is imported inside, so that `gpuenv --help` does not import it."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuenv.cli.common import FileOption, user_errors
from gpuenv.cli.run import RUN_SETTINGS, Command, EnvOption, ImageOption

slurm_app = typer.Typer(help="Run on a Slurm cluster: a workload as a batch job.",
                        no_args_is_help=True)  # fmt: skip


@slurm_app.command("run", context_settings=RUN_SETTINGS)
def run_cmd(
    command: Command = None,
    image: ImageOption = None,
    env: EnvOption = None,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes")] = 1,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", help="GPUs per node")] = 0,
    partition: Annotated[
        str | None, typer.Option("--partition", help="Partition [default: the cluster's]")
    ] = None,
    time: Annotated[
        str | None,
        typer.Option(
            "--time",
            help="Time limit in Slurm's syntax: 30 (minutes), 1:30:00, 2-00:00:00, UNLIMITED "
            "[default: the partition's]",
            show_default=False,
        ),
    ] = None,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="charliecloud, apptainer, pyxis or podman [default: charliecloud]",
            show_default=False,
        ),
    ] = None,
    shared: Annotated[
        str | None,
        typer.Option(
            "--shared",
            help="Directory every node mounts at the same path: the image (a SquashFS per "
            "image ID) and the jobs' output go there [default: $GPUENV_SLURM_SHARED]",
            show_default=False,
            metavar="DIR",
        ),
    ] = None,
    login: Annotated[
        str | None,
        typer.Option(
            "--login",
            help="The cluster's login node over your ssh: the image and the working directory "
            "are sent to --shared DIR there, what the job writes comes back "
            "[default: $GPUENV_SLURM_LOGIN; none: Slurm's commands on this machine]",
            show_default=False,
            metavar="[USER@]HOST[:PORT]",
        ),
    ] = None,
    from_registry: Annotated[
        str | None,
        typer.Option(
            "--from-registry",
            help="A published image, by digest, run without a Docker engine: verified with "
            "--key, then a SquashFS made from its layers (charliecloud) or pulled by the "
            "runtime (pyxis, apptainer, podman)",
            show_default=False,
            metavar="REGISTRY/REPO@sha256:DIGEST",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            help="The publisher's public key its attestations must verify with "
            "[default: $GPUENV_VERIFY_KEY]",
            show_default=False,
            metavar="PUB.pem",
        ),
    ] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Print the job ID and return")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the batch script, submit nothing")
    ] = False,
    file: FileOption = None,
) -> None:
    """Run a script or command in a cell's image as a Slurm batch job on every node, the
    working directory bound there; follow its output to its exit code (Ctrl-C cancels it)."""
    from gpuenv.run.slurm import login as over_ssh
    from gpuenv.run.slurm import published
    from gpuenv.run.slurm import run as slurm
    from gpuenv.run.slurm.ssh import login_for

    with user_errors(exit_code=125):
        opts = slurm.SlurmOptions(
            command=command or [], image=image, env=env or [], nodes=nodes,
            gpus_per_node=gpus_per_node, partition=partition, time=time,
            runtime=runtime or slurm.DEFAULT_RUNTIME,
            shared=shared, detach=detach, dry_run=dry_run, file=file, login=login,
        )  # fmt: skip
        if from_registry is not None:
            # Here, on the login node: no engine, the image verified and taken by digest.
            code = published.submit(opts, from_registry, key)
        elif key is not None:
            raise slurm.SlurmError("--key verifies a --from-registry image; give both")
        else:
            # Slurm's commands on this machine, or on a login node over ssh (--login).
            there = login_for(opts.login)
            code = over_ssh.submit(opts, there) if there else slurm.submit(opts)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")
