"""What a build sends (gpuenv/building/context.py), without an engine: the target its wheels are
chosen for, the parts its install steps mount (the same the templates mount), and the
context directory assembled from a stand-in fetcher."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest
from rendering import key_of

from gpuenv.building import context
from gpuenv.building.render import render
from gpuenv.catalog import compat
from gpuenv.matrix import schema as matrix
from gpuenv.matrix.cell import Cell
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.lockfile import CellLock

MIXED = """\
name: acme/ml
matrix:
  tensorflow: ["2.21"]
  torch: ["2.11"]
  jax: ["0.7"]
  python: ["3.11", "3.12"]
  variant: [cpu, gpu]
default: {torch: "2.11", python: "3.11"}
bases:
  "3.11": {debian: bookworm}
  "3.12": {image: "python:3.12-slim"}
"""
RESOLUTION = CellLock("inputs", "six==1.17.0 --hash=sha256:" + "1" * 64 + "\n",
                      "nvidia-cudnn-cu12==9.3.0.75 --hash=sha256:" + "2" * 64 + "\n")  # fmt: skip


@pytest.fixture
def cells(write_matrix) -> dict[str, Cell]:
    return {c.name: c for c in compat.resolve(matrix.load(write_matrix(MIXED))).cells}


# ---------------------------------------------------------------------------- the target


def test_a_debian_base_is_its_suites_glibc(cells):
    target = context.target_of(cells["tf2.21-py3.11-cpu"], "x86_64")
    assert target == context.WheelTarget("3.11", "x86_64", (2, 36))


def test_an_image_base_is_manylinux_2_28(cells):
    target = context.target_of(cells["tf2.21-py3.12-cpu"], "x86_64")
    assert target == context.WheelTarget("3.12", "x86_64", (2, 28))


@pytest.mark.parametrize("engine_says", ["x86_64", "amd64", "aarch64", "arm64"])
@pytest.mark.parametrize(("arch", "machine"), [("amd64", "x86_64"), ("arm64", "aarch64")])
def test_the_wheels_are_the_cells_architecture_whatever_the_engine(
    write_matrix, engine_says, arch, machine
):
    text = MIXED.replace("variant: [cpu, gpu]", f"variant: [cpu, gpu]\n  arch: [{arch}]")
    by_name = {c.name: c for c in compat.resolve(matrix.load(write_matrix(text))).cells}
    suffix = "" if arch == "amd64" else "-arm64"
    cell = by_name[f"jax0.7-py3.11-cpu{suffix}"]
    assert context.target_of(cell, engine_says).machine == machine


@pytest.mark.parametrize("engine_says", ["s390x", "riscv64", "ppc64le", ""])
def test_another_architecture_is_an_error_naming_it(cells, engine_says):
    with pytest.raises(GpuenvError) as caught:
        context.target_of(cells["jax0.7-py3.11-cpu"], engine_says)
    assert repr(engine_says) in caught.value.message
    assert "x86_64 and aarch64" in caught.value.message


# ---------------------------------------------------------------------------- the parts


def test_a_cpu_cell_sends_only_its_environment(cells):
    for name in ("tf2.21-py3.11-cpu", "torch2.11-py3.11-cpu", "jax0.7-py3.12-cpu"):
        assert context.parts(cells[name], RESOLUTION) == {"python-env": RESOLUTION.python_env}


def test_a_tensorflow_or_jax_gpu_cell_sends_its_cuda_wheels_apart(cells):
    for name in ("tf2.21-py3.11-cuda12.5-gpu", "jax0.7-py3.11-cuda12.9-gpu"):
        assert context.parts(cells[name], RESOLUTION) == {
            "python-env": RESOLUTION.python_env,
            "cuda": RESOLUTION.cuda,
        }


def test_a_torch_gpu_cell_sends_its_cuda_wheels_with_the_framework(cells):
    cell = cells["torch2.11-py3.11-cuda13.0-gpu"]
    assert cell.cuda_with_framework
    assert context.parts(cell, RESOLUTION) == {"python-env": RESOLUTION.python_env}


def test_the_parts_sent_are_the_parts_the_dockerfile_mounts(cells):
    for cell in cells.values():
        mounts = re.findall(r"^RUN --mount=type=bind,source=([\w-]+),target=/mnt ",
                            render(cell, key_of(cell)).dockerfile, re.M)  # fmt: skip
        assert mounts == list(context.parts(cell, RESOLUTION)), cell.name


# ---------------------------------------------------------------------------- assembled


PYPI = "https://pypi.org/simple/"
PRIVATE = "https://pkgs.example.com/simple/"


class StandInFetcher:
    """Gives, for each requirements text, the wheels a real fetcher would pick and store
    (filename, stored path, and the upstream that offers it: PyPI unless said)."""

    def __init__(self, wheels: dict[str, list[tuple[str, Path] | tuple[str, Path, str]]]) -> None:
        self.by_text, self.asked, self.downloaded = wheels, [], []
        self.paths: dict[str, tuple[str, Path]] = {}

    def picks(self, key, text, python, machine, glibc):
        from gpuenv.store.wheelhouse import IndexFile, locked_requirements

        self.asked.append((key, text, python, machine, glibc))
        out = []
        for req, given in zip(locked_requirements(text), self.by_text[text], strict=True):
            filename, path, upstream = (*given, PYPI)[:3]
            sha = min(req.hashes)
            self.paths[sha] = (filename, path)
            out.append((req, IndexFile(filename, upstream + filename, sha), upstream))
        return out

    def fetch_all(self, key, wanted):
        self.downloaded += [wheel.filename for _, wheel in wanted]
        return [self.paths[wheel.sha256] for _, wheel in wanted]


def _stored(tmp_path: Path, name: str, body: bytes, mode: int = 0o644) -> Path:
    path = tmp_path / "store" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    path.chmod(mode)
    return path


def test_the_context_holds_the_rendered_files_and_each_parts_wheels_and_uv(cells, tmp_path):
    cell = cells["tf2.21-py3.11-cuda12.5-gpu"]
    ctx = render(cell, key_of(cell))
    uv = _stored(tmp_path, "uv", b"\x7fELF uv", 0o755)
    six = _stored(tmp_path, "six", b"six wheel")
    cudnn = _stored(tmp_path, "cudnn", b"cudnn wheel")
    fetcher = StandInFetcher({
        RESOLUTION.python_env: [("six-1.17.0-py2.py3-none-any.whl", six)],
        RESOLUTION.cuda: [("nvidia_cudnn_cu12-9.3.0.75-py3-none-manylinux_2_27_x86_64.whl", cudnn)],
    })  # fmt: skip
    target = context.target_of(cell, "amd64")
    root = tmp_path / "contexts"
    stale = root / cell.name / "python-env" / "old-0.1-py3-none-any.whl"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"from an earlier build")
    supply = context.Supply(fetcher, "0123456789abcdef", target, uv)  # type: ignore[arg-type]
    with context.assembled(root, ctx, RESOLUTION, supply) as here:
        assert here == root / cell.name
        files = sorted(str(p.relative_to(here)) for p in here.rglob("*") if p.is_file())
        assert files == sorted([
            *ctx.files,
            "python-env/requirements.txt", "python-env/index.txt", "python-env/ca.pem",
            "python-env/uv", "python-env/six-1.17.0-py2.py3-none-any.whl",
            "cuda/requirements.txt", "cuda/index.txt", "cuda/ca.pem", "cuda/uv",
            "cuda/nvidia_cudnn_cu12-9.3.0.75-py3-none-manylinux_2_27_x86_64.whl",
        ])  # fmt: skip
        assert (here / "Dockerfile").read_text() == ctx.dockerfile
        assert (here / "python-env" / "requirements.txt").read_text() == RESOLUTION.python_env
        assert (here / "cuda" / "requirements.txt").read_text() == RESOLUTION.cuda
        # Nothing for the engine's host to fetch, and the CA's mount point empty.
        assert (here / "python-env" / "index.txt").read_text() == "--no-index\n"
        assert (here / "cuda" / "ca.pem").read_bytes() == b""
        uv_there = here / "cuda" / "uv"
        assert uv_there.read_bytes() == b"\x7fELF uv" and uv_there.stat().st_mode & stat.S_IXUSR
        # The wheels are the stored files themselves (no copy of a 600 MB wheel).
        assert (here / "python-env" / "six-1.17.0-py2.py3-none-any.whl").samefile(six)
    assert fetcher.asked == [
        ("0123456789abcdef", RESOLUTION.python_env, "3.11", "x86_64", (2, 36)),
        ("0123456789abcdef", RESOLUTION.cuda, "3.11", "x86_64", (2, 36)),
    ]


MIXED_RESOLUTION = CellLock(
    "inputs",
    "acme-model==1.0 \\\n    --hash=sha256:" + "3" * 64 + "\n"
    "numpy==2.4.6 \\\n    --hash=sha256:" + "4" * 64 + " \\\n    --hash=sha256:" + "5" * 64 + "\n"
    "six==1.17.0 --hash=sha256:" + "1" * 64 + "\n",
    "",
)


@pytest.mark.parametrize("index", [PYPI, "http://10.0.0.2:3141/root/pypi/+simple/"])
def test_near_the_engine_public_wheels_are_named_and_private_ones_sent(cells, tmp_path, index):
    from gpuenv.building.near import Near

    cell = cells["tf2.21-py3.11-cpu"]
    stored = {n: _stored(tmp_path, n, n.encode()) for n in ("acme", "numpy", "six", "uv")}
    fetcher = StandInFetcher({MIXED_RESOLUTION.python_env: [
        ("acme_model-1.0-py3-none-any.whl", stored["acme"], PRIVATE),
        ("numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", stored["numpy"]),
        ("six-1.17.0-py2.py3-none-any.whl", stored["six"]),
    ]})  # fmt: skip
    near = Near(index, None, "probe: HTTP 200")
    supply = context.Supply(fetcher, "0" * 16, context.target_of(cell, "x86_64"),  # type: ignore[arg-type]
                             stored["uv"], near=near, primary=PYPI)  # fmt: skip
    with context.assembled(tmp_path / "c", render(cell, key_of(cell)), MIXED_RESOLUTION,
                            supply) as here:  # fmt: skip
        part = here / "python-env"
        # Only the private wheel crosses; the public ones are named with the one hash of
        # the wheel the client-side path would have sent (numpy's first, not its second).
        assert fetcher.downloaded == ["acme_model-1.0-py3-none-any.whl"]
        assert sorted(p.name for p in part.iterdir() if p.suffix == ".whl") == [
            "acme_model-1.0-py3-none-any.whl"
        ]
        assert (part / "index.txt").read_text() == (
            f"--index-url {index}\n"
            f"numpy==2.4.6 --hash=sha256:{'4' * 64}\nsix==1.17.0 --hash=sha256:{'1' * 64}\n"
        )
        assert (part / "requirements.txt").read_text() == (
            "acme-model==1.0 \\\n    --hash=sha256:" + "3" * 64 + "\n"
        )


def test_uv_and_the_probes_verdict_are_awaited_only_once_the_wheels_are_picked(cells, tmp_path):
    """A cold build fetches uv and probes the engine while the cell's pages are read: the
    assembly waits for them after the first part's wheels are picked, not before."""
    from concurrent.futures import Future

    from gpuenv.building.near import Near

    events: list[str] = []

    class Arriving(Future):
        def __init__(self, name: str, value: object) -> None:
            super().__init__()
            self.name = name
            self.set_result(value)

        def result(self, timeout=None):
            events.append(self.name)
            return super().result(timeout)

    class Picking(StandInFetcher):
        def picks(self, *args):
            events.append("picks")
            return super().picks(*args)

    cell = cells["tf2.21-py3.11-cpu"]
    uv, six = _stored(tmp_path, "uv", b"uv", 0o755), _stored(tmp_path, "six", b"six")
    fetcher = Picking({RESOLUTION.python_env: [("six-1.17.0-py2.py3-none-any.whl", six)]})
    near = Arriving("probe", Near(PYPI, None, "probe: HTTP 200"))
    ctx, target = render(cell, key_of(cell)), context.target_of(cell, "x86_64")
    supply = context.Supply(fetcher, "0" * 16, target, Arriving("uv", uv), near=near,  # type: ignore[arg-type]
                             primary=PYPI)  # fmt: skip
    with context.assembled(tmp_path / "c", ctx, RESOLUTION, supply) as here:
        assert (here / "python-env" / "uv").samefile(uv)
        assert (here / "python-env" / "index.txt").read_text().startswith(f"--index-url {PYPI}")
    assert events[0] == "picks" and {"uv", "probe"} <= set(events), events


