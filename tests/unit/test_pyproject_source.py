"""`packages: {pyproject: {file, extras, groups}}` (issue 34, part 3): a project's
pyproject.toml as the cells' packages, each entry read as a requirements file's line is
(markers per cell, the framework checked, direct references refused) at its own line."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli_runner import CliRunner

from gpuenv.cli import app
from gpuenv.project.project import open_project

PROJECTS = Path(__file__).resolve().parents[1] / "projects"

MATRIX = """\
name: acme/flax
matrix:
  jax: ["0.9"]
  python: ["3.11"]
  variant: [cpu]
  arch: [amd64, arm64]
bases:
  "3.11": {{debian: bookworm}}
packages:
  pyproject: {source}
"""


def write(root: Path, source: str) -> Path:
    path = root / "matrix.yaml"
    path.write_text(MATRIX.format(source=source), encoding="utf-8")
    return path


def flax(tmp_path: Path) -> Path:
    root = tmp_path / "flax_mnist"
    shutil.copytree(PROJECTS / "flax_mnist", root)
    return root


def refused(path: Path) -> str:
    result = CliRunner().invoke(app, ["matrix", "-f", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    return result.stderr.rstrip("\n")


def test_dependencies_extras_and_groups_join_the_cells_packages(tmp_path):
    root = flax(tmp_path)
    cells = open_project(write(root, "{extras: [plots], groups: [dev]}")).cells
    # jax>=0.4.30 only restates the cell's framework; dev includes test (include-group).
    expected = ("flax>=0.10", "optax", "tensorflow-datasets", "matplotlib>=3.8", "pytest>=8",
                "ruff")  # fmt: skip
    assert [c.pip for c in cells] == [expected, expected]
    assert all(set(c.requirements) == {"pyproject.toml"} for c in cells)


def test_only_the_dependencies_when_no_extra_or_group_is_named(tmp_path):
    cells = open_project(write(flax(tmp_path), "{}")).cells
    assert cells[0].pip == ("flax>=0.10", "optax", "tensorflow-datasets")


def test_a_marker_in_pyproject_is_decided_per_cell_and_recorded_at_its_line(tmp_path):
    root = flax(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('"optax",', "\"optax; platform_machine == 'aarch64'\",")
    )
    cells = {c.arch: c for c in open_project(write(root, "{}")).cells}
    assert "optax" in cells["arm64"].pip and "optax" not in cells["amd64"].pip
    number = text.splitlines().index('    "optax",') + 1
    assert cells["amd64"].left_out == (
        f'pyproject.toml:{number}: optax; platform_machine == "aarch64"',
    )


def test_an_edit_outside_the_dependencies_changes_nothing_a_cell_installs(tmp_path):
    root = flax(tmp_path)
    path = write(root, "{}")
    before = open_project(path).cells[0]
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('version = "0.1.0"', 'version = "0.2.0"'))
    assert open_project(path).cells[0] == before


def test_a_vcs_reference_without_a_revision_is_refused_at_its_line_in_pyproject(tmp_path):
    root = flax(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('"optax",', '"optax @ git+https://github.com/google-deepmind/optax",')
    )
    message = refused(write(root, "{}"))
    number = text.splitlines().index('    "optax",') + 1
    assert message.startswith(f"error: {(root / 'pyproject.toml').resolve()}:{number}: ")
    assert "optax @ git+https://github.com/google-deepmind/optax: no revision" in message


def test_a_framework_pin_other_than_the_cells_is_one_error_naming_both(tmp_path):
    root = flax(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('"jax>=0.4.30"', '"jax==0.4.30"'))
    message = refused(write(root, "{}"))
    assert "jax==0.4.30 asks for another JAX than the cell's JAX 0.9" in message


def test_an_unknown_extra_or_group_or_dynamic_dependencies_are_refused(tmp_path):
    root = flax(tmp_path)
    path = write(root, "{groups: [docs]}")
    message = refused(path)
    line = path.read_text().splitlines().index("  pyproject: {groups: [docs]}") + 1
    assert message.startswith(f"error: {path}:{line}: ")
    assert "group 'docs' is not in pyproject.toml's [dependency-groups] (it has: dev, test)" in (
        message
    )
    assert "extra 'gui' is not in" in refused(write(root, "{extras: [gui]}"))
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('version = "0.1.0"', 'version = "0.1.0"\ndynamic = ["dependencies"]')
    )
    assert "declares its dependencies dynamic" in refused(write(root, "{}"))


NANOCHAT = """\
name: acme/nanochat
matrix:
  torch: ["2.9"]
  python: ["3.11"]
  variant: [cpu, gpu]
