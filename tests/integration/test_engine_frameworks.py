"""PyTorch and JAX cells built and validated for real (issues 12 and 23): the newest JAX
release's CPU and GPU cells and the newest PyTorch release's GPU cell the catalog holds (its
generated data, gpuenv/data/*.yaml), on Python 3.13, each built once per module from a test
matrix in a temporary directory (repository gpuenv-test-<session>/frameworks, removed when
the module ends). The releases and their pins come from the catalog, so a refresh moves
this test to the new newest releases with no edit.

Every check that needs no GPU must pass, the CUDA libraries' loading included; the device
checks are skipped with the reason (no GPU here), never faked. The torch CPU cell is not
built here: its wheels are on PyTorch's own index, which these machines cannot reach (its
rendering is golden-tested and hadolint-checked in tests/unit/test_frameworks.py).

Costs on the project's machine (cold: the wheels fetched into the wheelhouse first, then
sent in the build context): JAX CPU ~30 s, JAX GPU ~90 s (its CPU cell's layers reused),
torch GPU ~160 s; ~11 GB of images.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.register_assert_rewrite("validate_fixtures")

from support.cells import REPO, TEST_REPOSITORY_PREFIX, context_dir  # noqa: E402
from support.cli import build_cells, gpuenv_cmd  # noqa: E402
from support.engine import docker, run_in_image  # noqa: E402
from validate_fixtures import DEVICE_CHECKS, GPU_CHECKS, IMAGE_CHECKS  # noqa: E402

pytest_plugins = ["validate_fixtures"]

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("validate_leftovers")]

REPOSITORY = f"{TEST_REPOSITORY_PREFIX}/frameworks"
PYTHON = "3.13"


def _newest(framework: str) -> Any:
    from gpuenv.catalog import compat

    return compat.catalog(framework).newest()


TORCH, JAX = _newest("torch"), _newest("jax")
assert TORCH.gpu_default is not None and JAX.gpu_default is not None
JAX_MAJOR = JAX.gpu_default[0].split(".")[0]
JAX_CPU = f"jax{JAX.minor}-py{PYTHON}-cpu"
JAX_GPU = f"jax{JAX.minor}-py{PYTHON}-cuda{JAX.gpu_default[0]}-gpu"
TORCH_GPU = f"torch{TORCH.minor}-py{PYTHON}-cuda{TORCH.gpu_default[0]}-gpu"
TORCH_CPU = f"torch{TORCH.minor}-py{PYTHON}-cpu"
CELLS = (JAX_CPU, JAX_GPU, TORCH_GPU)
TORCH_EXCLUDE = (
    f'    - {{torch: "{TORCH.minor}", variant: cpu}}   # PyTorch\'s own index: unreachable\n'
)

MATRIX = f"""\
name: {REPOSITORY}
matrix:
  torch: ["{TORCH.minor}"]
  jax: ["{JAX.minor}"]
  python: ["{PYTHON}"]
  variant: [cpu, gpu]
  exclude:
{TORCH_EXCLUDE}default: {{jax: "{JAX.minor}", python: "{PYTHON}"}}
bases:
  "{PYTHON}": {{debian: trixie}}
"""

# Skipped everywhere here, with these reasons: no lock, no size baseline, no GPU.
NO_LOCK = "no matrix.lock for this cell"
NO_BASELINE = "no size baseline recorded"
NO_GPUS = "no --gpus given"


CPU_SIDE_GPU_CHECKS = (
    "test_cuda_libraries_load_without_a_driver",
    "test_cuda_runtime_version",
    "test_cudnn_version",
    "test_framework_build_info_agrees",
    "test_ldd_finds_everything_but_libcuda",
    "test_library_path_reaches_the_wheels",
)


def image(cell: str) -> str:
    return f"{REPOSITORY}:{cell}"


def free_disk() -> str:
    usage = shutil.disk_usage("/")
    return f"{usage.free / 1e9:.1f} GB free"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The matrix file and each cell built once (CPU before its GPU sibling), timed."""
    path = tmp_path_factory.mktemp("frameworks") / "matrix.yaml"
    path.write_text(MATRIX, encoding="utf-8")
    times: dict[str, float] = {}
    before = free_disk()
    for cell in CELLS:
        start = time.monotonic()
        result = build_cells(cell, matrix=path)[cell]
        times[cell] = time.monotonic() - start
        print(f"{cell}: {result['status']} in {times[cell]:.0f} s")
    print(f"disk before: {before}; after: {free_disk()}")
    return {"matrix": path, "times": times}