def test_a_wheel_that_cannot_be_had_stops_the_assembly(cells, tmp_path):
    class Failing:
        def picks(self, *args):
            raise GpuenvError("six==1.17.0 has no wheel for CPython 3.11 on linux/x86_64")

    cell = cells["tf2.21-py3.11-cpu"]
    uv = _stored(tmp_path, "uv", b"uv", 0o755)
    target = context.target_of(cell, "x86_64")
    with pytest.raises(GpuenvError, match=r"six==1\.17\.0"):
        ctx = render(cell, key_of(cell))
        supply = context.Supply(Failing(), "0" * 16, target, uv)  # type: ignore[arg-type]
        with context.assembled(tmp_path / "c", ctx, RESOLUTION, supply):
            pytest.fail("a context without its wheels was handed to the build")


def test_prune_removes_the_context_directories_no_build_holds(tmp_path):
    import fcntl

    root = tmp_path / "contexts"
    for cell in ("a", "b"):
        (root / "m" / cell / "python-env").mkdir(parents=True)
        (root / "m" / f".{cell}.lock").touch()
    with (root / "m" / ".b.lock").open("w") as held:  # a build of b is reading its context
        fcntl.flock(held, fcntl.LOCK_EX)
        assert context.prune(root) == 1
    assert not (root / "m" / "a").exists() and (root / "m" / "b" / "python-env").is_dir()
    assert context.prune(root) == 1 and not (root / "m" / "b").exists()
    assert (
        context.contexts_root(tmp_path / "cache" / "wheelhouse") == tmp_path / "cache" / "contexts"
    )


