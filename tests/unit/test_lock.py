"""matrix.lock without an engine: the file's round trip, drift, the inputs digest, base
drift, rendering from a lock (CPU and GPU), and `gpuenv diff`'s comparison and text."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from rendering import key_of

from gpuenv.building import context
from gpuenv.building import lock as locks
from gpuenv.building.plan import spec_hash
from gpuenv.building.render import render
from gpuenv.catalog import compat
from gpuenv.engine.client import ImageInfo
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.contract import LOCK_DIR
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.lockfile import CellLock, Lock
from gpuenv.validate.diff import IDENTITY_LABELS, Inventory, compare, render_text
from gpuenv.validate.expected import locked_versions

DATE = "2026-11-01T00:00:00Z"
BASE = "gpuenv/debian:bookworm"
ROOTFS = "sha256:" + "ab" * 32
BASE_ID = "sha256:" + "cd" * 32

# What `uv pip compile --generate-hashes --no-header --no-annotate` writes.
PYTHON_ENV = """\
absl-py==2.3.1 \\
    --hash=sha256:a97ee1f3e05b0fa48ef1c8a4a9c9b7ac6bd0a2b5b5c0f3a8cde6a3b2d7e1f0c1 \\
    --hash=sha256:eeecf07f0c2a93ace0772c92e596ace6d3d3996c042b2128459aaae2a76de11d
six==1.17.0 \\
    --hash=sha256:4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274 \\
    --hash=sha256:ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81
tensorflow==2.21.0 \\
    --hash=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
Typing_Extensions==4.15.0 ; python_full_version < '3.12' \\
    --hash=sha256:f0fa19c6845758ab08074a0cfa8b7aecb71c999ca73d62883bc25cc018c4e548
"""
CUDA = """\
nvidia-cudnn-cu12==9.3.0.75 \\
    --hash=sha256:1111111111111111111111111111111111111111111111111111111111111111
"""


@pytest.fixture
def cells(write_matrix) -> dict[str, Cell]:
    """The minimal matrix's cells (TF 2.21, Python 3.11, CPU and GPU), by variant."""
    resolved = compat.resolve(matrix.load(write_matrix())).cells
    return {c.variant: c for c in resolved}


def cell_lock(cell: Cell, python_env: str = PYTHON_ENV) -> CellLock:
    return CellLock(lockfile.inputs_digest(cell, DATE), python_env, CUDA if cell.is_gpu else "")


def make_lock(path: Path, cells: dict[str, Cell]) -> Lock:
    return Lock(
        path=path,
        exclude_newer=DATE,
        cells={c.name: cell_lock(c) for c in cells.values()},
        bases={BASE: {"id": BASE_ID, "rootfs": ROOTFS, "packages": ["python3=3.11.2-1+b1"]}},
    )


# --------------------------------------------------------------------------- the file


def test_lock_round_trip(tmp_path, cells):
    path = tmp_path / "matrix.lock"
    written = make_lock(path, cells)
    lockfile.write(written)
    loaded = lockfile.load(path)
    assert loaded == written
    text = path.read_text()
    assert text.startswith("# matrix.lock: written by `gpuenv lock`")
    # Reviewable: the requirements are literal blocks, one pin or hash a line.
    assert "python_env: |" in text and "cuda: |" in text
    assert "    six==1.17.0 \\\n" in text
    # Writing what was read gives the same bytes (a re-lock of an unchanged matrix is no diff).
    lockfile.write(loaded)
    assert path.read_text() == text


def test_cpu_cells_have_no_cuda_section(tmp_path, cells):
    path = tmp_path / "matrix.lock"
    lockfile.write(make_lock(path, {"cpu": cells["cpu"]}))
    assert "cuda:" not in path.read_text()
    assert lockfile.load(path).cells[cells["cpu"].name].cuda == ""


def test_lock_path_is_next_to_the_matrix(tmp_path):
    assert locks.lock_path(tmp_path / "envs.yaml") == tmp_path / "envs.lock"


def test_missing_lock_is_none_and_garbage_is_an_error(tmp_path):
    assert lockfile.load(tmp_path / "matrix.lock") is None
    bad = tmp_path / "bad.lock"
    bad.write_text("cells: [1, 2]\n")
    with pytest.raises(GpuenvError, match="not a gpuenv lock"):
        lockfile.load(bad)


# --------------------------------------------------------------------------- drift


