"""The `gpuenv` command line: one small module per verb (or group of verbs).

Each verb parses its options, calls one domain function, and prints. Heavy modules
(docker, jinja2, pydantic via the matrix, rich) are imported inside the verbs, so that
`gpuenv --help` and the parsing of every verb stay fast. A `gpuenv build` with nothing to
build is answered before Typer is even imported (gpuenv/cli/noop.py); every other
invocation, and that one whenever it finds anything to do, goes through the app
(gpuenv/cli/verbs.py).
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["build"]:
        from gpuenv.cli.noop import answered

        if answered(argv[1:]):
            return
    from gpuenv.cli.verbs import app_for, normalise_argv

    # `-it` (docker's spelling) would parse as `-i t` because -i takes the image.
    argv = normalise_argv(argv)
    app_for(argv)(argv)


def __getattr__(name: str) -> Any:
    """`gpuenv.cli.app` and `gpuenv.cli.app_for` (tests drive the app in-process), loaded
    on first use so that importing the package costs nothing."""
    if name in ("app", "app_for"):
        from gpuenv.cli import verbs

        return getattr(verbs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "app_for", "main"]