def test_cache_prune_forgets_the_requires_dist_of_wheels_no_longer_stored(tmp_path, monkeypatch):
    from gpuenv.store import cache, wheelhouse

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    store = wheelhouse.Store(tmp_path / "wheels")
    kept, gone = "a" * 64, "b" * 64
    store.path(kept).parent.mkdir(parents=True)
    store.path(kept).write_bytes(b"wheel")
    cache.write_record(context.REQUIRES_RECORD, {kept: ["numpy"], gone: ["absl-py"]})
    assert context.forget_requires(store) == 1
    assert cache.read_record(context.REQUIRES_RECORD) == {kept: ["numpy"]}
    assert context.forget_requires(store) == 0


def _never(name: str):
    from concurrent.futures import Future

    class Never(Future):
        def result(self, timeout=None):
            raise AssertionError(f"{name} was awaited: it is not sent")

    return Never()


UV_WHEEL = "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


@pytest.mark.parametrize("index", [PYPI, "http://10.0.0.2:3141/root/pypi/+simple/"])
def test_near_the_engine_uv_is_fetched_there_by_its_wheels_hash(cells, tmp_path, index):
    from gpuenv.building.near import Near
    from gpuenv.store.wheelhouse import IndexFile

    cell = cells["tf2.21-py3.11-cpu"]
    six = _stored(tmp_path, "six", b"six")
    fetcher = StandInFetcher({RESOLUTION.python_env: [("six-1.17.0-py2.py3-none-any.whl", six)]})
    offered = (IndexFile(UV_WHEEL, "https://files.example/" + UV_WHEEL, "9" * 64), PYPI)
    ctx, target = render(cell, key_of(cell)), context.target_of(cell, "x86_64")
    supply = context.Supply(fetcher, "0" * 16, target, _never("uv"),  # type: ignore[arg-type]
                             near=Near(index, None, "probe: HTTP 200"), primary=PYPI,
                             uv_offered=offered)  # fmt: skip
    with context.assembled(tmp_path / "c", ctx, RESOLUTION, supply) as here:
        part = here / "python-env"
        assert not (part / "uv").exists() and (part / "bin").is_dir()
        script = (part / "uv.py").read_text()
        assert f"{index!r}, {UV_WHEEL!r}, {'9' * 64!r}" in script
        compile(script, "uv.py", "exec")
        # The step runs uv from bin/, under a tmpfs, whichever way it came.
        assert "--mount=type=tmpfs,target=/mnt/bin" in ctx.dockerfile
        assert "python3 -B /mnt/uv.py /mnt/bin/uv" in ctx.dockerfile


