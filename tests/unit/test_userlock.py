"""Pins from a lock the project already has (`packages: {lock: ...}`, issue 34 part 4):
uv.lock and PEP 751 pylock.toml, as uv wrote them for tests/projects/jax_uv (a real
resolution on PyPI, with a fork: jax 0.10.2 for Python < 3.12, 0.12.0.1 above). Each pin
constrains the cells where its markers hold; the framework, Python and the lock's sources
are checked; the lock's pick must be one of the files the user's lock lists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner

from gpuenv.building import lock as locks
from gpuenv.cli import app
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.project import open_project

PROJECT = Path(__file__).resolve().parents[1] / "projects" / "jax_uv"

MATRIX = """\
name: acme/jaxuv
matrix:
  jax: ["{jax}"]
  python: ["{python}"]
  variant: [cpu]
bases:
  "3.11": {{debian: bookworm}}
  "3.13": {{debian: trixie}}
packages:
  pyproject: {{}}
  lock: {lock}
"""


def write(tmp_path: Path, lock: str = "uv.lock", jax: str = "0.12", python: str = "3.13"):
    root = tmp_path / "jax_uv"
    if not root.exists():
        shutil.copytree(PROJECT, root)
    path = root / "matrix.yaml"
    path.write_text(MATRIX.format(lock=lock, jax=jax, python=python), encoding="utf-8")
    return path


def refused(path: Path) -> str:
    result = CliRunner().invoke(app, ["matrix", "-f", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    return result.stderr.rstrip("\n")


@pytest.mark.parametrize("lock", ["uv.lock", "pylock.toml"])
def test_the_locks_pins_constrain_the_cell_where_their_markers_hold(tmp_path, lock):
    (cell,) = open_project(write(tmp_path, lock)).cells
    pins = dict(c.split("==") for c in cell.constraints)
    # The >= 3.12 fork's versions; jax itself is the cell's framework (checked, not passed).
    assert pins["jaxlib"] == "0.12.0.1" and pins["optax"] == "0.2.8"
    assert "jax" not in pins and "jax-uv" not in pins  # the project itself is skipped
    assert cell.pip == ("optax>=0.2",)
    hashes = {name: digests for name, digests, _ in cell.hashes}
    assert len(hashes["jaxlib"]) > 4  # every file of that version: sdist and wheels
    assert f"{lock}:" in dict((n, w) for n, _, w in cell.hashes)["optax"]


def test_a_lock_pinning_another_framework_release_is_one_error_naming_both(tmp_path):
    # Python 3.13 takes the >= 3.12 fork: jax 0.12.0.1, not the cell's 0.11.
    path = write(tmp_path, jax="0.11", python="3.13")
    message = refused(path)
    lock = (path.parent / "uv.lock").resolve()
    lines = lock.read_text().splitlines()
    number = lines.index('name = "jax"', lines.index('name = "jax"') + 1) + 1  # the 2nd fork
    assert message.startswith(f"error: {lock}:{number}: "), message
    assert "constraint jax==0.12.0.1 excludes the cell's JAX 0.11" in message


def test_a_cell_outside_the_locks_python_range_is_refused(tmp_path):
    path = write(tmp_path)
    lock = path.parent / "uv.lock"
    lock.write_text(
        lock.read_text().replace('requires-python = ">=3.11"', 'requires-python = ">=3.14"', 1)
    )
    message = refused(path)
    assert "uv.lock was resolved for Python >=3.14; a cell of Python 3.13" in message


def test_a_package_from_git_is_refused_at_its_line(tmp_path):
    path = write(tmp_path)
    lock = path.parent / "uv.lock"
    text = lock.read_text()
    start = text.index('\nname = "optax"\n')
    source = text.index("source = {", start)
    end = text.index("}", source) + 1
    lock.write_text(
        text[:source]
        + 'source = { git = "https://github.com/google-deepmind/optax?rev=v0.2.8" }'
        + text[end:]
    )
    message = refused(path)
    number = text.splitlines().index('name = "optax"') + 1
    assert message.startswith(f"error: {lock.resolve()}:{number}: optax comes from git")


JAX_FORK = """resolution-markers = [
    "python_full_version < '3.12'",
]"""


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        # The review's reproduction (N7, issue 44): an entry that is no marker.
        (JAX_FORK, JAX_FORK.replace("'3.12'", "'3.12' andand"), ("jax's resolution-markers",
                                                                "'3.12' andand")),
        # A hand edit that drops the list: each character would have become a marker.
        (JAX_FORK, "resolution-markers = \"python_full_version < '3.12'\"",
         ("jax's resolution-markers is", "not a list of markers")),
        (JAX_FORK, "resolution-markers = [1]", ("jax's resolution-markers entry '1'",)),
        # The lock's own Python range, read for every cell.
        ('requires-python = ">=3.11"', 'requires-python = ">=3.11 andand"',
         ("requires-python '>=3.11 andand' is not a version specifier",)),
    ],
    ids=["bad-entry", "not-a-list", "not-a-string", "requires-python"],
)  # fmt: skip
def test_a_bad_marker_in_uv_lock_is_one_error_at_its_line(tmp_path, old, new, names):
    path = write(tmp_path)
    lock = path.parent / "uv.lock"
    text = lock.read_text()
    assert old in text
    lock.write_text(text.replace(old, new, 1))
    message = refused(path)
    number = lock.read_text()[: lock.read_text().index(new)].count("\n") + 1
    if new.count("\n"):
        number += 1  # the entry's own line, inside the list
    assert message.startswith(f"error: {lock.resolve()}:{number}: "), message
    assert all(name in message for name in names), message
    assert message.endswith("correct it, or write the lock again with `uv lock`")


def test_a_file_that_is_not_a_lock_is_refused_at_the_matrix_line(tmp_path):
    path = write(tmp_path, lock="pyproject.toml")
    message = refused(path)
    line = path.read_text().splitlines().index("  lock: pyproject.toml") + 1
    assert message.startswith(f"error: {path}:{line}: ")
    assert "neither uv.lock nor a PEP 751 pylock.toml" in message


def test_the_resolution_must_pick_a_file_the_users_lock_lists(tmp_path):
    (cell,) = open_project(write(tmp_path)).cells
    (digests,) = [d for n, d, _ in cell.hashes if n == "optax"]
    good = f"optax==0.2.8 \\\n    --hash=sha256:{digests[0]}\n"
    assert locks.check_hashes(cell, good) == good
    with pytest.raises(GpuenvError, match=r"optax==0\.2\.8's files match none"):
        locks.check_hashes(cell, "optax==0.2.8 \\\n    --hash=sha256:" + "0" * 64 + "\n")


def test_the_users_lock_rehashed_drifts_matrix_lock(tmp_path):
    path = write(tmp_path)
    (before,) = open_project(path).cells
    lock = path.parent / "uv.lock"
    text = lock.read_text()
    digest = next(d for n, d, _ in before.hashes if n == "absl-py")[0]
    lock.write_text(text.replace(digest, "f" * 64))
    (after,) = open_project(path).cells
    assert after.constraints == before.constraints  # the same versions
    assert lockfile.inputs_digest(after, "x") != lockfile.inputs_digest(before, "x")


NANOCHAT = """\
name: acme/nanochat
matrix:
  torch: ["2.9"]
  python: ["3.11"]
  variant: [{variant}]
