"""The verbs are loaded when asked for (gpuenv/cli/verbs.py, Click's lazy-loading group):
`gpuenv run` imports and builds `run` alone, `--help` still lists every verb with its help,
and every verb a module of gpuenv/cli/ registers is in the table. The values of run (and of
the root's options) are Typer's, without pydantic where they need no coercion
(verbs.plain_values)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from gpuenv.cli.verbs import VERBS, load

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "gpuenv" / "cli"


def _entry_point(argv: list[str], tmp_path: Path, **env: str) -> tuple[str, set[str]]:
    """stderr of `gpuenv ARGV` in a fresh interpreter, and the modules of gpuenv.cli (and
    pydantic, if it was) that it loaded."""
    code = (
        "import sys\nfrom gpuenv.cli import main\n"
        f"sys.argv = ['gpuenv', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('CLI:' + ' '.join(m for m in sys.modules "
        "if m.startswith('gpuenv.cli') or m == 'pydantic'), file=sys.stderr)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("CLI:")]
    return proc.stderr, set(line.removeprefix("CLI:").split())


def test_run_loads_no_other_verb(tmp_path):
    (tmp_path / "x.py").write_text("")
    err, loaded = _entry_point(["run", "-f", str(tmp_path / "none.yaml"), "x.py"], tmp_path)
    assert "none.yaml: no such file" in err
    verbs = {m for m in loaded if m.removeprefix("gpuenv.cli.") in set(VERBS.values())}
    assert verbs == {"gpuenv.cli.run"}


def test_help_lists_every_verb_in_order_with_its_help(tmp_path):
    code = subprocess.run([sys.executable, "-m", "gpuenv", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    listed = code.stdout.split("Commands:\n")[1].splitlines()
    assert [line.split()[0] for line in listed] == list(VERBS)
    for line in listed:
        assert len(line.split()) > 1, f"no help for {line.split()[0]}"


def test_every_registered_verb_is_in_the_table():
    """A module's register() and VERBS agree: a verb added to a module and not to the table
    would never be found."""
    registered: dict[str, str] = {}
    for path in sorted(CLI.glob("*.py")):
        module = importlib.import_module(f"gpuenv.cli.{path.stem}")
        if not hasattr(module, "register"):
            continue
        app = typer.Typer()
        module.register(app)
        names = [c.name for c in app.registered_commands]
        names += [g.name for g in app.registered_groups]
        registered |= {str(name): path.stem for name in names}
    assert registered == VERBS


def test_each_verb_is_built_from_its_module_alone():
    for verb in VERBS:
        assert load(verb).name == verb
    assert load("nonesuch") is None


def test_a_misspelt_verb_is_offered_the_verb_meant(tmp_path):
    err, _ = _entry_point(["buld"], tmp_path)
    said = "error: No such command 'buld'. Did you mean 'build'? (see gpuenv -h)"
    assert err.splitlines()[0] == said


def test_run_parses_its_options_without_pydantic(tmp_path):
    """Typer builds a pydantic adapter for each parameter it parses, given or not (60-85 ms
    of every run, issue 48): run's and the root's plain values need none."""
    (tmp_path / "x.py").write_text("")
    argv = ["run", "-e", "A=1", "-v", "/x:/y", "-p", "1:1", "--network", "none", "--workdir",
            "/w", "--ipc", "host", "--monitor-out", "m.csv", "-f", "m.yaml", "-i", "acme/x:1",
            "x.py"]  # fmt: skip
    err, loaded = _entry_point(argv, tmp_path, DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert "none.sock" in err  # parsed, then no engine there
    assert "pydantic" not in loaded


# Paths: none there, a directory, a file, one stat refuses.
VALUES = [None, (), [], ("a",), ("a", "b"), ["x", ""], "x", "", "é", "-", " a b ", "a\0b",
          True, False, 0, 1.5, b"x", ("a", 1), Path("m.yaml"), "m.yaml", "/", "/etc/hostname",
          "/proc/1/root/x"]  # fmt: skip


def _coerced(runtime: Any, value: Any, param: Any) -> Any:
    try:
        got = runtime.coerce(value, param=param, ctx=None)
    except Exception as exc:  # Typer's BadParameter: the same error, worded the same
        return ("error", type(exc).__name__, str(exc))
    return (type(got).__name__, got)


def _params() -> list[tuple[str, Any]]:
    """(name, parameter) of run's command and of the root group, -h/--help included; built
    afresh, so that a value that went to Typer's own coercion leaves no trace."""
    from gpuenv.cli.common import app

    found = []
    for command in (load("run"), typer.main.get_command(app)):
        help_option = command.get_help_option(typer.Context(command))
        found += [(f"{command.name} {p.name}", p) for p in [*command.params, help_option]]
    return found


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_each_plain_value_is_typer_own(value):
    from typer._coercion import build_runtime_param  # Typer's own, to compare with

    checked = 0
    for name, param in _params():
        typer_own = build_runtime_param(param.type_descriptor)
        expected = _coerced(typer_own, value, param)
        assert _coerced(param._runtime_param, value, param) == expected, name
        checked += 1
    assert checked == 16  # run's 13 parameters and its -h, the root's --version and -h


def test_the_entry_point_leaves_its_objects_to_the_exit(tmp_path):
    """main() freezes the collector's objects as the command ends: the interpreter's last
    collections over them were 30-40 ms of CPU of every command (issue 48)."""
    code = (
        "import gc, sys\nfrom gpuenv.cli import main\nsys.argv = ['gpuenv', '--version']\n"
        "try:\n    main()\nexcept SystemExit:\n    print('FROZEN', gc.get_freeze_count())"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)  # fmt: skip
    frozen = int(proc.stdout.split("FROZEN")[1])
    assert frozen > 1000, proc.stdout
