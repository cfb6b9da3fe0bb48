"""The base a lock pins, pushed beside the cells and pulled back by the lock (issue 43, item 6).

A lock made on one day pins its Debian base by root filesystem; a base bootstrapped later has
another, and the build refuses it. `gpuenv push` puts a locked cell's base beside its images
(`gpuenv base --push` the bases alone); `gpuenv base --pull` brings it back, and tags it only
when it is the locked one. No framework is built: the base is what moves, so the test works
on a copy of the shared base tagged into its own repository (never the shared tag, which
other tests use), with a matrix whose base is that copy and a lock that pins it.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cells import BASE_IMAGE, SHIPPED_MATRIX, jax_cpu_matrix, test_repository
from support.cli import Proc, output

pytest.register_assert_rewrite("push_fixtures")

from push_fixtures import Cli, Registry, docker_cmd, inspect  # noqa: E402

pytest_plugins = ["push_fixtures"]
pytestmark = [pytest.mark.engine]

REPOSITORY = test_repository("basepull")
BASE_COPY = f"{REPOSITORY}:bookworm"  # the matrix's base: the shared base's image, named here
TODAYS = f"{REPOSITORY}:todays"  # another image: the base a fresh machine bootstraps today


@dataclass
class Locked:
    matrix: Path
    image_id: str  # what the lock pins
    rootfs: str
    tag: str  # the tag the lock's identity gives: base-bookworm-<12 hex of the rootfs>


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory, cli: Cli) -> Iterator[Locked]:
    if inspect(BASE_IMAGE) is None:
        cli("base", "-f", str(SHIPPED_MATRIX), timeout=600)
    info = inspect(BASE_IMAGE)
    assert info is not None
    (rootfs,) = info["RootFS"]["Layers"]  # a bootstrapped base: one layer
    docker_cmd("tag", info["Id"], BASE_COPY)
    directory = tmp_path_factory.mktemp("basepull")
    matrix = directory / "matrix.yaml"
    # The suite's JAX CPU matrix, on a copy of the base (never the shared tag).
    text = jax_cpu_matrix(REPOSITORY).replace("{debian: bookworm}", f'{{image: "{BASE_COPY}"}}')
    matrix.write_text(text, encoding="utf-8")
    # The lock as `gpuenv lock` writes it, for its base and the cell's inputs (which the
    # build checks first); no resolution: nothing is built here.
    from gpuenv.project.lockfile import inputs_digest
    from gpuenv.project.project import open_project

    (cell,) = open_project(matrix).cells
    date = "2026-11-28T00:00:00Z"
    lock = {
        "version": 1,
        "exclude_newer": date,
        "bases": {BASE_COPY: {"id": info["Id"], "rootfs": rootfs, "packages": []}},
        "cells": {cell.name: {"inputs": inputs_digest(cell, date), "python_env": ""}},
    }
    (directory / "matrix.lock").write_text(json.dumps(lock, indent=2), encoding="utf-8")
    try:
        yield Locked(matrix, info["Id"], rootfs, f"base-bookworm-{rootfs[7:19]}")
    finally:
        # Untags only: the shared base's own tag keeps the image. TODAYS is new: the janitor.
        docker_cmd("rmi", BASE_COPY, check=False)


@pytest.fixture(scope="module")
def todays(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another one-layer image, standing for a base bootstrapped after Debian moved on."""
    rootfs = tmp_path_factory.mktemp("todays") / "rootfs.tar"
    data = b"bookworm, a week later\n"
    with tarfile.open(rootfs, mode="w") as tar:
        member = tarfile.TarInfo("etc/debian_version")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    docker_cmd("import", str(rootfs), TODAYS)
    info = inspect(TODAYS)
    assert info is not None
    return str(info["Id"])


def one_error(proc: Proc) -> str:
    """The single `error:` line a refusal prints (no traceback, nothing else on stderr)."""
    assert proc.returncode != 0, output(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, output(proc)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return line


def test_a_locked_base_pushed_beside_the_cells_comes_back_by_the_lock(
    cli: Cli, registry: Registry, locked: Locked, todays: str
) -> None:
    repo = f"{registry.host}/team/basepull"
    ref = f"{repo}:{locked.tag}"
    f = ("-f", str(locked.matrix))

    # Published: the base under the tag its locked identity gives; once.
    pushed = cli("base", *f, "--push", repo)
    (line,) = pushed.stdout.splitlines()
    assert line.startswith(f"{ref}  sha256:") and line.endswith(f"pushed (base {BASE_COPY})"), line
    assert registry.tags("team/basepull") == [locked.tag]
    again = cli("base", *f, "--push", repo)
    assert again.stdout.split()[-3:] == ["present", "(base", f"{BASE_COPY})"], again.stdout

    # A fresh machine: the matrix's base name is today's bootstrap, and this engine has no
    # reference to the pushed tag (the image stays: the shared base's own tag holds it).
    docker_cmd("rmi", ref)
    docker_cmd("tag", todays, BASE_COPY)
    stopped = one_error(cli("build", *f, "--dry-run", check=False))
    assert f"base {BASE_COPY} differs from {locked.matrix.with_suffix('.lock')}" in stopped
    for way in ("gpuenv base --load FILE", "gpuenv base --pull REGISTRY/REPO", "gpuenv lock"):
        assert way in stopped, stopped

    # A tag is no proof: another image under the base's tag is refused, nothing tagged.
    forged = f"{registry.host}/team/forged:{locked.tag}"
    docker_cmd("tag", todays, forged)
    docker_cmd("push", forged)
    docker_cmd("rmi", forged)  # untags only: TODAYS holds the image
    refused = one_error(cli("base", *f, "--pull", f"{registry.host}/team/forged", check=False))
    assert f"{forged} is not the base matrix.lock pins for {BASE_COPY}" in refused, refused
    assert locked.rootfs in refused and "nothing was tagged" in refused, refused
    assert inspect(BASE_COPY)["Id"] == todays  # type: ignore[index]  # not moved
    assert inspect(forged) is None  # the pull's reference undone

    # Pulled back by the lock: the base name is the locked image again.
    pulled = cli("base", *f, "--pull", repo)
    assert pulled.stdout.split() == [BASE_COPY, locked.image_id[:19], "pulled", "from", ref]
    back = inspect(BASE_COPY)
    assert back is not None
    assert back["Id"] == locked.image_id and back["RootFS"]["Layers"] == [locked.rootfs]
    assert "already in the engine" in cli("base", *f, "--pull", repo).stdout


def test_a_repository_without_the_base_says_how_else_to_get_it(
    cli: Cli, registry: Registry, locked: Locked
) -> None:
    empty = f"{registry.host}/team/nothing"
    docker_cmd("rmi", BASE_COPY, check=False)
    try:
        line = one_error(cli("base", "-f", str(locked.matrix), "--pull", empty, check=False))
        assert f"cannot pull {empty}:{locked.tag}" in line, line
        assert "gpuenv base --load FILE" in line, line
        assert inspect(BASE_COPY) is None
    finally:
        docker_cmd("tag", locked.image_id, BASE_COPY)
