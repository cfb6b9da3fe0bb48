"""gpuenv's recipe (gpuenv/building/recipe.py): the digest, its table, and the one line each
of a build, `gpuenv lock --check`, `gpuenv --version` and `gpuenv verify --rebuild` says
when a lock or an image was made by another recipe."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_runner import CliRunner

import gpuenv
from gpuenv.building import builder, recipe
from gpuenv.building import plan as plans
from gpuenv.building.results import Reporter
from gpuenv.catalog import compat
from gpuenv.cli import app
from gpuenv.engine.client import ImageInfo
from gpuenv.matrix import contract
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.lockfile import CellLock, Lock, Recipe
from gpuenv.project.project import open_project
from gpuenv.publish.attest import provenance, verify

DATE = "2026-11-01T00:00:00Z"
BASE = "gpuenv/debian:bookworm"
OLD = Recipe("0.1.0", "sha256:" + "ab" * 32)


def test_the_table_records_this_versions_recipe():
    """Fails after a template or build module changed without a new version: the images of
    a lock would change while gpuenv's version says nothing changed."""
    now, table = recipe.current(), recipe.recorded()
    assert table.get(now.gpuenv) == now.digest, (
        f"gpuenv {now.gpuenv}'s recipe is {now.digest}, but {recipe.TABLE} records "
        f"{table.get(now.gpuenv) or 'nothing'} for it: what a build renders or runs changed. "
        "Bump __version__ in gpuenv/__init__.py, then run: python -m gpuenv.building.recipe "
        "--record (it adds the line)"
    )


