"""What every verb shares: the Typer app, the common options, and how errors are printed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click import exceptions as click_errors  # Typer's own copy of Click's
from typer.core import TyperGroup

from gpuenv.cli.signals import interrupted_code, interrupted_message, on_sigterm_raise


class _Group(TyperGroup):
    """Click's errors as gpuenv's: one `error:` line, never a box or a traceback.

    Usage errors exit 2, under `run` 125 (as `docker run` does for its own failures)."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        on_sigterm_raise()
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            code = exc.exit_code
        except click_errors.ClickException as exc:
            verb = argv[0] if argv and argv[0] in self.commands else ""
            usage = isinstance(exc, click_errors.UsageError)
            code = 125 if usage and argv[:1] == ["run"] else exc.exit_code
            hint = f" (see gpuenv {verb + ' ' if verb else ''}-h)" if usage else ""
            message = " ".join(exc.format_message().split())
            print(f"error: {verb + ': ' if verb else ''}{message}{hint}", file=sys.stderr)
        except typer.Abort as exc:
            code = interrupted_code(exc)
            print(interrupted_message(code), file=sys.stderr)
        if not isinstance(code, int):
            code = 0
        if standalone_mode:
            sys.exit(code)
        return code


_FALLBACK = object()


def _plain_value(descriptor: Any, value: Any, param: Any, ctx: Any) -> Any:
    """A command-line value coerced without pydantic, for the plain cases gpuenv's options
    use; _FALLBACK for anything else (then Typer's own pydantic coercion decides, with its
    own messages, exactly as without this)."""
    from typing import get_args, get_origin

    info, annotation = descriptor.parameter_info, descriptor.annotation
    if descriptor.file_annotation is not None or info.parser is not None:
        return _FALLBACK
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return list(value) if ok else _FALLBACK
    if annotation is str:
        return value if isinstance(value, str) else _FALLBACK
    if annotation is bool:
        return value if isinstance(value, bool) else _FALLBACK
    if annotation in (int, float) and not info.clamp:
        if type(value) is annotation:  # a default (-j's 1)
            number = value
        elif isinstance(value, str):
            text = value.strip()
            if not (text.isascii() and text.replace(".", "", annotation is float).isdigit()):
                return _FALLBACK  # signs, exponents, underscores, words: pydantic's call
            number = annotation(text)
        else:
            return _FALLBACK
        if (info.min is not None and number < info.min) or (
            info.max is not None and number > info.max
        ):
            return _FALLBACK  # pydantic words the range error
        return number
    if annotation is Path and isinstance(value, str) and value and "\0" not in value:
        flags = (info.exists, info.resolve_path, info.writable, info.allow_dash)
        if any(flags) or info.path_type not in (None, Path):
            return _FALLBACK
        from typer._param_types import coerce_cli_path

        return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    return _FALLBACK


def _without_pydantic_on_the_plain_path() -> None:
    """Typer 0.2x coerces every option through a pydantic TypeAdapter, which imports
    pydantic (~50 ms) and builds an adapter per parameter (~25 ms for `run`) on every
    command. gpuenv's options are plain (str, bool, Path, list[str], bounded int/float):
    those are coerced here, and anything else, including every value that would be an
    error, goes to Typer's own coercion, so results and messages are Typer's
    (tests/unit/test_cli_coercion.py compares both on every option). Typer internals are
    used only when they look as expected; otherwise nothing changes."""
    try:
        from dataclasses import dataclass as _dataclass

        from typer import _coercion, core
    except ImportError:
        return
    original = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if original is None or base is None or getattr(original, "_gpuenv", False):
        return

    @_dataclass(frozen=True)
    class PlainParam(base):  # type: ignore[misc, valid-type]
        descriptor: Any = None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            got = _plain_value(self.descriptor, value, param, ctx)
            if got is _FALLBACK:
                return original(self.descriptor)._coerce_value(value, param=param, ctx=ctx)
            return got

    def build(descriptor: Any) -> Any:
        return PlainParam(descriptor.parameter_info, descriptor.annotation, descriptor)

    build._gpuenv = True  # type: ignore[attr-defined]
    build.original = original  # type: ignore[attr-defined]
    core.build_runtime_param = build


_without_pydantic_on_the_plain_path()


def new_app() -> typer.Typer:
    """The Typer app the verbs register on (`app`; main makes one per verb: cli/__init__)."""
    return typer.Typer(
        cls=_Group,
        name="gpuenv",
        help="Reproducible CPU and GPU Docker environments for TensorFlow, from one matrix.yaml.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        # Plain Click help: with Rich installed Typer would otherwise import it (and
        # markdown-it) for every --help and usage error, about 60 ms of a 0.2 s start-up.
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )


app = new_app()

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
    line = " ".join(message.split())
    if len(line) > MAX_ERROR:
        line = f"{line[:MAX_ERROR]}... ({len(line) - MAX_ERROR} more characters)"
    print(f"error: {line}", file=sys.stderr)
    return typer.Exit(code)


@contextmanager
def user_errors(exit_code: int | None = None) -> Iterator[None]:
    """Turn GpuenvError into one `error:` line and an exit code, never a traceback."""
    from gpuenv.errors import GpuenvError

    try:
        yield
    except GpuenvError as exc:
        # `run` fails with 125 unless the error knows better (126: cannot invoke, 127: not found).
        if exit_code is None:  # other verbs: 2 for usage, 1 for everything else
            code = 2 if exc.exit_code == 2 else 1
        else:
            code = exc.exit_code if exc.exit_code in (2, 126, 127) else exit_code
        raise fail(exc.message, code) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        code = interrupted_code(exc)
        raise fail(interrupted_message(code).removeprefix("error: "), code) from None


def say(message: str) -> None:
    """Progress for the user, on stderr so that stdout stays the command's result."""
    print(f"gpuenv: {message}", file=sys.stderr)


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2))


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


# Options of `run` that take a value: the word after them is not the command.
_VALUED = {"-i", "--image", "--gpus", "-e", "--env", "-v", "--volume", "-p", "--publish",
           "--network", "--workdir", "--ipc", "-f", "--file", "--context", "--namespace",
           "--registry", "--pvc", "--timeout", "--runtime-class", "--shm-size",
           "--pull-secret", "--attach", "--logs", "--monitor-out"}  # fmt: skip


def normalise_argv(args: list[str]) -> list[str]:
    """`-it` (docker's spelling) would parse as `-i t`, because -i takes the image; a bare
    `--monitor` takes the default interval (INTERVAL only with `=`, as in --monitor=2)."""
    args = list(args)
    if args[:1] == ["bench"]:  # options and patterns interleave there; no command follows
        return [a if a != "--monitor" else "--monitor=default" for a in args]
    if args[:1] == ["run"]:
        for i, arg in enumerate(args):
            if arg == "--" or (i > 0 and not arg.startswith("-") and args[i - 1] not in _VALUED):
                break
            if arg in ("-it", "-ti"):
                args[i] = "--interactive"
            if arg == "--monitor":  # --monitor[=INTERVAL]: alone, the default interval
                args[i] = "--monitor=default"
    return args
