"""`gpuenv monitor -- CMD`: run a command on this machine and sample its GPUs (NVML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import user_errors


def monitor_cmd(
    command: Annotated[list[str], typer.Argument(help="CMD [ARGS...] (after --)")],
    interval: Annotated[
        str, typer.Option("--interval", help="Seconds between samples (0.5, 2s, 250ms)")
    ] = "0.5",
    out: Annotated[Path | None, typer.Option("--out", help="Write every sample as CSV")] = None,
) -> None:
    """Run CMD here, sample every GPU while it runs, print a summary; exit with CMD's code."""
    from gpuenv.gpu import monitor

    with user_errors():
        opts = monitor.MonitorOptions.parse(interval, out)
        assert opts is not None
        code = monitor.monitor_command(command, opts)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command(
        "monitor",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(monitor_cmd)
