"""`gpuenv catalog`: what gpuenv knows of each framework's releases, and `--refresh`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import JsonOption, print_json, print_table, say, user_errors


def catalog_cmd(
    framework: Annotated[
        str | None, typer.Argument(help="tensorflow, torch or jax (default: all three)")
    ] = None,
    as_json: JsonOption = False,
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh",
            help="Regenerate gpuenv/data/ from the package index's metadata and show what changed",
        ),
    ] = False,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            help="With --refresh: also write the pages and METADATA read to DIR (test fixtures)",
        ),
    ] = None,
) -> None:
    """List the framework releases gpuenv can make cells of (release, Pythons, CUDA, cuDNN,
    source, when refreshed)."""
    from gpuenv.catalog import listing

    with user_errors():
        if refresh:
            changes = listing.refresh_catalog(record=record)
            if as_json:
                print_json({"changes": changes})
            else:
                for line in changes or ["the catalog is up to date: nothing changed"]:
                    say(line)
            return
        entries = listing.entries(framework)
    if as_json:
        print_json({"releases": entries})
        return
    rows = [("FRAMEWORK", "RELEASE", "PYTHON", "CUDA", "CUDNN", "REFRESHED")]
    for e in entries:
        gpu = e["gpu"]
        pythons = e["python"]
        rows.append((
            e["framework"], e["version"], _pythons(pythons),
            gpu["cuda_release"] or gpu["cuda"] if gpu else "CPU only",
            gpu["cudnn_wheel"] or gpu["cudnn"] if gpu else "-", e["refreshed"] or "-",
        ))  # fmt: skip
    print_table(rows)
    print("(sources: `gpuenv catalog --json`; newer releases: `gpuenv catalog --refresh`)")


def _pythons(pythons: list[str]) -> str:
    """3.10-3.14 when every minor between is there, else each one."""
    minors = [int(p.split(".")[1]) for p in pythons]
    if len(pythons) > 1 and minors == list(range(minors[0], minors[-1] + 1)):
        return f"{pythons[0]}-{pythons[-1]}"
    return ",".join(pythons)


def register(app: typer.Typer) -> None:
    app.command("catalog")(catalog_cmd)
