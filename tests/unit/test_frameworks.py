"""PyTorch and JAX beside TensorFlow: the walk over every catalog row x Python of each
framework (resolve, render, pins inside the framework's own requirements), the mixed
matrix's semantics, the torch CPU index, and the hostile inputs of the new keys."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from rendering import key_of
from test_matrix_errors import assert_rejected
from test_render import _lint

from gpuenv.building.render import render
from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import MatrixError
from gpuenv.project.lockfile import cuda_requirements, env_requirements
from gpuenv.project.snapshot import Settings
from gpuenv.store.wheelhouse import index_key

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI = "https://pypi.org/simple/"


def _data(name: str) -> dict:
    return yaml.safe_load(resources.files("gpuenv.data").joinpath(name).read_text("utf-8"))


ROWS = {f: _data(f"{f}.yaml")["releases"] for f in ("torch", "jax")}
CUDA = _data("cuda.yaml")
# The generated CUDA 13 wheel sets and PyTorch's cuDNN pairs beside the hand-kept ones.
CUDA["toolkits"] = {**_data("cuda-wheels.yaml")["toolkits"], **CUDA["toolkits"]}
CUDA["pairs"] = [*CUDA["pairs"], *_data("cuda-wheels.yaml")["pairs"]]
SHORT = {"torch": "torch", "jax": "jax"}

# What PyPI says (torch/jax wheel tags and METADATA, read 2026-11-23 and, for 2.15 and
# 0.12, 2026-11-24): release -> (exact version, Python range, CUDA, cuDNN major.minor of the
# pins). tests/unit/test_catalog.py checks every row against the recorded index.
FACTS = {
    ("torch", "2.15"): ("2.15.0", ("3.11", "3.15"), "13.2", "9.26"),
    ("jax", "0.12"): ("0.12.0.1", ("3.12", "3.15"), "13.0", "9.19"),
    ("torch", "2.11"): ("2.11.0", ("3.10", "3.14"), "13.0", "9.19"),
    ("torch", "2.9"): ("2.9.1", ("3.10", "3.14"), "12.8", "9.10"),
    ("jax", "0.11"): ("0.11.2", ("3.12", "3.15"), "13.0", "9.19"),
    ("jax", "0.7"): ("0.7.2", ("3.11", "3.14"), "12.9", "9.10"),
}


def matrix_text(framework: str, minor: str, python: str, extra: str = "") -> str:
    return (
        "name: acme/gpuenv\n"
        "matrix:\n"
        f'  {framework}: ["{minor}"]\n'
        f'  python: ["{python}"]\n'
        "  variant: [cpu, gpu]\n"
        "bases:\n"
        f'  "{python}": {{image: "python:{python}-slim"}}\n' + extra
    )


def resolve(write_matrix, text: str) -> compat.Resolution:
    return compat.resolve(matrix.load(write_matrix(text)))


def install_words(cell: Cell) -> set[str]:
    """What a build of the cell installs: its resolution's input (gpuenv/building/lock.py), which
    its install steps receive in their mounted part (the Dockerfile names no package)."""
    return set(env_requirements(cell)) | set(cuda_requirements(cell))


def pins_on_run_lines(dockerfile: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-]+", dockerfile))


def env_line(dockerfile: str, name: str) -> str:
    m = re.search(rf"{name}=(\S+)", dockerfile)
    return m.group(1) if m else ""


# ---------------------------------------------------------------------------- the walk

WALK = [(f, row["minor"], py) for f, rows in ROWS.items() for row in rows for py in row["python"]]


def test_the_catalogs_hold_the_releases_pypi_has():
    found = {(f, r["minor"]) for f, rows in ROWS.items() for r in rows}
    assert found >= set(FACTS)
    for (framework, minor), (version, (low, high), cuda, cudnn) in FACTS.items():
        row = next(r for r in ROWS[framework] if r["minor"] == minor)
        assert row["version"] == version
        pythons = [Version(p) for p in row["python"]]
        assert (row["python"][0], row["python"][-1]) == (low, high)
        assert [p.minor for p in pythons] == list(range(pythons[0].minor, pythons[-1].minor + 1))
        assert (row["gpu"]["cuda"], row["gpu"]["cudnn"]) == (cuda, cudnn)
        assert row["source"] and version in " ".join(row["source"].split())


@pytest.mark.parametrize(
    ("framework", "minor", "python"), WALK, ids=[f"{f}{m}-py{p}" for f, m, p in WALK]
)
def test_walk_every_row(write_matrix, framework, minor, python):
    row = next(r for r in ROWS[framework] if r["minor"] == minor)
    version = row["version"]
    res = resolve(write_matrix, matrix_text(framework, minor, python))
    assert res.rejected == []
    cpu = next(c for c in res.cells if not c.is_gpu)
    gpu = next(c for c in res.cells if c.is_gpu)
    short = SHORT[framework]
    cuda, cudnn = row["gpu"]["cuda"], row["gpu"]["cudnn"]
    assert cpu.name == f"{short}{minor}-py{python}-cpu"
    assert gpu.name == f"{short}{minor}-py{python}-cuda{cuda}-gpu"
    assert cpu.framework == gpu.framework == framework
    assert cpu.framework_version == gpu.framework_version == version

    # CPU: jax from PyPI; torch's +cpu build from PyTorch's own index.
    cpu_df = render(cpu, key_of(cpu)).dockerfile
    assert pins_on_run_lines(cpu_df) == set()
    if framework == "torch":
        assert install_words(cpu) == {f"torch=={version}+cpu"}
        assert cpu.indexes == (TORCH_CPU_INDEX,)
        assert Settings("t").indexes(cpu)[0] == TORCH_CPU_INDEX + "/"
    else:
        assert install_words(cpu) == {f"jax=={version}"}
        assert cpu.indexes == () and Settings("t").indexes(cpu) == (PYPI,)
    assert "NVIDIA_" not in cpu_df and "INDEX_URL" not in cpu_df

    # GPU: every CUDA wheel the framework requires is pinned, inside its requirement; the
    # pins are nothing but those (and the toolkit's companions of one: nvcc's crt).
    requires = row["wheel_requires"]
    companions = {
        c for w in requires for c in CUDA["toolkits"][cuda].get("companions", {}).get(w, [])
    }
    assert set(requires) <= set(gpu.wheels) <= set(requires) | companions
    for package, spec in requires.items():
        assert Version(gpu.wheels[package]) in SpecifierSet(spec), (package, spec)
    assert gpu.cuda_release == row["gpu"].get("release", CUDA["toolkits"][cuda]["release"])
    assert gpu.cudnn_wheel is not None and gpu.cudnn_wheel.startswith(f"{cudnn}.")
    gpu_df = render(gpu, key_of(gpu)).dockerfile
    pins = {f"{n}=={v}" for n, v in gpu.wheels.items()}
    assert install_words(gpu) == {f"{framework}=={version}"} | pins
    assert pins_on_run_lines(gpu_df) == set()
    assert f'NVIDIA_REQUIRE_CUDA="cuda>={cuda.split(".")[0]}.0"' in gpu_df
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu_df
    libs = env_line(gpu_df, "LD_LIBRARY_PATH").split(":")
    assert libs == [
        f"/opt/venv/lib/python{python}/site-packages/nvidia/{d}/lib" for d in gpu.nvidia_lib_dirs
    ]
    if cuda.startswith("13."):
        assert "cu13" in gpu.nvidia_lib_dirs
    runs = [r.split("\n\n")[0] for r in gpu_df.split("\nRUN ")[1:] if "uv pip install" in r]
    if framework == "torch":
        # PyPI's Linux torch requires its CUDA wheels: one layer installs them with torch
        # (and the lock resolves them with it), no CUDA layer, no ptxas on the PATH.
        assert len(runs) == 1 and gpu.cuda_with_framework
        assert cuda_requirements(gpu) == [] and set(pins) <= set(env_requirements(gpu))
        assert "cuda_nvcc" not in gpu_df and "cu13/bin" not in gpu_df
    else:
        # JAX: the CPU cell's environment layer, then one layer of plugin + CUDA wheels.
        assert len(runs) == 2 and not gpu.cuda_with_framework
        assert runs[0].strip() == cpu_df.split("\nRUN ")[1].split("\n\n")[0].strip()
        assert f"jax-cuda{cuda.split('.')[0]}-plugin=={version}" in pins
        ptxas = "cuda_nvcc/bin" if cuda.startswith("12.") else "cu13/bin"
        assert f"site-packages/nvidia/{ptxas}:" in env_line(gpu_df, "PATH")


def test_every_gpu_wheel_set_names_real_toolkit_and_pair():
    for framework, rows in ROWS.items():
        for row in rows:
            cuda, cudnn = row["gpu"]["cuda"], row["gpu"]["cudnn"]
            assert cuda in CUDA["toolkits"], (framework, row["minor"])
            assert any(p["cuda"] == cuda and p["cudnn"] == cudnn for p in CUDA["pairs"])


def test_cuda_13_toolkit_is_cuda_toolkit_13_0_2():
    """torch 2.11 requires cuda-toolkit[...]==13.0.2, whose METADATA pins each wheel ==X.*:
    gpuenv's 13.0 set is exactly those releases."""
    tk = CUDA["toolkits"]["13.0"]
    torch = next(r for r in ROWS["torch"] if r["minor"] == "2.11")
    for package, spec in torch["wheel_requires"].items():
        if package in tk["wheels"]:
            assert spec == f"=={tk['wheels'][package]}.*", package
    assert tk["release"] == "13.0.2" and torch["gpu"]["wheels"]["cuda-toolkit"] == "13.0.2"
    assert CUDA["driver_floor"]["13"] == "580.65.06"


