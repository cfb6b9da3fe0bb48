"""A first run in a directory without matrix.yaml (issue 48, item 5): every verb that reads
the matrix says, in its one error line, the command that writes one (`gpuenv init`, with the
directory when it is not this one), as well as -f/--file and GPUENV_MATRIX. The hint is
given where the file is read (gpuenv/matrix/yamlfile.py), so no verb can miss it."""

from __future__ import annotations

import pytest

from gpuenv.cli.argv import click_app  # the app as Click runs it, as main() does


@pytest.fixture
def project_with_only_train_py(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUENV_MATRIX", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["run", "--gpus", "all", "train.py"], 125),
        (["run", "train.py"], 125),
        (["build"], 1),
        (["matrix"], 1),
        (["lock"], 1),
        (["render", "-o", "out"], 1),
        (["devcontainer"], 1),
    ],
)
def test_the_error_names_gpuenv_init(project_with_only_train_py, capsys, argv, code):
    assert click_app()(argv, prog_name="gpuenv", standalone_mode=False) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "error: matrix.yaml: no such file; write one for the project here with `gpuenv init` "
        "(it chooses the cells from requirements.txt or pyproject.toml), or pass -f/--file "
        "or set GPUENV_MATRIX\n"
    )


def test_a_matrix_named_elsewhere_gets_that_directorys_init(tmp_path, capsys, monkeypatch):
    where = tmp_path / "my project"
    where.mkdir()
    monkeypatch.setenv("GPUENV_MATRIX", str(where / "matrix.yaml"))
    assert click_app()(["matrix"], prog_name="gpuenv", standalone_mode=False) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {where}/matrix.yaml: no such file; write one for the "
                          f"project there with `gpuenv init '{where}'` (")  # fmt: skip


def test_another_name_is_checked_and_init_writes_matrix_yaml(tmp_path, capsys):
    missing = tmp_path / "none.yaml"
    assert (
        click_app()(["matrix", "-f", str(missing)], prog_name="gpuenv", standalone_mode=False) == 1
    )
    assert capsys.readouterr().err == (
        f"error: {missing}: no such file; pass -f/--file or set GPUENV_MATRIX to a matrix that "
        f"exists, or write one with `gpuenv init {tmp_path}` (it writes "
        f"{tmp_path}/matrix.yaml)\n"
    )
