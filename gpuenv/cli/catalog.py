"""`gpuenv catalog`: what gpuenv knows of each framework's releases, and `--refresh`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuenv.cli.common import JsonOption, fail, print_json, print_table, say, user_errors


def catalog_cmd(
    framework: Annotated[
        str | None, typer.Argument(help="tensorflow, torch or jax (default: all three)")
    ] = None,
    as_json: JsonOption = False,
    refresh: Annotated[
        bool,
        typer.Option(
            "--refresh",
            help="Regenerate the catalog from the package index's metadata into your cache "
            "(read instead of the package's while newer) and show what changed",
        ),
    ] = False,
    into: Annotated[
        Path | None,
        typer.Option(
            "--into",
            help="With --refresh: rewrite the generated files in DIR instead (a checkout's "
            "gpuenv/data, as the catalog workflow does)",
            show_default=False,
        ),
    ] = None,
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
            changes, where = listing.refresh_catalog(into=into, record=record)
            if as_json:
                print_json({"changes": changes, "written": where})
            else:
                for line in changes or ["the catalog is up to date: nothing changed"]:
                    say(line)
                say(f"catalog written to {where}" if changes or into is None else f"{where}: kept")
            return
        if into is not None or record is not None:
            raise fail("--into and --record go with --refresh: gpuenv catalog --refresh --into DIR",
                       2)  # fmt: skip
        entries = listing.entries(framework)
        note, source = listing.stale_note(), listing.in_use()
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
    print(f"(the catalog: {source}; sources: `gpuenv catalog --json`; newer releases: "
          "`gpuenv catalog --refresh`)")  # fmt: skip
    if note:
        say(note)


def _pythons(pythons: list[str]) -> str:
    """3.10-3.14 when every minor between is there, else each one."""
    minors = [int(p.split(".")[1]) for p in pythons]
    if len(pythons) > 1 and minors == list(range(minors[0], minors[-1] + 1)):
        return f"{pythons[0]}-{pythons[-1]}"
    return ",".join(pythons)


def register(app: typer.Typer) -> None:
    app.command("catalog")(catalog_cmd)
