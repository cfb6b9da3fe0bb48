"""Requirements files (`packages: {requirements: [...]}`, per include too): what joins a
cell's packages, what the plan and the lock see, and every hostile file or path refused
with one `error:` line naming the file and line (through the real CLI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.building import plan
from gpuenv.cli import app
from gpuenv.project import lockfile
from gpuenv.project.project import open_project

MATRIX = """\
name: acme/gpuenv
matrix:
  tensorflow: ["2.21"]
  python: ["3.11"]
  variant: [cpu, gpu]
{include}bases:
  "3.11": {{debian: bookworm}}
packages:
  pip: [rich]
  requirements: [{files}]
"""


def write(tmp_path: Path, files: str = "reqs.txt", include: str = "") -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX.format(files=files, include=include), encoding="utf-8")
    return path


def rejected(path: Path) -> str:
    result = CliRunner().invoke(app, ["matrix", "-f", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    return result.stderr.rstrip("\n")


def test_lines_join_every_cells_pip_after_the_matrix_packages(tmp_path):
    (tmp_path / "reqs.txt").write_text("# tools\nsix==1.17.0  # pinned\n\nattrs>=23,<26\n")
    path = write(tmp_path)
    project = open_project(path)
    for cell in project.cells:
        assert cell.pip == ("rich", "six==1.17.0", "attrs<26,>=23")
        assert set(cell.requirements) == {"reqs.txt"}
    # The lock resolves them (its inputs digest covers them: an edit drifts the lock).
    assert "six==1.17.0" in lockfile.env_requirements(project.cells[0])


def test_a_direct_reference_to_an_archive_reaches_the_cell_with_its_hash(tmp_path):
    sha = "ab" * 32
    url = "https://files.example/p/ply-3.11.tar.gz"
    (tmp_path / "reqs.txt").write_text(f'ply @ {url}#sha256={sha} ; sys_platform == "linux"\n')
    cell = open_project(write(tmp_path)).cells[0]
    # The fragment is the hash the lock's file must have (as pip checks it); uv gets the URL.
    assert cell.pip == ("rich", f"ply @ {url}")
    assert [(name, hashes) for name, hashes, _ in cell.hashes] == [("ply", (sha,))]


def test_per_include_requirements_only_reach_that_cell(tmp_path):
    inc = (
        '  include:\n    - {tensorflow: "2.21", python: "3.11", variant: gpu,'
        " requirements: [gpu.txt]}\n"
    )
    (tmp_path / "gpu.txt").write_text("attrs==25.1.0\n")
    (tmp_path / "reqs.txt").write_text("six\n")
    project = open_project(write(tmp_path, include=inc))
    pips = {c.variant: c.pip for c in project.cells}
    assert pips == {"cpu": ("rich", "six"), "gpu": ("rich", "six", "attrs==25.1.0")}


def test_an_edit_changes_the_plan_inputs_and_names_the_file(tmp_path):
    from gpuenv.engine.client import ImageInfo

    def inputs() -> tuple[dict[str, str], str]:
        project = open_project(path)
        cell = project.cells[0]
        p = plan.prepare(project, [cell])[cell.name]
        inputs = plan.input_digests(p.context, p.templates, "sha256:b", None, project.settings)
        return inputs, p.context.digest

    (tmp_path / "reqs.txt").write_text("six==1.16.0\n")
    path = write(tmp_path)
    before, context_before = inputs()
    (tmp_path / "reqs.txt").write_text("six==1.17.0\n")
    after, context_after = inputs()
    assert before["requirements"] != after["requirements"]
    assert context_before != context_after  # so the spec hash differs: a rebuild
    image = ImageInfo("sha256:i", labels={"io.gpuenv.inputs": json.dumps(before)})
    reasons, layer = plan._why_rebuild(image, after)
    assert "requirements file reqs.txt changed" in reasons
    assert layer == "packages"  # the framework's layer is not what the edit touched


def contexts(project):
    return {name: p.context for name, p in plan.prepare(project, project.cells).items()}


def test_a_comment_only_edit_changes_no_context(tmp_path):
    (tmp_path / "reqs.txt").write_text("six==1.17.0\n")
    path = write(tmp_path)
    first = contexts(open_project(path))
    (tmp_path / "reqs.txt").write_text("# why: tests\nsix==1.17.0\n")
    second = contexts(open_project(path))
    assert {k: v.digest for k, v in first.items()} == {k: v.digest for k, v in second.items()}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        # Each: what pip would have done, and what to write instead.
        ("-e .\n", "-e: pip would install that project in development mode"),
        ("--editable=.\n", "-e: pip would install that project in development mode"),
        ("--find-links ./wheels\n", "-f: pip would look for packages in that directory"),
        ("--no-index\n", "--no-index: pip would use only --find-links"),
        ("--no-binary :all:\n", "--no-binary: pip would build those packages from source"),
        ("--trusted-host example.org\n", "--trusted-host: pip would skip TLS verification"),
        ("--pre\n", "pin the pre-release you want exactly"),
        ("--frobnicate\n", "not an option pip reads in a requirements file"),
        ("-r\n", "-r needs a value"),
        ("-r missing.txt\n", "'missing.txt' does not exist"),
        ("--index-url ftp://example.org/simple\n", "not a plain http(s) URL"),
        ("six==1.17.0 --hash=md5:abc\n", "expected sha256:<64 hex digits>"),
        ("six==1.17.0 --config-settings=x=y\n", "passes no build options"),
        ("git+https://github.com/x/y.git\n", "pip would install from that URL or VCS"),
        ("y @ git+https://github.com/x/y\n", "y @ git+https://github.com/x/y: no revision"),
        ("y @ https://example.org/y/\n", "gpuenv takes the URL of an archive"),
        ("y @ http://example.org/y-1.0.tar.gz\n", "gpuenv fetches direct references over https"),
        ("y @ https://example.org/y-1.0.zip#egg=y\n", "takes #sha256=<64 hex digits> only"),
        ("y @ file:///tmp/y\n", "'/tmp/y' is outside the project directory"),
        ("https://example.org/y-1.0-py3-none-any.whl\n", "pip would install from that URL"),
        ("https://user:secret@example.org/simple/y\n", "a URL with credentials"),
        ("--extra-index-url https://u:secret@example.org/simple\n", "a URL with credentials"),
        ("./local/pkg\n", "'./local/pkg' does not exist (pip would stop here too)"),
        ("y-1.0-py3-none-any.whl\n", "does not exist (pip would stop here too)"),
        ('six; platform_release >= "6"\n', "names the kernel of the machine pip runs on"),
        ('six; python_full_version >= "3.11.4"\n', "holds for some Python 3.11 patch"),
        ('six; frobs == "1"\n', "not a valid pip requirement"),
        ("six==1.17.0; rm -rf /\n", "-r: not an option pip takes on a requirement's line"),
        ("six>=\n", "not a valid pip requirement"),
        ("$(curl evil)\n", "not a valid pip requirement"),
        ("${GPUENV_TEST_UNSET_VARIABLE}\n", "fills no variable of the environment"),
        ("six \\\n  ==1.17.0 \\\n  --hash=sha256:zz\n", "expected sha256:<64 hex"),
    ],
)
def test_hostile_lines_are_refused_with_the_files_line(tmp_path, text, says):
    (tmp_path / "reqs.txt").write_text("six\n\n" + text)
    message = rejected(write(tmp_path))
    assert message.startswith(f"error: {tmp_path / 'reqs.txt'}:3: "), message
    assert says in message
    assert "secret" not in message  # a credential is never echoed


@pytest.mark.parametrize(
    ("files", "setup", "says"),
    [
        ("../outside.txt", "outside", "outside the matrix's directory"),
        ("link.txt", "symlink-out", "outside the matrix's directory"),
        ("/etc/passwd", None, "relative to the matrix file's directory"),
        ("~/reqs.txt", None, "relative to the matrix file's directory"),
        ("missing.txt", None, "does not exist"),
        ("adir", "dir", "not a regular file"),
        ("zero", "devzero", "outside the matrix's directory"),
        ("fifo", "fifo", "not a regular file"),
        ("bin.txt", "binary", "not UTF-8"),
        ("big.txt", "big", "larger than"),
        ("secret.txt", "unreadable", "cannot be read"),
        ("1.5", None, "YAML reads"),
    ],
)
def test_bad_paths_are_refused_at_their_matrix_line(tmp_path, files, setup, says):
    root = tmp_path / "project"
    root.mkdir()
    if setup == "outside":
        (tmp_path / "outside.txt").write_text("six\n")
    elif setup == "symlink-out":
        (tmp_path / "outside.txt").write_text("six\n")
        (root / "link.txt").symlink_to(tmp_path / "outside.txt")
    elif setup == "dir":
        (root / "adir").mkdir()
    elif setup == "devzero":
        (root / "zero").symlink_to("/dev/zero")
    elif setup == "fifo":
        os.mkfifo(root / "fifo")  # must be refused without being opened (no hang)
    elif setup == "binary":
        (root / "bin.txt").write_bytes(b"six\n\xff\xfe\n")
    elif setup == "big":
        (root / "big.txt").write_text("six\n" * 300_000)
    elif setup == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads files whatever their mode")
        (root / "secret.txt").write_text("six\n")
        (root / "secret.txt").chmod(0)
    path = write(root, files=files)
    message = rejected(path)
    line = MATRIX.format(files=files, include="").splitlines().index(f"  requirements: [{files}]")
    assert message.startswith(f"error: {path}:{line + 1}: "), message
    assert says in message


def test_credentials_in_the_matrix_path_itself_are_refused(tmp_path):
    message = rejected(write(tmp_path, files='"https://u:p@example.org/r.txt"'))
    assert "credentials do not belong in the matrix" in message
    assert "u:p" not in message
