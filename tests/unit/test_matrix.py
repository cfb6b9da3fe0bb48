"""Expansion of matrix.yaml into cells: GitHub Actions include/exclude semantics, unique
cell names, and the default cells `gpuenv run` uses."""

from __future__ import annotations

import pytest

from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.errors import MatrixError

HEAD = """\
name: acme/gpuenv
matrix:
  tensorflow: ["2.20", "2.21"]
  python: ["3.11", "3.12"]
  variant: [cpu, gpu]
"""
BASES = """\
bases:
  "3.11": {debian: bookworm}
  "3.12": {image: "python:3.12-slim-bookworm"}
  "3.13": {debian: trixie}
"""


def axes(combo: dict) -> tuple[str, str, str]:
    return combo["tensorflow"], combo["python"], combo["variant"]


def expand(write_matrix, text: str) -> list[dict]:
    return matrix.expand(matrix.load(write_matrix(text)))


def resolve(write_matrix, text: str) -> compat.Resolution:
    return compat.resolve(matrix.load(write_matrix(text)))


def test_product_of_the_axes(write_matrix):
    combos = expand(write_matrix, HEAD + BASES)
    assert sorted(map(axes, combos)) == sorted(
        (tf, py, v) for tf in ("2.20", "2.21") for py in ("3.11", "3.12") for v in ("cpu", "gpu")
    )
    assert all(c["_include"] is None for c in combos)


def test_variant_defaults_to_cpu(write_matrix, minimal_matrix):
    text = minimal_matrix.replace("  variant: [cpu, gpu]\n", "")
    assert [axes(c) for c in expand(write_matrix, text)] == [("2.21", "3.11", "cpu")]


def test_exclude_partial_match_removes_every_matching_combination(write_matrix):
    text = HEAD + '  exclude:\n    - {python: "3.12"}\n' + BASES
    assert sorted(map(axes, expand(write_matrix, text))) == [
        ("2.20", "3.11", "cpu"),
        ("2.20", "3.11", "gpu"),
        ("2.21", "3.11", "cpu"),
        ("2.21", "3.11", "gpu"),
    ]


def test_exclude_needs_every_key_to_match(write_matrix):
    text = HEAD + '  exclude:\n    - {tensorflow: "2.20", python: "3.12", variant: gpu}\n' + BASES
    combos = sorted(map(axes, expand(write_matrix, text)))
    assert len(combos) == 7
    assert ("2.20", "3.12", "gpu") not in combos
    assert ("2.20", "3.12", "cpu") in combos
    assert ("2.21", "3.12", "gpu") in combos


def test_several_excludes_add_up(write_matrix):
    text = HEAD + '  exclude:\n    - {tensorflow: "2.20"}\n    - {variant: gpu}\n' + BASES
    assert sorted(map(axes, expand(write_matrix, text))) == [
        ("2.21", "3.11", "cpu"),
        ("2.21", "3.12", "cpu"),
    ]


def test_exclude_that_matches_nothing_is_refused(write_matrix):
    # Probably a typo: the author meant to remove something that is still there.
    text = HEAD + '  exclude:\n    - {python: "3.13"}\n' + BASES
    with pytest.raises(MatrixError, match="exclude entry 1"):
        expand(write_matrix, text)


def test_include_extends_matching_combinations(write_matrix):
    text = (
        HEAD
        + "  include:\n"
        + '    - {tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.10"}\n'
        + BASES
    )
    combos = expand(write_matrix, text)
    assert len(combos) == 8  # extended, not added
    by_axes = {axes(c): c for c in combos}
    extended = by_axes["2.21", "3.11", "gpu"]
    assert (extended["cuda"], extended["cudnn"], extended["_include"]) == ("12.8", "9.10", 0)
    others = [c for k, c in by_axes.items() if k != ("2.21", "3.11", "gpu")]
    assert not any("cuda" in c or "cudnn" in c for c in others)
    assert all(c["_include"] is None for c in others)


def test_include_never_overwrites_an_original_axis_value(write_matrix):
    # python 3.13 is not in the product: adding it to any combination would overwrite that
    # combination's python, so (as in GitHub Actions) it becomes a combination of its own.
    text = HEAD + '  include:\n    - {tensorflow: "2.21", python: "3.13"}\n' + BASES
    combos = expand(write_matrix, text)
    assert len(combos) == 9
    assert sorted(map(axes, combos))[:8] == sorted(
        (tf, py, v) for tf in ("2.20", "2.21") for py in ("3.11", "3.12") for v in ("cpu", "gpu")
    )
    added = [c for c in combos if c["_include"] == 0]
    assert [axes(c) for c in added] == [("2.21", "3.13", "cpu")]


