"""Concurrent `gpuenv build`s neither wait for each other nor interfere.

Builds used to share a loopback port (the CA server's, the wheelhouse's) and wait for it;
now each gpuenv process resolves and fetches on its own, assembles the cell's context in
its cache and hands it to the engine, so two processes building at once, different cells or
the same cell, with the same CA bundle or another, must each go their own way.

"Not waiting" is shown without timing races: one build is held inside its build step (the
docker CLI gpuenv builds with is a stand-in, GPUENV_DOCKER_CLI, that waits for the test's
word before it runs the real one), holding whatever gpuenv holds while a long build runs;
the other build must finish meanwhile. "Not interfering" is shown by three builds of one
cell name at once, from two matrices with different packages: each image holds its own.

The matrices are small test matrices whose install steps and resolution are the shipped
ones (the layer cache makes their builds seconds); their tags are removed first, so the
cells are built again.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cells import CPU_CELL, GPU_CELL, TEST_REPOSITORY_PREFIX, matrix_text
from support.cli import GPUENV, REPO, clean_env, output

pytestmark = pytest.mark.engine

CELLS = (CPU_CELL, GPU_CELL)
EXTRA = "iniconfig==2.1.0"  # tiny, pure Python, not in TensorFlow's resolution
ALONE = 120  # seconds a cached build may take here, alone (it takes ~3-20)


def public_roots() -> Path:
    if os.environ.get("PIP_CERT"):
        return Path(os.environ["PIP_CERT"])
    import certifi

    return Path(certifi.where())


@pytest.fixture
def matrices(tmp_path: Path, docker) -> Iterator[dict[str, Path]]:
    """Matrices a and b (gpuenv-test/harden-a, -b), untagged before and after."""
    paths = {}
    for key in ("a", "b"):
        path = tmp_path / key / "matrix.yaml"
        path.parent.mkdir()
        path.write_text(
            matrix_text(name=f"{TEST_REPOSITORY_PREFIX}/harden-{key}"), encoding="utf-8"
        )
        paths[key] = path
    for key in paths:
        untag(docker, key)
    yield paths
    for key in paths:
        untag(docker, key)


def untag(docker, key: str) -> None:
    """Remove the matrix's tags, so that its cells need building (the layers stay cached)."""
    docker("rmi", *(f"{TEST_REPOSITORY_PREFIX}/harden-{key}:{c}" for c in CELLS), check=False)


class Held:
    """A docker CLI stand-in that, for a build, says it has been entered, then waits for the
    test's word (a file) before it runs the real CLI gpuenv would have used."""

    def __init__(self, tmp: Path) -> None:
        from gpuenv.engine.client import buildkit_cli, connect

        real = buildkit_cli(connect())[0][0]
        self.entered, self.go = tmp / "entered", tmp / "go"
        self.wrapper = tmp / "docker"
        self.wrapper.write_text(
            "#!/bin/bash\n"
            'if [ "$1" = build ] || [ "$1 $2" = "buildx build" ]; then\n'
            f"  touch {self.entered}\n"
            f"  for _ in $(seq 6000); do [ -e {self.go} ] && break; sleep 0.1; done\n"
            "fi\n"
            f'exec {real} "$@"\n'
        )
        self.wrapper.chmod(0o755)

    def release(self) -> None:
        self.go.touch()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    hold = Held(tmp_path)
    yield hold
    hold.release()  # whatever happened, no build stays held


