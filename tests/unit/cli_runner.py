"""typer.testing.CliRunner, with the Click command built once per app.

typer's runner builds the Click command from the Typer app at every `invoke`: about 13 ms of
evaluating every verb's annotations, some 800 times in this suite. This one builds it once
(typer.main.get_command, public API; no test changes an app's commands) and invokes it as
typer's does."""

from __future__ import annotations

from functools import cache
from typing import Any

import click.testing
import typer.main


@cache
def _command(app: typer.Typer) -> click.Command:
    return typer.main.get_command(app)


class CliRunner(click.testing.CliRunner):
    def invoke(self, app: Any, args: Any = None, **kwargs: Any) -> click.testing.Result:  # type: ignore[override]
        return super().invoke(_command(app), args, **kwargs)


def invoke_as_entry_point(args: list[str], **kwargs: Any) -> click.testing.Result:
    """`python -m gpuenv ARGS`, in this process: argv normalised as gpuenv.cli.main does (the
    old spellings forwarded to their verbs, -it), then the app. A fresh interpreter per call
    cost 0.5-2 s of imports each (the kubernetes client alone 1.9 s); the tests of the
    entry point itself (test_cli_coercion, test_matrix_errors) still start one."""
    from gpuenv.cli import app
    from gpuenv.cli.argv import normalise_argv

    return CliRunner().invoke(app, normalise_argv(list(args)), **kwargs)
