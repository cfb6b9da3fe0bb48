"""Every bad input of issue 2, through the real CLI.

Each must give exactly one stderr line ``error: <file>[:<line>]: what is wrong``, exit 1,
no traceback, and `gpuenv render -o DIR` must write nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.cli import app

BASE = """\
name: acme/gpuenv
matrix:
  tensorflow: ["2.21"]
  python: ["3.11"]
  variant: [cpu, gpu]
bases:
  "3.11": {debian: bookworm}
"""


def with_include(entry: str) -> str:
    return BASE.replace("  variant: [cpu, gpu]\n", f"  variant: [cpu, gpu]\n  include:\n{entry}")


def q(value: str) -> str:
    """A YAML double-quoted scalar holding ``value`` exactly (JSON is YAML)."""
    return json.dumps(value)


def invoke(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    # An exception that escaped the CLI also exits 1 in CliRunner; only SystemExit is a
    # deliberate exit.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def assert_rejected(
    path: Path,
    tmp_path: Path,
    *says: str,
    line: int | None = None,
    patterns: tuple[str, ...] = (),
) -> str:
    """Run `matrix` and `render` on ``path``; both must fail the same way. Returns the line."""
    out = tmp_path / "rendered"
    messages = []
    for verb in (["matrix"], ["matrix", "--json"], ["render", "-o", str(out)]):
        code, stdout, stderr = invoke([*verb, *patterns, "-f", str(path)])
        assert code == 1, (verb, stdout, stderr)
        assert "Traceback" not in stdout + stderr
        assert stdout == ""
        assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
        message = stderr.rstrip("\n")
        prefix = f"error: {path}:{line}: " if line is not None else f"error: {path}: "
        if line is None:
            # No line asserted: there may be one, but it must be a number.
            assert re.match(rf"error: {re.escape(str(path))}(:\d+)?: \S", message), message
        else:
            assert message.startswith(prefix), message
        for text in says:
            assert text in message, message
        messages.append(message)
    assert not out.exists() or not any(out.iterdir())
    assert len(set(messages)) == 1
    return messages[0]


# ---------------------------------------------------------------------------- YAML


def test_malformed_yaml(write_matrix, tmp_path):
    text = BASE.replace("name: acme/gpuenv", "name: acme/gpuenv: x")
    assert_rejected(write_matrix(text), tmp_path, "malformed YAML", line=1)


def test_malformed_yaml_unclosed_sequence(write_matrix, tmp_path):
    text = BASE.replace('python: ["3.11"]', 'python: ["3.11"')
    assert_rejected(write_matrix(text), tmp_path, "malformed YAML")


def test_not_a_mapping(write_matrix, tmp_path):
    assert_rejected(write_matrix("- just\n- a list\n"), tmp_path, "expected a mapping")


def test_empty_file(write_matrix, tmp_path):
    assert_rejected(write_matrix(""), tmp_path, "expected a mapping")


def test_missing_file(tmp_path):
    assert_rejected(tmp_path / "nope.yaml", tmp_path, "no such file")


def test_duplicate_key(write_matrix, tmp_path, line_of):
    text = BASE + "name: other/name\n"
    message = assert_rejected(
        write_matrix(text), tmp_path, "duplicate key", line=line_of(text, "other/name")
    )
    assert "'name'" in message


def test_yaml_bomb(write_matrix, tmp_path):
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]")
    path = write_matrix("\n".join(lines) + "\n")
    assert_rejected(path, tmp_path, "aliases expand")


def test_python_object_tag(write_matrix, tmp_path, line_of):
    marker = tmp_path / "pwned"
    text = BASE + f'extra: !!python/object/apply:os.system ["touch {marker}"]\n'
    message = assert_rejected(
        write_matrix(text), tmp_path, "unsupported YAML tag", line=line_of(text, "os.system")
    )
    assert "python/object" in message
    assert not marker.exists()


# -------------------------------------------------------------------------- schema


def test_unknown_top_level_key(write_matrix, tmp_path, line_of):
    text = BASE + "pakages:\n  pip: []\n"
    message = assert_rejected(
        write_matrix(text), tmp_path, "unknown key", line=line_of(text, "pakages")
    )
    assert "'pakages'" in message


def test_unknown_key_with_block_value_points_at_the_key(write_matrix, tmp_path, line_of):
    text = BASE.replace("  variant: [cpu, gpu]\n", "  variant: [cpu, gpu]\n  tpyo:\n    a: 1\n")
    message = assert_rejected(
        write_matrix(text), tmp_path, "unknown key", line=line_of(text, "tpyo")
    )
    assert "matrix.tpyo" in message


def test_unknown_key_in_include(write_matrix, tmp_path, line_of):
    text = with_include('    - {tensorflow: "2.21", variant: gpu, cuda_version: "12.8"}\n')
    message = assert_rejected(
        write_matrix(text), tmp_path, "unknown key", line=line_of(text, "cuda_version")
    )
    assert "cuda_version" in message


def test_missing_required_key(write_matrix, tmp_path):
    text = BASE.replace('bases:\n  "3.11": {debian: bookworm}\n', "")
    assert_rejected(write_matrix(text), tmp_path, "missing", "'bases'")


def test_wrong_type_string_for_list(write_matrix, tmp_path, line_of):
    text = BASE.replace('tensorflow: ["2.21"]', 'tensorflow: "2.21"')
    assert_rejected(
        write_matrix(text), tmp_path, "matrix.tensorflow", "list", line=line_of(text, "tensorflow")
    )


def test_wrong_type_variant(write_matrix, tmp_path, line_of):
    text = BASE.replace("[cpu, gpu]", "[cpu, tpu]")
    assert_rejected(write_matrix(text), tmp_path, "'tpu'", "cpu, gpu", line=line_of(text, "tpu"))


def test_wrong_type_mapping_for_packages(write_matrix, tmp_path, line_of):
    text = BASE + "packages: [pandas]\n"
    assert_rejected(write_matrix(text), tmp_path, "packages", line=line_of(text, "packages"))


def test_base_with_both_kinds(write_matrix, tmp_path, line_of):
    text = BASE.replace("{debian: bookworm}", '{debian: bookworm, image: "python:3.11-slim"}')
    assert_rejected(
        write_matrix(text), tmp_path, "exactly one of debian", line=line_of(text, "bookworm")
    )


@pytest.mark.parametrize(
    ("old", "new", "written", "read"),
    [
        ('tensorflow: ["2.21"]', 'tensorflow: ["2.21", 2.20]', "2.20", "2.2"),
        ('python: ["3.11"]', "python: [3.10, 3.11]", "3.10", "3.1"),
        ('"3.11": {debian', "3.11: {debian", "3.11", "3.11"),
    ],
    ids=["tensorflow-2.20", "python-3.10", "bases-key"],
)
def test_unquoted_float_version(write_matrix, tmp_path, line_of, old, new, written, read):
    text = BASE.replace(old, new)
    message = assert_rejected(write_matrix(text), tmp_path, line=line_of(text, new))
    assert f'"{written}"' in message  # the fix, as the user wrote it
    assert f"number {read}" in message  # what YAML made of it


def test_unquoted_float_in_default(write_matrix, tmp_path, line_of):
    text = BASE + 'default: {tensorflow: 2.20, python: "3.11"}\n'
    message = assert_rejected(write_matrix(text), tmp_path, line=line_of(text, "default"))
    assert '"2.20"' in message


# ------------------------------------------------------------------------- catalog


def test_unknown_framework_version(write_matrix, tmp_path, line_of):
    text = BASE.replace('tensorflow: ["2.21"]', 'tensorflow: ["2.21", "2.22"]')
    assert_rejected(
        write_matrix(text),
        tmp_path,
        "unknown TensorFlow version 2.22",
        "2.21",
        line=line_of(text, "tensorflow"),
    )


def test_unknown_framework_patch_release(write_matrix, tmp_path):
    # 2.16.0 never reached PyPI (docs/architecture.md).
    text = BASE.replace('tensorflow: ["2.21"]', 'tensorflow: ["2.16.0"]')
    assert_rejected(write_matrix(text), tmp_path, "2.16.0")


@pytest.mark.parametrize("python", ["3.14", "3.7", "2.7"])
def test_python_outside_supported_range(write_matrix, tmp_path, line_of, python):
    text = BASE.replace('python: ["3.11"]', f'python: ["3.11", "{python}"]')
    text += f'  "{python}": {{image: "python:{python}-slim"}}\n'
    assert_rejected(
        write_matrix(text),
        tmp_path,
        f"Python {python}",
        "outside the supported range",
        line=line_of(text, "python: ["),
    )


def test_override_contradicts_exact_pins(write_matrix, tmp_path, line_of):
    # TF 2.19 pins CUDA 12.5 wheels exactly; 12.8 is not allowed.
    entry = (
        '    - {tensorflow: "2.19", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.10"}\n'
    )
    text = with_include(entry)
    message = assert_rejected(
        write_matrix(text), tmp_path, "include entry 1", line=line_of(text, '"2.19"')
    )
    assert "2.19" in message and "12.8" in message


def test_override_outside_cuda_12(write_matrix, tmp_path, line_of):
    entry = '    - {tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "11.8"}\n'
    text = with_include(entry)
    assert_rejected(
        write_matrix(text), tmp_path, "include entry 1", "11.8", line=line_of(text, '"11.8"')
    )


def test_override_on_a_cpu_cell(write_matrix, tmp_path, line_of):
    entry = '    - {tensorflow: "2.21", python: "3.11", variant: cpu, cuda: "12.8"}\n'
    text = with_include(entry)
    assert_rejected(write_matrix(text), tmp_path, "CPU", line=line_of(text, '"12.8"'))


def test_impossible_include(write_matrix, tmp_path, line_of):
    # A product cell TF 2.17 / Python 3.13 is rejected; an include of it is an error.
    text = with_include('    - {tensorflow: "2.17", python: "3.13"}\n')
    text += '  "3.13": {debian: trixie}\n'
    assert_rejected(
        write_matrix(text), tmp_path, "include entry 1", "3.13", line=line_of(text, '"2.17"')
    )


def test_exclude_removes_every_cell(write_matrix, tmp_path, line_of):
    text = BASE.replace(
        "  variant: [cpu, gpu]\n", '  variant: [cpu, gpu]\n  exclude:\n    - {tensorflow: "2.21"}\n'
    )
    assert_rejected(
        write_matrix(text), tmp_path, "exclude removes every", line=line_of(text, "exclude")
    )


def test_catalog_rejects_every_cell(write_matrix, tmp_path):
    text = BASE.replace('tensorflow: ["2.21"]', 'tensorflow: ["2.17"]').replace('"3.11"', '"3.13"')
    text = text.replace("bookworm", "trixie")
    assert_rejected(write_matrix(text), tmp_path, "no cell", "3.13")


def test_python_without_base(write_matrix, tmp_path, line_of):
    text = BASE.replace('python: ["3.11"]', 'python: ["3.11", "3.12"]')
    assert_rejected(
        write_matrix(text), tmp_path, "no base for Python 3.12", line=line_of(text, "bases")
    )


def test_debian_suite_with_another_python(write_matrix, tmp_path, line_of):
    text = BASE.replace('python: ["3.11"]', 'python: ["3.11", "3.13"]')
    text += '  "3.13": {debian: bookworm}\n'
    message = assert_rejected(
        write_matrix(text), tmp_path, "bookworm", line=line_of(text, '"3.13": {debian')
    )
    assert "3.11" in message and "3.13" in message


def test_unknown_debian_suite(write_matrix, tmp_path, line_of):
    text = BASE.replace("bookworm", "buster")
    assert_rejected(
        write_matrix(text), tmp_path, "unknown Debian suite", line=line_of(text, "buster")
    )


def test_default_that_is_not_a_cell(write_matrix, tmp_path, line_of):
    text = BASE + 'default: {tensorflow: "2.20", python: "3.11"}\n'
    assert_rejected(
        write_matrix(text), tmp_path, "default", "not a cell", line=line_of(text, "default")
    )


def test_glob_that_matches_nothing(write_matrix, tmp_path):
    message = assert_rejected(write_matrix(BASE), tmp_path, "tf9*", patterns=("tf9*",))
    assert "tf2.21-py3.11-cpu" in message  # lists what there is


def test_one_of_several_globs_matches_nothing(write_matrix, tmp_path):
    assert_rejected(write_matrix(BASE), tmp_path, "*-tpu", patterns=("*-cpu", "*-tpu"))


# ----------------------------------------------------------------------- injection

SHELL = [
    "x\nRUN id",
    "x; id",
    "x && id",
    "x $(id)",
    "x`id`",
    'x"',
    "x'",
    "x | id",
    "x\\",
]


@pytest.mark.parametrize("bad", ["pandas==2.2.3" + s.removeprefix("x") for s in SHELL])
def test_injection_in_pip_package(write_matrix, tmp_path, line_of, bad):
    text = BASE + f"packages:\n  pip:\n    - pandas==2.2.3\n    - {q(bad)}\n"
    assert_rejected(
        write_matrix(text),
        tmp_path,
        "packages.pip.1",
        "pip requirement",
        line=line_of(text, q(bad)),
    )


@pytest.mark.parametrize(
    "bad", ["pandas @ https://evil.example/p.whl", "pandas; python_version>'3'", "-e ."]
)
def test_pip_urls_markers_and_options(write_matrix, tmp_path, line_of, bad):
    text = BASE + f"packages:\n  pip:\n    - {q(bad)}\n"
    assert_rejected(write_matrix(text), tmp_path, "packages.pip.0", line=line_of(text, q(bad)))


def test_injection_in_include_pip(write_matrix, tmp_path, line_of):
    text = with_include(f'    - {{tensorflow: "2.21", pip: [{q("rich$(id)")}]}}\n')
    assert_rejected(
        write_matrix(text), tmp_path, "matrix.include.0.pip.0", line=line_of(text, "rich")
    )


@pytest.mark.parametrize("bad", ["curl" + s.removeprefix("x") for s in SHELL] + ["Curl", "-y"])
def test_injection_in_apt_package(write_matrix, tmp_path, line_of, bad):
    text = BASE + f"packages:\n  apt:\n    - {q(bad)}\n"
    assert_rejected(
        write_matrix(text), tmp_path, "packages.apt.0", "Debian package", line=line_of(text, q(bad))
    )


@pytest.mark.parametrize(
    "bad",
    ["python:3.11-slim" + s.removeprefix("x") for s in SHELL]
    + [
        "python:3.11 slim",  # space in the tag
        "python:3.11-slim!",  # tag characters
        "python:.3.11",  # a tag cannot start with '.'
        "python:" + "a" * 129,  # tags are at most 128 characters
        "python:3.11@sha256:abc",  # not a digest
        "Python:3.11",  # uppercase repository
        "python:3.11\nFROM evil",
    ],
)
def test_injection_in_image_reference(write_matrix, tmp_path, line_of, bad):
    text = BASE.replace("{debian: bookworm}", f"{{image: {q(bad)}}}")
    assert_rejected(
        write_matrix(text), tmp_path, "bases.3.11.image", "image reference",
        line=line_of(text, "image:"),
    )  # fmt: skip


@pytest.mark.parametrize("bad", ["bookworm" + s.removeprefix("x") for s in SHELL] + ["Bookworm"])
def test_injection_in_debian_suite(write_matrix, tmp_path, line_of, bad):
    text = BASE.replace("{debian: bookworm}", f"{{debian: {q(bad)}}}")
    assert_rejected(
        write_matrix(text), tmp_path, "bases.3.11.debian", "suite", line=line_of(text, "debian:")
    )


@pytest.mark.parametrize(
    "bad",
    ["acme/gpuenv" + s.removeprefix("x") for s in SHELL]
    + ["acme/GPUenv", "acme gpuenv", "acme/gpuenv:latest", "acme//gpuenv", "/acme", "acme/"],
)
def test_invalid_repository_name(write_matrix, tmp_path, bad):
    text = BASE.replace("name: acme/gpuenv", f"name: {q(bad)}")
    assert_rejected(write_matrix(text), tmp_path, "name:", "image repository", line=1)


@pytest.mark.parametrize("bad", ["2.21; id", "2.21\nRUN id", "2.21-rc1", "2.21 ", "latest"])
def test_injection_in_versions(write_matrix, tmp_path, line_of, bad):
    text = BASE.replace('tensorflow: ["2.21"]', f"tensorflow: [{q(bad)}]")
    assert_rejected(
        write_matrix(text), tmp_path, "matrix.tensorflow.0", line=line_of(text, "tensorflow")
    )


@pytest.mark.parametrize(
    "bad", ["https://pypi.example/simple $(id)", "https://u:p@pypi.example/", "file:///etc"]
)
def test_injection_in_index_url(write_matrix, tmp_path, line_of, bad):
    text = BASE + f"build:\n  index_url: {q(bad)}\n"
    assert_rejected(write_matrix(text), tmp_path, "index_url", line=line_of(text, "index_url"))


# -------------------------------------------------------------- the real console script


def test_console_script_prints_one_line(write_matrix, tmp_path):
    gpuenv = Path(sys.executable).parent / "gpuenv"
    if not gpuenv.exists():
        pytest.skip(f"no console script at {gpuenv} (install the project)")
    path = write_matrix(BASE + 'x: !!python/object/apply:os.system ["true"]\n')
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(gpuenv), "render", "-f", str(path), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"error: {path}:8: ") and proc.stderr.count("\n") == 1
    assert not out.exists()
