"""Option values as the command line gives them (gpuenv/cli/common.py, Typer's own
coercion): a value of the wrong kind or out of range is one `error:` line naming the verb
and the option, with the hint, exit 2 and nothing on stdout; a good value reaches the verb
(which then fails here on the missing matrix, the next thing it reads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuenv.cli.argv import click_app  # the app as Click runs it, as main() does


def _invoke(argv: list[str], capsys) -> tuple[int, str, str]:
    code = click_app()(argv, prog_name="gpuenv", standalone_mode=False)
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
    verb = " ".join(w for w in argv[:2] if not w.startswith("-"))  # `cache prune`: both
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
    assert err.startswith(f"error: {missing}: no such file; pass -f/--file or set GPUENV_MATRIX")


def test_the_entry_point_reads_docker_spelling(tmp_path):
    """`gpuenv run -it ...` is --interactive, not `-i t` (an image named t): main()."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuenv", "run", "-it", "-f", str(tmp_path / "none.yaml"), "sh"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert "none.yaml: no such file" in proc.stderr, proc.stderr
    assert "'t'" not in proc.stderr and "Traceback" not in proc.stderr


def test_run_options_that_take_a_value_come_from_the_parser(capsys, tmp_path, monkeypatch):
    """The architecture review's drift case: Slurm's --partition was missing from a list kept
    by hand, so `-it` after it parsed as `-i t` and gave an unrelated error. Now each
    front-end's own parser says which of its options take a value, and `-it` is refused by
    Slurm's front-end, which has no terminal to give."""
    from gpuenv.cli.argv import _command, _valued_options, normalise_argv

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    args = ["run", "--slurm", "--partition", "gpu", "--dry-run", "-it", "train.py"]
    argv = normalise_argv(args)
    assert argv == ["slurm", "run", "--partition", "gpu", "--dry-run", "--interactive",
                    "train.py"]  # fmt: skip
    code, out, err = _invoke(argv, capsys)
    assert (code, out) == (125, "")
    assert err == "error: slurm run: No such option: --interactive (see gpuenv slurm run -h)\n"
    valued = _valued_options(_command(["slurm", "run"]))
    assert {"--partition", "--nodes", "--time", "--gpus-per-node", "-i", "-e"} <= valued
    assert not {"--detach", "--dry-run", "--interactive"} & valued
    local = _valued_options(_command(["run"]))
    assert {"-i", "--gpus", "-v", "-p", "--workdir"} <= local
    assert not {"--partition", "--interactive", "--monitor"} & local


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["run", "--kube", "-i", "c", "--timeout", "15m", "check.py", "--kube"],
         ["kube", "run", "-i", "c", "--timeout", "15m", "check.py", "--kube"]),
        (["run", "-i", "c", "--kube", "--dry-run", "--", "python", "-V"],
         ["kube", "run", "-i", "c", "--dry-run", "--", "python", "-V"]),
        (["run", "--kube", "--context", "prod", "--attach", "job-1"],
         ["kube", "attach", "--context", "prod", "job-1"]),
        (["run", "--kube", "--logs", "job-1", "--namespace", "ns"],
         ["kube", "logs", "--namespace", "ns", "job-1"]),
        (["run", "--attach=job-1"], ["kube", "attach", "job-1"]),
        (["run", "--kube", "--slurm", "x.py"], ["slurm", "run", "--kube", "x.py"]),
        (["run", "--nodes", "2", "--slurm", "-ti", "x.py"],
         ["slurm", "run", "--nodes", "2", "--interactive", "x.py"]),
        (["run", "-it", "-i", "c", "python", "--slurm"],  # the command's own --slurm
         ["run", "--interactive", "-i", "c", "python", "--slurm"]),
    ],
)  # fmt: skip
def test_the_old_spellings_of_cluster_runs_reach_their_front_ends(old, new):
    from gpuenv.cli.argv import normalise_argv

    assert normalise_argv(old) == new