def test_include_that_matches_nothing_adds_a_cell(write_matrix):
    text = HEAD + '  include:\n    - {tensorflow: "2.19", python: "3.12", variant: gpu}\n' + BASES
    res = resolve(write_matrix, text)
    names = [c.name for c in res.cells]
    assert len(names) == 9
    assert "tf2.19-py3.12-cuda12.5-gpu" in names
    assert "tf2.19-py3.12-cpu" not in names  # only what the include names


def test_include_without_axes_extends_every_combination(write_matrix):
    text = HEAD + '  include:\n    - {pip: ["rich==13.9.4"]}\n' + BASES
    combos = expand(write_matrix, text)
    assert len(combos) == 8
    assert all(c["pip"] == ["rich==13.9.4"] for c in combos)


def test_github_actions_documentation_example(write_matrix):
    """The fruit/animal example of GitHub's docs, with tensorflow for fruit and python for
    animal: a later include may overwrite what an earlier include added (pip), never an
    axis value; an include matching nothing becomes a combination of its own."""
    text = (
        "name: acme/gpuenv\n"
        "matrix:\n"
        '  tensorflow: ["2.20", "2.21"]\n'
        '  python: ["3.11", "3.12"]\n'
        "  include:\n"
        '    - {pip: ["rich==13.9.4"]}\n'  # color: green
        '    - {python: "3.11", pip: ["attrs==24.2.0"]}\n'  # color: pink, animal: cat
        '    - {tensorflow: "2.20", apt: [curl]}\n'  # fruit: apple, shape: circle
        '    - {tensorflow: "2.19", python: "3.11"}\n' + BASES  # fruit: banana
    )
    res = resolve(write_matrix, text)
    got = {c.name: (c.pip, c.apt) for c in res.cells}
    assert got == {
        "tf2.20-py3.11-cpu": (("attrs==24.2.0",), ("curl",)),
        "tf2.20-py3.12-cpu": (("rich==13.9.4",), ("curl",)),
        "tf2.21-py3.11-cpu": (("attrs==24.2.0",), ()),
        "tf2.21-py3.12-cpu": (("rich==13.9.4",), ()),
        "tf2.19-py3.11-cpu": ((), ()),
    }


def test_a_later_include_does_not_extend_a_cell_an_earlier_include_added(write_matrix):
    # GitHub Actions extends only the product's combinations; two includes for the same new
    # GPU cell with different CUDA make two cells, not one overwritten by the other.
    text = (
        "name: acme/gpuenv\n"
        "matrix:\n"
        '  tensorflow: ["2.21"]\n'
        '  python: ["3.11"]\n'
        "  include:\n"
        '    - {tensorflow: "2.20", python: "3.12", variant: gpu}\n'
        '    - {tensorflow: "2.20", python: "3.12", variant: gpu, cuda: "12.8", cudnn: "9.10"}\n'
        + BASES
    )
    names = [c.name for c in resolve(write_matrix, text).cells]
    assert names == [
        "tf2.21-py3.11-cpu",
        "tf2.20-py3.12-cuda12.5-gpu",
        "tf2.20-py3.12-cuda12.8-gpu",
    ]


def test_package_lists_add_up(write_matrix):
    text = (
        HEAD
        + "  include:\n"
        + '    - {tensorflow: "2.21", variant: gpu, pip: ["rich==13.9.4"], apt: [curl]}\n'
        + BASES
        + "packages:\n  pip: [pandas==2.2.3]\n  apt: [git]\n"
    )
    cells = {c.name: c for c in resolve(write_matrix, text).cells}
    gpu = cells["tf2.21-py3.12-cuda12.5-gpu"]
    assert (gpu.pip, gpu.apt) == (("pandas==2.2.3", "rich==13.9.4"), ("git", "curl"))
    cpu = cells["tf2.21-py3.12-cpu"]
    assert (cpu.pip, cpu.apt) == (("pandas==2.2.3",), ("git",))


# ------------------------------------------------------------------------ unique cells


