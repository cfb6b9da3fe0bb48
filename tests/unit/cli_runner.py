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
