"""The build plan without an engine: what `gpuenv build --dry-run` says after one edit.

The "engine" is the shared fake holding the images an earlier plan would have built (their
spec hash and per-input digests as labels), so each test edits one input and reads the
reasons the next plan gives.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from gpuenv.building import plan, recipe, render
from gpuenv.engine.client import ImageInfo
from gpuenv.matrix import contract
from gpuenv.project.lockfile import CellLock, Lock
from gpuenv.project.project import open_project

BASE = "gpuenv/debian:bookworm"
BASE_ID = "sha256:" + "ba" * 32


def built(the_plan: plan.BuildPlan) -> dict[str, ImageInfo]:
    """The images a build of this plan leaves, as the engine would report them."""
    out = {BASE: ImageInfo(id=BASE_ID)}
    for i, p in enumerate(the_plan.cells):
        labels = {
            contract.SPEC_HASH: str(p.spec_hash),
            contract.INPUTS: json.dumps(p.inputs, sort_keys=True),
            contract.RECIPE: recipe.label(recipe.current()),
        }
        out[p.cell.image] = ImageInfo(id=f"sha256:{i:064d}", labels=labels)
    return out


def make(fake_engine, path, images=None, **kw) -> plan.BuildPlan:
    project = open_project(path)
    engine = fake_engine(local=images if images is not None else {BASE: ImageInfo(id=BASE_ID)})
    return plan.make_plan(engine, project, project.cells, **kw)


def actions(the_plan: plan.BuildPlan) -> dict[str, tuple[str, list[str]]]:
    return {p.cell.name: (p.action, p.reasons) for p in the_plan.cells}


CPU, GPU = "tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu"


@pytest.fixture
def matrix(write_matrix, minimal_matrix):
    return write_matrix(minimal_matrix, "matrix.yaml")


@pytest.fixture
def templates(tmp_path, monkeypatch):
    copy = tmp_path / "images"
    shutil.copytree(render.templates_dir(), copy)
    monkeypatch.setattr(render, "templates_dir", lambda: copy)
    render._digest_of.cache_clear()
    yield copy
    render._digest_of.cache_clear()


def test_nothing_built_means_build_every_cell(fake_engine, matrix):
    assert actions(make(fake_engine, matrix)) == {
        CPU: ("build", ["image missing"]),
        GPU: ("build", ["image missing"]),
    }


def test_a_missing_base_is_said_and_there_is_no_spec_hash_yet(fake_engine, matrix):
    the_plan = make(fake_engine, matrix, images={})
    assert [p.spec_hash for p in the_plan.cells] == [None, None]
    assert actions(the_plan)[CPU] == ("build", [f"base {BASE} is missing (it is made first)"])


def test_an_unchanged_matrix_is_up_to_date(fake_engine, matrix, tmp_path):
    first = make(fake_engine, matrix)
    again = make(fake_engine, matrix, images=built(first))
    assert actions(again) == {CPU: ("up-to-date", []), GPU: ("up-to-date", [])}


def test_no_cache_rebuilds_everything(fake_engine, matrix):
    first = make(fake_engine, matrix)
    again = make(fake_engine, matrix, images=built(first), no_cache=True)
    assert actions(again) == {CPU: ("build", ["--no-cache"]), GPU: ("build", ["--no-cache"])}


def test_a_gpu_only_partial_rebuilds_only_gpu_cells(fake_engine, matrix, templates):
    first = make(fake_engine, matrix)
    partial = templates / "partials" / "cuda-wheels.j2"
    partial.write_text(partial.read_text() + "ENV X=1\n")
    render._digest_of.cache_clear()
    assert actions(make(fake_engine, matrix, images=built(first))) == {
        CPU: ("up-to-date", []),
        GPU: ("build", ["template (images/) changed"]),
    }


def test_a_new_base_rebuilds_the_cells_on_it(fake_engine, matrix):
    images = built(make(fake_engine, matrix))
    images[BASE] = ImageInfo(id="sha256:" + "ff" * 32)
    assert actions(make(fake_engine, matrix, images=images)) == {
        CPU: ("build", ["base image changed"]),
        GPU: ("build", ["base image changed"]),
    }


def test_a_package_for_one_cell_rebuilds_that_cell(fake_engine, write_matrix, minimal_matrix):
    path = write_matrix(minimal_matrix, "matrix.yaml")
    images = built(make(fake_engine, path))
    include = (
        '  include:\n    - {tensorflow: "2.21", python: "3.11", variant: cpu, pip: [six==1.17.0]}\n'
    )
    text = minimal_matrix.replace("  variant: [cpu, gpu]\n", "  variant: [cpu, gpu]\n" + include)
    path.write_text(text)
    assert actions(make(fake_engine, path, images=images)) == {
        CPU: ("build", ["packages changed"]),
        GPU: ("up-to-date", []),
    }


def test_a_changed_lock_entry_rebuilds_only_that_cell(fake_engine, matrix, monkeypatch):
    project = open_project(matrix)
    from gpuenv.project import lockfile

    date = "2026-11-01T00:00:00Z"
    entries = {
        c.name: CellLock(lockfile.inputs_digest(c, date), f"{c.framework}==2.21.0 --hash=x\n",
                         "nvidia-cudnn-cu12==9.3.0.75 --hash=y\n" if c.is_gpu else "")
        for c in project.cells
    }  # fmt: skip
    lockfile.write(Lock(project.lock_path, date, entries))
    images = built(make(fake_engine, matrix))
    edited = dataclasses.replace(entries[CPU], python_env=entries[CPU].python_env + "six==1\n")
    lockfile.write(Lock(project.lock_path, date, {**entries, CPU: edited}))
    assert actions(make(fake_engine, matrix, images=images)) == {
        CPU: ("build", ["lock entry changed"]),
        GPU: ("up-to-date", []),
    }


def test_an_image_from_an_older_gpuenv_says_so(fake_engine, matrix):
    images = built(make(fake_engine, matrix))
    images[f"acme/gpuenv:{CPU}"] = ImageInfo(id="sha256:old", labels={contract.SPEC_HASH: "0"})
    assert actions(make(fake_engine, matrix, images=images))[CPU] == (
        "build",
        ["spec hash differs (the image records no inputs: built by an older gpuenv)"],
    )


def test_a_registry_turns_builds_into_pulls_first(fake_engine, matrix):
    # Only with a way to vet what it pulls (a verify key): issue 35, M1.
    registry = "127.0.0.1:5000/team/gpuenv"
    assert make(fake_engine, matrix, pull_from=registry).cells[0].action == "build"
    the_plan = make(fake_engine, matrix, pull_from=registry, vet=lambda r, s: (r, "sha256:x"))
    p = the_plan.cells[0]
    assert p.action == "pull" and p.reasons == ["image missing"]
    assert p.pull_ref == f"127.0.0.1:5000/team/gpuenv:{CPU}"
    assert plan.describe(the_plan)[0].startswith(f"{CPU}: pull 127.0.0.1:5000/team/gpuenv:")


def test_plan_json_names_action_and_reasons(fake_engine, matrix):
    doc = make(fake_engine, matrix).to_json()
    assert [c["action"] for c in doc["cells"]] == ["build", "build"]
    assert set(doc["cells"][0]) >= {"cell", "image", "action", "reasons", "spec_hash", "base_id"}
