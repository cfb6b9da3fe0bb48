"""A locked cell built, run and validated on every kind of engine users have, none of which
shares this machine's loopback, each started and torn down here:

- ``netns``: dockerd in another network namespace, reached two ways: behind a Unix socket
  (Docker Desktop's shape: the socket is local, the engine's network is not), and over TCP
  with TLS client certificates (a remote GPU host's shape);
- ``rootless``: dockerd-rootless.sh run by a throwaway user (rootlesskit, slirp4netns);
- ``podman``: podman's Docker-compatible API service.

The namespaced engines have no route to any index: the build succeeds because the engine
fetches nothing (the wheels travel in the build context). `--reproducible` gives every
engine the image ID the local engine gives (gpuenv/building/reproducible.py's canonical form).
The namespaced engine builds, runs and validates the cell through its Unix socket, then
rebuilds it `--offline` through TLS, from the wheelhouse alone, with the same ID: one engine
for both shapes (the transport is the only difference between them, and a second engine
cost CI about two minutes), and once is enough for `--offline`: what it changes is on the
client (no index asked), and the engines above get the same context either way.

The cell is JAX 0.7 on CPU, the smallest framework cell (~120 MB of wheels), fetched once
into a wheelhouse the module shares.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cells import BASE_IMAGE, JAX_CPU_CELL, JAX_LOCK_DATE, jax_cpu_matrix, test_repository
from support.cli import clean_env, gpuenv_cmd, output, run
from support.netns_engine import remote_engine
from support.podman_engine import load_into_podman, podman_engine
from support.private_engine import load_image
from support.rootless_engine import rootless_engine

pytestmark = pytest.mark.engine

NAME = test_repository("anywhere")
CELL = JAX_CPU_CELL
IMAGE = f"{NAME}:{CELL}"
MATRIX = jax_cpu_matrix(NAME)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The matrix and its lock (a fixed date, so the resolution does not move)."""
    root = tmp_path_factory.mktemp("anywhere")
    (root / "matrix.yaml").write_text(MATRIX)
    lock = gpuenv_cmd("lock", "--exclude-newer", JAX_LOCK_DATE, cwd=root,
                      env=_env(root))  # fmt: skip
    assert (root / "matrix.lock").exists(), output(lock)
    return root


def _env(root: Path, **extra: str) -> dict[str, str]:
    # One wheelhouse for the module: the wheels are fetched once, whatever the engine.
    return clean_env(XDG_CACHE_HOME=str(root / "cache"), **extra)


@pytest.fixture(scope="module")
def local_id(project: Path) -> Iterator[str]:
    """The cell built --reproducible on the local engine: the ID every engine must give."""
    gpuenv_cmd("base", CELL, cwd=project, env=_env(project))
    built = gpuenv_cmd("build", "--reproducible", "--json", CELL, cwd=project,
                       env=_env(project))  # fmt: skip
    image_id = json.loads(built.stdout)["results"][0]["image_id"]
    yield image_id
    run(["docker", "rmi", IMAGE], check=False)


@dataclass
class Lab:
    kind: str  # netns, rootless or podman
    env: dict[str, str]  # what points gpuenv at the engine
    workdir: Path  # where its user works: `gpuenv run` mounts it
    tls_env: dict[str, str] | None = None  # the same engine over TCP with TLS (netns only)


@contextlib.contextmanager
def _lab(kind: str, tmp: Path, project: Path) -> Iterator[Lab]:
    """A fresh engine of that kind, holding the base."""
    if kind == "netns":
        with remote_engine() as engine:
            load_image(engine.sock, BASE_IMAGE)
            yield Lab(kind, {"DOCKER_HOST": engine.sock}, project, tls_env=engine.env())
    elif kind == "rootless":
        with rootless_engine(tmp / "rootless.log") as engine:
            load_image(engine.sock, BASE_IMAGE)
            # A rootless engine runs as its user, who can mount only what it can reach.
            workdir = engine.home / "project"
            workdir.mkdir()
            for name in ("matrix.yaml", "matrix.lock"):
                shutil.copy(project / name, workdir / name)
            run(["chown", "-R", f"{engine.user}:", str(workdir)])
            yield Lab(kind, engine.env(), workdir)
    else:
        with podman_engine() as engine:
            load_into_podman(engine, BASE_IMAGE)
            yield Lab(kind, engine.env(), project)


@pytest.fixture(scope="module", params=["netns", "rootless", "podman"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
        project: Path, local_id: str) -> Iterator[Lab]:  # fmt: skip
    with _lab(request.param, tmp_path_factory.mktemp(request.param), project) as it:
        yield it


def test_a_locked_cell_builds_runs_and_validates_with_the_local_image_id(
    lab: Lab, project: Path, local_id: str
) -> None:
    env, cwd = _env(project, **lab.env), lab.workdir
    built = gpuenv_cmd("build", "--reproducible", "--json", CELL, cwd=cwd, env=env)
    result = json.loads(built.stdout)["results"][0]
    assert result["status"] == "built", output(built)
    # Not the local engine's image: the lab's own, from its own builder.
    assert run(["docker", "image", "inspect", IMAGE], check=False,
               env=clean_env(**lab.env)).returncode == 0  # fmt: skip
    assert result["image_id"] == local_id, output(built)
    ran = gpuenv_cmd("run", "--", "python", "-c",
                     "import jax.numpy as n; print(int(n.arange(4).sum()))",
                     cwd=cwd, env=env)  # fmt: skip
    assert ran.stdout.strip().splitlines()[-1] == "6", output(ran)
    validated = gpuenv_cmd("validate", CELL, cwd=cwd, env=env, check=False)
    assert validated.returncode == 0, output(validated)
    if lab.tls_env is None:
        return
    # The same engine through TLS, offline, from the wheelhouse alone (the engine never had
    # an index to reach anyway).
    run(["docker", "rmi", IMAGE], env=clean_env(**lab.tls_env))
    offline = gpuenv_cmd("build", "--offline", "--reproducible", "--json", CELL, cwd=cwd,
                         env=_env(project, **lab.tls_env))  # fmt: skip
    again = json.loads(offline.stdout)["results"][0]
    assert (again["status"], again["image_id"]) == ("built", local_id), output(offline)
