"""The `gpuenv` command line: one small module per verb (or group of verbs).

Each verb parses its options, calls one domain function, and prints. Heavy modules
(docker, jinja2, pydantic via the matrix, rich) are imported inside the verbs, so that
`gpuenv --help` and the parsing of every verb stay fast.
"""

from __future__ import annotations

import sys

from gpuenv.cli import (
    bench,
    build,
    cache,
    diff,
    doctor,
    lock,
    matrix,
    monitor,
    push,
    run,
    validate,
)
from gpuenv.cli.common import app, normalise_argv

for _verbs in (matrix, build, run, bench, monitor, validate, lock, diff, push, doctor, cache):
    _verbs.register(app)


def main() -> None:
    # `-it` (docker's spelling) would parse as `-i t` because -i takes the image.
    app(normalise_argv(sys.argv[1:]))


__all__ = ["app", "main"]