def _copy_recipe(to: Path, mode: int = 0o644, mtime: int = 0) -> tuple[Path, Path]:
    """The recipe's files elsewhere (templates dir, package root), with other mtimes and
    permission bits."""
    images = to / "images"
    shutil.copytree(recipe.templates_dir(), images)
    for name in recipe.MODULES:
        (to / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(recipe.PACKAGE.parent / name, to / name)
    for path in to.rglob("*"):
        if path.is_file():
            path.chmod(mode)
            os.utime(path, (mtime, mtime))
    return images, to / "gpuenv"


def test_the_digest_is_of_names_and_bytes_not_of_where_or_when(tmp_path):
    images, package = _copy_recipe(tmp_path / "elsewhere", 0o600, 86400)
    (images / ".Dockerfile.j2.swp").write_text("an editor's swap file")
    assert recipe.digest_of(recipe.recipe_files(images, package)) == recipe.current().digest


def test_one_byte_of_a_template_or_a_build_module_changes_it(tmp_path):
    images, package = _copy_recipe(tmp_path / "copy")
    before = recipe.digest_of(recipe.recipe_files(images, package))
    partial = images / "partials" / "runtime.j2"
    partial.write_bytes(partial.read_bytes() + b" ")
    after_template = recipe.digest_of(recipe.recipe_files(images, package))
    normalise = package / "building" / "reproducible.py"
    normalise.write_bytes(normalise.read_bytes() + b"#")
    after_module = recipe.digest_of(recipe.recipe_files(images, package))
    assert len({before, after_template, after_module}) == 3


def test_record_writes_this_versions_line_and_keeps_the_others(tmp_path):
    table = tmp_path / "recipes.yaml"
    table.write_text(
        f'# history\n"0.1.0": {OLD.digest}\n"{gpuenv.__version__}": sha256:{"0" * 64}\n'
    )
    line = recipe.record(table)
    assert line == f'"{gpuenv.__version__}": {recipe.current().digest}'
    assert table.read_text() == f'# history\n"0.1.0": {OLD.digest}\n{line}\n'
    assert recipe.recorded(table) == {
        "0.1.0": OLD.digest,
        gpuenv.__version__: recipe.current().digest,
    }


def test_the_label_round_trips_and_anything_else_is_no_recipe():
    now = recipe.current()
    assert recipe.from_label(recipe.label(now)) == now
    for text in (None, "", "0.2.0", "0.2.0 sha256:abc", "sha256:" + "a" * 64):
        assert recipe.from_label(text) is None


def test_version_prints_the_version_and_the_recipe():
    result = CliRunner().invoke(app, ["--version"])
    now = recipe.current()
    assert result.exit_code == 0
    assert result.output == f"gpuenv {now.gpuenv} (recipe {now.digest[:19]})\n"


# --------------------------------------------------------------------------- the lock


@pytest.fixture
def locked(write_matrix, tmp_path) -> Path:
    """A matrix and its lock (this gpuenv's recipe), every cell matching."""
    path = write_matrix(name="matrix.yaml")
    cells = compat.resolve(matrix.load(path)).cells
    entries = {
        c.name: CellLock(lockfile.inputs_digest(c, DATE), "six==1.17.0\n", "") for c in cells
    }
    lockfile.write(Lock(path.with_suffix(".lock"), DATE, entries, recipe=recipe.current()))
    return path


def relocked_by(path: Path, by: Recipe | None) -> Lock:
    lock = lockfile.load(path.with_suffix(".lock"))
    assert lock is not None
    lock.recipe = by
    lockfile.write(lock)
    return lock


def test_a_fresh_lock_carries_its_recipe_and_an_old_one_loads_without(locked):
    path = locked.with_suffix(".lock")
    now = recipe.current()
    assert f"recipe:\n  gpuenv: {now.gpuenv}\n  digest: {now.digest}\n" in path.read_text()
    loaded = lockfile.load(path)
    assert loaded is not None and loaded.recipe == now
    path.write_text(
        path.read_text().replace(f"recipe:\n  gpuenv: {now.gpuenv}\n  digest: {now.digest}\n", "")
    )
    old = lockfile.load(path)
    assert old is not None and old.recipe is None and old.cells == loaded.cells


def test_a_malformed_recipe_is_one_error_naming_the_lock(locked):
    path = locked.with_suffix(".lock")
    path.write_text(path.read_text().replace("digest: sha256:", "digest: md5:"))
    with pytest.raises(
        GpuenvError, match=r"matrix.lock: not a gpuenv lock \(recipe: .*gpuenv lock"
    ):
        lockfile.load(path)


def test_the_lock_note(locked):
    assert recipe.lock_note(relocked_by(locked, recipe.current())) is None
    now = recipe.current()
    assert recipe.lock_note(relocked_by(locked, OLD)) == (
        f"matrix.lock was written by gpuenv 0.1.0 (recipe sha256:abababababab); this is "
        f"gpuenv {now.gpuenv} (recipe {now.digest[:19]}): images will not match those built "
        "then; pip install gpuenv==0.1.0 rebuilds them, gpuenv lock records this recipe"
    )
    assert recipe.lock_note(relocked_by(locked, None)) == (
        "matrix.lock records no recipe (written before gpuenv 0.2.0); gpuenv lock adds it"
    )
    # The same version with another digest is a modified checkout: no release rebuilds it.
    modified = Recipe(now.gpuenv, OLD.digest)
    assert "pip install" not in str(recipe.lock_note(relocked_by(locked, modified)))


@pytest.fixture
def engine(fake_engine, monkeypatch):
    from gpuenv.engine import client as engines

    fake = fake_engine(local={BASE: ImageInfo(id="sha256:" + "ba" * 32)})
    monkeypatch.setattr(engines, "connect", lambda *a, **kw: fake)
    return fake


def test_lock_check_passes_under_the_locks_recipe(locked, engine):
    result = CliRunner().invoke(app, ["lock", "--check", "-f", str(locked)])
    assert result.exit_code == 0, result.output
    assert result.output.endswith("2 cell(s) match the matrix\n")


@pytest.mark.parametrize(
    ("by", "says"),
    [
        (OLD, "was written by gpuenv 0.1.0"),
        (None, "records no recipe (written before gpuenv 0.2.0)"),
    ],
)
def test_lock_check_fails_in_one_line_under_another_recipe_or_none(locked, engine, by, says):
    relocked_by(locked, by)
    result = CliRunner().invoke(app, ["lock", "--check", "-f", str(locked)])
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith("error: matrix.lock ") and says in line and "gpuenv lock" in line


def test_a_drifted_lock_names_its_recipe_beside_the_drift(locked, engine):
    relocked_by(locked, OLD)
    locked.write_text(locked.read_text().replace('"2.21"', '"2.20"'))
    result = CliRunner().invoke(app, ["lock", "--check", "-f", str(locked)])
    assert result.exit_code == 1
    recipe_lines = [x for x in result.output.splitlines() if "gpuenv 0.1.0" in x]
    assert len(recipe_lines) == 1 and recipe_lines[0].startswith("recipe: matrix.lock was")


class Said(Reporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


@pytest.mark.parametrize("by", [OLD, None])
def test_a_build_says_it_once_for_every_cell(locked, fake_engine, monkeypatch, by):
    relocked_by(locked, by)
    project = open_project(locked)
    assert len(project.cells) == 2
    # The plan itself is test_plan.py's: here, only what the build says before it.
    monkeypatch.setattr(plans, "prepare", lambda project, cells: {})
    monkeypatch.setattr(plans, "make_plan", lambda *a, **kw: plans.BuildPlan([], False, None))
    said = Said()
    builder.plan_and_build(
        fake_engine(), project, project.cells, said, ca_bundle=None, offline=True
    )
    assert said.lines == [recipe.lock_note(project.lock)] and said.lines[0]


def test_a_build_under_the_locks_recipe_says_nothing(locked, fake_engine, monkeypatch):
    project = open_project(locked)
    monkeypatch.setattr(plans, "prepare", lambda project, cells: {})
    monkeypatch.setattr(plans, "make_plan", lambda *a, **kw: plans.BuildPlan([], False, None))
    said = Said()
    builder.plan_and_build(
        fake_engine(), project, project.cells, said, ca_bundle=None, offline=True
    )
    assert said.lines == []


# --------------------------------------------------------------------------- images


def test_a_rebuild_names_the_gpuenv_that_built_the_image(fake_engine, write_matrix):
    """The plan's reasons, when a cell rebuilds for another reason and its image was built
    by another recipe; the spec hash itself leaves the recipe out."""
    path = write_matrix(name="matrix.yaml")
    project = open_project(path)
    engine = fake_engine(local={BASE: ImageInfo(id="sha256:" + "ba" * 32)})
    first = plans.make_plan(engine, project, project.cells)
    p = first.cells[0]
    inputs = {**p.inputs, "packages": "edited"}
    labels = {
        contract.SPEC_HASH: "other",
        contract.INPUTS: json.dumps(inputs),
        contract.RECIPE: recipe.label(OLD),
    }
    engine = fake_engine(
        local={
            BASE: ImageInfo(id="sha256:" + "ba" * 32),
            p.cell.image: ImageInfo(id="sha256:1", labels=labels),
        }
    )
    (again, *_) = plans.make_plan(engine, project, project.cells).cells
    assert again.reasons == [f"built by {OLD}; this is {recipe.current()}", "packages changed"]
    labels[contract.RECIPE] = recipe.label(recipe.current())
    (same, *_) = plans.make_plan(engine, project, project.cells).cells
    assert same.reasons == ["packages changed"]


def _report(recipe_label: str | None, attested: str = "0.1.0") -> verify.Report:
    facts = provenance.BuildFacts(
        cell="tf2.21-py3.11-cpu", spec_hash="e" * 64, image_id="sha256:" + "c" * 64,
        matrix_path="matrix.yaml", matrix_digest="", lock_digest="",
        base_name=BASE, base_id="sha256:" + "b" * 64, gpuenv_version=attested,
        builder_id="urn:gpuenv:builder:local", reproducible=True,
        recipe=recipe_label or "",
    )  # fmt: skip
    st = provenance.Statement(provenance.SLSA_PROVENANCE, [], provenance.slsa_predicate(facts))
    report = verify.Report("127.0.0.1:5000/t/x:tf2.21-py3.11-cpu", "sha256:d", "sha256:c", "api")
    report.verified.append(verify.Verified("sha256:a", st))
    return report


def test_the_provenance_records_the_recipe_only_when_the_image_has_one():
    internal = lambda r: _report(r).provenance().predicate["buildDefinition"]["internalParameters"]  # noqa: E731
    assert internal(recipe.label(OLD))["recipe"] == recipe.label(OLD)
    assert "recipe" not in internal(None)


@pytest.mark.parametrize(
    ("recorded", "says"),
    [
        (
            recipe.label(OLD),
            "tf2.21-py3.11-cpu was built by gpuenv 0.1.0 (recipe sha256:abababababab); this is ",
        ),
        (
            None,
            "records no recipe: it was built by a gpuenv before 0.2.0 (attested by gpuenv 0.1.0)",
        ),
    ],
)
def test_verify_rebuild_names_the_gpuenv_that_reproduces_the_image(
    locked, fake_engine, recorded, says
):
    """The recipe is a label of the image, so no other recipe gives its ID: the error names
    the gpuenv that does, after the rebuild (which names the layer and files that differ;
    here the published image cannot be pulled, and the details say so)."""
    from gpuenv.building.results import CellResult

    built = []

    def build(cells, **kw):
        built.append(cells)
        return [CellResult(cells[0], status="built", image_id="sha256:" + "f" * 64)]

    engine = fake_engine(remote={"127.0.0.1:5000/t/x@sha256:d": GpuenvError("manifest unknown")})
    with pytest.raises(GpuenvError) as caught:
        verify.rebuild(engine, open_project(locked), _report(recorded), build)
    assert "not reproduced" in caught.value.message and says in caught.value.message
    assert caught.value.message.endswith("pip install gpuenv==0.1.0 and rebuild")
    assert len(built) == 1
    assert engine.pulled == ["127.0.0.1:5000/t/x@sha256:d"]
    assert "could not be had" in caught.value.details[0]
    assert "manifest unknown" in caught.value.details[0]


def test_verify_rebuild_under_the_same_recipe_builds(locked, fake_engine):
    built = []

    def build(cells, **kw):
        built.append(cells)
        raise GpuenvError("built")

    with pytest.raises(GpuenvError, match="built"):
        verify.rebuild(
            fake_engine(), open_project(locked), _report(recipe.label(recipe.current())), build
        )
    assert len(built) == 1
