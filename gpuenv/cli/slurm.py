"""`gpuenv run --slurm`'s options and its one call into gpuenv/run/slurm/run.py (imported
inside, so `gpuenv --help` does not import it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuenv.cli.common import user_errors

_P = "Slurm (--slurm)"
SlurmFlag = Annotated[
    bool, typer.Option("--slurm", help="Run as a Slurm batch job", rich_help_panel=_P)
]
SlurmNodes = Annotated[
    int | None, typer.Option("--nodes", help="Nodes [default: 1]", rich_help_panel=_P)
]
SlurmGpusPerNode = Annotated[
    int | None,
    typer.Option("--gpus-per-node", help="GPUs per node [default: 0]", rich_help_panel=_P),
]
SlurmPartition = Annotated[
    str | None,
    typer.Option("--partition", help="Partition [default: the cluster's]", rich_help_panel=_P),
]
SlurmTime = Annotated[
    str | None,
    typer.Option(
        "--time",
        help="Time limit in Slurm's syntax: 30 (minutes), 1:30:00, 2-00:00:00, UNLIMITED "
        "[default: the partition's]",
        rich_help_panel=_P,
        show_default=False,
    ),
]
SlurmRuntime = Annotated[
    str | None,
    typer.Option(
        "--runtime",
        help="charliecloud, apptainer, pyxis or podman [default: charliecloud]",
        rich_help_panel=_P,
        show_default=False,
    ),
]
SlurmShared = Annotated[
    str | None,
    typer.Option(
        "--shared",
        help="Directory every node mounts at the same path: the image (a SquashFS per image "
        "ID) and the jobs' output go there [default: $GPUENV_SLURM_SHARED]",
        rich_help_panel=_P,
        show_default=False,
        metavar="DIR",
    ),
]


def slurm_flags_given(**values: Any) -> list[str]:
    """The --slurm options given (to refuse them elsewhere)."""
    return ["--" + key.replace("_", "-") for key, value in values.items() if value is not None]


def run_slurm(command: list[str], refused: dict[str, Any], *, file: Path | None,
              **kw: Any) -> int:  # fmt: skip
    """Refuse the options that mean nothing on a Slurm node, then submit (and follow);
    gpuenv's own failures are one `error:` line, exit 125."""
    from gpuenv.run.slurm import SlurmError
    from gpuenv.run.slurm import run as slurm

    with user_errors(exit_code=125):
        for flag, value in refused.items():
            if not value:
                continue
            if flag in ("--kube", "--attach", "--logs"):
                raise SlurmError(f"{flag} and --slurm: give one (--{flag[2:]} is for Kubernetes)")
            reason = slurm.REFUSED.get(flag, "it is an option of --kube")
            raise SlurmError(f"{flag} with --slurm: {reason}")
        opts = slurm.SlurmOptions(
            command=command,
            image=kw["image"],
            env=kw["env"],
            nodes=1 if kw["nodes"] is None else kw["nodes"],
            gpus_per_node=kw["gpus_per_node"] or 0,
            partition=kw["partition"],
            time=kw["time"],
            runtime=kw["runtime"] or slurm.DEFAULT_RUNTIME,
            shared=kw["shared"],
            detach=kw["detach"],
            dry_run=kw["dry_run"],
            file=file,
        )
        return slurm.submit(opts)
    return 125  # not reached: user_errors raises
