"""The spec hash is exact: what changes a cell's image rebuilds that cell, and nothing else.

How the cost is kept down (every cell installs TensorFlow, ~40 s on two cores, and a GPU
cell adds ~3 GB of CUDA wheels):

* The test matrix (``gpuenv-test/tf``: TF 2.21, Python 3.11, cpu + gpu) renders the same
  install steps as the shipped default cells and resolves to the same wheels, which the
  session builds first; the engine keys those steps' cache on the mounted files, so its
  builds are layer-cache hits and only the ENV/LABEL steps run.
* Template changes are real builds: a change confined to the GPU-only partial adds an ENV
  line (cache hits below it), a change to the shared runtime partial adds a LABEL line.
* A per-cell package change is a real build of that one cell; the pin is one TensorFlow's
  resolution already holds (support/cells.py: EXTRA_PIP), so the wheels mounted are the
  same and that layer is usually in the cache too.
* A changed base image ID and a matrix-wide package change would rebuild every layer of the
  GPU cell (TF and 3 GB of wheels again). Those run gpuenv's real decision path (the build
  plan, the client-side resolution and fetch, and its execution against the real, built
  images) with an engine whose builds are recorded instead of run.
* A lock (``gpuenv lock``, real) makes every cell it covers rebuild: real decision path, as
  above, since building from it reinstalls everything. That a later change to one cell's
  lock entry touches that cell's spec hash only is checked on the hashes themselves.

Each change is also put to ``gpuenv build --dry-run`` (the CLI with --json where the change
is in a file; the same plan function in-process where the test patches the templates or
the base): it must name exactly the affected cells, and the input that changed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.cells import test_repository

from gpuenv.store.wheelhouse import index_key

pytestmark = pytest.mark.engine

CPU = "tf2.21-py3.11-cpu"
GPU = "tf2.21-py3.11-cuda12.5-gpu"
REPOSITORY = test_repository("tf")


def _load(path: Path):
    from gpuenv.project.project import open_project

    project = open_project(path)
    return project, project.cells


def _build_api(path: Path, engine=None) -> dict:
    """A build through the Python API, as the CLI calls it; results by cell name."""
    from gpuenv.building import builder as build
    from gpuenv.engine import client as engines

    project, cells = _load(path)
    bundle = project.ca_bundle(None)
    eng = engine or engines.connect()
    results = build.plan_and_build(
        eng, project, cells, build.Reporter(), ca_bundle=bundle, keep_going=True
    )
    return {r.cell.name: r for r in results}


def _plan(path: Path, engine=None) -> dict[str, dict]:
    """`gpuenv build --dry-run --json`, in-process (sees monkeypatched templates)."""
    from gpuenv.building import plan
    from gpuenv.engine import client as engines

    project, cells = _load(path)
    the_plan = plan.make_plan(engine or engines.connect(), project, cells)
    return {p["cell"]: p for p in the_plan.to_json()["cells"]}


def _dry_run(gpuenv, path: Path) -> dict[str, dict]:
    """`gpuenv build --dry-run --json` through the CLI."""
    import json

    doc = json.loads(gpuenv("build", "-f", str(path), "--dry-run", "--json").stdout)
    return {p["cell"]: p for p in doc["cells"]}


def actions(plan: dict[str, dict]) -> dict[str, tuple[str, list[str]]]:
    return {name: (p["action"], p["reasons"]) for name, p in plan.items()}


@pytest.fixture
def baseline(write_test_matrix, shipped_gpu, gpuenv, parse_build):
    """The test matrix built (cache hits on the shipped cells' layers); its path and results."""
    path = write_test_matrix()
    results = parse_build(gpuenv("build", "-f", str(path), "--json"))
    assert {r["status"] for r in results.values()} <= {"built", "cached"}, results
    return path, results


@pytest.fixture
def templates(tmp_path, monkeypatch):
    """A private copy of images/ that gpuenv renders from (the repository's stays untouched)."""
    from gpuenv.building import render

    copy = tmp_path / "images"
    shutil.copytree(render.templates_dir(), copy)
    monkeypatch.setattr(render, "templates_dir", lambda: copy)
    return copy


class RecordingEngine:
    """The real engine for every question; a build is recorded and reported as failed.
    With `base_id` set, the bookworm base reports that ID (as if it had been rebuilt)."""

    def __init__(self, base_id: str | None = None) -> None:
        from gpuenv.engine import client as engine

        self.real = engine.connect()
        self.builds = 0
        self.base_id = base_id

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def image(self, ref: str):
        import dataclasses

        info = self.real.image(ref)
        if self.base_id and info is not None and ref == "gpuenv/debian:bookworm":
            return dataclasses.replace(info, id=self.base_id)
        return info

    def build_directory(self, build, **kwargs):
        """Where every build goes (gpuenv/building/builder.py: _build), with its context
        assembled."""
        from gpuenv.engine.client import BuildFailed

        directory = build.directory
        assert (directory / "Dockerfile").is_file() and (directory / "python-env").is_dir()
        self.builds += 1
        raise BuildFailed("recorded, not built")

    def build(self, context, **kwargs):
        raise AssertionError("gpuenv builds context directories now (build_directory)")


def statuses(results: dict) -> dict[str, str]:
    return {name: getattr(r, "status", None) or r["status"] for name, r in results.items()}


def test_unchanged_matrix_rebuilds_nothing(baseline, gpuenv, parse_build):
    path, first = baseline
    assert actions(_dry_run(gpuenv, path)) == {CPU: ("up-to-date", []), GPU: ("up-to-date", [])}
    again = parse_build(gpuenv("build", "-f", str(path), "--json"))
    assert statuses(again) == {CPU: "cached", GPU: "cached"}
    assert {n: r["image_id"] for n, r in again.items()} == {
        n: r["image_id"] for n, r in first.items()
    }


def test_gpu_only_template_change_rebuilds_only_the_gpu_cell(baseline, templates):
    from gpuenv.building import render

    path, first = baseline
    project, cells = _load(path)
    settings = project.settings
    before = {c.name: render.render(c, index_key(settings.indexes(c))).dockerfile for c in cells}
    partial = templates / "partials" / "cuda-wheels.j2"
    partial.write_text(partial.read_text() + "ENV GPUENV_TEST_TEMPLATE=gpu-only\n")
    render._digest_of.cache_clear()
    after = {c.name: render.render(c, index_key(settings.indexes(c))).dockerfile for c in cells}
    assert after[CPU] == before[CPU] and after[GPU] != before[GPU]  # the premise
    assert actions(_plan(path)) == {
        CPU: ("up-to-date", []),
        GPU: ("build", ["template (images/) changed"]),
    }

    results = _build_api(path)
    assert statuses(results) == {CPU: "cached", GPU: "built"}
    assert results[CPU].image_id == first[CPU]["image_id"]
    assert results[GPU].image_id != first[GPU]["image_id"]
    from gpuenv.engine import client as engine

    env = engine.connect().image(f"{REPOSITORY}:{GPU}").env
    assert "GPUENV_TEST_TEMPLATE=gpu-only" in env


def test_shared_template_change_rebuilds_every_cell(baseline, templates):
    path, first = baseline
    partial = templates / "partials" / "runtime.j2"
    partial.write_text(partial.read_text() + "LABEL io.gpuenv.test-template=shared\n")
    from gpuenv.building import render

    render._digest_of.cache_clear()
    reason = ["template (images/) changed"]
    assert actions(_plan(path)) == {CPU: ("build", reason), GPU: ("build", reason)}
    results = _build_api(path)
    assert statuses(results) == {CPU: "built", GPU: "built"}
    for name in (CPU, GPU):
        assert results[name].image_id != first[name]["image_id"]


def test_cell_package_change_rebuilds_only_that_cell(
    baseline, write_test_matrix, extra_pip, gpuenv, parse_build
):
    _path, first = baseline
    include = {"tensorflow": "2.21", "python": "3.11", "variant": "cpu", "pip": [extra_pip]}
    changed = write_test_matrix("matrix-package.yaml", include=[include])
    assert actions(_dry_run(gpuenv, changed)) == {
        CPU: ("build", ["packages changed"]),
        GPU: ("up-to-date", []),
    }
    results = parse_build(gpuenv("build", "-f", str(changed), "--json"))
    assert statuses(results) == {CPU: "built", GPU: "cached"}
    assert results[GPU]["image_id"] == first[GPU]["image_id"]
    assert results[CPU]["image_id"] != first[CPU]["image_id"]


def test_base_image_change_rebuilds_the_cells_on_it(baseline):
    """Decision path only (see the module docstring): the build asks for a build of every
    cell on a base whose ID changed, and of none when the ID is the real one."""
    path, _first = baseline
    spy = RecordingEngine()
    assert statuses(_build_api(path, spy)) == {CPU: "cached", GPU: "cached"}
    assert spy.builds == 0
    spy = RecordingEngine(base_id="sha256:" + "f" * 64)
    reason = ["base image changed"]
    assert actions(_plan(path, spy)) == {CPU: ("build", reason), GPU: ("build", reason)}
    assert statuses(_build_api(path, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2


def test_matrix_wide_package_change_rebuilds_every_cell(
    baseline, write_test_matrix, extra_pip, gpuenv
):
    spy = RecordingEngine()
    changed = write_test_matrix("matrix-global.yaml", pip=[extra_pip])
    reason = ["packages changed"]
    assert actions(_dry_run(gpuenv, changed)) == {CPU: ("build", reason), GPU: ("build", reason)}
    assert statuses(_build_api(changed, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2


def test_lock_change_rebuilds_only_the_cells_whose_entry_changed(baseline, gpuenv):
    import dataclasses

    from gpuenv.building import lock as locks
    from gpuenv.building import plan, render
    from gpuenv.engine import client as engine
    from gpuenv.project import lockfile

    path, _first = baseline
    gpuenv("lock", "-f", str(path))
    reason = ["lock entry changed"]
    assert actions(_dry_run(gpuenv, path)) == {CPU: ("build", reason), GPU: ("build", reason)}
    spy = RecordingEngine()
    assert statuses(_build_api(path, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2

    settings = _load(path)[0].settings
    base_id = engine.connect().image("gpuenv/debian:bookworm").id

    def hashes() -> dict[str, str]:
        project, cells = _load(path)  # the lock is read from the file on disk, drift-checked
        entries = plan.lock_entries(project, cells)
        return {
            c.name: plan.spec_hash(
                render.render(c, index_key(settings.indexes(c)), entries[c.name]).digest, base_id
            )
            for c in cells
        }

    before = hashes()
    lock = lockfile.load(locks.lock_path(path))
    entry = lock.cells[CPU]
    # As if a re-lock had resolved one more (or another) package for the CPU cell only.
    edited = dataclasses.replace(entry, python_env=entry.python_env + "# re-locked\n")
    lockfile.write(dataclasses.replace(lock, cells={**lock.cells, CPU: edited}))
    after = hashes()
    assert after[GPU] == before[GPU]
    assert after[CPU] != before[CPU]
    assert actions(_dry_run(gpuenv, path))[CPU] == ("build", reason)


def test_spec_hash_is_deterministic_and_keyed_on_its_inputs(baseline):
    from gpuenv.building import plan, render
    from gpuenv.engine import client as engine

    path, _first = baseline
    project, cells = _load(path)
    settings = project.settings
    ctx = render.render(cells[0], index_key(settings.indexes(cells[0])))
    base_id = engine.connect().image(cells[0].base.image).id
    plain = plan.spec_hash(ctx.digest, base_id)
    again = render.render(_load(path)[1][0], index_key(settings.indexes(_load(path)[1][0])))
    assert plan.spec_hash(again.digest, base_id) == plain  # no timestamps, stable order
    assert plan.spec_hash(ctx.digest, "sha256:" + "f" * 64) != plain
