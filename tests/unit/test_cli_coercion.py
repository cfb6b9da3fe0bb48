"""gpuenv/cli/common.py coerces plain option values without pydantic; every option of every
verb must come out exactly as Typer's own (pydantic) coercion makes it: the same value, or
the same error message, for ordinary and hostile values alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import typer.main
from typer import core
from typer._click.core import Context
from typer._click.exceptions import BadParameter

from gpuenv.cli import app

SAMPLES: dict[Any, list[Any]] = {
    str: ["x", "", "a b", "tf2.21-*", "é", "-x"],
    bool: [True, False],
    int: [1, "1", "2", "64", "0", "65", "x", "-1", " 3 ", "+2", "1.0", "1_0", "٣", "", "9" * 40],
    float: [0.5, "0.5", "2", "x", "-1", "1e3", ".5", "5.", "nan", "inf", " 2 ", "1.2.3", ""],
    Path: ["matrix.yaml", "/nonexistent/x", ".", "", "a\0b", "~", "/dev/null"],
}
LIST_SAMPLES = [("a", "b"), (), ("",), ["x"]]


def params() -> list[tuple[str, Any]]:
    cmd = typer.main.get_command(app)
    out = []
    for name, sub in cmd.commands.items():
        for p in sub.params:
            if getattr(p, "type_descriptor", None) is not None:
                out.append((f"{name} {p.name}", p))
    return out


def outcome(runtime: Any, value: Any, param: Any, ctx: Context) -> tuple[str, Any]:
    try:
        got = runtime._coerce_value(value, param=param, ctx=ctx)
        return "value", (type(got).__name__, repr(got))  # repr: nan == nan
    except BadParameter as exc:
        return "error", exc.format_message()


def test_the_plain_coercion_is_installed():
    assert getattr(core.build_runtime_param, "_gpuenv", False)


@pytest.mark.parametrize(("where", "param"), params(), ids=[w for w, _ in params()])
def test_every_option_coerces_as_typer_does(where, param):
    descriptor = param.type_descriptor
    mine = core.build_runtime_param(descriptor)
    theirs = core.build_runtime_param.original(descriptor)
    ctx = Context(typer.main.get_command(app))
    annotation = descriptor.annotation
    samples = LIST_SAMPLES if get_origin(annotation) is list else SAMPLES[annotation]
    assert get_origin(annotation) is not list or get_args(annotation) == (str,)
    for value in samples:
        assert outcome(mine, value, param, ctx) == outcome(theirs, value, param, ctx), (
            where, value)  # fmt: skip


def test_parsing_a_command_line_builds_no_adapter(tmp_path):
    import os
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from gpuenv.cli import app\n"
        "try:\n"
        "    app(['build', '-j', '2', '--keep-going', '-f', 'nothing.yaml', '--ca-bundle',"
        " 'x.pem', 'a*', 'b*'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('HEAVY:' + ('typer._adapters' if 'typer._adapters' in sys.modules else ''),"
        " file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True)  # fmt: skip
    line = [x for x in out.stderr.splitlines() if x.startswith("HEAVY:")][-1]
    assert "nothing.yaml" in out.stderr  # the command ran (and failed on the matrix)
    assert line == "HEAVY:", out.stderr


VERBS = ["matrix", "render", "base", "build", "run", "bench", "monitor", "validate", "lock",
         "diff", "push", "doctor"]  # fmt: skip


@pytest.mark.parametrize("verb", VERBS)
def test_a_one_verb_app_says_what_the_whole_app_says(verb):
    """main() registers only the invoked verb (cli/verbs.app_for): help, usage errors
    and exit codes must be the whole app's."""
    from typer.testing import CliRunner

    from gpuenv.cli import app_for

    for argv in ([verb, "--help"], [verb, "--no-such-option"], [verb, "-h"]):
        one = CliRunner().invoke(app_for(argv), argv, prog_name="gpuenv")
        whole = CliRunner().invoke(app, argv, prog_name="gpuenv")
        assert (one.exit_code, one.output) == (whole.exit_code, whole.output), argv
    assert app_for([verb]) is not app


def test_no_verb_or_an_unknown_one_gets_the_whole_app():
    from gpuenv.cli import app_for

    assert app_for([]) is app and app_for(["--help"]) is app and app_for(["nosuch"]) is app