# ---------------------------------------------------------------------- overrides


def test_jax_takes_another_cuda_inside_its_ranges(write_matrix):
    entry = '{jax: "0.7", python: "3.12", variant: gpu, cuda: "12.8", cudnn: "9.10"}'
    extra_include = f"  include:\n    - {entry}\n"
    text = matrix_text("jax", "0.7", "3.12").replace("bases:\n", extra_include + "bases:\n")
    res = resolve(write_matrix, text)
    gpu = next(c for c in res.cells if c.is_gpu)
    assert gpu.name == "jax0.7-py3.12-cuda12.8-gpu"
    assert gpu.wheels["nvidia-cuda-runtime-cu12"].startswith("12.8.")


@pytest.mark.parametrize(
    ("framework", "minor", "cuda", "cudnn", "says"),
    [
        ("torch", "2.9", "12.9", "9.10", "requires nvidia-cublas-cu12==12.8.4.1"),
        ("torch", "2.11", "12.8", "9.10", "which gpuenv's CUDA 12.8 wheel set does not include"),
        ("jax", "0.7", "13.0", "9.19", "which gpuenv's CUDA 13.0 wheel set does not include"),
        ("jax", "0.11", "12.9", "9.10", "which gpuenv's CUDA 12.9 wheel set does not include"),
        ("jax", "0.7", "12.3", "8.9", "requires nvidia-cuda-nvcc-cu12>=12.6.85"),
    ],
)
def test_impossible_cuda_for_the_framework(
    write_matrix, tmp_path, line_of, framework, minor, cuda, cudnn, says
):
    python = "3.12"
    entry = f'{{{framework}: "{minor}", python: "{python}", variant: gpu, '
    entry += f'cuda: "{cuda}", cudnn: "{cudnn}"}}'
    text = matrix_text(framework, minor, python).replace(
        "bases:\n", f"  include:\n    - {entry}\n" + "bases:\n"
    )
    assert_rejected(
        write_matrix(text),
        tmp_path,
        "include entry 1 cannot be built",
        says,
        line=line_of(text, entry),
    )