def test_shipped_matrix_cells(shipped_matrix):
    """docs/architecture.md: TF 2.17 and 2.21 on Python 3.11 and 3.13, CPU and GPU; 2.17 has no 3.13
    wheels; GPU cells use the tested CUDA (2.17: 12.3, 2.21: 12.5)."""
    res = compat.resolve(matrix.load(shipped_matrix))
    names = [c.name for c in res.cells]
    assert len(names) == len(set(names))
    assert sorted(names) == [
        "tf2.17-py3.11-cpu",
        "tf2.17-py3.11-cuda12.3-gpu",
        "tf2.21-py3.11-cpu",
        "tf2.21-py3.11-cuda12.5-gpu",
        "tf2.21-py3.13-cpu",
        "tf2.21-py3.13-cuda12.5-gpu",
    ]
    assert sorted((r["tensorflow"], r["python"], r["variant"]) for r in res.rejected) == [
        ("2.17", "3.13", "cpu"),
        ("2.17", "3.13", "gpu"),
    ]
    for r in res.rejected:
        assert set(r) == {"tensorflow", "python", "variant", "reason"}
        assert "3.13" in r["reason"]
    for cell in res.cells:
        assert cell.image == f"gpuenv/tensorflow:{cell.name}"
        assert (
            cell.base.describe()
            == {"3.11": "debian:bookworm", "3.13": "debian:trixie"}[cell.python]
        )


def test_cell_json_has_the_promised_keys(shipped_matrix):
    res = compat.resolve(matrix.load(shipped_matrix))
    promised = {"name", "image", "variant", "python", "framework", "framework_version"}
    promised |= {"cuda", "cudnn", "base"}
    for cell in res.cells:
        data = cell.to_json()
        assert promised <= set(data)
        assert data["framework"] == "tensorflow"
        if cell.is_gpu:
            assert data["cuda"] and data["cudnn"]
        else:
            assert data["cuda"] is None and data["cudnn"] is None


def test_cells_that_differ_only_in_cudnn_are_refused(write_matrix):
    text = (
        "name: acme/gpuenv\n"
        "matrix:\n"
        '  tensorflow: ["2.21"]\n'
        '  python: ["3.11"]\n'
        "  include:\n"
        '    - {tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.3"}\n'
        '    - {tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.10"}\n'
        + BASES
    )
    with pytest.raises(MatrixError, match=r"two cells are named tf2\.21-py3\.11-cuda12\.8-gpu"):
        resolve(write_matrix, text)


def test_repeated_axis_values_are_refused(write_matrix, minimal_matrix):
    text = minimal_matrix.replace('python: ["3.11"]', 'python: ["3.11", "3.11"]')
    with pytest.raises(MatrixError, match="repeat"):
        matrix.load(write_matrix(text))


# ---------------------------------------------------------------------- default cells


def test_default_cells_of_the_shipped_matrix(shipped_matrix):
    res = compat.resolve(matrix.load(shipped_matrix))
    assert res.default_cpu is not None and res.default_gpu is not None
    assert res.default_cpu.name == "tf2.21-py3.11-cpu"
    assert res.default_gpu.name == "tf2.21-py3.11-cuda12.5-gpu"


def test_default_gpu_prefers_the_tested_cuda(write_matrix):
    text = (
        "name: acme/gpuenv\n"
        "matrix:\n"
        '  tensorflow: ["2.21"]\n'
        '  python: ["3.11"]\n'
        "  include:\n"
        '    - {tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.10"}\n'
        '    - {tensorflow: "2.21", python: "3.11", variant: gpu}\n'
        'default: {tensorflow: "2.21", python: "3.11"}\n' + BASES
    )
    res = resolve(write_matrix, text)
    assert [c.name for c in res.cells if c.is_gpu] == [
        "tf2.21-py3.11-cuda12.8-gpu",
        "tf2.21-py3.11-cuda12.5-gpu",
    ]
    assert res.default_gpu is not None and res.default_gpu.name == "tf2.21-py3.11-cuda12.5-gpu"
    assert res.default_cpu is not None and res.default_cpu.name == "tf2.21-py3.11-cpu"


def test_default_follows_the_default_key_not_the_order(write_matrix):
    text = HEAD + BASES + 'default: {tensorflow: "2.20", python: "3.12"}\n'
    res = resolve(write_matrix, text)
    assert res.default_cpu is not None and res.default_cpu.name == "tf2.20-py3.12-cpu"
    assert res.default_gpu is not None and res.default_gpu.name == "tf2.20-py3.12-cuda12.5-gpu"


def test_without_default_the_first_cells_are_used(write_matrix):
    res = resolve(write_matrix, HEAD + BASES)
    assert res.default_cpu is res.cells[0]
    assert res.default_cpu.name == "tf2.20-py3.11-cpu"
    assert res.default_gpu is not None and res.default_gpu.name == "tf2.20-py3.11-cuda12.5-gpu"


def test_cpu_only_matrix_has_no_default_gpu(write_matrix, minimal_matrix):
    text = minimal_matrix.replace("[cpu, gpu]", "[cpu]")
    text += 'default: {tensorflow: "2.21", python: "3.11"}\n'
    res = resolve(write_matrix, text)
    assert res.default_cpu is not None and res.default_cpu.name == "tf2.21-py3.11-cpu"
    assert res.default_gpu is None
