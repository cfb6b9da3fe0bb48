"""The shipped matrix's default CPU and GPU cells, built by `gpuenv build` on the real engine."""

from __future__ import annotations

import json
import re

import pytest

from gpuenv.store.wheelhouse import index_key

pytestmark = pytest.mark.engine

OCI = "org.opencontainers.image"


@pytest.fixture(params=["shipped_cpu", "shipped_gpu"], ids=["cpu", "gpu"])
def shipped(request: pytest.FixtureRequest, shipped_cells) -> dict:
    """One built shipped cell: its build result plus its `gpuenv matrix --json` entry."""
    result = request.getfixturevalue(request.param)
    return {**result, "matrix": shipped_cells[result["cell"]]}


def test_build_result_names_the_image(shipped, inspect):
    info = inspect(shipped["image"])
    assert info is not None, f"{shipped['image']} is not tagged after a successful build"
    assert info["Id"] == shipped["image_id"]
    assert shipped["size"] == info["Size"]


def test_labels_match_the_matrix(shipped, inspect):
    cell = shipped["matrix"]
    labels = inspect(shipped["image"])["Config"]["Labels"]
    expected = {
        "io.gpuenv.cell": cell["name"],
        "io.gpuenv.variant": cell["variant"],
        "io.gpuenv.python": cell["python"],
        "io.gpuenv.framework": cell["framework"],
        "io.gpuenv.framework-version": cell["framework_version"],
        "io.gpuenv.cuda": cell["cuda"] or "",
        "io.gpuenv.cudnn": cell["cudnn"] or "",
        f"{OCI}.title": cell["image"],
        f"{OCI}.version": cell["name"],
        f"{OCI}.base.name": cell["base_image"],
    }
    assert {k: labels.get(k) for k in expected} == expected
    assert cell["framework_version"] in labels[f"{OCI}.description"]
    if cell["variant"] == "gpu":
        assert cell["cuda_release"] in labels[f"{OCI}.description"]
        assert cell["wheels"]["nvidia-cudnn-cu12"] in labels[f"{OCI}.description"]
    assert re.fullmatch(r"[0-9a-f]{64}", labels["io.gpuenv.spec-hash"])


def test_spec_hash_label_is_what_gpuenv_computes(shipped, inspect, shipped_matrix):
    """The label is the hash of the rendered context and the base image's ID, recomputed here
    through the Python API from the same matrix file."""
    from gpuenv.building import plan, render
    from gpuenv.engine import client as engine
    from gpuenv.matrix import contract
    from gpuenv.project.project import open_project

    project = open_project(shipped_matrix)
    cell = project.one_cell(shipped["cell"], "-i")
    # No CA bundle in it: the bundle serves gpuenv's own fetches and never reaches a build.
    ctx = render.render(cell, index_key(project.settings.indexes(cell)))
    base_id = engine.connect().image(cell.base.image).id
    labels = inspect(shipped["image"])["Config"]["Labels"]
    assert labels[contract.SPEC_HASH] == plan.spec_hash(ctx.digest, base_id)


def test_tensorflow_imports_and_user_is_not_root(shipped, in_image, inspect):
    cell = shipped["matrix"]
    code = (
        "import json, os, sys, tensorflow as tf; "
        "print(json.dumps({'tf': tf.__version__, 'uid': os.getuid(), "
        "'python': '%d.%d' % sys.version_info[:2], 'exe': sys.executable}))"
    )
    out = in_image(shipped["image"], "python", "-c", code)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["tf"] == cell["framework_version"]
    assert got["python"] == cell["python"]
    assert got["exe"].startswith("/opt/venv/")  # `python` on the PATH is the cell's env
    assert got["uid"] != 0
    user = inspect(shipped["image"])["Config"]["User"]
    assert user and user.split(":")[0] not in ("", "0", "root")


def test_gpu_image_holds_the_pinned_cuda_wheels(shipped_gpu, shipped_cells, in_image):
    wanted = shipped_cells[shipped_gpu["cell"]]["wheels"]
    assert wanted, "a GPU cell without pinned nvidia wheels"
    code = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    )
    out = in_image(shipped_gpu["image"], "python", "-c", code, *sorted(wanted))
    assert json.loads(out.strip().splitlines()[-1]) == wanted


@pytest.mark.parametrize("which", ["shipped_cpu", "shipped_gpu"])
def test_no_driver_files_in_the_image(which, request, in_image):
    """The driver comes from the host at run time; nothing of it may be baked in. Run as root
    so no directory is unreadable to find; -xdev stays on the image's own filesystem."""
    image = request.getfixturevalue(which)["image"]
    out = in_image(
        image,
        "find", "/", "-xdev", "(", "-name", "libcuda.so*", "-o", "-name", "libnvidia-*", ")",
        user="0",
    )  # fmt: skip
    assert out.split() == []


def test_second_build_is_a_noop(shipped_cpu, shipped_gpu, gpuenv, parse_build, shipped_matrix):
    cells = [shipped_cpu["cell"], shipped_gpu["cell"]]
    results = parse_build(gpuenv("build", "-f", str(shipped_matrix), *cells, "--json"))
    for before in (shipped_cpu, shipped_gpu):
        again = results[before["cell"]]
        assert again["status"] == "cached", again
        assert again["image_id"] == before["image_id"]
        assert again["seconds"] < 1.0, again