# ---------------------------------------------------------------------- the mixed matrix


def test_each_framework_makes_its_own_product(write_matrix):
    text = (
        "name: acme/ml\nmatrix:\n"
        '  tensorflow: ["2.21"]\n  torch: ["2.9", "2.11"]\n  jax: ["0.7"]\n'
        '  python: ["3.11", "3.12"]\n  variant: [cpu, gpu]\n'
        "  exclude:\n"
        '    - {torch: "2.9", variant: cpu}\n'  # only torch 2.9's CPU cells
        '    - {python: "3.12", variant: gpu}\n'  # every framework's
        "  include:\n"
        '    - {jax: "0.7", apt: [git]}\n'  # extends jax cells only
        '    - {python: "3.11", pip: ["six==1.17.0"]}\n'  # extends every framework's
        '    - {torch: "2.11", python: "3.13", variant: cpu}\n'  # a new torch cell
        'default: {torch: "2.11", python: "3.11"}\n'
        'bases:\n  "3.11": {debian: bookworm}\n  "3.12": {image: "python:3.12-slim"}\n'
        '  "3.13": {debian: trixie}\n'
    )
    res = resolve(write_matrix, text)
    names = [c.name for c in res.cells]
    assert names == [
        "tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu", "tf2.21-py3.12-cpu",
        "torch2.9-py3.11-cuda12.8-gpu",
        "torch2.11-py3.11-cpu", "torch2.11-py3.11-cuda13.0-gpu", "torch2.11-py3.12-cpu",
        "jax0.7-py3.11-cpu", "jax0.7-py3.11-cuda12.9-gpu", "jax0.7-py3.12-cpu",
        "torch2.11-py3.13-cpu",
    ]  # fmt: skip
    by = {c.name: c for c in res.cells}
    assert by["jax0.7-py3.12-cpu"].apt == ("git",) and by["tf2.21-py3.12-cpu"].apt == ()
    assert by["tf2.21-py3.11-cpu"].pip == ("six==1.17.0",) == by["torch2.11-py3.11-cpu"].pip
    assert (res.default_cpu.name, res.default_gpu.name) == (
        "torch2.11-py3.11-cpu",
        "torch2.11-py3.11-cuda13.0-gpu",
    )


