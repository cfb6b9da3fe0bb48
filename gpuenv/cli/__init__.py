"""The `gpuenv` command line: one small module per verb (or group of verbs).

Each verb parses its options, calls one domain function, and prints. Heavy modules
(docker, jinja2, pydantic via the matrix, rich) are imported inside the verbs, so that
`gpuenv --help` and the parsing of every verb stay fast. The app is gpuenv/cli/common.py's,
its verbs listed in gpuenv/cli/verbs.py and loaded when asked for.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    from gpuenv.cli.argv import click_app, normalise_argv

    # `-it` (docker's spelling) would parse as `-i t` because -i takes the image.
    argv = normalise_argv(sys.argv[1:])
    # The Click command normalise_argv read the verbs' options from: Typer's app(argv) would
    # build it again (issue 48: ~25 ms of every `gpuenv run`). The same command, run the
    # same way: the app turns Typer's pretty tracebacks off, its only other work.
    try:
        click_app()(argv)
    finally:
        # The command is done (it exits now): the interpreter's last collections, over the
        # 30,000 objects the imports made, would free memory the process is about to give
        # back whole, 30-40 ms of CPU of every command (issue 48). Frozen, they are skipped;
        # atexit handlers and module teardown still run.
        import gc

        gc.freeze()


def __getattr__(name: str) -> Any:
    """`gpuenv.cli.app` (tests drive the app in-process), loaded on first use so that
    importing the package costs nothing."""
    if name == "app":
        from gpuenv.cli.common import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
