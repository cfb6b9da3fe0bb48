"""What every verb shares: the Typer app, the common options, and how errors are printed."""

from __future__ import annotations

import difflib
import errno
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from gpuenv.cli.signals import interrupted_code, interrupted_message, on_sigterm_raise
from gpuenv.cli.verbs import VERBS, PlainValues
from gpuenv.cli.verbs import load as load_verb
from gpuenv.matrix.errors import printable

# `run` and its front-ends for clusters: their usage errors exit 125, as docker run's do.
RUN_VERBS = ("run", "kube", "slurm")


class _Group(PlainValues, TyperGroup):
    """The verbs, each loaded when it is asked for (verbs.py), and Click's errors as gpuenv's:
    one `error:` line, never a box or a traceback.

    Usage errors exit 2, under RUN_VERBS 125 (as `docker run` does for its own failures)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            command = load_verb(cmd_name)
            if command is None:
                return None
            self.commands[cmd_name] = command
        return self.commands[cmd_name]

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:  # no such verb: Typer's suggestion, among them all
            close = difflib.get_close_matches(args[0], VERBS) if args else []
            if close and "Did you mean" not in exc.message:
                names = ", ".join(repr(m) for m in close)
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {names}?"
            raise

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        on_sigterm_raise()
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as exc:  # Click's errors (Typer's own copy of Click)
            ctx = getattr(exc, "ctx", None)  # a usage error knows its command
            if ctx is not None and exc.format_message() == ctx.get_help():
                print(ctx.get_help(), file=sys.stderr)  # no_args_is_help: the help alone
                code = exc.exit_code
            else:
                verb = _verb(ctx) or (argv[0] if argv and argv[0] in VERBS else "")
                usage = exc.exit_code == 2  # Click's UsageError; its other errors exit 1
                code = 125 if usage and argv[:1] and argv[0] in RUN_VERBS else exc.exit_code
                hint = f" (see gpuenv {verb + ' ' if verb else ''}-h)" if usage else ""
                message = " ".join(exc.format_message().split())
                print(f"error: {verb + ': ' if verb else ''}{message}{hint}", file=sys.stderr)
        except typer.Abort as exc:
            code = interrupted_code(exc)
            print(interrupted_message(code), file=sys.stderr)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            print(f"error: {out_of_space(exc)}", file=sys.stderr)
            code = 1
        if not isinstance(code, int):
            code = 0
        if standalone_mode:
            sys.exit(code)
        return code


def _verb(ctx: Any) -> str:
    """The verb (and sub-verb) a Click context parses: `cache prune`, not the program's name."""
    names: list[str] = []
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    return " ".join(names)


def out_of_space(exc: OSError) -> str:
    """A full disk, as one line: the file, where it is known, else the places gpuenv writes
    on this host, and how to make room. Every verb can meet it (a normalised layer under
    TMPDIR, a wheel or a build context in the cache), so it is said once, here. No free-space
    figure: what failed was removed on the way out, so the disk looks roomier than it was."""
    from gpuenv.store.cache import cache_dir

    what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
    if exc.filename:
        where = f"writing {exc.filename}"
    else:
        where = f"gpuenv writes temporary files under TMPDIR ({tempfile.gettempdir()})"
        cache = cache_dir()
        if cache is not None:
            where += f" and its cache under {cache}"
    return (
        f"{what}: {where}; make room (gpuenv cache prune, docker builder prune) or set "
        "TMPDIR or XDG_CACHE_HOME to a larger filesystem"
    )


app = typer.Typer(
    cls=_Group,
    name="gpuenv",
    help="Reproducible CPU and GPU Docker environments for TensorFlow, PyTorch and JAX, "
    "from one matrix.yaml.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain Click help: with Rich installed Typer would import it (and markdown-it) for
    # every --help and usage error, which alone is most of the --help target (0.3 s).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from gpuenv.building.recipe import current

        recipe = current()
        print(f"gpuenv {recipe.gpuenv} (recipe {recipe.digest[:19]})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_version,
            help="Print gpuenv's version and recipe (what decides its images' bytes) and exit",
        ),
    ] = False,
) -> None:
    """The root: its one option is --version (the help is the app's)."""


FileOption = Annotated[
    Path | None,
    typer.Option(
        "-f",
        "--file",
        help="Matrix file [default: ./matrix.yaml, or $GPUENV_MATRIX]",
        show_default=False,
    ),
]
Patterns = Annotated[
    list[str] | None,
    typer.Argument(
        help="Shell-style globs over cell names, e.g. 'tf2.21-*-gpu'", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table")]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-bundle",
        help="PEM bundle gpuenv's own package fetches trust [default: build.ca_bundle, "
        "$GPUENV_CA_BUNDLE, $PIP_CERT]",
        show_default=False,
    ),
]


MAX_ERROR = 2000


def fail(message: str, code: int = 1) -> typer.Exit:
    # One line, whatever the message holds (a library's multi-line text, a hostile value).
    # Bounded: a hostile value (a 60 KB label) is not echoed in full.
    line = printable(" ".join(message.split()))
    if len(line) > MAX_ERROR:
        line = f"{line[:MAX_ERROR]}... ({len(line) - MAX_ERROR} more characters)"
    print(f"error: {line}", file=sys.stderr)
    return typer.Exit(code)


@contextmanager
def user_errors(exit_code: int | None = None) -> Iterator[None]:
    """Turn GpuenvError into one `error:` line and an exit code, never a traceback."""
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.store.cache import held_records

    # A command that fails writes no snapshot into gpuenv's cache ("nothing written").
    with held_records() as held:
        try:
            yield
        except GpuenvError as exc:
            held.clear()
            for line in exc.details:
                print(f"  {printable(line)}", file=sys.stderr)
            # `run` fails with 125 unless the error knows better (126: cannot invoke, 127:
            # not found).
            if exit_code is None:  # other verbs: 2 for usage, 1 for everything else
                code = 2 if exc.exit_code == 2 else 1
            else:
                code = exc.exit_code if exc.exit_code in (2, 126, 127) else exit_code
            raise fail(exc.message, code) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
            held.clear()
            code = interrupted_code(exc)
            raise fail(interrupted_message(code).removeprefix("error: "), code) from None


def say(message: str) -> None:
    """Progress for the user, on stderr so that stdout stays the command's result."""
    print(f"gpuenv: {printable(message)}", file=sys.stderr)


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2))


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
