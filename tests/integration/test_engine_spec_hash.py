"""The spec hash is exact: what changes a cell's image rebuilds that cell, and nothing else.

How the cost is kept down (every cell installs TensorFlow, ~40 s on two cores, and a GPU
cell adds ~3 GB of CUDA wheels):

* The test matrix (``gpuenv-test/tf``: TF 2.21, Python 3.11, cpu + gpu) renders the same
  RUN lines as the shipped default cells, which the session builds first; so its builds are
  layer-cache hits and only the ENV/LABEL steps run.
* Template changes are real builds: a change confined to the GPU-only partial adds an ENV
  line (cache hits below it), a change to the shared runtime partial adds a LABEL line.
* A per-cell package change is a real build of that one cell; the pin is the one the CA
  test builds with, so that layer is usually in the cache too.
* A changed base image ID and a matrix-wide package change would rebuild every layer of the
  GPU cell (TF and 3 GB of wheels again). Those run gpuenv's real decision path
  (``build_cells`` against the real, built images) with an engine whose ``build`` records
  the request instead of building.
* A lock (``gpuenv lock``, real) makes every cell it covers rebuild: real decision path, as
  above, since building from it reinstalls everything. That a later change to one cell's
  lock entry touches that cell's spec hash only is checked on the hashes themselves.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

CPU = "tf2.21-py3.11-cpu"
GPU = "tf2.21-py3.11-cuda12.5-gpu"
REPOSITORY = "gpuenv-test/tf"


def _load(path: Path):
    from gpuenv import compat, matrix

    m = matrix.load(path)
    return m, compat.resolve(m).cells


def _build_api(path: Path, engine=None) -> dict:
    """build_cells through the Python API, as the CLI calls it; results by cell name."""
    from gpuenv import build
    from gpuenv import engine as engines

    m, cells = _load(path)
    request = build.BuildRequest(
        matrix=m, cells=cells, ca_bundle=build.ca_bundle_for(m, None), keep_going=True
    )
    results = build.build_cells(engine or engines.connect(), request, build.Reporter())
    return {r.cell.name: r for r in results}


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
    from gpuenv import render

    copy = tmp_path / "images"
    shutil.copytree(render.templates_dir(), copy)
    monkeypatch.setattr(render, "templates_dir", lambda: copy)
    return copy


class RecordingEngine:
    """The real engine for every question; a build is recorded and reported as failed."""

    def __init__(self) -> None:
        from gpuenv import engine

        self.real = engine.connect()
        self.builds = 0

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def build(self, context, **kwargs):
        from gpuenv.engine import BuildFailed

        self.builds += 1
        raise BuildFailed("recorded, not built")


def statuses(results: dict) -> dict[str, str]:
    return {name: getattr(r, "status", None) or r["status"] for name, r in results.items()}


def test_unchanged_matrix_rebuilds_nothing(baseline, gpuenv, parse_build):
    path, first = baseline
    again = parse_build(gpuenv("build", "-f", str(path), "--json"))
    assert statuses(again) == {CPU: "cached", GPU: "cached"}
    assert {n: r["image_id"] for n, r in again.items()} == {
        n: r["image_id"] for n, r in first.items()
    }


def test_gpu_only_template_change_rebuilds_only_the_gpu_cell(baseline, templates):
    from gpuenv import build, render

    path, first = baseline
    m, cells = _load(path)
    options = build.render_options(m, None)
    before = {c.name: render.render(c, options).dockerfile for c in cells}
    partial = templates / "partials" / "cuda-wheels.j2"
    partial.write_text(partial.read_text() + "ENV GPUENV_TEST_TEMPLATE=gpu-only\n")
    after = {c.name: render.render(c, options).dockerfile for c in cells}
    assert after[CPU] == before[CPU] and after[GPU] != before[GPU]  # the premise

    results = _build_api(path)
    assert statuses(results) == {CPU: "cached", GPU: "built"}
    assert results[CPU].image_id == first[CPU]["image_id"]
    assert results[GPU].image_id != first[GPU]["image_id"]
    from gpuenv import engine

    env = engine.connect().image(f"{REPOSITORY}:{GPU}")["Config"]["Env"]
    assert "GPUENV_TEST_TEMPLATE=gpu-only" in env


def test_shared_template_change_rebuilds_every_cell(baseline, templates):
    path, first = baseline
    partial = templates / "partials" / "runtime.j2"
    partial.write_text(partial.read_text() + "LABEL io.gpuenv.test-template=shared\n")
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
    results = parse_build(gpuenv("build", "-f", str(changed), "--json"))
    assert statuses(results) == {CPU: "built", GPU: "cached"}
    assert results[GPU]["image_id"] == first[GPU]["image_id"]
    assert results[CPU]["image_id"] != first[CPU]["image_id"]


def test_base_image_change_rebuilds_the_cells_on_it(baseline, monkeypatch):
    """Decision path only (see the module docstring): build_cells asks for a build of every
    cell on a base whose ID changed, and of none when the ID is the real one."""
    import gpuenv.base

    path, _first = baseline
    spy = RecordingEngine()
    assert statuses(_build_api(path, spy)) == {CPU: "cached", GPU: "cached"}
    assert spy.builds == 0
    monkeypatch.setattr(gpuenv.base, "ensure", lambda *a, **k: "sha256:" + "f" * 64)
    assert statuses(_build_api(path, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2


def test_matrix_wide_package_change_rebuilds_every_cell(baseline, write_test_matrix, extra_pip):
    spy = RecordingEngine()
    changed = write_test_matrix("matrix-global.yaml", pip=[extra_pip])
    assert statuses(_build_api(changed, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2


def test_lock_change_rebuilds_only_the_cells_whose_entry_changed(baseline, gpuenv):
    import dataclasses

    from gpuenv import build, engine, render
    from gpuenv import lock as locks

    path, _first = baseline
    gpuenv("lock", "-f", str(path))
    spy = RecordingEngine()
    assert statuses(_build_api(path, spy)) == {CPU: "failed", GPU: "failed"}
    assert spy.builds == 2

    m, cells = _load(path)
    options = build.render_options(m, None)
    base_id = engine.connect().image(cells[0].base.image)["Id"]

    def hashes() -> dict[str, str]:
        entries = build.lock_entries(m, cells)  # from the file on disk, drift-checked
        return {
            c.name: build.spec_hash(render.render(c, options, entries[c.name]), base_id)
            for c in cells
        }

    before = hashes()
    lock = locks.load(locks.lock_path(path))
    entry = lock.cells[CPU]
    # As if a re-lock had resolved one more (or another) package for the CPU cell only.
    edited = dataclasses.replace(entry, python_env=entry.python_env + "# re-locked\n")
    locks.write(dataclasses.replace(lock, cells={**lock.cells, CPU: edited}))
    after = hashes()
    assert after[GPU] == before[GPU]
    assert after[CPU] != before[CPU]


def test_spec_hash_is_deterministic_and_keyed_on_its_inputs(baseline):
    from gpuenv import build, engine, render

    path, _first = baseline
    m, cells = _load(path)
    ctx = render.render(cells[0], build.render_options(m, None))
    base_id = engine.connect().image(cells[0].base.image)["Id"]
    plain = build.spec_hash(ctx, base_id)
    again = render.render(_load(path)[1][0], build.render_options(m, None))
    assert build.spec_hash(again, base_id) == plain  # no timestamps, stable order
    assert build.spec_hash(ctx, base_id, "a lock entry") != plain
    assert build.spec_hash(ctx, "sha256:" + "f" * 64) != plain
