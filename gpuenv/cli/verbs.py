"""The Typer app: every verb module registered, and the app one invocation needs."""

from __future__ import annotations

import typer

from gpuenv.cli import (
    attest,
    bench,
    build,
    cache,
    catalog,
    diff,
    doctor,
    lock,
    matrix,
    monitor,
    push,
    run,
    validate,
)
from gpuenv.cli.common import app, new_app, normalise_argv

VERB_MODULES = (
    matrix, build, run, bench, monitor, validate, lock, diff, push, attest, doctor, cache,
    catalog,
)  # fmt: skip
for _verbs in VERB_MODULES:
    _verbs.register(app)


def app_for(argv: list[str]) -> typer.Typer:
    """An app with only the verb's own module registered when argv names one (Typer turns
    every registered command into a Click command on each call: ~20 ms for all of them);
    the whole app for `--help`, no verb or an unknown one (its error lists them all)."""
    verb = argv[0] if argv and not argv[0].startswith("-") else None
    if verb is None:
        return app
    for module in VERB_MODULES:
        one = new_app()
        # A callback keeps it a group: Typer would run a lone command directly, reading
        # the verb itself as the command's first argument.
        one.callback()(_group)
        module.register(one)
        if any(c.name == verb for c in one.registered_commands):
            return one
    return app


def _group() -> None:
    pass


__all__ = ["VERB_MODULES", "app", "app_for", "normalise_argv"]
