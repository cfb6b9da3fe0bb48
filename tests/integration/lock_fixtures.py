"""Fixtures for the `gpuenv lock` integration tests (loaded by test_engine_lock.py).

They live apart from conftest.py, which belongs to the build tests. Everything runs the
installed CLI as a user would (a subprocess), on the real engine, with test matrices in a
temporary directory: JAX 0.7 / Python 3.11 / CPU on bookworm (support/cells.py's JAX_CPU_CELL,
the smallest framework cell: 690 MB where TF 2.21's is 2.26 GB, and the module builds it
twice without a layer cache), built into the test-only repositories below. CPU only, to
keep the time down: the GPU path is the same code with requirements/cuda.txt
(tests/unit/test_lock.py covers its rendering).

- ``locked_matrix``: a matrix and its matrix.lock (locked once per module, with a fixed
  --exclude-newer date so the resolution does not move).
- ``first_build``: the locked cell built with --no-cache; its image ID, also tagged
  ``REPOSITORY:first`` so that later builds of the cell cannot remove it.
- ``lock_cli``: `gpuenv ...` -> CompletedProcess, optionally against another engine.
- ``second_engine``: a second dockerd (own data-root, exec-root, pidfile and socket; no
  bridge, no iptables), empty; stopped by its PID and removed at the end of the module.
- ``layer_listing(ref, host=None)``: `docker save` read with tarfile: the image config and,
  per layer, its entries (path, type, mode, owner, link target, sha256 of the contents).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from support import cells, cleanup
from support.cells import test_repository
from support.cli import Proc, gpuenv_cmd
from support.cli import output as output
from support.dockerd import second_dockerd
from support.engine import docker as docker
from support.engine import image_id as image_id

CELL = cells.JAX_CPU_CELL
BASE = cells.BASE_IMAGE
REPOSITORY = test_repository("lock")  # the locked cell's images
BAD_REPOSITORY = test_repository("lock-bad")  # builds that must fail (drift, tampered hash)
# Other tags of the cell's builds. Another repository: removing an image by ID (as a rebuild
# does with the build it supersedes) also removes its other tags in the same repository.
KEEP_REPOSITORY = test_repository("lock-keep")
OUR_REPOSITORIES = (REPOSITORY, BAD_REPOSITORY, KEEP_REPOSITORY)
IMAGE = f"{REPOSITORY}:{CELL}"
FIRST = f"{KEEP_REPOSITORY}:first"
# Resolve as of the engine labs' date (JAX 0.7.2 is older): the lock stays the same month to
# month, and is the labs' resolution.
EXCLUDE_NEWER = cells.JAX_LOCK_DATE
BUILD_TIMEOUT = 900
# Labels of the containers gpuenv starts to look into images (none may be left behind).
CONTAINER_LABELS = ("io.gpuenv.validate", "io.gpuenv.diff", "io.gpuenv.probe")


def matrix_text(name: str = REPOSITORY, pip: tuple[str, ...] = ()) -> str:
    """The locked cell's matrix (CPU only), under another name or with more pip packages."""
    packages = f"packages:\n  pip: {json.dumps(list(pip))}\n" if pip else ""
    return cells.jax_cpu_matrix(name) + packages


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="session")
def lock_cli() -> Callable[..., Proc]:
    """lock_cli("build", ..., host=None, timeout=...) -> CompletedProcess (text), unchecked."""

    def cli(*args: str, host: str | None = None, timeout: float = BUILD_TIMEOUT) -> Proc:
        return gpuenv_cmd(*args, host=host, timeout=timeout, check=False)

    return cli


# --------------------------------------------------------------------------- images and containers


@pytest.fixture
def no_leftover_containers() -> Iterator[None]:
    """Fails (and cleans up) when gpuenv left a validate/diff/probe container of one of the
    test repositories' images behind (others' containers on a shared engine are not ours)."""

    def ours() -> dict[str, str]:
        return {
            cid: cleanup.describe(c)
            for cid, c in cleanup.containers(CONTAINER_LABELS).items()
            if cells.repository(c["Config"]["Image"]) in OUR_REPOSITORIES
        }

    with cleanup.fails_on_leftovers(ours):
        yield


# --------------------------------------------------------------------------- the locked cell