def test_no_drift_when_the_matrix_is_unchanged(tmp_path, cells):
    lock = make_lock(tmp_path / "matrix.lock", cells)
    assert lockfile.drift(lock, list(cells.values())) == {}


def test_an_added_package_is_drift(tmp_path, cells):
    lock = make_lock(tmp_path / "matrix.lock", cells)
    edited = dataclasses.replace(cells["cpu"], pip=("iniconfig==2.1.0",))
    assert lockfile.drift(lock, [edited, cells["gpu"]]) == {
        edited.name: "the matrix changed since it was locked"
    }


def test_a_cell_missing_from_the_lock_is_drift(tmp_path, cells):
    lock = make_lock(tmp_path / "matrix.lock", {"cpu": cells["cpu"]})
    assert lockfile.drift(lock, list(cells.values())) == {cells["gpu"].name: "not in the lock"}


def test_the_project_decides_the_drift_once_for_every_step_that_asks(write_matrix, monkeypatch):
    """A build's plan refuses a drifted cell only where it builds it; its --validate then reads
    the same answer (Project.lock_drift), decided once per command for every cell."""
    from gpuenv.building import plan
    from gpuenv.project.project import open_project

    project = open_project(write_matrix())
    cpu, gpu = sorted(project.cells, key=lambda c: c.is_gpu)
    lockfile.write(make_lock(project.lock_path, {"cpu": cpu}))  # the GPU cell: not locked
    asked: list[int] = []
    drift = lockfile.drift
    monkeypatch.setattr(
        lockfile, "drift", lambda lock, cs: asked.append(len(cs)) or drift(lock, cs)
    )
    assert plan.lock_entries(project, [cpu]) == {cpu.name: cell_lock(cpu)}
    with pytest.raises(GpuenvError, match=f"{gpu.name}: not in the lock"):
        plan.lock_entries(project, [gpu])
    assert project.lock_drift == {gpu.name: "not in the lock"} and asked == [2]


def test_inputs_digest_changes_with_each_input(cells, monkeypatch):
    cpu, gpu = cells["cpu"], cells["gpu"]
    digest = lockfile.inputs_digest(cpu, DATE)
    assert digest.startswith("sha256:") and digest == lockfile.inputs_digest(cpu, DATE)
    variants = {
        "python": lockfile.inputs_digest(dataclasses.replace(cpu, python="3.12"), DATE),
        "framework version": lockfile.inputs_digest(
            dataclasses.replace(cpu, framework_version="2.21.1"), DATE
        ),
        "pip": lockfile.inputs_digest(dataclasses.replace(cpu, pip=("six==1.17.0",)), DATE),
        "exclude_newer": lockfile.inputs_digest(cpu, "2026-11-02T00:00:00Z"),
    }
    wheels = dict(gpu.wheels, **{"nvidia-cudnn-cu12": "9.5.1.17"})
    variants["cuda wheels"] = lockfile.inputs_digest(dataclasses.replace(gpu, wheels=wheels), DATE)
    assert lockfile.inputs_digest(gpu, DATE) != digest
    # An arm64 cell resolves for aarch64-manylinux_2_28: its own lock entry.
    variants["platform"] = lockfile.inputs_digest(dataclasses.replace(cpu, arch="arm64"), DATE)
    for what, other in variants.items():
        assert other != digest, f"the digest ignores the {what}"
    assert len({*variants.values(), digest}) == len(variants) + 1


def test_inputs_digest_ignores_the_image_name(cells):
    # A lock is about what is installed: renaming the repository needs no re-lock.
    cpu = cells["cpu"]
    renamed = dataclasses.replace(cpu, repository="acme/other")
    assert lockfile.inputs_digest(renamed, DATE) == lockfile.inputs_digest(cpu, DATE)


# --------------------------------------------------------------------------- base drift


def info(
    image_id: str = BASE_ID, rootfs: str | None = ROOTFS, layers: tuple[str, ...] | None = None
) -> ImageInfo:
    labels = {"io.gpuenv.rootfs": rootfs} if rootfs else {}
    if layers is None:  # as the engine gives a bootstrapped base: the label states its layer
        layers = (rootfs,) if rootfs else ("sha256:" + "a1" * 32, "sha256:" + "a2" * 32)
    return ImageInfo(id=image_id, labels=labels, layers=layers)