def test_the_example_mixed_matrix_resolves():
    res = compat.resolve(matrix.load(REPO / "examples" / "mixed-matrix.yaml"))
    assert {c.framework for c in res.cells} == {"tensorflow", "torch", "jax"}
    # The newest torch and JAX the catalog holds (issue 23), torch's default on Python 3.13.
    assert res.default_gpu is not None and res.default_gpu.name == "torch2.15-py3.13-cuda13.2-gpu"
    minors = {(c.framework, c.framework_minor) for c in res.cells}
    assert {("torch", compat.catalog("torch").newest().minor),
            ("jax", compat.catalog("jax").newest().minor)} <= minors  # fmt: skip
    for r in res.rejected:  # only what the catalog says cannot exist
        assert "has no wheels for Python" in r["reason"]


def test_the_shipped_default_stays_valid(shipped_matrix):
    res = compat.resolve(matrix.load(shipped_matrix))
    assert res.default_cpu is not None and res.default_cpu.name == "tf2.21-py3.11-cpu"
    assert {c.framework for c in res.cells} == {"tensorflow"}


def test_torch_cpu_index_mirror_replaces_pytorchs(write_matrix):
    mirror = "https://mirror.example/pytorch/whl/cpu"
    text = matrix_text("torch", "2.11", "3.11", f"build:\n  torch_cpu_index: {mirror}\n")
    res = resolve(write_matrix, text)
    cpu = next(c for c in res.cells if not c.is_gpu)
    gpu = next(c for c in res.cells if c.is_gpu)
    assert cpu.indexes == (mirror,) and gpu.indexes == ()
    options = Settings("t", extra_index_urls=("https://a.example/simple",))
    assert options.indexes(cpu) == ("https://a.example/simple/", f"{mirror}/", PYPI)
    assert TORCH_CPU_INDEX + "/" not in options.indexes(cpu)
    dockerfile = render(cpu, key_of(cpu, options)).dockerfile
    assert f"keyed {index_key(options.indexes(cpu))} " in dockerfile
    assert TORCH_CPU_INDEX not in dockerfile and mirror not in dockerfile
    assert cpu.to_json()["indexes"] == [mirror] and cpu.to_json()["install"] == "torch==2.11.0+cpu"


def test_torch_cpu_index_is_fetched_from_under_its_own_key(write_matrix):
    # What gpuenv builds: the wheelhouse key stands for the matrix's indexes plus the cell's
    # own, so the CPU cell's Dockerfile names a key of its own and no upstream.
    res = resolve(write_matrix, matrix_text("torch", "2.11", "3.11"))
    cpu = next(c for c in res.cells if not c.is_gpu)
    gpu = next(c for c in res.cells if c.is_gpu)
    options = Settings("t")
    assert options.indexes(cpu)[0] == TORCH_CPU_INDEX + "/"
    assert index_key(options.indexes(cpu)) != index_key(options.indexes(gpu))
    dockerfile = render(cpu, key_of(cpu, options)).dockerfile
    assert f"keyed {index_key(options.indexes(cpu))} " in dockerfile
    assert index_key(options.indexes(gpu)) not in dockerfile
    assert TORCH_CPU_INDEX not in dockerfile and "INDEX_URL" not in dockerfile