@pytest.mark.parametrize("case", ["no near fetch", "uv on another index", "uv not offered"])
def test_uv_is_sent_where_the_engines_host_does_not_fetch_it(cells, tmp_path, case):
    from gpuenv.building.near import Near
    from gpuenv.store.wheelhouse import IndexFile

    cell = cells["tf2.21-py3.11-cpu"]
    uv, six = _stored(tmp_path, "uv", b"uv", 0o755), _stored(tmp_path, "six", b"six")
    fetcher = StandInFetcher({RESOLUTION.python_env: [("six-1.17.0-py2.py3-none-any.whl", six)]})
    wheel = IndexFile(UV_WHEEL, "https://files.example/" + UV_WHEEL, "9" * 64)
    near = Near(None, None, "sent") if case == "no near fetch" else Near(PYPI, None, "probe")
    offered = {"uv not offered": None, "uv on another index": (wheel, PRIVATE)}.get(
        case, (wheel, PYPI)
    )
    ctx, target = render(cell, key_of(cell)), context.target_of(cell, "x86_64")
    supply = context.Supply(fetcher, "0" * 16, target, uv, near=near, primary=PYPI,  # type: ignore[arg-type]
                             uv_offered=offered)  # fmt: skip
    with context.assembled(tmp_path / "c", ctx, RESOLUTION, supply) as here:
        assert (here / "python-env" / "uv").samefile(uv)
        assert not (here / "python-env" / "uv.py").exists()