@pytest.fixture(scope="module")
def outcomes(built: dict[str, Any], junit_outcomes: Callable[..., Any]) -> dict[str, Any]:
    """`gpuenv validate` of the three cells, once: exit status and per-check outcomes."""
    xml = built["matrix"].parent / "junit.xml"
    proc = gpuenv_cmd(
        "validate", *CELLS, "-f", str(built["matrix"]), "--junitxml", str(xml), check=False
    )
    return {"proc": proc, "found": junit_outcomes(xml) if xml.exists() else {}}


def test_validation_passes_every_check_that_needs_no_gpu(outcomes) -> None:
    proc, found = outcomes["proc"], outcomes["found"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert set(found) == set(CELLS)
    for cell, checks in found.items():
        gpu = "gpu" in cell
        assert set(checks) == set(IMAGE_CHECKS) | (
            set(GPU_CHECKS) | set(DEVICE_CHECKS) if gpu else set()
        )
        failed = {name: o.message for name, o in checks.items() if o.outcome == "failed"}
        assert not failed, (cell, failed)
        skipped = {name: o.message for name, o in checks.items() if o.outcome == "skipped"}
        expected_skips = {
            "test_packages_match_the_lock": NO_LOCK,
            "test_size_within_baseline": NO_BASELINE,
        }
        if gpu:
            expected_skips.update(dict.fromkeys(DEVICE_CHECKS, NO_GPUS))
        if cell == JAX_CPU:  # a CPU cell without packages pins nothing
            expected_skips["test_pinned_packages_are_installed"] = (
                "pins no pip packages or CUDA wheels"
            )
        if cell == TORCH_GPU:  # torch's CUDA wheels bring no nvcc: nothing compiles PTX
            expected_skips["test_ptxas_is_found"] = "torch requires no nvcc wheel"
        assert set(skipped) == set(expected_skips), (cell, skipped)
        for name, reason in expected_skips.items():
            assert reason in skipped[name], (cell, name, skipped[name])
    # The CPU-side GPU checks passed for both CUDA majors: libraries load, versions agree.
    for cell in (JAX_GPU, TORCH_GPU):
        for name in CPU_SIDE_GPU_CHECKS:
            assert found[cell][name].outcome == "passed", (cell, name)
    assert found[JAX_GPU]["test_ptxas_is_found"].outcome == "passed"


def run_python(cell: str, code: str) -> str:
    return run_in_image(image(cell), "python", "-c", code).strip()


def test_images_hold_what_the_catalog_says(built) -> None:
    # torch's GPU wheel is the CUDA build of its pins and finds its CUDA wheels with no driver.
    doc = json.loads(
        run_python(
            TORCH_GPU,
            "import json, torch, importlib.metadata as m\n"
            "print(json.dumps({'version': m.version('torch'), 'cuda': torch.version.cuda,\n"
            "  'cudnn': torch.backends.cudnn.version(), 'available': torch.cuda.is_available(),\n"
            "  'toolkit': m.version('cuda-toolkit'), 'cublas': m.version('nvidia-cublas')}))",
        )
    )
    pins = TORCH.gpu_pins
    cudnn = [int(p) for p in pins["nvidia-cudnn-cu13"].split(".")[:3]]
    assert doc == {"version": TORCH.version, "cuda": TORCH.gpu_default[0],
                   "cudnn": cudnn[0] * 10000 + cudnn[1] * 100 + cudnn[2], "available": False,
                   "toolkit": pins["cuda-toolkit"], "cublas": pins["nvidia-cublas"]}  # fmt: skip
    # JAX's GPU image: its CUDA plugin at jax's version; without a GPU it runs on the CPU.
    out = run_python(
        JAX_GPU,
        "import importlib.metadata as m, jax\n"
        f"print(m.version('jax-cuda{JAX_MAJOR}-plugin'), m.version('jaxlib'), "
        "jax.devices()[0].platform)",
    )
    assert out.splitlines()[-1] == f"{JAX.version} {JAX.version} cpu"


# The diff ID of a layer that holds nothing (an empty tar): BuildKit writes one for WORKDIR.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def layers(ref: str) -> list[str]:
    out = docker("image", "inspect", "-f", "{{json .RootFS.Layers}}", ref).stdout
    return list(json.loads(out))


def test_layers(built) -> None:
    """JAX's GPU image is its CPU image's layers plus the CUDA layer(s) on top (the layer
    cache shares them; BuildKit's empty layers, WORKDIR's, are no content of either); torch's
    GPU image installs torch and its CUDA wheels in one layer: one install step, which
    mounts one part of the context (python-env/: torch and the CUDA wheels together), and
    whose layer is nearly all of the image above the base."""
    from gpuenv.store.cache import cache_dir

    cpu = [d for d in layers(image(JAX_CPU)) if d != EMPTY_LAYER]
    gpu = [d for d in layers(image(JAX_GPU)) if d != EMPTY_LAYER]
    assert gpu[: len(cpu)] == cpu and len(gpu) > len(cpu), (cpu, gpu)
    rows = docker("history", "--no-trunc", "--format", "{{json .}}", image(TORCH_GPU)).stdout
    history = [json.loads(line) for line in rows.splitlines()]
    installs = [h for h in history if "uv pip install" in h["CreatedBy"]]
    assert len(installs) == 1, [h["CreatedBy"][:80] for h in history]
    rendered = built["matrix"].parent / "rendered-torch-gpu"
    gpuenv_cmd("render", "-f", str(built["matrix"]), TORCH_GPU, "-o", str(rendered))
    dockerfile = (rendered / TORCH_GPU / "Dockerfile").read_text()
    assert dockerfile.count("--mount=type=bind,source=") == 1
    assert "--mount=type=bind,source=python-env," in dockerfile
    # What that step mounted (the build's context, kept in gpuenv's cache): torch and its
    # CUDA wheels in one resolution, each either fetched by the engine's host (index.txt,
    # with its locked hash) or sent (requirements.txt, its wheel beside it).
    sent = context_dir(cache_dir().parent, built["matrix"], TORCH_GPU)
    assert not (sent / "cuda").exists()
    fetched = (sent / "python-env" / "index.txt").read_text()
    requirements = (sent / "python-env" / "requirements.txt").read_text()
    cudnn = TORCH.gpu_pins["nvidia-cudnn-cu13"]
    for pin in (f"torch=={TORCH.version} ", f"nvidia-cudnn-cu13=={cudnn} "):
        assert pin in fetched + requirements, pin
    if f"torch=={TORCH.version} " in requirements:
        assert any(f.name.startswith(f"torch-{TORCH.version}-")
                   for f in (sent / "python-env").iterdir())  # fmt: skip
    info = json.loads(docker("image", "inspect", image(TORCH_GPU)).stdout)[0]
    base = json.loads(docker("image", "inspect", info["Config"]["Labels"][
        "org.opencontainers.image.base.name"]).stdout)[0]  # fmt: skip
    install_size = _size(installs[0]["Size"])
    assert install_size > 0.95 * (info["Size"] - base["Size"]), (install_size, info["Size"])


def _size(text: str) -> float:
    """docker history's human sizes (decimal units: 2.14GB, 8.91kB, 0B)."""
    units = {"kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


@pytest.mark.parametrize(("cell", "script", "says"), [
    (JAX_CPU, "train_jax.py", "device: cpu:0"),
    (TORCH_GPU, "train_torch.py", "device: cpu (CPU)"),
])  # fmt: skip
def test_examples_run_and_print_their_device(built, cell, script, says) -> None:
    """The example workloads through `gpuenv run` (no GPU here: both say they use the CPU)."""
    proc = gpuenv_cmd(
        "run", "-f", str(built["matrix"]), "-i", cell, "--network", "none", "--",
        "python", str(REPO / "examples" / script), timeout=600,
    )  # fmt: skip
    assert says in proc.stdout and "accuracy" in proc.stdout, proc.stdout[-2000:]


def test_torch_cpu_cell_is_planned_with_pytorchs_index(built) -> None:
    """The excluded torch CPU cell, rendered from a matrix that keeps it: the Dockerfile names
    the key of its upstream indexes, which stands for the mirror (never the mirror itself,
    and not the key of the cells without it), the cell carries the mirror as its index and
    its CPU wheel as what it installs, and `build --dry-run` plans it."""
    from gpuenv.project.project import open_project
    from gpuenv.store import wheelhouse

    text = MATRIX.replace(TORCH_EXCLUDE, "")
    text = (
        text.replace("  exclude:\n", "")
        + "build:\n  torch_cpu_index: https://mirror.example/whl/cpu\n"
    )
    path = built["matrix"].parent / "with-torch-cpu.yaml"
    path.write_text(text, encoding="utf-8")
    out = path.parent / "rendered"
    gpuenv_cmd("render", "-f", str(path), TORCH_CPU, "-o", str(out))
    dockerfile = (out / TORCH_CPU / "Dockerfile").read_text()
    project = open_project(path)
    urls = project.settings.indexes(project.one_cell(TORCH_CPU, "-i"))
    assert "https://mirror.example/whl/cpu" in [u.rstrip("/") for u in urls], urls
    others = project.settings.indexes(project.one_cell(TORCH_GPU, "-i"))
    assert wheelhouse.index_key(urls) != wheelhouse.index_key(others)
    assert f"indexes keyed {wheelhouse.index_key(urls)} " in dockerfile
    assert "mirror.example" not in dockerfile and "127.0.0.1" not in dockerfile
    cells = json.loads(gpuenv_cmd("matrix", "-f", str(path), "--json").stdout)
    cpu = next(c for c in cells["cells"] if c["name"] == TORCH_CPU)
    assert cpu["indexes"] == ["https://mirror.example/whl/cpu"]
    assert cpu["install"] == f"torch=={TORCH.version}+cpu"
    plan = json.loads(gpuenv_cmd("build", "-f", str(path), TORCH_CPU, "--dry-run", "--json").stdout)
    assert TORCH_CPU in json.dumps(plan)


def test_images_validate_from_their_labels(built) -> None:
    """`validate -i IMAGE`: the cell each image's labels claim, rebuilt from the torch and
    JAX catalogs (never the labels alone), passes."""
    proc = gpuenv_cmd("validate", "-i", image(JAX_CPU), "-i", image(TORCH_GPU), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"✓ {image(JAX_CPU)}" in proc.stdout and f"✓ {image(TORCH_GPU)}" in proc.stdout


@pytest.fixture(scope="module")
def broken(built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Images derived from the built ones and broken in one respect each (one layer)."""
    cases = {
        # CUDA 13's runtime under another name: nothing opens libcudart.so.13.
        "broken-cudart13": (TORCH_GPU, "RUN cd {sp}/nvidia/cu13/lib && mv libcudart.so.13 x.so\n"),
        # jaxlib's XLA extension gone: jax imports nothing that computes.
        "broken-jaxlib": (
            JAX_CPU,
            "RUN rm {sp}/jaxlib/_jax.so\n",
        ),
    }
    sp = f"/opt/venv/lib/python{PYTHON}/site-packages"
    refs = {}
    for tag, (cell, step) in cases.items():
        context = tmp_path_factory.mktemp(tag)
        (context / "Dockerfile").write_text(
            f"FROM {image(cell)}\nUSER root\n{step.format(sp=sp)}USER 1000:1000\n"
        )
        ref = f"{REPOSITORY}:{tag}"
        docker("build", "--network", "none", "-t", ref, str(context), timeout=600)
        refs[tag] = ref
    return refs


@pytest.fixture(scope="module")
def broken_validated(broken: dict[str, str]) -> Callable[[str], Any]:
    """validated(tag) -> `gpuenv validate -i` of that broken image, run once per image:
    one validation shows every check it fails (a torch GPU image's took 30-60 s, and two
    cases below read the same image's)."""
    runs: dict[str, Any] = {}

    def validated(tag: str) -> Any:
        if tag not in runs:
            runs[tag] = gpuenv_cmd("validate", "-i", broken[tag], check=False)
        return runs[tag]

    return validated


@pytest.mark.parametrize(("tag", "check", "says"), [
    ("broken-cudart13", "cuda libraries load without a driver", "libcudart.so.13: cannot open"),
    ("broken-cudart13", "cuda runtime version", "libcudart.so.13"),
    ("broken-jaxlib", "framework computes on the cpu", "python exited 1"),
])  # fmt: skip
def test_framework_checks_fail_on_a_broken_image(broken_validated, tag, check, says) -> None:
    proc = broken_validated(tag)
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = [line for line in proc.stdout.splitlines() if line.strip().startswith("FAILED")]
    line = next((f for f in failed if f.strip().startswith(f"FAILED {check}:")), "")
    assert says in line, failed