# ---------------------------------------------------------------------- golden, hadolint


def _cell(write_matrix, framework: str, minor: str, variant: str) -> Cell:
    text = matrix_text(framework, minor, "3.11").replace(
        'image: "python:3.11-slim"', "debian: bookworm"
    )
    res = resolve(write_matrix, text)
    return next(c for c in res.cells if c.variant == variant)


@pytest.mark.parametrize(
    ("framework", "minor", "variant"),
    [
        ("torch", "2.11", "cpu"),
        ("torch", "2.11", "gpu"),
        ("jax", "0.7", "cpu"),
        ("jax", "0.7", "gpu"),
    ],
)
def test_golden(write_matrix, framework, minor, variant):
    cell = _cell(write_matrix, framework, minor, variant)
    got = render(cell, key_of(cell)).dockerfile
    path = GOLDEN / f"{cell.name}.Dockerfile"
    if os.environ.get("GPUENV_UPDATE_GOLDEN") == "1":
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with GPUENV_UPDATE_GOLDEN=1"
    assert got == path.read_text(encoding="utf-8"), f"{cell.name} renders differently from {path}"


def test_hadolint_reports_no_errors(tmp_path, write_matrix):
    """Every torch and JAX row, both variants, oldest and newest Python, with users'
    packages and indexes: the torch CPU cells (built only where PyTorch's index is
    reachable) are linted here."""
    paths = []
    for framework, rows in ROWS.items():
        for row in rows:
            for python in {row["python"][0], row["python"][-1]}:
                text = matrix_text(
                    framework,
                    row["minor"],
                    python,
                    'packages:\n  pip: ["pandas<3"]\n  apt: [git]\n',
                )
                for cell in resolve(write_matrix, text).cells:
                    options = Settings("t", index_url="https://pypi.example/simple")
                    path = tmp_path / cell.name / "Dockerfile"
                    path.parent.mkdir()
                    path.write_text(render(cell, key_of(cell, options)).dockerfile)
                    paths.append(path)
    assert len(paths) == 4 * sum(len(rows) for rows in ROWS.values())
    result = _lint(paths)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------- hostile inputs

BASE = """\
name: acme/gpuenv
matrix:
  torch: ["2.11"]
  python: ["3.12"]
  variant: [cpu, gpu]
bases:
  "3.12": {image: "python:3.12-slim"}
"""


