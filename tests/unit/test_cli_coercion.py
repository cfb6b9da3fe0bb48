"""Option values as the command line gives them (gpuenv/cli/common.py, Typer's own
coercion): a value of the wrong kind or out of range is one `error:` line naming the verb
and the option, with the hint, exit 2 and nothing on stdout; a good value reaches the verb
(which then fails here on the missing matrix, the next thing it reads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuenv.cli import app


def _invoke(argv: list[str], capsys) -> tuple[int, str, str]:
    code = app(argv, prog_name="gpuenv", standalone_mode=False)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "option", "says"),
    [
        (["build", "-j", "x"], "'-j' / '--jobs'", "valid integer"),
        (["build", "-j", "0"], "'-j' / '--jobs'", "greater than or equal to 1"),
        (["build", "-j", "65"], "'-j' / '--jobs'", "less than or equal to 64"),
        (["bench", "--scale", "lots"], "'--scale'", "valid number"),
        (["cache", "prune", "--keep-days", "-1"], "'--keep-days'", "greater than or equal to 0"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_option(argv, option, says, capsys, tmp_path):
    code, out, err = _invoke([*argv, "-f", str(tmp_path / "none.yaml")], capsys)
    assert code == 2 and out == ""
    [line] = err.splitlines()
    verb = argv[0]
    assert line.startswith(f"error: {verb}: Invalid value for {option}: "), line
    assert says in line and line.endswith(f"(see gpuenv {verb} -h)"), line


@pytest.mark.parametrize(
    "argv",
    [["build", "-j", "2"], ["build", "-j", "64"], ["bench", "--scale", "0.5"],
     ["cache", "prune", "--keep-days", "1.5"]],
)  # fmt: skip
def test_a_good_value_reaches_the_verb(argv, capsys, tmp_path):
    missing = tmp_path / "none.yaml"
    code, out, err = _invoke([*argv, "-f", str(missing)], capsys)
    assert code == 1 and out == "", err
    assert err == f"error: {missing}: no such file; pass -f/--file or set GPUENV_MATRIX\n"


def test_the_entry_point_reads_docker_spelling(tmp_path):
    """`gpuenv run -it ...` is --interactive, not `-i t` (an image named t): main()."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuenv", "run", "-it", "-f", str(tmp_path / "none.yaml"), "sh"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert "none.yaml: no such file" in proc.stderr, proc.stderr
    assert "'t'" not in proc.stderr and "Traceback" not in proc.stderr


def test_run_options_that_take_a_value_come_from_the_parser():
    """The architecture review's drift case: Slurm's --partition was missing from a list kept
    by hand, so `-it` after it parsed as `-i t` and gave an unrelated error."""
    from gpuenv.cli.common import _valued_options, normalise_argv
    from gpuenv.cli.verbs import app  # registers the verbs

    assert app is not None
    args = ["run", "--slurm", "--partition", "gpu", "--dry-run", "-it", "train.py"]
    assert normalise_argv(args)[5] == "--interactive"
    valued = _valued_options("run")
    assert {"--partition", "--nodes", "--time", "-i", "--gpus", "-v"} <= valued
    assert not {"--slurm", "--kube", "--dry-run", "--interactive", "--monitor"} & valued
