"""`gpuenv init` (issue 34, part 4): a commented matrix.yaml from the project's own files,
that loads and resolves, never written over an existing one. Through the real CLI; the
catalog is gpuenv's shipped one (its newest releases are what init must pick)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.catalog.compat import catalog
from gpuenv.cli import app
from gpuenv.project.project import open_project

PROJECTS = Path(__file__).resolve().parents[1] / "projects"


def project(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(PROJECTS / name, root)
    return root


def init(root: Path) -> CliRunner:
    result = CliRunner().invoke(app, ["init", str(root)])
    return result


def newest(framework: str, python: str | None = None) -> str:
    rows = catalog(framework).releases.values()
    fits = [r for r in rows if python is None or python in r.python]
    return max(fits, key=lambda r: tuple(int(p) for p in r.minor.split("."))).minor


def test_word_language_model_gets_the_newest_torch_its_requirement_allows(tmp_path):
    """pytorch/examples word_language_model, its real files (tests/projects/README.md):
    requirements.txt is `torch>=2.6`."""
    root = project(tmp_path, "word_language_model")
    result = init(root)
    assert result.exit_code == 0, result.output
    text = (root / "matrix.yaml").read_text()
    minor = newest("torch", "3.13")
    assert f'torch: ["{minor}"]' in text
    assert "requirements.txt:1 asks for torch>=2.6" in text  # each choice is explained
    assert "requirements: [requirements.txt]" in text
    cells = open_project(root / "matrix.yaml").cells
    assert {c.variant for c in cells} == {"cpu", "gpu"}
    assert {c.python for c in cells} == {"3.13"}  # trixie's: the newest a Debian base ships
    assert all(c.pip == () for c in cells)  # torch>=2.6 only restates the cell's framework


def test_init_never_overwrites(tmp_path):
    root = project(tmp_path, "word_language_model")
    (root / "matrix.yaml").write_text("# mine\n")
    result = init(root)
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "never overwrites" in result.stderr
    assert (root / "matrix.yaml").read_text() == "# mine\n"


def test_a_tensorflow_project_keeps_its_other_packages(tmp_path):
    root = project(tmp_path, "keras_mnist")
    assert init(root).exit_code == 0
    cells = open_project(root / "matrix.yaml").cells
    assert {c.framework for c in cells} == {"tensorflow"}
    assert all(c.pip == ("numpy",) for c in cells)


def test_a_pyproject_project_takes_python_from_python_version(tmp_path):
    root = project(tmp_path, "flax_mnist")
    assert init(root).exit_code == 0, init(root).output
    text = (root / "matrix.yaml").read_text()
    assert 'python: ["3.11"]' in text and ".python-version (3.11)" in text
    assert f'jax: ["{newest("jax", "3.11")}"]' in text
    assert "pyproject.toml:7 asks for jax>=0.4.30" in text
    assert "  pyproject: {file: pyproject.toml}\n" in text
    assert "Add extras: [plots] and groups: [dev, test]" in text
    cells = open_project(root / "matrix.yaml").cells
    assert all(c.pip == ("flax>=0.10", "optax", "tensorflow-datasets") for c in cells)


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"requirements.txt": "numpy\n"}, "no TensorFlow, PyTorch or JAX requirement"),
        ({}, "no requirements.txt or pyproject.toml"),
        ({"requirements.txt": "torch<1.0\n"}, "requirements.txt:1: no PyTorch release"),
        (
            {"requirements.txt": "torch\n", ".python-version": "3.12\n"},
            ".python-version (3.12): no Debian base ships that Python",
        ),
        ({"requirements.txt": "torch\n-e .\n"}, "requirements.txt:2: -e: pip would"),
        ({"pyproject.toml": "[project\n"}, "not TOML"),
    ],
)
def test_what_init_cannot_choose_is_one_error_and_no_file(tmp_path, files, says):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = init(tmp_path)
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert says in result.stderr, result.stderr
    assert not (tmp_path / "matrix.yaml").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".matrix.")] == []


def test_tensorflow_examples_recommendation_keeps_its_other_packages(tmp_path):
    """tensorflow/examples `lite/examples/recommendation/ml/requirements.txt`, verbatim
    (tests/projects/README.md): pandas, tensorflow>=2.2.0, absl-py."""
    root = project(tmp_path, "tf_recommendation")
    result = init(root)
    assert result.exit_code == 0, result.output
    text = (root / "matrix.yaml").read_text()
    assert f'tensorflow: ["{newest("tensorflow")}"]' in text
    assert "requirements.txt:2 asks for tensorflow>=2.2.0" in text
    cells = open_project(root / "matrix.yaml").cells
    assert {c.framework for c in cells} == {"tensorflow"}
    assert {c.variant for c in cells} == {"cpu", "gpu"}
    assert all(c.pip == ("pandas>=1.0.5", "absl-py>=0.1.6") for c in cells)


@pytest.mark.parametrize(
    ("name", "says"),
    [
        # karpathy/nanochat: pyproject.toml's torch==2.9.1 fits Python 3.10, no Debian has it.
        ("nanochat", "though PyTorch 2.9.1 satisfies torch==2.9.1 (pyproject.toml:15) for "
         "Python 3.10: allow one of "),
        # yberreby/jax-rl-playground: jax>=0.6.2 fits 3.12, which no Debian ships either.
        ("jax_rl_playground", f"though JAX {newest('jax', '3.12')}"),
    ],
)  # fmt: skip
def test_a_python_version_no_debian_ships_is_named_as_the_cause(tmp_path, name, says):
    """Two real projects' own pyproject.toml and `.python-version`, verbatim
    (tests/projects/README.md): their framework requirement fits the catalog; the Python
    they pin is what no Debian base ships, so init names that file, not the requirement."""
    root = project(tmp_path, name)
    result = init(root)
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: .python-version (")
    assert "): no Debian base ships that Python (they ship " in result.stderr
    assert says in result.stderr, result.stderr
    assert not (root / "matrix.yaml").exists()