@pytest.mark.parametrize(
    ("old", "new", "needle", "says"),
    [
        (
            '  torch: ["2.11"]',
            '  pytorch: ["2.11"]',
            "pytorch:",
            ("unknown key 'matrix.pytorch'", "tensorflow, torch, jax"),
        ),
        (
            '  torch: ["2.11"]',
            "  torch: [2.11]",
            "torch: [",
            ("YAML reads 2.11 as the number 2.11", 'quote versions: "2.11"'),
        ),
        ('  torch: ["2.11"]', "  jax: [0.7]", "jax: [", ("YAML reads 0.7 as the number 0.7",)),
        (
            '  torch: ["2.11"]',
            '  torch: ["2.16"]',
            "torch: [",
            (
                "unknown PyTorch version 2.16",
                "holds 2.9-2.15 (every minor release), the newest 2.15 (2.15.0",
                "run `gpuenv catalog --refresh`",
            ),
        ),
        (
            '  torch: ["2.11"]',
            '  jax: ["0.5"]',
            "jax: [",
            ("unknown JAX version 0.5", "0.7-0.12 (every minor release)", "newest 0.12"),
        ),
        (
            '  torch: ["2.11"]',
            '  torch: ["2.11.1"]',
            "torch: [",
            ("unknown PyTorch version 2.11.1",),
        ),
        ('  torch: ["2.11"]', '  torch: ["2.11", "2.11"]', "torch: [", ("values repeat",)),
        ('  torch: ["2.11"]', "  torch: []", "torch: [", ("at least 1 item",)),
        ('  torch: ["2.11"]\n', "", "matrix:", ("no framework axis", "tensorflow, torch, jax")),
        (
            '  python: ["3.12"]',
            '  python: ["3.16"]',
            "python: [",
            ("Python 3.16 is outside the supported range of PyTorch",),
        ),
    ],
)
def test_hostile_axes(write_matrix, tmp_path, line_of, old, new, needle, says):
    text = BASE.replace(old, new)
    if new.startswith('  python: ["3.16"]'):
        text += '  "3.16": {image: "python:3.16-slim"}\n'
    assert_rejected(write_matrix(text), tmp_path, *says, line=line_of(text, needle))


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('{torch: "2.11", jax: "0.7", python: "3.12"}', ("names torch and jax", "one framework")),
        ('{pytorch: "2.11", python: "3.12"}', ("unknown key 'matrix.include.0.pytorch'",)),
        ('{torch: 2.11, python: "3.12"}', ("YAML reads 2.11 as the number",)),
        ('{python: "3.11"}', ("lacks a framework (tensorflow, torch or jax)",)),
        (
            '{jax: "0.11", python: "3.11"}',
            ("include entry 1 cannot be built", "JAX 0.11.2 has no wheels for Python 3.11"),
        ),
        (
            '{torch: "2.11", python: "3.12", variant: cpu, cuda: "13.0"}',
            ("cuda/cudnn are set on a CPU cell",),
        ),
        # Impossible CUDA for the framework: torch 2.11 ships CUDA 13 wheels only, JAX 0.7
        # CUDA 12 ones.
        (
            '{torch: "2.11", python: "3.12", variant: gpu, cuda: "12.8", cudnn: "9.10"}',
            (
                "include entry 1 cannot be built",
                "PyTorch 2.11.0 requires nvidia-cublas",
                "CUDA 12.8 wheel set does not include",
            ),
        ),
        (
            '{jax: "0.7", python: "3.12", variant: gpu, cuda: "13.0", cudnn: "9.19"}',
            (
                "include entry 1 cannot be built",
                "JAX 0.7.2 requires nvidia-cublas-cu12",
                "CUDA 13.0 wheel set does not include",
            ),
        ),
    ],
)
def test_hostile_include(write_matrix, tmp_path, line_of, entry, says):
    text = BASE.replace(
        "  variant: [cpu, gpu]\n", f"  variant: [cpu, gpu]\n  include:\n    - {entry}\n"
    )
    text += '  "3.11": {debian: bookworm}\n'
    assert_rejected(write_matrix(text), tmp_path, *says, line=line_of(text, entry))


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ('{torch: "2.11", jax: "0.7"}', ("names torch and jax",)),
        ('{tensorflow: "2.21"}', ("matches no combination",)),
    ],
)
def test_hostile_exclude(write_matrix, tmp_path, line_of, entry, says):
    text = BASE.replace(
        "  variant: [cpu, gpu]\n", f"  variant: [cpu, gpu]\n  exclude:\n    - {entry}\n"
    )
    assert_rejected(write_matrix(text), tmp_path, *says, line=line_of(text, entry))


@pytest.mark.parametrize(
    ("default", "says"),
    [
        ('{torch: "2.11", jax: "0.7", python: "3.12"}', ("default names exactly one framework",)),
        ('{python: "3.12"}', ("default names exactly one framework",)),
        ('{torch: 2.11, python: "3.12"}', ("YAML reads 2.11 as the number",)),
        (
            '{jax: "0.7", python: "3.12"}',
            ("default (jax 0.7, python 3.12) is not a cell of the matrix",),
        ),
        ('{pytorch: "2.11", python: "3.12"}', ("unknown key 'default.pytorch'",)),
    ],
)
def test_hostile_default(write_matrix, tmp_path, line_of, default, says):
    text = BASE + f"default: {default}\n"
    assert_rejected(write_matrix(text), tmp_path, *says, line=line_of(text, "default:"))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "https://user:secret@mirror.example/whl/cpu",
            ("credentials do not belong in the matrix",),
        ),
        ('"https://mirror.example/whl/cpu; rm -rf /"', ("is not a plain http(s) URL",)),
        ("ftp://mirror.example/whl/cpu", ("is not a plain http(s) URL",)),
    ],
)
def test_hostile_torch_cpu_index(write_matrix, tmp_path, line_of, url, says):
    text = BASE + f"build:\n  torch_cpu_index: {url}\n"
    message = assert_rejected(
        write_matrix(text), tmp_path, *says, line=line_of(text, "torch_cpu_index")
    )
    assert "secret" not in message