bases:
  "3.11": {debian: bookworm}
packages:
  pyproject: {groups: [dev]}
"""


def test_nanochat_dependencies_and_its_dev_group_are_the_cells_packages(tmp_path):
    """karpathy/nanochat's own pyproject.toml (tests/projects/README.md): `torch==2.9.1`
    restates the cell's framework; its PEP 735 `dev` group joins the dependencies; its
    [tool.uv.sources] torch indexes are uv's and change nothing here."""
    root = tmp_path / "nanochat"
    shutil.copytree(PROJECTS / "nanochat", root)
    (root / "matrix.yaml").write_text(NANOCHAT, encoding="utf-8")
    cells = open_project(root / "matrix.yaml").cells
    assert {(c.variant, c.framework_version) for c in cells} == {("cpu", "2.9.1"), ("gpu", "2.9.1")}
    expected = ("filelock>=3.19.0", "kernels>=0.11.7", "numpy>=1.26.0", "psutil>=7.1.0",
                "pyarrow>=21.0.0", "rustbpe>=0.1.0", "tiktoken>=0.11.0", "wandb>=0.21.3",
                "ipykernel>=7.1.0", "matplotlib>=3.10.8", "pytest>=8.0.0",
                "python-dotenv>=1.2.1")  # fmt: skip
    assert all(c.pip == expected for c in cells)
    (root / "matrix.yaml").write_text(NANOCHAT.replace("groups: [dev]", ""), encoding="utf-8")
    assert all("pytest>=8.0.0" not in c.pip for c in open_project(root / "matrix.yaml").cells)


PLAYGROUND = """\
name: acme/playground
matrix:
  jax: ["0.7"]
  python: ["3.13"]
  variant: [cpu]
bases:
  "3.13": {debian: trixie}
packages:
  pyproject: {groups: [dev]}
"""


def test_a_group_naming_the_project_itself_is_the_project_not_a_package(tmp_path):
    """yberreby/jax-rl-playground's own pyproject.toml: its `dev` group lists
    "jax-rl-playground", uv's way of saying "this project". pip would fetch a package of
    that name from the index (someone else's, or none): it is left out of the cells."""
    root = tmp_path / "jax_rl_playground"
    shutil.copytree(PROJECTS / "jax_rl_playground", root)
    (root / "matrix.yaml").write_text(PLAYGROUND, encoding="utf-8")
    (cell,) = open_project(root / "matrix.yaml").cells
    assert "jax-rl-playground" not in cell.pip
    assert cell.pip[:3] == ("flax>=0.10.0", "optax>=0.2.0", "gymnasium>=1.0.0")
    assert cell.pip[-2:] == ("ruff>=0.12.0", "rust-just>=1.40.0")
    assert len(cell.pip) == 19  # 12 dependencies less jax, 9 in dev less the project


def test_the_project_naming_itself_with_an_extra_brings_that_extras_packages(tmp_path):
    root = flax(tmp_path)
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('"ruff"]', '"ruff", "flax-mnist[plots]"]'))
    cells = open_project(write(root, "{groups: [dev]}")).cells
    assert cells[0].pip[-3:] == ("pytest>=8", "ruff", "matplotlib>=3.8")
    (root / "pyproject.toml").write_text(
        text.replace('"ruff"]', '"ruff", \'flax-mnist; python_version < "3.12"\']')
    )
    message = refused(write(root, "{groups: [dev]}"))
    number = text.splitlines().index('dev = [{include-group = "test"}, "ruff"]') + 1
    assert message.startswith(f"error: {(root / 'pyproject.toml').resolve()}:{number}: ")
    assert "the project names itself with a marker or URL" in message