def test_bootstrapped_base_is_pinned_by_its_root_filesystem(tmp_path, cells):
    lock = make_lock(tmp_path / "matrix.lock", cells)
    assert lockfile.base_drift(lock, BASE, info()) is None
    # The same root filesystem imported again (another ID) is the same base.
    assert lockfile.base_drift(lock, BASE, info(image_id="sha256:" + "ef" * 32)) is None
    other = "sha256:" + "99" * 32
    why = lockfile.base_drift(lock, BASE, info(rootfs=other))
    assert why and other in why and ROOTFS in why


def test_a_base_whose_label_claims_the_locked_root_filesystem_is_drift(tmp_path, cells):
    """Issue 35, M2b: another filesystem with the locked io.gpuenv.rootfs label copied onto
    it (as a crafted `cache import` or `docker load` brings) is compared by its layer."""
    lock = make_lock(tmp_path / "matrix.lock", cells)
    forged = "sha256:" + "66" * 32
    why = lockfile.base_drift(lock, BASE, info(image_id="sha256:" + "ef" * 32, layers=(forged,)))
    assert why and forged in why and ROOTFS in why
    # Nor does a base that dropped the label escape the pin.
    why = lockfile.base_drift(lock, BASE, info(rootfs=None, layers=(forged,)))
    assert why and forged in why


def test_image_base_is_pinned_by_its_id(tmp_path, cells):
    lock = make_lock(tmp_path / "matrix.lock", cells)
    lock.bases = {"nvidia/cuda:12.5": {"id": BASE_ID, "rootfs": None, "packages": []}}
    assert lockfile.base_drift(lock, "nvidia/cuda:12.5", info(rootfs=None)) is None
    why = lockfile.base_drift(lock, "nvidia/cuda:12.5", info("sha256:" + "12" * 32, None))
    assert why and "is not the locked" in why


def test_a_base_the_lock_does_not_know_is_drift(tmp_path, cells):
    # The matrix moved a Python to another base after locking.
    lock = make_lock(tmp_path / "matrix.lock", cells)
    why = lockfile.base_drift(lock, "gpuenv/debian:trixie", info())
    assert why and "not in the lock" in why


def test_base_identity_records_the_root_filesystems_layer():
    found = lockfile.base_identity(info(), ["python3=3.11.2-1+b1"])
    assert found == {"id": BASE_ID, "rootfs": ROOTFS, "packages": ["python3=3.11.2-1+b1"]}
    # The layer the engine hashed, not what the label says.
    layer = "sha256:" + "77" * 32
    assert lockfile.base_identity(info(layers=(layer,)), [])["rootfs"] == layer


# --------------------------------------------------------------------------- rendering