def start(matrix: Path, *args: str, cli: Path | None = None) -> subprocess.Popen[str]:
    env = clean_env(**({"GPUENV_DOCKER_CLI": str(cli)} if cli else {}))
    return subprocess.Popen(
        [*GPUENV, "build", "-f", str(matrix), *args, "--json"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 600) -> dict[str, dict]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        waits = waiting_on(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"the build did not end within {timeout} s ({waits}): {err[-3000:]}"
        ) from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert done.returncode == 0, output(done)
    return {r["cell"]: r for r in json.loads(out)["results"]}


def waiting_on(pid: int) -> str:
    """What a process waits in (the kernel's wchan), and the lock files it has open."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError as exc:
        return f"not known: {exc}"
    locks = [fd for fd in fds if fd.endswith(".lock")]
    return f"waiting in {wchan or '?'}, lock files open: {locks}"


def poll(what: str, ready, proc: subprocess.Popen[str], timeout: float = ALONE) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"gpuenv ended before {what}: {proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def while_held(held: Held, first: subprocess.Popen[str], second: subprocess.Popen[str]) -> dict:
    """The second build's results, which must come while the first is held in its build
    step; then the first is let go, and must succeed too."""
    try:
        began = time.monotonic()
        results = finish(second, timeout=ALONE)
        assert first.poll() is None and not held.go.exists(), "the first build was not held"
        print(f"\nthe second build took {time.monotonic() - began:.1f} s beside a held one")
    finally:
        held.release()
    return {"second": results, "first": finish(first)}


def test_builds_of_different_cells_do_not_wait_for_each_other(shipped_gpu, matrices, held):
    """The GPU cell of a (held in its build step) and, meanwhile, the CPU cell of b, with
    another CA bundle: b's build runs to its end."""
    first = start(matrices["a"], GPU_CELL, cli=held.wrapper)
    poll("the first build to reach its build step", held.entered.exists, first)
    other = matrices["b"].parent / "other-bundle.pem"
    other.write_bytes(public_roots().read_bytes() + b"\n")  # sound, and not the same bytes
    second = start(matrices["b"], CPU_CELL, "--ca-bundle", str(other))
    results = while_held(held, first, second)
    assert results["second"][CPU_CELL]["status"] == "built"
    assert results["first"][GPU_CELL]["status"] == "built"


def test_builds_of_one_cell_from_two_matrices_do_not_wait_for_each_other(
    shipped_gpu, matrices, held
):
    """The CPU cell of a (held in its build step) and, meanwhile, the CPU cell of b: the
    same cell name, another project, another image."""
    first = start(matrices["a"], CPU_CELL, cli=held.wrapper)
    poll("the first build to reach its build step", held.entered.exists, first)
    second = start(matrices["b"], CPU_CELL)
    results = while_held(held, first, second)
    assert results["second"][CPU_CELL]["status"] == "built"
    assert results["first"][CPU_CELL]["status"] == "built"


def test_builds_of_one_cell_at_once_do_not_interfere(shipped_gpu, matrices, in_image, inspect):
    """Three builds of the CPU cell at once: matrix a twice, and matrix b with one more
    package. All succeed; each image holds its own matrix's environment and labels."""
    doc = json.loads(matrices["b"].read_text())
    doc["packages"]["pip"] = [EXTRA]
    matrices["b"].write_text(json.dumps(doc))
    procs = [start(matrices["a"], CPU_CELL), start(matrices["b"], CPU_CELL),
             start(matrices["a"], CPU_CELL)]  # fmt: skip
    results = [finish(p)[CPU_CELL] for p in procs]
    assert {r["status"] for r in results} <= {"built", "cached"}, results
    code = (
        "import importlib.util as u, importlib.metadata as m; "
        "print(m.version('tensorflow'), u.find_spec('iniconfig') is not None)"
    )
    for key, has_extra in (("a", False), ("b", True)):
        image = f"{TEST_REPOSITORY_PREFIX}/harden-{key}:{CPU_CELL}"
        got = in_image(image, "python", "-c", code).split()
        assert got == ["2.21.0", str(has_extra)], (image, got)
        labels = inspect(image)["Config"]["Labels"]
        assert labels["org.opencontainers.image.title"] == image
    a_ids = {results[0]["image_id"], results[2]["image_id"]}
    assert inspect(f"{TEST_REPOSITORY_PREFIX}/harden-a:{CPU_CELL}")["Id"] in a_ids
    assert results[1]["image_id"] not in a_ids
