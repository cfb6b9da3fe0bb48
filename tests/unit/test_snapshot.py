"""The resolved-matrix snapshot (gpuenv/project/snapshot.py): a hit gives exactly what loading
gives, every input change misses, a corrupt entry is ignored, and what `--help`, a no-op
build and `run` import stays small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv.building import plan
from gpuenv.project import fingerprint, snapshot
from gpuenv.project.project import open_project
from gpuenv.store import cache

REPO = Path(__file__).resolve().parents[2]

LOCK = """\
version: 1
exclude_newer: '2026-01-01T00:00:00Z'
bases: {}
cells: {}
"""


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def project_dir(tmp_path: Path, minimal_matrix: str) -> Path:
    root = tmp_path / "p"
    root.mkdir()
    (root / "reqs.txt").write_text("six==1.17.0\n")
    text = minimal_matrix + "packages:\n  requirements: [reqs.txt]\n"
    (root / "matrix.yaml").write_text(text)
    return root


def same(a, b) -> None:
    assert [c for c in a.cells] == [c for c in b.cells]
    assert a.resolution.default_cpu == b.resolution.default_cpu
    assert a.resolution.default_gpu == b.resolution.default_gpu
    assert list(a.resolution.rejected) == list(b.resolution.rejected)
    assert a.settings == b.settings
    assert a.lock == b.lock or (a.lock.cells, a.lock.bases) == (b.lock.cells, b.lock.bases)


def test_a_hit_gives_what_loading_gives(project_dir):
    path = project_dir / "matrix.yaml"
    fresh = open_project(path)
    first = open_project(path, cached=True)  # a miss: loads, writes the snapshot
    assert first._matrix is not None and first.snapshot is not None
    hit = open_project(path, cached=True)
    assert hit._matrix is None, "a hit must not load (validate) the matrix"
    same(fresh, hit)
    # Rendered contexts come back byte for byte.
    rendered = plan.prepare(fresh, fresh.cells)
    plan.prepare(hit, hit.cells)  # fills the snapshot's contexts
    again = open_project(path, cached=True)
    assert again.cached_contexts()
    cached = plan.prepare(again, again.cells)
    assert {k: v.context.files for k, v in cached.items()} == {
        k: v.context.files for k, v in rendered.items()
    }
    # And the validated matrix is still there when something asks for it.
    assert again.matrix.model.name == "acme/gpuenv"


def _edit_matrix(d: Path) -> None:
    p = d / "matrix.yaml"
    p.write_text(p.read_text().replace("variant: [cpu, gpu]", "variant: [cpu]"))


def _edit_reqs(d: Path) -> None:
    (d / "reqs.txt").write_text("six==1.16.0\n")


def _retarget_reqs(d: Path) -> None:
    (d / "other.txt").write_text("six==1.17.0\n")
    (d / "reqs.txt").unlink()
    (d / "reqs.txt").symlink_to(d / "other.txt")


def _add_lock(d: Path) -> None:
    (d / "matrix.lock").write_text(LOCK)


@pytest.mark.parametrize("change", [_edit_matrix, _edit_reqs, _retarget_reqs, _add_lock])
def test_every_file_input_change_misses(project_dir, change):
    path = project_dir / "matrix.yaml"
    open_project(path, cached=True)
    assert open_project(path, cached=True)._matrix is None  # hit
    change(project_dir)
    after = open_project(path, cached=True)
    assert after._matrix is not None, f"{change.__name__} must miss"
    same(open_project(path), after)


def test_a_code_or_template_change_misses(project_dir, monkeypatch, tmp_path):
    path = project_dir / "matrix.yaml"
    open_project(path, cached=True)
    assert open_project(path, cached=True)._matrix is None
    templates = tmp_path / "images"
    subprocess.run(["cp", "-r", str(fingerprint.templates_dir()), str(templates)], check=True)
    monkeypatch.setattr(fingerprint, "templates_dir", lambda: templates)
    # Other files with the same bytes: a miss (files are known by their signature), once.
    assert open_project(path, cached=True)._matrix is not None
    assert open_project(path, cached=True)._matrix is None
    (templates / "Dockerfile.j2").write_text((templates / "Dockerfile.j2").read_text() + "\n")
    assert open_project(path, cached=True)._matrix is not None
    assert open_project(path, cached=True)._matrix is None
    # An edit of the same size with the old mtime put back (as `touch -r` or a tar would):
    # the ctime, which nothing can set back, still tells.
    template = templates / "Dockerfile.j2"
    before, text = template.stat(), template.read_text()
    template.write_text(text.replace("FROM", "from", 1))
    os.utime(template, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert template.stat().st_size == before.st_size
    assert open_project(path, cached=True)._matrix is not None
    monkeypatch.setattr(fingerprint.gpuenv, "__version__", "99.0")
    assert open_project(path, cached=True)._matrix is not None


def test_a_removed_lock_misses(project_dir):
    path = project_dir / "matrix.yaml"
    _add_lock(project_dir)
    assert open_project(path, cached=True).lock is not None
    (project_dir / "matrix.lock").unlink()
    after = open_project(path, cached=True)
    assert after._matrix is not None and after.lock is None


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "{",
        "[]",
        '{"format": 1}',
        "KEY",  # the right key, nothing else
        "KEY-cells",  # the right key, cells of the wrong shape
        "KEY-contexts",  # the right key, a context file that is not text
        "\x00\xff",
    ],
)
def test_a_corrupt_entry_is_ignored_and_rewritten(project_dir, cache_home, garbage):
    path = project_dir / "matrix.yaml"
    open_project(path, cached=True)
    entry = cache_home / "gpuenv" / snapshot.entry_name(path)
    good = json.loads(entry.read_text())
    if garbage == "KEY":
        garbage = json.dumps({"format": 1, "key": good["key"]})
    elif garbage == "KEY-cells":
        garbage = json.dumps({**good, "cells": [{"name": 1}]})
    elif garbage == "KEY-contexts":
        garbage = json.dumps({**good, "contexts": {"x": {"Dockerfile": 5}}})
    entry.write_bytes(garbage.encode("utf-8", "surrogateescape"))
    project = open_project(path, cached=True)
    assert project._matrix is not None  # loaded, not trusted
    same(open_project(path), project)
    assert json.loads(entry.read_text())["key"] == good["key"]  # rewritten
    assert open_project(path, cached=True)._matrix is None


def test_bad_inputs_still_fail_as_before(project_dir):
    path = project_dir / "matrix.yaml"
    open_project(path, cached=True)
    (project_dir / "reqs.txt").write_text("-e .\n")
    from gpuenv.matrix.errors import MatrixError

    with pytest.raises(MatrixError, match="development mode"):
        open_project(path, cached=True)
    (project_dir / "matrix.lock").write_text("version: 7\n")
    (project_dir / "reqs.txt").write_text("six\n")
    project = open_project(path, cached=True)
    from gpuenv.matrix.errors import GpuenvError

    with pytest.raises(GpuenvError, match="not a gpuenv lock"):
        project.lock  # noqa: B018 (the lock's own error, every time: never snapshotted)
    assert open_project(path, cached=True)._matrix is not None


def test_an_unwritable_cache_only_costs_the_load(project_dir, cache_home):
    cache_home.mkdir()
    (cache_home / "gpuenv").write_text("not a directory")
    path = project_dir / "matrix.yaml"
    same(open_project(path), open_project(path, cached=True))


def test_dev_zero_as_matrix_or_lock_is_never_read_for_the_key(tmp_path):
    # The key digests only regular files; /dev/zero would otherwise fill memory.
    assert cache.file_digest(Path("/dev/zero")).startswith("special:")
    assert cache.file_digest(tmp_path / "nope") == "absent"
    os.mkfifo(tmp_path / "fifo")
    assert cache.file_digest(tmp_path / "fifo").startswith("special:")


def _imports_after(code: str, cwd: Path) -> set[str]:
    # A cache of this test's own (beside cwd, the same for both calls of a test): in the
    # user's, another test's write or prune could turn the second call's hit into a miss.
    cache = cwd.parent / f"{cwd.name}-cache"
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(cache)}
    probe = (
        "import sys\n"
        f"{code}\n"
        "heavy = ('docker', 'pydantic', 'jinja2', 'rich', 'yaml', 'requests')\n"
        "print('HEAVY:' + ' '.join(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stderr.splitlines() if x.startswith("HEAVY:")][-1]
    return set(line.removeprefix("HEAVY:").split())


def test_help_imports_nothing_heavy(tmp_path):
    code = "from gpuenv.cli import app\ntry:\n    app(['--help'])\nexcept SystemExit:\n    pass"
    assert _imports_after(code, tmp_path) == set()


def test_a_snapshot_hit_imports_no_schema_templates_or_yaml(project_dir):
    code = (
        "from pathlib import Path\n"
        "from gpuenv.building import plan\n"
        "from gpuenv.project.project import open_project\n"
        "p = open_project(Path('matrix.yaml'), cached=True)\n"
        "plan.prepare(p, p.cells)\n"
        "p.default_cell(False)"
    )
    assert "pydantic" in _imports_after(code, project_dir)  # the first time: a miss
    assert _imports_after(code, project_dir) == set()  # then nothing heavy


def test_an_edit_while_loading_writes_no_snapshot(project_dir, cache_home, monkeypatch):
    from gpuenv.project import project as projects

    path = project_dir / "matrix.yaml"
    real = projects._load

    def load_then_edit(p):
        loaded = real(p)
        _edit_matrix(project_dir)  # the file changes after it was read
        return loaded

    monkeypatch.setattr(projects, "_load", load_then_edit)
    assert open_project(path, cached=True).snapshot is None
    assert not (cache_home / "gpuenv" / snapshot.entry_name(path)).exists()
    monkeypatch.setattr(projects, "_load", real)
    assert open_project(path, cached=True)._matrix is not None  # a miss, then a snapshot
    assert open_project(path, cached=True)._matrix is None


def test_a_requirements_edit_after_loading_is_not_recorded_as_loaded(project_dir, monkeypatch):
    from gpuenv.project import project as projects

    path = project_dir / "matrix.yaml"
    real = projects._load

    def load_then_edit(p):
        loaded = real(p)
        _edit_reqs(project_dir)
        return loaded

    monkeypatch.setattr(projects, "_load", load_then_edit)
    open_project(path, cached=True)
    monkeypatch.setattr(projects, "_load", real)
    again = open_project(path, cached=True)
    assert again._matrix is not None, "the snapshot recorded the old bytes: must miss"
    assert again.cells[0].pip == ("six==1.16.0",)


def test_an_included_file_or_an_expanded_variable_changed_misses(project_dir, monkeypatch):
    path = project_dir / "matrix.yaml"
    monkeypatch.setenv("GPUENV_ALLOW_ENV", "ATTRS_PIN")
    monkeypatch.setenv("ATTRS_PIN", "25.1.0")
    (project_dir / "reqs.txt").write_text("six==1.17.0\n-r more.txt\nattrs==${ATTRS_PIN}\n")
    (project_dir / "more.txt").write_text("tomli==2.2.1\n")
    open_project(path, cached=True)
    assert open_project(path, cached=True)._matrix is None  # the snapshot stood in
    (project_dir / "more.txt").write_text("tomli==2.2.0\n")
    assert "tomli==2.2.0" in open_project(path, cached=True).cells[0].pip
    monkeypatch.setenv("ATTRS_PIN", "24.3.0")
    assert "attrs==24.3.0" in open_project(path, cached=True).cells[0].pip


def test_a_cell_with_hashed_lines_is_kept(project_dir):
    # A cell's `hashes` nests tuples, which JSON gives back as lists: the snapshot must
    # still equal what it was made from, or it is never written.
    (project_dir / "reqs.txt").write_text("six==1.17.0 --hash=sha256:" + "a" * 64 + "\n")
    path = project_dir / "matrix.yaml"
    assert open_project(path, cached=True).snapshot is not None
    hit = open_project(path, cached=True)
    assert hit._matrix is None
    same(open_project(path), hit)
