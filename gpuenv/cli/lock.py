"""`gpuenv lock`: write, or --check, matrix.lock."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from gpuenv.cli.common import CaOption, FileOption, Patterns, fail, say, user_errors


def lock_cmd(
    patterns: Patterns = None,
    file: FileOption = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Exit 1 if the lock no longer matches the matrix, its bases or gpuenv's recipe",
        ),
    ] = False,
    exclude_newer: Annotated[
        str | None,
        typer.Option(
            "--exclude-newer",
            help="Resolve as of this date (YYYY-MM-DD) [default: the lock's, else today]",
            show_default=False,
        ),
    ] = None,
    ca_bundle: CaOption = None,
    pylock: Annotated[
        bool,
        typer.Option(
            "--pylock",
            help="Also write each cell's resolution as a PEP 751 pylock.<cell>.toml beside it",
        ),
    ] = False,
) -> None:
    """Write (or --check) matrix.lock: every cell's complete pip resolution, with hashes."""
    from gpuenv.building import lock as locks
    from gpuenv.engine import client as engine
    from gpuenv.matrix import vcs
    from gpuenv.project.project import open_project
    from gpuenv.store import credentials

    with user_errors():
        # Locking fetches the git references the requirements name; --check only reads.
        with contextlib.nullcontext() if check else vcs.fetching():
            project = open_project(file)
        cells = project.select(patterns)
        if check:
            from gpuenv.building.recipe import lock_note

            with engine.connect() as docker:
                drifted = locks.check(docker, project.lock, project.lock_path, cells)
            for name, why in drifted.items():
                print(f"drift: {name}: {why}")
            # Another recipe fails the check too: re-locking would change the file (its
            # recipe entry), and images built from it would not match those built before.
            note = lock_note(project.lock) if project.lock else None
            if drifted:
                if note:
                    print(f"recipe: {note}")
                path = project.lock_path
                raise fail(f"{path}: {len(drifted)} cell(s) drifted; re-lock: gpuenv lock")
            if note:
                raise fail(note)
            print(f"{project.lock_path}: {len(cells)} cell(s) match the matrix")
            return
        if exclude_newer is not None:
            locks.exclude_newer_date(exclude_newer, None)  # a bad date is a usage error, first
        # What a build's resolution uses: the same CA bundle and credentials.
        bundle, creds = project.ca_bundle(ca_bundle), credentials.load()
        from gpuenv.building.sendable import sources_for

        with engine.connect() as client:
            path = locks.relock(
                client, project.matrix, cells, every_cell=project.cells,
                current=project.lock, exclude_newer=exclude_newer, say=say,
                credentials=creds, ca_bundle=bundle, pylock=pylock,
                sources_for=sources_for(client, project.settings, bundle, creds, say,
                                        project.path),
            )  # fmt: skip
        print(path)
        from gpuenv.catalog.listing import stale_note

        if note := stale_note():
            say(note)


def register(app: typer.Typer) -> None:
    app.command("lock")(lock_cmd)