def test_include_errors_keep_their_framework(write_matrix):
    """A torch include never extends a TensorFlow combination (it would make a cell of two
    frameworks); it adds its own."""
    text = BASE.replace('  torch: ["2.11"]', '  tensorflow: ["2.21"]').replace(
        "  variant: [cpu, gpu]\n",
        '  variant: [cpu]\n  include:\n    - {torch: "2.11", python: "3.12"}\n',
    )
    res = resolve(write_matrix, text)
    assert [c.name for c in res.cells] == ["tf2.21-py3.12-cpu", "torch2.11-py3.12-cpu"]
    with pytest.raises(MatrixError):
        resolve(write_matrix, text.replace('{torch: "2.11", python: "3.12"}', '{torch: "2.11"}'))


# ---------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("driver", "level", "says"),
    [
        ("575.57.08", "error", "older than 580.65.06, the minimum for any CUDA 13.x"),
        ("580.65.06", "warning", "older than 580.95.05, CUDA 13.0.2's own minimum"),
        ("580.95.05", "ok", "supports CUDA 13.0.2"),
    ],
)
def test_cuda_13_driver_verdicts(driver, level, says):
    from gpuenv.gpu.gpus import driver_verdict

    verdict = driver_verdict(driver, "13.0")
    assert verdict.level == level and says in verdict.message


@pytest.mark.parametrize(
    ("framework", "release", "cc", "level", "says"),
    [
        ("torch", "2.11.0", "7.0", "error", "Use PyTorch 2.9 instead"),  # CUDA 13 dropped Volta
        ("torch", "2.9.1", "7.0", "ok", "sm_70 kernels"),
        ("torch", "2.11.0", "9.0", "ok", "sm_90 kernels"),
        ("torch", "2.11.0", "12.1", "ok", "sm_120 kernels"),
        ("jax", "0.11.2", "7.0", "error", "Use JAX 0.7 instead"),
        ("jax", "0.11.2", "11.0", "ok", "sm_110 kernels"),
        ("jax", "0.7.2", "6.1", "ok", "sm_60 kernels"),
    ],
)
def test_capability_verdicts_per_framework(framework, release, cc, level, says):
    from gpuenv.gpu.capability import gpu_verdict
    from gpuenv.gpu.gpus import GpuInfo

    verdict = gpu_verdict([GpuInfo("580.95.05", "GPU", cc)], framework, release)
    assert verdict.level == level and says in verdict.message, verdict


# The releases whose kernels were read from their wheels (data/sass-*.yaml, hand-kept:
# no metadata says it); the generated rows after them have no record yet.
KERNEL_RECORDS = {("torch", "2.9"), ("torch", "2.11"), ("jax", "0.7"), ("jax", "0.11")}


def test_kernel_records_match_the_catalog_rows():
    from gpuenv.gpu.capability import judge_release, kernels_for
    from gpuenv.gpu.gpus import GpuInfo

    for framework, rows in ROWS.items():
        for row in rows:
            kernels = kernels_for(framework, row["version"])
            if (framework, row["minor"]) in KERNEL_RECORDS:
                assert kernels is not None and kernels.version == row["version"], (framework, row)
                continue
            # No record: the verdict says so (info), never a guess.
            assert kernels is None, (framework, row["minor"])
            verdict = judge_release(GpuInfo("595.71.05", "GPU", "9.0"), framework, row["version"])
            assert verdict.level == "info" and "no record of the CUDA kernels" in verdict.message


def test_bench_refuses_cells_of_other_frameworks(write_matrix):
    """bench's workloads import TensorFlow: a torch cell is refused up front, not run."""
    from gpuenv.bench import benchmark as bench
    from gpuenv.matrix.errors import GpuenvError
    from gpuenv.project.project import open_project

    project = open_project(write_matrix(matrix_text("torch", "2.11", "3.11")))
    with pytest.raises(
        GpuenvError, match=re.escape("measures TensorFlow workloads; torch2.11-py3.11-cpu")
    ):
        bench.plan(project, ["torch2.11-py3.11-cpu"])