@pytest.fixture(scope="module")
def locked_matrix(lock_cli: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tmp/matrix.yaml and its matrix.lock, written by `gpuenv lock`."""
    path = tmp_path_factory.mktemp("locked") / "matrix.yaml"
    path.write_text(matrix_text(), encoding="utf-8")
    proc = lock_cli("lock", "-f", str(path), "--exclude-newer", EXCLUDE_NEWER, timeout=600)
    assert proc.returncode == 0, output(proc)
    assert path.with_suffix(".lock").exists(), output(proc)
    return path


@pytest.fixture(scope="module")
def first_build(locked_matrix: Path, lock_cli: Callable[..., Any]) -> str:
    """The locked cell, built with --no-cache; its image ID (also tagged FIRST)."""
    proc = lock_cli("build", "-f", str(locked_matrix), CELL, "--no-cache", "--json")
    assert proc.returncode == 0, output(proc)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "built", result
    docker("tag", result["image_id"], FIRST)
    return str(result["image_id"])


def copy_matrix(locked_matrix: Path, target: Path, name: str, pip: tuple[str, ...] = ()) -> Path:
    """The locked matrix (renamed to ``name``, optionally with more pip packages) and a copy of
    its lock, in ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    path = target / "matrix.yaml"
    path.write_text(matrix_text(name, pip), encoding="utf-8")
    shutil.copyfile(locked_matrix.with_suffix(".lock"), path.with_suffix(".lock"))
    return path


# --------------------------------------------------------------------------- a second engine


@dataclass
class SecondEngine:
    host: str  # DOCKER_HOST value
    root: Path


@pytest.fixture(scope="module")
def second_engine() -> Iterator[SecondEngine]:
    """An empty second dockerd (tests/integration/dockerd.py), without the hook."""
    with second_dockerd("gpuenv-lk-") as (_client, root):
        yield SecondEngine(f"unix://{root / 'd.sock'}", root)


# --------------------------------------------------------------------------- docker save


@dataclass
class Saved:
    """What `docker save` holds for one image."""

    config: dict[str, Any]
    layers: list[list[tuple[Any, ...]]]  # per layer: (path, type, mode, uid, gid, link, sha256)
    mtimes: list[dict[str, int]]  # per layer: path -> mtime (what bit-identity needs too)
    order: list[list[str]]  # per layer: the paths in the order the tar holds them


def _entries(fileobj: IO[bytes]) -> tuple[list[tuple[Any, ...]], dict[str, int], list[str]]:
    entries, mtimes, order = [], {}, []
    with tarfile.open(fileobj=fileobj, mode="r|") as tar:
        for member in tar:
            digest = ""
            if member.isreg():
                stream = tar.extractfile(member)
                assert stream is not None
                digest = hashlib.file_digest(stream, "sha256").hexdigest()
            entries.append(
                (member.name, member.type.decode(), member.mode, member.uid, member.gid,
                 member.linkname, digest)
            )  # fmt: skip
            mtimes[member.name] = int(member.mtime)
            order.append(member.name)
    return sorted(entries), mtimes, order


def _read_save(stream: IO[bytes]) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(layer.tar name -> its entries, layer.tar name -> the copy it links to, JSON files)."""
    layers: dict[str, Any] = {}
    links: dict[str, str] = {}
    blobs: dict[str, Any] = {}
    try:
        outer = tarfile.open(fileobj=stream, mode="r|")  # noqa: SIM115 (closed below)
    except tarfile.ReadError:  # nothing came: docker save failed, its stderr says why
        return layers, links, blobs
    with outer:
        for member in outer:
            if member.name.endswith("/layer.tar"):
                if member.issym():  # a layer saved twice is a link to the first copy
                    base = os.path.dirname(member.name)
                    links[member.name] = os.path.normpath(os.path.join(base, member.linkname))
                elif member.size == 0:
                    layers[member.name] = ([], {}, [])
                else:
                    fileobj = outer.extractfile(member)
                    assert fileobj is not None
                    layers[member.name] = _entries(fileobj)
            elif member.isreg() and member.name.endswith(".json"):
                fileobj = outer.extractfile(member)
                assert fileobj is not None
                blobs[member.name] = json.load(fileobj)
    return layers, links, blobs


def layer_listing(ref: str, host: str | None = None) -> Saved:
    """`docker save ref`, streamed through tarfile (nothing is written to disk)."""
    argv = ["docker", *(["-H", host] if host else []), "save", ref]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        layers, links, blobs = _read_save(proc.stdout)
    finally:
        proc.stdout.close()
        err = proc.stderr.read().decode(errors="replace")
        code = proc.wait(timeout=120)
    assert code == 0 and "manifest.json" in blobs, f"{' '.join(argv)} exited {code}: {err}"
    (manifest,) = blobs["manifest.json"]
    names = [links.get(name, name) for name in manifest["Layers"]]
    return Saved(
        config=blobs[manifest["Config"]],
        layers=[layers[n][0] for n in names],
        mtimes=[layers[n][1] for n in names],
        order=[layers[n][2] for n in names],
    )


def bit_identity_report(a: Saved, b: Saved) -> list[str]:
    """What keeps two builds with the same files from having the same image ID."""
    found = []
    ca, cb = a.config, b.config
    for key in sorted(set(ca) | set(cb)):
        if key in ("history", "rootfs", "config", "container_config"):
            continue
        if ca.get(key) != cb.get(key):
            found.append(f"config.{key}: {ca.get(key)!r} != {cb.get(key)!r}")
    for key in ("config", "container_config"):
        sa, sb = ca.get(key) or {}, cb.get(key) or {}
        for sub in sorted(set(sa) | set(sb)):
            if sa.get(sub) != sb.get(sub):
                found.append(f"config.{key}.{sub}: {str(sa.get(sub))[:80]!r} != "
                             f"{str(sb.get(sub))[:80]!r}")  # fmt: skip
    ha, hb = ca.get("history") or [], cb.get("history") or []
    for i, (x, y) in enumerate(zip(ha, hb, strict=False)):
        for field in sorted(set(x) | set(y)):
            if x.get(field) != y.get(field):
                found.append(f"history[{i}].{field}: {x.get(field)!r} != {y.get(field)!r}")
    da, db = (
        (ca.get("rootfs") or {}).get("diff_ids", []),
        (cb.get("rootfs") or {}).get("diff_ids", []),
    )
    for i, (x, y) in enumerate(zip(da, db, strict=False)):
        if x != y:
            mt = sum(a.mtimes[i].get(p) != t for p, t in b.mtimes[i].items())
            ordered = a.order[i] == b.order[i]
            found.append(
                f"rootfs.diff_ids[{i}]: {x[:19]} != {y[:19]} ({mt} entries with another mtime, "
                f"tar order {'same' if ordered else 'differs'})"
            )
    return found
