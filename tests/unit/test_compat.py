"""The compatibility catalog: a walk over every TensorFlow row, the legal CUDA/cuDNN
overrides, and the sanity of the CUDA data, checked against docs/architecture.md's facts."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rendering import key_of

from gpuenv.building.render import render
from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import MatrixError
from gpuenv.project.lockfile import cuda_requirements, env_requirements


def _data(name: str) -> dict:
    return yaml.safe_load(resources.files("gpuenv.data").joinpath(name).read_text("utf-8"))


TF_ROWS = _data("tensorflow.yaml")["releases"]
CUDA = _data("cuda.yaml")

# docs/architecture.md, "The compatibility catalog": TF -> (Python range, cuDNN, CUDA), Linux GPU.
DESIGN_TABLE = {
    "2.21": (("3.10", "3.13"), "9.3", "12.5"),
    "2.20": (("3.9", "3.13"), "9.3", "12.5"),
    "2.19": (("3.9", "3.12"), "9.3", "12.5"),
    "2.18": (("3.9", "3.12"), "9.3", "12.5"),
    "2.17": (("3.9", "3.12"), "8.9", "12.3"),
    "2.16": (("3.9", "3.12"), "8.9", "12.3"),
    "2.15": (("3.9", "3.11"), "8.9", "12.2"),
    "2.14": (("3.9", "3.11"), "8.7", "11.8"),
    "2.13": (("3.8", "3.11"), "8.6", "11.8"),
    "2.12": (("3.8", "3.11"), "8.6", "11.8"),
}
# docs/architecture.md: CUDA minimum Linux driver of each GA release, and the per-major floors.
DESIGN_GA_DRIVER = {
    "13.2": "595.45.04", "13.1": "590.44.01",  # release notes of 13.2 Update 2 (issue 23)
    "13.0": "580.65.06", "12.9": "575.51.03", "12.8": "570.26", "12.6": "560.28.03",
    "12.5": "555.42.02", "12.4": "550.54.14", "12.3": "545.23.06", "12.2": "535.54.03",
    "12.1": "530.30.02", "12.0": "525.60.13", "11.8": "520.61.05", "11.7": "515.43.04",
    "11.6": "510.39.01", "11.4": "470.42.01", "11.2": "460.27.03", "11.0": "450.51.06",
}  # fmt: skip
DESIGN_FLOOR = {"12": "525.60.13", "11": "450.80.02"}


def driver(version: str) -> tuple[int, ...]:
    """Driver versions compare per component, numerically (570.26 < 570.124.06)."""
    return tuple(int(part) for part in version.split("."))


def minor(version: str) -> Version:
    return Version(version)


def gpu_row(row: dict) -> bool:
    return minor(row["minor"]) >= Version("2.15")


def matrix_text(tf: str, python: str, variants: str = "[cpu, gpu]", include: str = "") -> str:
    return (
        "name: acme/gpuenv\n"
        "matrix:\n"
        f'  tensorflow: ["{tf}"]\n'
        f'  python: ["{python}"]\n'
        f"  variant: {variants}\n"
        + (f"  include:\n    - {include}\n" if include else "")
        + "bases:\n"
        + f'  "{python}": {{image: "python:{python}-slim"}}\n'
    )


def resolve(write_matrix, text: str) -> compat.Resolution:
    return compat.resolve(matrix.load(write_matrix(text)))


def install_words(cell: Cell, dockerfile: str) -> set[str]:
    """What a build of the cell installs: the requirements its resolution is made from
    (gpuenv/building/lock.py), which the install steps get in their mounted part of the context; the
    Dockerfile itself pins nothing."""
    assert not re.search(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-]+", dockerfile)
    assert "--require-hashes" in dockerfile
    return set(env_requirements(cell)) | set(cuda_requirements(cell))


# ---------------------------------------------------------------------------- the walk

WALK = [(row["minor"], py) for row in TF_ROWS for py in row["python"]]


def test_the_catalog_has_every_release_from_2_12_to_2_21():
    assert sorted((r["minor"] for r in TF_ROWS), key=Version) == sorted(DESIGN_TABLE, key=Version)


@pytest.mark.parametrize("row", TF_ROWS, ids=[r["minor"] for r in TF_ROWS])
def test_row_agrees_with_design_table(row):
    (low, high), cudnn, cuda = DESIGN_TABLE[row["minor"]]
    pythons = [Version(p) for p in row["python"]]
    assert pythons == sorted(pythons)
    assert (row["python"][0], row["python"][-1]) == (low, high)
    # Contiguous: every minor Python between the ends is listed.
    assert [p.minor for p in pythons] == list(range(pythons[0].minor, pythons[-1].minor + 1))
    if gpu_row(row):
        assert (row["gpu"]["cuda"], row["gpu"]["cudnn"]) == (cuda, cudnn)
    else:
        assert "gpu" not in row and row["gpu_unsupported"]
    assert row["source"]


@pytest.mark.parametrize(("tf", "python"), WALK, ids=[f"tf{t}-py{p}" for t, p in WALK])
def test_walk_every_row(write_matrix, tf, python):
    row = next(r for r in TF_ROWS if r["minor"] == tf)
    res = resolve(write_matrix, matrix_text(tf, python))
    version = row["version"]
    assert re.fullmatch(rf"{re.escape(tf)}\.\d+", version), version  # exact patch release

    cpu = next(c for c in res.cells if not c.is_gpu)
    assert cpu.name == f"tf{tf}-py{python}-cpu"
    assert cpu.framework_version == version
    assert (cpu.cuda, cpu.cudnn, cpu.wheels) == (None, None, {})
    cpu_df = render(cpu, key_of(cpu)).dockerfile
    assert f"FROM python:{python}-slim\n" in cpu_df
    assert install_words(cpu, cpu_df) == {f"tensorflow=={version}"}

    gpus = [c for c in res.cells if c.is_gpu]
    if not gpu_row(row):
        assert gpus == []
        assert len(res.rejected) == 1
        rejected = res.rejected[0]
        assert (rejected["tensorflow"], rejected["python"], rejected["variant"]) == (
            tf,
            python,
            "gpu",
        )
        assert "2.15" in rejected["reason"]
        return

    assert res.rejected == []
    (gpu,) = gpus
    cuda, cudnn = row["gpu"]["cuda"], row["gpu"]["cudnn"]
    assert gpu.name == f"tf{tf}-py{python}-cuda{cuda}-gpu"
    assert (gpu.framework_version, gpu.cuda, gpu.cudnn) == (version, cuda, cudnn)
    assert gpu.cuda_release is not None and gpu.cuda_release.startswith(f"{cuda}.")
    # Every CUDA wheel TensorFlow asks for is pinned by gpuenv (none left to pip), and
    # every pin satisfies TensorFlow's own requirement.
    requires = row["wheel_requires"]
    assert set(gpu.wheels) == set(requires)
    for package, pinned in gpu.wheels.items():
        assert re.fullmatch(r"\d+(\.\d+)+", pinned), (package, pinned)
        assert Version(pinned) in SpecifierSet(requires[package]), (package, pinned)
    gpu_df = render(gpu, key_of(gpu)).dockerfile
    assert install_words(gpu, gpu_df) == {f"tensorflow=={version}"} | {
        f"{name}=={pin}" for name, pin in gpu.wheels.items()
    }
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=12.0"' in gpu_df


def test_2_16_is_not_2_16_0(write_matrix):
    # docs/architecture.md: 2.16.0 never reached PyPI.
    res = resolve(write_matrix, matrix_text("2.16", "3.11"))
    versions = {c.framework_version for c in res.cells}
    assert len(versions) == 1
    (version,) = versions
    assert version != "2.16.0" and version.startswith("2.16.")
    assert Version(version) >= Version("2.16.1")


# ---------------------------------------------------------------------- overrides


def test_tf_2_21_on_cuda_12_8_is_legal(write_matrix):
    include = '{tensorflow: "2.21", python: "3.11", variant: gpu, cuda: "12.8", cudnn: "9.10"}'
    res = resolve(write_matrix, matrix_text("2.21", "3.11", include=include))
    gpu = next(c for c in res.cells if c.is_gpu)
    assert gpu.name == "tf2.21-py3.11-cuda12.8-gpu"
    assert (gpu.cuda, gpu.cudnn) == ("12.8", "9.10")
    assert gpu.cuda_release is not None and gpu.cuda_release.startswith("12.8.")
    assert gpu.wheels["nvidia-cuda-runtime-cu12"].startswith("12.8.")
    assert gpu.wheels["nvidia-cudnn-cu12"].startswith("9.10.")
    dockerfile = render(gpu, key_of(gpu)).dockerfile
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=12.0"' in dockerfile  # the major's floor, not 12.8
    assert any(r.startswith("nvidia-cuda-runtime-cu12==12.8.") for r in cuda_requirements(gpu))


@pytest.mark.parametrize(
    ("tf", "cuda", "cudnn"),
    [
        ("2.21", "11.8", None),
        ("2.17", "12.5", "9.3"),
        ("2.19", "12.8", "9.10"),
        ("2.21", "13.0", "9.10"),
    ],
)
def test_illegal_overrides_are_errors(write_matrix, tf, cuda, cudnn):
    include = f'{{tensorflow: "{tf}", python: "3.11", variant: gpu, cuda: "{cuda}"'
    include += f', cudnn: "{cudnn}"}}' if cudnn else "}"
    with pytest.raises(MatrixError, match="include entry 1 cannot be built") as err:
        resolve(write_matrix, matrix_text(tf, "3.11", include=include))
    assert cuda in str(err.value)


def test_override_ranges_follow_design(write_matrix):
    """docs/architecture.md: exact pins for TF 2.15-2.19; CUDA >=12.5,<13 / cuDNN >=9.3,<10
    for 2.20-2.21.
    So every catalog pair is legal for 2.20/2.21 exactly when it is in those ranges, and
    only the tested pair is legal for 2.15-2.19."""
    cat = compat.catalog()
    for row in cat.releases.values():
        if row.gpu_default is None:
            continue
        for cuda, cudnn in cat.pairs:
            if Version(row.minor) >= Version("2.20"):
                legal = Version("12.5") <= Version(cuda) < Version("13") and Version(
                    "9.3"
                ) <= Version(cudnn) < Version("10")
            else:
                legal = (cuda, cudnn) == row.gpu_default
            if legal:
                wheels = compat.gpu_wheels(row, cuda, cudnn)
                for package, spec in row.wheel_requires.items():
                    assert Version(wheels[package]) in SpecifierSet(spec)
            else:
                with pytest.raises(ValueError):
                    compat.gpu_wheels(row, cuda, cudnn)


# ---------------------------------------------------------------------- catalog data


def test_every_pair_has_a_toolkit():
    for pair in CUDA["pairs"]:
        assert pair["cuda"] in CUDA["toolkits"], pair
        cudnn = Version(pair["cudnn"])
        wheel = Version(pair["cudnn_wheel"])
        assert wheel.release[:2] == cudnn.release[:2], pair


def test_pairs_are_unique():
    pairs = [(p["cuda"], p["cudnn"]) for p in CUDA["pairs"]]
    assert len(pairs) == len(set(pairs))


def test_toolkits_are_consistent():
    floors = CUDA["driver_floor"]
    for name, tk in CUDA["toolkits"].items():
        major = name.split(".")[0]
        assert tk["release"].startswith(f"{name}."), name
        assert driver(tk["min_driver"]) >= driver(floors[major]), name
        # An update release needs at least the driver of its GA release.
        assert driver(tk["min_driver"]) >= driver(DESIGN_GA_DRIVER[name]), name
        # CUDA 12's wheels carry a -cu12 suffix; CUDA 13's toolkit wheels carry none.
        suffix = "-cu12" if major == "12" else ""
        for package, version in tk["wheels"].items():
            assert package.startswith("nvidia-"), package
            assert package.endswith("-cu12") == (major == "12"), package
            assert re.fullmatch(r"\d+(\.\d+)+", version), (package, version)
        for runtime in (f"nvidia-cuda-runtime{suffix}", f"nvidia-cuda-nvrtc{suffix}"):
            assert tk["wheels"][runtime].startswith(f"{name}."), (name, runtime)
        for wheel, companions in (tk.get("companions") or {}).items():
            assert {wheel, *companions} <= set(tk["wheels"]), (name, wheel)


def test_driver_numbers_match_design():
    assert CUDA["ga_min_driver"] == DESIGN_GA_DRIVER
    for major, floor in DESIGN_FLOOR.items():
        assert CUDA["driver_floor"][major] == floor
    # 12.5.1's own minimum, as docs/architecture.md states it.
    assert CUDA["toolkits"]["12.5"]["min_driver"] == "555.42.06"


def test_driver_comparison_is_numeric():
    # A string comparison would put 570.26 above 570.124.06.
    assert driver("570.26") < driver("570.124.06")
    assert driver("525.60.13") < driver("535.54.03")


def test_driver_floor_lookup():
    assert compat.driver_floor("12.5") == "525.60.13"
    assert compat.driver_floor("12.8") == "525.60.13"


def test_debian_suites_provide_the_documented_pythons():
    assert compat.catalog().debian_python["bookworm"] == "3.11"
    assert compat.catalog().debian_python["trixie"] == "3.13"


# ---------------------------------------------------------------------------- arm64 cells

ARM = """\
name: acme/arm
matrix:
  tensorflow: ["2.21"]
  torch: ["2.11"]
  jax: ["0.7"]
  python: ["3.11"]
  variant: [cpu, gpu]
  arch: [amd64, arm64]