bases:
  "3.11": {{debian: bookworm}}
packages:
  pyproject: {{groups: [dev]}}
  lock: uv.lock
"""


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_nanochats_uv_lock_with_local_torch_builds_is_one_error_at_the_build(tmp_path, variant):
    """karpathy/nanochat's own uv.lock (tests/projects/README.md): uv forked torch 2.9.1 by
    the project's `cpu`/`gpu` extras, so the lock holds PyPI's 2.9.1, 2.9.1+cpu and
    2.9.1+cu128 at once, and a cell can take none of them as a pin: one error at the first
    local build, for either variant, naming the build and its index."""
    root = tmp_path / "nanochat"
    shutil.copytree(PROJECT.parent / "nanochat", root)
    path = root / "matrix.yaml"
    path.write_text(NANOCHAT.format(variant=variant), encoding="utf-8")
    message = refused(path)
    lock = (root / "uv.lock").resolve()
    lines = lock.read_text().splitlines()
    number = next(
        n for n, line in enumerate(lines, 1)
        if line == 'version = "2.9.1+cpu"' and lines[n - 2] == 'name = "torch"'
    ) - 1  # fmt: skip
    assert message.startswith(f"error: {lock}:{number}: torch 2.9.1+cpu is a local build")
    assert "('+cpu', from https://download.pytorch.org/whl/cpu), not a release" in message


def test_a_real_lock_of_a_jax_the_catalog_lacks_is_one_error_naming_the_pin(tmp_path):
    """yberreby/jax-rl-playground's own uv.lock pins jax 0.6.2 (uv's resolution of its
    `jax>=0.6.2`), older than any JAX release in gpuenv's catalog (0.7 and later): a cell
    cannot take that lock; one error at the lock's jax entry, naming both versions."""
    root = tmp_path / "jax_rl_playground"
    shutil.copytree(PROJECT.parent / "jax_rl_playground", root)
    path = root / "matrix.yaml"
    path.write_text(
        MATRIX.format(lock="uv.lock", jax="0.7", python="3.13").replace("acme/jaxuv", "acme/rl"),
        encoding="utf-8",
    )
    message = refused(path)
    lock = (root / "uv.lock").resolve()
    number = lock.read_text().splitlines().index('name = "jax"') + 1
    assert message.startswith(f"error: {lock}:{number}: constraint jax==0.6.2 excludes ")
    assert "the cell's JAX 0.7.2" in message
