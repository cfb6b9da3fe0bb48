"""The Typer app, with every verb module registered."""

from __future__ import annotations

from gpuenv.cli import (
    attest,
    bench,
    build,
    cache,
    catalog,
    diff,
    doctor,
    init,
    kube,
    lock,
    matrix,
    monitor,
    notebook,
    prune,
    push,
    run,
    slurm,
    validate,
)
from gpuenv.cli.argv import click_app, normalise_argv
from gpuenv.cli.common import app

VERB_MODULES = (
    init, matrix, build, run, kube, slurm, notebook, bench, monitor, validate, lock, diff, push,
    attest, doctor, cache, catalog, prune,
)  # fmt: skip
for _verbs in VERB_MODULES:
    _verbs.register(app)


__all__ = ["VERB_MODULES", "app", "click_app", "normalise_argv"]