bases:
  "3.11": {debian: bookworm}
"""


def test_arm64_cells_are_named_and_placed_for_their_platform(write_matrix):
    res = compat.resolve(matrix.load(write_matrix(ARM)))
    cells = {c.name: c for c in res.cells}
    arm = cells["jax0.7-py3.11-cpu-arm64"]
    assert arm.platform == "linux/arm64" and arm.machine == "aarch64"
    assert arm.base.image == "gpuenv/debian:bookworm-arm64"
    assert arm.to_json()["platform"] == "linux/arm64"
    amd = cells["jax0.7-py3.11-cpu"]
    assert amd.platform == "linux/amd64" and amd.base.image == "gpuenv/debian:bookworm"
    assert "torch2.11-py3.11-cuda13.0-gpu-arm64" in cells
    # the default cells `gpuenv run` picks stay the amd64 ones
    assert res.default_cpu is not None and res.default_cpu.arch == "amd64"


def test_tensorflow_gpu_on_arm64_is_refused_with_the_reason(write_matrix):
    res = compat.resolve(matrix.load(write_matrix(ARM)))
    names = {c.name for c in res.cells}
    assert "tf2.21-py3.11-cpu-arm64" in names
    assert not any(n.startswith("tf") and n.endswith("gpu-arm64") for n in names)
    (refused,) = [r for r in res.rejected if r.get("arch") == "arm64"]
    assert refused["tensorflow"] == "2.21" and refused["variant"] == "gpu"
    assert "aarch64 wheels are CPU-only" in refused["reason"]


def test_an_arm64_python_without_aarch64_wheels_is_refused(write_matrix):
    text = ARM.replace('jax: ["0.7"]', 'jax: ["0.12"]').replace("3.11", "3.12")
    text = text.replace("{debian: bookworm}", '{image: "python:3.12-slim"}')
    text = text.replace('  tensorflow: ["2.21"]\n  torch: ["2.11"]\n', "")
    row = compat.catalog("jax").release("0.12")
    assert row is not None and row.aarch64_python and "3.12" in row.aarch64_python
    names = {c.name for c in compat.resolve(matrix.load(write_matrix(text))).cells}
    assert "jax0.12-py3.12-cpu-arm64" in names
    row11 = compat.catalog("jax").release("0.11")
    assert row11 is not None and row11.aarch64_python is not None
    assert "3.11" not in row11.aarch64_python


def test_an_image_base_names_its_arm64_image_separately(write_matrix):
    """Docker's classic store holds one architecture per tag: `arm64:` is the arm64 cells'
    base; without it both architectures name `image`."""
    text = ARM.replace("{debian: bookworm}", '{image: "acme/base:py3.11", arm64: "acme/base:arm"}')
    cells = {c.name: c for c in compat.resolve(matrix.load(write_matrix(text))).cells}
    assert cells["jax0.7-py3.11-cpu"].base.image == "acme/base:py3.11"
    assert cells["jax0.7-py3.11-cpu-arm64"].base.image == "acme/base:arm"
    text = ARM.replace("{debian: bookworm}", '{image: "acme/base:py3.11"}')
    cells = {c.name: c for c in compat.resolve(matrix.load(write_matrix(text))).cells}
    assert cells["jax0.7-py3.11-cpu-arm64"].base.image == "acme/base:py3.11"


def test_an_unknown_arch_names_the_choices(write_matrix):
    with pytest.raises(MatrixError) as caught:
        matrix.load(write_matrix(ARM.replace("arch: [amd64, arm64]", "arch: [riscv64]")))
    assert "amd64" in str(caught.value) and "arm64" in str(caught.value)
