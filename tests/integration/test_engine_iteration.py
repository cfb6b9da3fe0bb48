"""Adding a package to a locked cell rebuilds one small layer, not the framework (issue 28).

One locked CPU cell (JAX 0.7, Python 3.11: the smallest framework, ~120 MB of wheels, so a
build without the cache is cheap), built without packages of its own, then with a small
pure-Python package added (tomli-w, not a JAX dependency) and re-locked (a fixed
exclude-newer date, so nothing else moves). The
rebuilt image must keep every layer up to the framework's, add the packages layer (under a
megabyte: its own bytecode only, not the framework's rewritten) and the lock's copy, differ
in size by under 1 %, and differ, for `gpuenv diff`, by exactly that package. Two
`--reproducible` builds of it, the second without the cache, give one image ID.
Rebuild times and registry bytes are measured in benchmarks/iteration.py, not asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cells import BUILD_TIMEOUT, test_repository

pytestmark = pytest.mark.engine

REPOSITORY = test_repository("iteration")
CELL = "jax0.7-py3.11-cpu"
PACKAGE, VERSION = "tomli-w", "1.2.0"  # 6 kB, pure Python, not in JAX's closure
# BuildKit's empty layer (WORKDIR of a directory that exists): no content of either image.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def write(root: Path, pip: list[str]) -> Path:
    doc = {
        "name": REPOSITORY,
        "matrix": {"jax": ["0.7"], "python": ["3.11"], "variant": ["cpu"]},
        "bases": {"3.11": {"debian": "bookworm"}},
        "packages": {"pip": pip},
    }
    path = root / "matrix.yaml"
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def layers(inspect, ref: str) -> list[str]:
    return [d for d in inspect(ref)["RootFS"]["Layers"] if d != EMPTY_LAYER]


@pytest.fixture(scope="module")
def before_and_after(tmp_path_factory):
    """(image without the package, image with it, the matrix): each locked and built."""
    from support.cli import build_json, gpuenv_cmd
    from support.engine import docker

    root = tmp_path_factory.mktemp("iteration")
    matrix = write(root, [])
    gpuenv_cmd("lock", "-f", str(matrix), "--exclude-newer", "2026-11-20")
    # --reproducible: layers compared by content (a raw layer's bytes carry its build's
    # times, and the engine's cache may hold several builds of one step).
    gpuenv_cmd("build", "-f", str(matrix), "--reproducible", timeout=BUILD_TIMEOUT)
    before = f"{REPOSITORY}:{CELL}-before"
    docker("tag", f"{REPOSITORY}:{CELL}", before)
    write(root, [f"{PACKAGE}=={VERSION}"])
    gpuenv_cmd("lock", "-f", str(matrix))  # the lock's date is kept
    plan = json.loads(gpuenv_cmd("build", "-f", str(matrix), "--dry-run", "--json").stdout)
    result = build_json(
        gpuenv_cmd("build", "-f", str(matrix), "--reproducible", "--json", timeout=BUILD_TIMEOUT)
    )
    assert result[CELL]["status"] == "built", result
    return before, f"{REPOSITORY}:{CELL}", matrix, plan["cells"][0]


def test_dry_run_names_the_packages_layer(before_and_after):
    *_, plan = before_and_after
    assert plan["action"] == "build" and plan["rebuilds_from"] == "packages", plan
    assert "packages changed" in plan["reasons"], plan


def test_the_framework_layers_are_kept_and_one_small_layer_is_added(
    before_and_after, inspect, docker
):  # fmt: skip
    before, after, *_ = before_and_after
    old, new = layers(inspect, before), layers(inspect, after)
    # Base, framework: the same layers; the last of each is the lock's copy.
    assert new[: len(old) - 1] == old[:-1], (old, new)
    assert len(new) == len(old) + 1, (old, new)
    size = int(docker("image", "inspect", "-f", "{{.Size}}", after).stdout)
    old_size = int(docker("image", "inspect", "-f", "{{.Size}}", before).stdout)
    # The packages layer (and the lock's copy, a few lines longer): under a megabyte, so its
    # own bytecode only (uv's --compile-bytecode would rewrite the framework's .pyc files
    # into it: tens of MB for JAX, hundreds for TensorFlow); well within 1 % of the image.
    assert 0 < size - old_size < 1_000_000, (old_size, size)


def test_the_package_is_installed_and_compiled(before_and_after, in_image):
    _, after, *_ = before_and_after
    code = (
        "import importlib.metadata as m, importlib.util as u, tomli_w, pathlib; "
        "print(m.version('tomli-w'), pathlib.Path(u.cache_from_source(tomli_w.__file__)).is_file())"
    )
    assert in_image(after, "python", "-c", code).split() == [VERSION, "True"]


def test_diff_lists_exactly_the_added_package(before_and_after, gpuenv):
    before, after, *_ = before_and_after
    proc = gpuenv("diff", before, after, "--json", check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    # Names as the distributions' metadata spell them (tomli_w).
    added = [name.replace("_", "-").lower() for name in doc["pip"]["only_b"]]
    assert added == [PACKAGE] and doc["pip"]["only_a"] == doc["pip"]["changed"] == [], doc["pip"]
    assert "apt" not in doc and "size" not in doc, doc


def test_reproducible_with_the_packages_layer(before_and_after, gpuenv, parse_build):
    _, _, matrix, _ = before_and_after
    first = parse_build(gpuenv("build", "-f", str(matrix), "--reproducible", "--json",
                               timeout=BUILD_TIMEOUT))  # fmt: skip
    again = parse_build(gpuenv("build", "-f", str(matrix), "--no-cache", "--reproducible",
                               "--json", timeout=BUILD_TIMEOUT))  # fmt: skip
    assert first[CELL]["image_id"] == again[CELL]["image_id"]
