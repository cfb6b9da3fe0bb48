"""Requirements files read as pip reads them (issue 34, part 1): markers decided per cell,
-r/-c includes inside the project, index options joining build.*, ${VAR}s and line
continuations, --hash values held against the lock, and a line that asks for another
framework release than the cell's. Pure logic: no engine, no index (uv is not run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.building import lock as locks
from gpuenv.cli import app
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.project import open_project

PROJECTS = Path(__file__).resolve().parents[1] / "projects"

TORCH_MATRIX = """\
name: acme/project
matrix:
  torch: ["2.11"]
  python: ["3.13"]
  variant: [cpu, gpu]
  arch: [amd64, arm64]
bases:
  "3.13": {{debian: trixie}}
packages:
  requirements: [{files}]
{build}"""


def torch_matrix(root: Path, files: str = "requirements.txt", build: str = "") -> Path:
    path = root / "matrix.yaml"
    path.write_text(TORCH_MATRIX.format(files=files, build=build), encoding="utf-8")
    return path


def refused(path: Path) -> str:
    result = CliRunner().invoke(app, ["matrix", "-f", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    return result.stderr.rstrip("\n")


def cells(path: Path) -> dict[str, object]:
    return {c.name: c for c in open_project(path).cells}


# ---------------------------------------------------------------- markers


def test_tensor_parallelism_marker_line_applies_to_every_linux_cell(tmp_path):
    """pytorch/examples distributed/tensor_parallelism's real file (a comment, a blank line,
    `torch >= 2.7.1; sys_platform == "linux"`): the marker holds for every cell (all are
    Linux), and it only restates the framework the cell installs (2.11 satisfies >=2.7.1):
    nothing is added, nothing left out."""
    shutil.copy(PROJECTS / "tensor_parallelism" / "requirements.txt", tmp_path)
    found = cells(torch_matrix(tmp_path))
    assert len(found) == 4
    for cell in found.values():
        assert cell.pip == () and cell.left_out == ()  # type: ignore[attr-defined]


def test_a_marker_decides_per_cell_and_the_lock_records_what_it_left_out(tmp_path):
    (tmp_path / "requirements.txt").write_text(
        "six==1.17.0\n"
        'attrs==25.1.0; platform_machine == "aarch64"\n'
        'tomli==2.2.1; python_version < "3.11"\n'
        'pywin32==308; sys_platform == "win32"\n'
    )
    found = cells(torch_matrix(tmp_path))
    amd = found["torch2.11-py3.13-cpu"]
    arm = found["torch2.11-py3.13-cpu-arm64"]
    assert amd.pip == ("six==1.17.0",)  # type: ignore[attr-defined]
    assert arm.pip == ("six==1.17.0", "attrs==25.1.0")  # type: ignore[attr-defined]
    assert amd.left_out == (  # type: ignore[attr-defined]
        'requirements.txt:2: attrs==25.1.0; platform_machine == "aarch64"',
        'requirements.txt:3: tomli==2.2.1; python_version < "3.11"',
        'requirements.txt:4: pywin32==308; sys_platform == "win32"',
    )
    # The lock says so: its entry lists them, and a lock written without them drifts.
    entry = lockfile.CellLock(lockfile.inputs_digest(amd, "2026-01-01T00:00:00Z"), "", "",  # type: ignore[arg-type]
                           amd.left_out)  # type: ignore[attr-defined]  # fmt: skip
    path = tmp_path / "matrix.lock"
    lockfile.write(lockfile.Lock(path, "2026-01-01T00:00:00Z", {amd.name: entry}))  # type: ignore[attr-defined]
    assert "    - 'requirements.txt:4: pywin32==308; sys_platform == \"win32\"'" in (
        path.read_text()
    )
    loaded = lockfile.load(path)
    assert loaded is not None and loaded.cells[amd.name].left_out == entry.left_out  # type: ignore[attr-defined]
    without = amd.__class__(**{**amd.__dict__, "left_out": ()})
    assert lockfile.inputs_digest(without, "x") != lockfile.inputs_digest(amd, "x")  # type: ignore[arg-type]


def test_a_python_full_version_marker_is_decided_when_the_whole_minor_release_agrees(tmp_path):
    (tmp_path / "requirements.txt").write_text('six==1.17.0; python_full_version >= "3.13.0"\n')
    (cell, *_) = cells(torch_matrix(tmp_path)).values()
    assert cell.pip == ("six==1.17.0",)  # type: ignore[attr-defined]


def test_a_patch_release_marker_that_splits_the_minor_release_is_refused_at_its_line(
    tmp_path,
):
    (tmp_path / "requirements.txt").write_text('six\nattrs; python_full_version >= "3.13.4"\n')
    message = refused(torch_matrix(tmp_path))
    assert message.startswith(f"error: {(tmp_path / 'requirements.txt').resolve()}:2: ")
    assert "compare python_version instead" in message


# ---------------------------------------------------------------- the cell's framework


def test_a_line_asking_for_another_framework_release_is_one_error_naming_both(tmp_path):
    (tmp_path / "requirements.txt").write_text("numpy\ntorch==2.9.1\n")
    message = refused(torch_matrix(tmp_path))
    assert message.startswith(f"error: {(tmp_path / 'requirements.txt').resolve()}:2: ")
    assert "torch==2.9.1 asks for another PyTorch than the cell's PyTorch 2.11.0" in message


def test_a_constraint_excluding_the_framework_release_is_an_error(tmp_path):
    (tmp_path / "requirements.txt").write_text("-c pins.txt\nsix\n")
    (tmp_path / "pins.txt").write_text("torch<2.10\n")
    message = refused(torch_matrix(tmp_path))
    assert message.startswith(f"error: {(tmp_path / 'pins.txt').resolve()}:1: ")
    assert "excludes the cell's PyTorch 2.11.0" in message


def test_a_framework_line_with_extras_is_kept(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch[opt-einsum]>=2.6\n")
    (cell, *_) = cells(torch_matrix(tmp_path)).values()
    assert cell.pip == ("torch[opt-einsum]>=2.6",)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- -r and -c


def test_includes_are_read_in_place_relative_to_the_including_file(tmp_path):
    (tmp_path / "reqs").mkdir()
    (tmp_path / "requirements.txt").write_text("six\n-r reqs/base.txt\n--constraint=reqs/c.txt\n")
    (tmp_path / "reqs" / "base.txt").write_text("attrs\n-r ../requirements.txt\n")  # a cycle
    (tmp_path / "reqs" / "c.txt").write_text("attrs<26\nsix==1.17.0\n")
    path = torch_matrix(tmp_path)
    (cell, *_) = cells(path).values()
    assert cell.pip == ("six", "attrs")  # type: ignore[attr-defined]
    assert cell.constraints == ("attrs<26", "six==1.17.0")  # type: ignore[attr-defined]
    # An edit of an included file changes what the plan sees of the file the matrix names.
    before = cell.requirements  # type: ignore[attr-defined]
    (tmp_path / "reqs" / "c.txt").write_text("attrs<25\n")
    (after, *_) = cells(path).values()
    assert after.requirements != before  # type: ignore[attr-defined]
    assert after.constraints == ("attrs<25",)  # type: ignore[attr-defined]


def test_an_include_leaving_the_project_through_a_symlink_is_refused_at_its_line(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "secret.txt").write_text("six\n")
    (project / "inner.txt").symlink_to(tmp_path / "secret.txt")
    (project / "requirements.txt").write_text("# ours\n-r inner.txt\n")
    message = refused(torch_matrix(project))
    assert message.startswith(f"error: {(project / 'requirements.txt').resolve()}:2: ")
    assert "outside the matrix's directory" in message


def test_an_error_in_an_included_file_names_that_file_and_line(tmp_path):
    (tmp_path / "requirements.txt").write_text("-r more.txt\n")
    (tmp_path / "more.txt").write_text("six\n\nsix>=\n")
    message = refused(torch_matrix(tmp_path))
    assert message.startswith(f"error: {(tmp_path / 'more.txt').resolve()}:3: ")


# ---------------------------------------------------------------- indexes


def test_index_options_join_the_matrix_build_indexes(tmp_path):
    (tmp_path / "requirements.txt").write_text(
        "--index-url https://pypi.example.org/simple\n"
        "--extra-index-url=https://extra.example.org/simple\nsix\n"
    )
    project = open_project(torch_matrix(tmp_path))
    build = project.matrix.model.build
    assert build.index_url == "https://pypi.example.org/simple"
    assert build.extra_index_urls == ["https://extra.example.org/simple"]


def test_an_index_url_other_than_the_matrix_one_is_one_error(tmp_path):
    (tmp_path / "requirements.txt").write_text("six\n-i https://other.example.org/simple\n")
    path = torch_matrix(tmp_path, build="build:\n  index_url: https://pypi.example.org/simple\n")
    message = refused(path)
    assert message.startswith(f"error: {(tmp_path / 'requirements.txt').resolve()}:2: ")
    assert "--index-url https://other.example.org/simple conflicts with the matrix's " in message
    assert "build.index_url https://pypi.example.org/simple" in message


def test_the_matrix_own_index_url_repeated_is_no_conflict(tmp_path):
    (tmp_path / "requirements.txt").write_text("-i https://pypi.example.org/simple\nsix\n")
    path = torch_matrix(tmp_path, build="build:\n  index_url: https://pypi.example.org/simple\n")
    assert open_project(path).matrix.model.build.index_url == "https://pypi.example.org/simple"


# ---------------------------------------------------------------- pip's line rules


def test_environment_variables_and_continuations_as_pip_reads_them(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "SIX_VERSION")  # gpuenv fills only those named
    monkeypatch.setenv("SIX_VERSION", "1.17.0")
    digest = "a" * 64
    (tmp_path / "requirements.txt").write_text(
        "six==${SIX_VERSION} \\\n"
        f"    --hash=sha256:{digest}\n"
        "attrs \\\n"
        "  >=23 # why: tests\n"
        "# a comment ending in a backslash does not join \\\n"
        "tomli\n"
    )
    path = torch_matrix(tmp_path)
    (cell, *_) = cells(path).values()
    assert cell.pip == ("six==1.17.0", "attrs>=23", "tomli")  # type: ignore[attr-defined]
    assert cell.hashes == (("six", (digest,), "requirements.txt:1"),)  # type: ignore[attr-defined]
    # A cached resolution sees the variable change.
    from gpuenv.project import snapshot

    depends = snapshot.depends_of(open_project(path).matrix)
    assert "$SIX_VERSION" in depends and "1.17.0" not in json.dumps(depends)


def test_a_variable_holding_a_credential_is_refused_without_echoing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("INDEX", "https://user:hunter2@pypi.example.org/simple")
    (tmp_path / "requirements.txt").write_text("--extra-index-url ${INDEX}\n")
    message = refused(torch_matrix(tmp_path))
    assert "fills no variable" in message and "hunter2" not in message
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "INDEX")  # allowed, but never into a URL
    message = refused(torch_matrix(tmp_path))
    assert "${INDEX} inside a URL" in message and "hunter2" not in message


def test_hash_values_hold_against_the_lock_pick(tmp_path):
    digest = "b" * 64
    (tmp_path / "requirements.txt").write_text(f"six==1.17.0 --hash=sha256:{digest}\n")
    (cell, *_) = cells(torch_matrix(tmp_path)).values()
    good = f"six==1.17.0 \\\n    --hash=sha256:{digest}\n"
    assert locks.check_hashes(cell, good) == good  # type: ignore[arg-type]
    with pytest.raises(GpuenvError) as exc:
        locks.check_hashes(cell, "six==1.17.0 \\\n    --hash=sha256:" + "c" * 64 + "\n")  # type: ignore[arg-type]
    assert exc.value.message.startswith("requirements.txt:1: six==1.17.0's files match none")


def test_an_index_option_is_held_to_build_index_urls_rules(tmp_path):
    # Plain http off loopback is refused there (pages alterable on the way): here too.
    (tmp_path / "requirements.txt").write_text(
        "six\n--extra-index-url http://pypi.example/simple\n"
    )
    message = refused(torch_matrix(tmp_path))
    assert message.startswith(f"error: {(tmp_path / 'requirements.txt').resolve()}:2: ")
    assert "a plain-http index can be read and altered on the way" in message