def runs(dockerfile: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def copies(dockerfile: str) -> list[tuple[str, str]]:
    return [
        tuple(line.split()[1:3])  # type: ignore[misc]
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
    ]


INSTALL = "--require-hashes --no-deps --python /opt/venv/bin/python -r /mnt/requirements.txt"


def mounted(run: str) -> str | None:
    m = re.match(r"RUN --mount=type=bind,source=([\w-]+),target=/mnt ", run)
    return m.group(1) if m else None


def test_cpu_cell_installs_exactly_the_lock(cells):
    cpu = cells["cpu"]
    ctx = render(cpu, key_of(cpu), cell_lock(cpu))
    assert ctx.files["requirements/python-env.txt"] == PYTHON_ENV
    assert "requirements/cuda.txt" not in ctx.files
    # The lock's entry is copied into the image after every install step (one layer).
    assert copies(ctx.dockerfile) == [("requirements/", f"{LOCK_DIR}/")]
    assert ctx.dockerfile.index("COPY requirements/") > ctx.dockerfile.rindex("uv pip install")
    (install,) = [r for r in runs(ctx.dockerfile) if "pip install" in r and "/opt/venv" in r]
    # The step installs its mounted part's requirements.txt, which is the lock's entry.
    assert mounted(install) == "python-env" and INSTALL in install
    assert context.parts(cpu, cell_lock(cpu)) == {"python-env": PYTHON_ENV}
    assert "tensorflow==" not in install  # the resolution comes from the file, not the line


def test_gpu_cell_installs_the_cuda_wheels_from_the_lock(cells):
    gpu = cells["gpu"]
    ctx = render(gpu, key_of(gpu), cell_lock(gpu))
    assert ctx.files["requirements/python-env.txt"] == PYTHON_ENV
    assert ctx.files["requirements/cuda.txt"] == CUDA
    assert copies(ctx.dockerfile) == [("requirements/", f"{LOCK_DIR}/")]
    installs = [r for r in runs(ctx.dockerfile) if "uv pip install" in r]
    assert len(installs) == 2
    assert [mounted(r) for r in installs] == ["python-env", "cuda"]
    assert all(INSTALL in r for r in installs)
    assert context.parts(gpu, cell_lock(gpu)) == {"python-env": PYTHON_ENV, "cuda": CUDA}
    assert not any("nvidia-cudnn-cu12==" in r for r in installs)
    # Every COPY source is in the context.
    assert all(any(f.startswith(src) for f in ctx.files) for src, _ in copies(ctx.dockerfile))


def test_without_a_lock_nothing_is_copied_and_the_steps_are_the_same(cells):
    # An unlocked cell is resolved at build time (gpuenv/building/sendable.py, Sender.resolution)
    # and installed from its mounted part as a locked one is: hashes required, no index.
    for cell in cells.values():
        ctx = render(cell, key_of(cell))
        assert set(ctx.files) == {"Dockerfile", "cell.json"}
        assert not copies(ctx.dockerfile)
        assert runs(ctx.dockerfile) == runs(render(cell, key_of(cell), cell_lock(cell)).dockerfile)
        assert "--require-hashes" in ctx.dockerfile and "tensorflow==" not in ctx.dockerfile


def test_the_lock_is_part_of_the_spec_hash(cells):
    cpu = cells["cpu"]
    plain = spec_hash(render(cpu, key_of(cpu)).digest, BASE_ID)
    locked = spec_hash(render(cpu, key_of(cpu), cell_lock(cpu)).digest, BASE_ID)
    other = spec_hash(
        render(cpu, key_of(cpu), cell_lock(cpu, PYTHON_ENV.replace("2.3.1", "2.3.2"))).digest,
        BASE_ID,
    )
    assert len({plain, locked, other}) == 3


def test_locked_versions_reads_the_pins(cells):
    assert locked_versions(cell_lock(cells["cpu"]), gpu=False) == {
        "absl-py": "2.3.1",
        "six": "1.17.0",
        "tensorflow": "2.21.0",
        "typing-extensions": "4.15.0",
    }
    assert locked_versions(cell_lock(cells["gpu"]), gpu=True)["nvidia-cudnn-cu12"] == "9.3.0.75"


# --------------------------------------------------------------------------- gpuenv diff


def inventory(ref: str, **changes) -> Inventory:
    inv = Inventory(
        ref=ref,
        image_id="sha256:" + "00" * 32,
        size=2_260_000_000,
        env={"PATH": "/opt/venv/bin:/usr/bin", "VIRTUAL_ENV": "/opt/venv"},
        labels={"io.gpuenv.cell": "tf2.21-py3.11-cpu", IDENTITY_LABELS[0]: "a" * 64},
        pip={"tensorflow": "2.21.0", "six": "1.17.0"},
        apt={"python3": "3.11.2-1+b1"},
        files={
            "/opt/venv/bin/python": "120777 0:0 16 link:python3",
            "/etc/passwd": "100644 0:0 9 x",
        },
    )
    return dataclasses.replace(inv, **changes)


def test_identical_inventories():
    a = inventory("a")
    b = inventory("b", image_id="sha256:" + "11" * 32, labels={**a.labels, IDENTITY_LABELS[0]: "b"})
    result = compare(a, b)
    assert result == {}
    assert render_text(a, b, result) == "identical: a and b hold the same environment"


def test_every_section_reports_its_differences():
    a = inventory("a")
    b = inventory(
        "b",
        size=a.size + 5_000_000,
        env={**a.env, "PYTHONUNBUFFERED": "1"},
        labels={**a.labels, "io.gpuenv.cell": "other"},
        pip={**a.pip, "six": "1.16.0", "iniconfig": "2.1.0"},
        apt={},
        files={"/etc/passwd": "100644 0:0 9 y"},
    )
    result = compare(a, b)
    assert result["pip"] == {
        "only_a": [],
        "only_b": ["iniconfig"],
        "changed": [["six", "1.17.0", "1.16.0"]],
    }
    assert result["apt"]["only_a"] == ["python3"]
    assert result["env"]["only_b"] == ["PYTHONUNBUFFERED"]
    assert result["labels"]["changed"] == [["io.gpuenv.cell", "tf2.21-py3.11-cpu", "other"]]
    assert result["files"]["only_a"] == ["/opt/venv/bin/python"]
    assert result["files"]["changed"][0][0] == "/etc/passwd"
    assert result["size"] == [a.size, b.size]
    text = render_text(a, b, result).splitlines()
    assert text[0].startswith("--- a (") and text[1].startswith("+++ b (")
    assert "pip: 2 difference(s)" in text
    assert "  + iniconfig" in text and "  ~ six: 1.17.0 -> 1.16.0" in text
    assert "  - python3" in text and "  - /opt/venv/bin/python" in text
    assert text[-1] == "size: 2260.0 MB -> 2265.0 MB (+5.0 MB)"


def test_long_sections_are_cut_at_the_limit():
    a = inventory("a", files={})
    b = inventory("b", files={f"/f{i:03}": "100644 0:0 0 x" for i in range(50)})
    text = render_text(a, b, compare(a, b), limit=10).splitlines()
    assert "files: 50 difference(s)" in text
    assert sum(line.startswith("  + /f") for line in text) == 10
    assert "  ... and 40 more (--json lists all)" in text


def test_reproducible_epoch_comes_from_the_lock():
    from gpuenv.building import reproducible

    assert reproducible.epoch_for("2026-11-22T00:00:00Z", 1) == 1795305600
    assert reproducible.epoch_for(None, 1735689600) == 1735689600


def test_a_size_under_the_reports_resolution_is_not_a_difference():
    """Two builds of one lock: the same files, layer archives whose headers carry each
    build's times, so the engine's sizes differ by bytes; a real change is reported."""
    a = inventory("a")
    assert "size" not in compare(a, inventory("b", size=a.size + 4_096))
    assert compare(a, inventory("b", size=a.size + 2_000_000))["size"] == [
        a.size,
        a.size + 2_000_000,
    ]


# ------------------------------------------------------------------ pylock.toml (PEP 751)


def _pylock(packages: dict[str, str]) -> str:
    rows = "".join(
        f'\n[[packages]]\nname = "{n}"\nversion = "{v}"\nindex = "https://pypi.org/simple"\n'
        f'wheels = [{{ url = "https://files.example/{n.replace("-", "_")}-{v}-py3-none-any.whl", '
        f'hashes = {{ sha256 = "{"a" * 64}" }} }}]\n'
        for n, v in packages.items()
    )
    return f'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.11"\n{rows}'


LOCKED = {"absl-py": "2.3.1", "six": "1.17.0", "tensorflow": "2.21.0",
          "typing-extensions": "4.15.0", "nvidia-cudnn-cu12": "9.3.0.75"}  # fmt: skip


def test_pylock_is_the_same_resolution_as_the_lock_in_pep_751_form(monkeypatch, cells, tmp_path):
    from packaging.pylock import Pylock, is_valid_pylock_path

    seen = {}

    def run(command, **kw):
        seen["command"] = command
        seen["requirements"] = Path(command[3]).read_text().split()
        return locks.subprocess.CompletedProcess(command, 0, _pylock(LOCKED), "")

    monkeypatch.setattr(locks, "_uv", lambda: "uv")
    monkeypatch.setattr(locks.subprocess, "run", run)
    gpu = cells["gpu"]
    text = locks.pylock_text(gpu, cell_lock(gpu), DATE, None)
    assert seen["command"][-2:] == ["--format", "pylock.toml"]
    # The environment and the CUDA layer's pins, resolved together: one environment.
    assert seen["requirements"] == [
        *lockfile.env_requirements(gpu),
        *lockfile.cuda_requirements(gpu),
    ]
    import tomllib

    assert {p.name for p in Pylock.from_dict(tomllib.loads(text)).packages} == set(LOCKED)
    path = locks.pylock_path(tmp_path / "matrix.lock", gpu)
    assert is_valid_pylock_path(path) and path.parent == tmp_path


def test_a_pylock_resolution_that_differs_from_the_lock_is_an_error(monkeypatch, cells):
    other = {**LOCKED, "six": "1.16.0"}

    def run(command, **kw):
        return locks.subprocess.CompletedProcess(command, 0, _pylock(other), "")

    monkeypatch.setattr(locks, "_uv", lambda: "uv")
    monkeypatch.setattr(locks.subprocess, "run", run)
    gpu = cells["gpu"]
    with pytest.raises(GpuenvError, match=r"differs from matrix\.lock's") as exc:
        locks.pylock_text(gpu, cell_lock(gpu), DATE, None)
    assert "six==1.16.0" in exc.value.message and "six==1.17.0" in exc.value.message
