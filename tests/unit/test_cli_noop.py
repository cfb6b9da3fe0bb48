"""The no-op build path (gpuenv/cli/noop.py): which command lines it takes, and that it
hands every other case, errors included, to the verb, which then says what it always says.
Whether it answers a real up-to-date build without Typer is tested on the engine
(tests/integration/test_engine_noop.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv.cli import noop

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        ([], ([], None, False)),
        (["--json"], ([], None, True)),
        (["tf2.21-*", "-f", "m.yaml"], (["tf2.21-*"], Path("m.yaml"), False)),
        (["--file", "m.yaml", "a", "b", "--json"], (["a", "b"], Path("m.yaml"), True)),
        (["--file=m.yaml"], ([], Path("m.yaml"), False)),
    ],
)
def test_the_plain_spellings_are_taken(argv, parsed):
    assert noop.parse(argv) == parsed


@pytest.mark.parametrize(
    "argv",
    [
        ["--no-cache"], ["--dry-run"], ["-j", "2"], ["--keep-going"], ["--validate"],
        ["--help"], ["-h"], ["--offline"], ["--reproducible"], ["--ca-bundle", "x.pem"],
        ["--", "a"], ["-fm.yaml"], ["-f"], ["-f", "--json"], ["-f", "a.yaml", "-f", "b.yaml"],
        ["--file="], [""], ["--jso"],
    ],
)  # fmt: skip
def test_everything_else_goes_to_the_verb(argv):
    assert noop.parse(argv) is None
    assert noop.answered(argv) is False


def test_a_registry_setting_goes_to_the_verb(monkeypatch):
    monkeypatch.setenv("GPUENV_REGISTRY", "not a registry")  # the verb's error to give
    assert noop.answered([]) is False


def _gpuenv(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    probe = (
        "import sys\n"
        "from gpuenv.cli import main\n"
        f"sys.argv = ['gpuenv', *{list(args)!r}]\n"
        "try:\n"
        "    main()\n"
        "finally:\n"
        "    print('TYPER:' + str('typer' in sys.modules), file=sys.stderr)\n"
    )
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_matrix_error_is_the_verbs_one_line(tmp_path):
    (tmp_path / "matrix.yaml").write_text("name: x\nmatrix: [\n")
    out = _gpuenv(tmp_path, "build")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 1 and len(errors) == 1, out.stderr
    assert "matrix.yaml" in errors[0] and "Traceback" not in out.stderr
    assert "TYPER:True" in out.stderr  # the verb said it, not the no-op path


def test_an_unreachable_engine_is_the_verbs_one_line(tmp_path):
    (tmp_path / "matrix.yaml").write_text((REPO / "matrix.yaml").read_text())
    out = _gpuenv(tmp_path, "build", "--json", DOCKER_HOST=f"unix://{tmp_path}/no.sock")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode != 0 and len(errors) == 1, out.stderr
    assert "TYPER:True" in out.stderr and out.stdout == ""
