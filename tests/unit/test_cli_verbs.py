"""The verbs are loaded when asked for (gpuenv/cli/verbs.py, Click's lazy-loading group):
`gpuenv run` imports and builds `run` alone, `--help` still lists every verb with its help,
and every verb a module of gpuenv/cli/ registers is in the table."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import typer

from gpuenv.cli.verbs import VERBS, load

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "gpuenv" / "cli"


def _entry_point(argv: list[str], tmp_path: Path) -> tuple[str, set[str]]:
    """stderr of `gpuenv ARGV` in a fresh interpreter, and the modules of gpuenv.cli it loaded."""
    code = (
        "import sys\nfrom gpuenv.cli import main\n"
        f"sys.argv = ['gpuenv', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('CLI:' + ' '.join(m for m in sys.modules if m.startswith('gpuenv.cli')), "
        "file=sys.stderr)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
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
