"""Names the tests build and look up: the shipped cells, their images and base, and the
test-only repositories (the only ones the session janitor removes images from)."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
SHIPPED_MATRIX = REPO / "matrix.yaml"

CPU_CELL = "tf2.21-py3.11-cpu"
GPU_CELL = "tf2.21-py3.11-cuda12.5-gpu"
CPU_IMAGE = f"gpuenv/tensorflow:{CPU_CELL}"
GPU_IMAGE = f"gpuenv/tensorflow:{GPU_CELL}"
BASE_IMAGE = "gpuenv/debian:bookworm"  # the cells' base: ~125 MB

# A package the tests add to one cell. It is already in every TF 2.21 environment (tensorflow
# -> requests -> certifi), at this version when the shipped cells resolve today: the pin
# changes the spec hash but not the resolution, so the install step mounts the same files
# and the engine's cache has the layer (after a newer certifi, the first build installs).
EXTRA_PIP = "certifi==2026.10.18"
BUILD_TIMEOUT = 1800  # seconds; a cold GPU build downloads ~3 GB of wheels

# Every session tags into repositories of its own (gpuenv-test-<session>/...): two sessions on
# one engine (a developer's and CI's, or one killed before its janitor ran and the next) never
# see, sweep or collide with each other's tags. What a killed session left stays until removed
# by hand (`docker images 'gpuenv-test-*/*'`); it is only disk, never a wrong answer.
SESSION_ID = uuid.uuid4().hex  # this test session (containers are labelled with it too)
TEST_REPOSITORY_PREFIX = f"gpuenv-test-{SESSION_ID[:8]}"


def test_repository(name: str) -> str:
    """This session's repository `name` (say "tf" -> gpuenv-test-1a2b3c4d/tf)."""
    return f"{TEST_REPOSITORY_PREFIX}/{name}"


test_repository.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test

# Every repository these tests build or tag into; the janitor removes new images there.
TEST_REPOSITORIES = frozenset(
    test_repository(name)
    for name in (
        "tf",  # test matrices (conftest.py)
        "ca",  # test_engine_ca.py
        "fail",  # test_engine_failures.py
        "lock",  # lock_fixtures.py: the locked cell
        "lock-bad",  # builds that must fail
        "lock-keep",  # other tags of the locked cell's builds
        "broken",  # validate_fixtures.py: images broken in one respect
        "broken-checks",  # test_engine_validate_breaks.py: one check broken per image
        "push",  # test_engine_push.py: the JAX CPU cell it pushes
        "pushpull",  # test_engine_push.py: pull before build
        "harden-a",  # test_engine_ca_concurrent.py: concurrent builds
        "harden-b",
        "harden-labels",  # test_engine_hostile.py: images with hostile labels
        "faults",  # test_engine_faults.py (a private engine; never the shared one)
        "faults-push",
        "frameworks",  # test_engine_frameworks.py: the torch and JAX cells
        "wheelhouse",  # test_engine_wheelhouse.py: online, then offline
        "wheelhouse-keep",  # its online build, kept for the diff
        "private",  # test_engine_private_index.py: a basic-auth index
        "creds",  # test_engine_index_credentials.py: the credential attack (never built)
        "reqs",  # test_engine_requirements.py: a cell with a requirements file
        "init",  # test_engine_init.py: the cell `gpuenv init` chose for a project
        "iteration",  # test_engine_iteration.py: a package added to a locked cell
        "peek",  # test_engine_push.py: a candidate with another spec hash
        "anywhere",  # test_engine_anywhere.py: the locked JAX cell on every engine
        "another-host",  # test_engine_another_host.py: the locked JAX cell on another host
        "near",  # test_engine_near_fetch.py: the locked JAX cell fetched near the engine
        "other-user",  # test_engine_other_user.py: a second local user
        "slurm",  # test_engine_slurm.py: the base plus a probe file and ENV
        "slurm-jax",  # test_engine_slurm_multinode.py: the locked JAX CPU cell on two nodes
        "attest",  # test_engine_attest.py: the locked JAX cell pushed with attestations
        "arm64",  # test_engine_arm64.py: the JAX CPU cell for amd64 and arm64, its arm64 base
        "basepull",  # test_engine_base_pull.py: a copy of the base, pushed and pulled back
        "bench",  # test_engine_bench.py: benchmarks/build.py on the JAX CPU cell
        "act",  # test_engine_act.py: images.yml run under nektos/act on the JAX CPU cell
        "planted",  # test_engine_cache_import.py: an empty image under a cell's tag (no build)
    )
)


# Repositories whose images session fixtures build once and several modules use
# (push_fixtures.py, validate_fixtures.py): only the session's janitor removes them.
SESSION_REPOSITORIES = frozenset(test_repository(n) for n in ("pushpull", "broken"))
# The others: each module's images are removed when it ends (conftest.py's module_janitor),
# so that the suite holds one module's images at a time, not every module's until the end.
MODULE_REPOSITORIES = TEST_REPOSITORIES - SESSION_REPOSITORIES


def context_dir(cache_home: Path, matrix: Path, cell: str) -> Path:
    """Where gpuenv assembles the build context of a matrix's cell, with XDG_CACHE_HOME
    `cache_home` (gpuenv/building/sendable.py, Sender.context: one directory per matrix and
    cell)."""
    project = hashlib.sha256(str(matrix.resolve()).encode()).hexdigest()[:16]
    return cache_home / "gpuenv" / "contexts" / project / cell


def repository(ref: str) -> str:
    """'host:5000/a/b:tag' -> 'host:5000/a/b' (a digest reference keeps what is before @)."""
    name = ref.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def matrix_text(
    *,
    name: str = f"{TEST_REPOSITORY_PREFIX}/tf",
    variants: tuple[str, ...] = ("cpu", "gpu"),
    include: list[dict[str, Any]] | None = None,
    pip: list[str] | None = None,
) -> str:
    """A small matrix: TF 2.21 on Python 3.11 (bookworm), as the shipped default cells, so
    its install steps and their resolution are the shipped ones, and the engine's layer
    cache (keyed on the files the steps mount) makes builds cheap.

    JSON is YAML; json.dumps keeps version strings quoted ("2.21", not 2.21)."""
    assert name in TEST_REPOSITORIES, f"{name}: add it to TEST_REPOSITORIES (the janitor)"
    doc: dict[str, Any] = {
        "name": name,
        "matrix": {"tensorflow": ["2.21"], "python": ["3.11"], "variant": list(variants)},
        "bases": {"3.11": {"debian": "bookworm"}},
        "packages": {"pip": pip or [], "apt": []},
    }
    if include:
        doc["matrix"]["include"] = include
    return json.dumps(doc, indent=2) + "\n"


# The smallest framework cell (~120 MB of wheels): JAX 0.7 on CPU, for the engine labs
# (test_engine_anywhere.py, test_engine_another_host.py). Locked with a fixed date.
JAX_CPU_CELL = "jax0.7-py3.11-cpu"
JAX_LOCK_DATE = "2026-11-20"


def jax_cpu_matrix(name: str) -> str:
    assert name in TEST_REPOSITORIES, f"{name}: add it to TEST_REPOSITORIES (the janitor)"
    return f"""\
name: {name}
matrix:
  jax: ["0.7"]
  python: ["3.11"]
  variant: [cpu]
default: {{jax: "0.7", python: "3.11"}}
bases:
  "3.11": {{debian: bookworm}}
"""
