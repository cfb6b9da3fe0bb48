"""`gpuenv bench`: the shipped benchmark workloads in the selected cells, as the seed's table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import (
    FileOption,
    JsonOption,
    Patterns,
    print_json,
    print_table,
    say,
    user_errors,
)


def bench_cmd(
    patterns: Patterns = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="GPUs for the GPU cells' rows: all, N, device=0,2"),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", help="lstm, lstm-cudnn, cnn, matmul [default: all]"),
    ] = None,
    scale: Annotated[
        float,
        typer.Option("--scale", help="Fraction of each workload's dataset (0.1: a tenth)"),
    ] = 1.0,
    as_json: JsonOption = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="Also write the rows as CSV")] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also draw a chart (PNG; needs matplotlib)")
    ] = None,
    monitor: Annotated[
        str | None,
        typer.Option("--monitor", help="Sample the GPUs during GPU rows, every INTERVAL s"),
    ] = None,
    file: FileOption = None,
) -> None:
    """Measure the shipped workloads (default: the default CPU and GPU cells)."""
    from gpuenv.bench import benchmark as bench
    from gpuenv.engine import client as engine
    from gpuenv.gpu.gpus import parse_gpus
    from gpuenv.gpu.monitor import MonitorOptions
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.project.project import open_project

    with user_errors():
        if not 0 < scale <= 1:
            raise GpuenvError("--scale must be in (0, 1]", exit_code=2)
        opts = bench.BenchOptions(
            patterns=patterns, gpus=parse_gpus(gpus) if gpus else None,
            workloads=bench.select_workloads(workload), scale=scale,
            monitor=MonitorOptions.parse(monitor, None),
        )  # fmt: skip
        project = open_project(file)  # a wrong matrix is named before the engine is reached
        with engine.connect() as docker:
            rows = bench.bench(docker, project, opts, say)
        if csv is not None:
            bench.write_csv(rows, csv)
        if plot is not None:
            bench.plot(rows, plot)
    if as_json:
        print_json(bench.as_json(rows, scale))
    else:
        print_table(bench.table(rows))
        for line in bench.summary_lines(rows, scale):
            print(f"  {line}")
    if not any(r.ms_per_step for r in rows):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
