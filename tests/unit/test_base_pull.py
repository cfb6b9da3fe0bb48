"""The base a lock pins, obtainable later (issue 43, item 6): the build's one error naming
every way back, the tag a locked base is published under, and `gpuenv base --pull` keeping
only the locked image (tests/integration/test_engine_base_pull.py does it on the engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuenv.building import plan
from gpuenv.building.base import published_tag
from gpuenv.building.pull import pull_locked_base
from gpuenv.engine.client import EngineError, ImageInfo
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project import lockfile
from gpuenv.project.lockfile import CellLock, Lock
from gpuenv.project.project import open_project
from gpuenv.publish.push import push_locked_bases

BASE = "gpuenv/debian:bookworm"
LOCKED_ID = "sha256:" + "ba" * 32
ROOTFS = "sha256:" + "5e" * 32
TODAYS = "sha256:" + "70" * 32  # the root filesystem a base bootstrapped later has
REPO = "127.0.0.1:5000/team/tensorflow"
TAG = f"base-bookworm-{'5e' * 6}"


def base(image_id: str = LOCKED_ID, rootfs: str = ROOTFS) -> ImageInfo:
    """A bootstrapped base as the engine reports it: one layer, labelled with its digest."""
    return ImageInfo(id=image_id, labels={"io.gpuenv.rootfs": rootfs}, layers=(rootfs,))


def lock(path: Path, cells: dict[str, CellLock] | None = None) -> Lock:
    pinned = {"id": LOCKED_ID, "rootfs": ROOTFS, "packages": []}
    return Lock(path, "2026-11-28T00:00:00Z", cells or {}, {BASE: pinned})


# --------------------------------------------------------------------------- the build's error


@pytest.fixture
def locked_matrix(write_matrix, minimal_matrix) -> Path:
    """The minimal matrix (its cells on BASE), locked on 2026-11-28."""
    path = write_matrix(minimal_matrix, "matrix.yaml")
    project = open_project(path)
    date = "2026-11-28T00:00:00Z"
    entries = {c.name: CellLock(lockfile.inputs_digest(c, date), "x==1 --hash=sha256:0\n", "")
               for c in project.cells}  # fmt: skip
    lockfile.write(lock(project.lock_path, entries))
    return path


@pytest.mark.parametrize(
    ("pull_from", "named"),
    [(None, "REGISTRY/REPO, where the cell was pushed"), (REPO, REPO)],
)
def test_a_base_bootstrapped_later_stops_the_build_naming_every_way_back(
    fake_engine, locked_matrix, pull_from, named
):
    project = open_project(locked_matrix)
    engine = fake_engine(local={BASE: base("sha256:" + "d7" * 32, TODAYS)})
    with pytest.raises(GpuenvError) as exc:
        plan.make_plan(engine, project, project.cells, pull_from=pull_from)
    message = exc.value.message
    assert "\n" not in message
    assert message.startswith(f"base {BASE} differs from {project.lock_path} (root filesystem "
                              f"{TODAYS} is not the locked {ROOTFS})")  # fmt: skip
    assert "gpuenv base --load FILE" in message
    assert f"gpuenv base --pull {named})" in message
    assert "gpuenv lock; that changes the image" in message


def test_the_locked_base_builds(fake_engine, locked_matrix):
    project = open_project(locked_matrix)
    engine = fake_engine(local={BASE: base("sha256:" + "d7" * 32)})  # same rootfs, another ID
    assert plan.make_plan(engine, project, project.cells).cells


# --------------------------------------------------------------------------- the tag


def test_the_published_tag_comes_from_what_the_lock_pins():
    assert published_tag(BASE, {"id": LOCKED_ID, "rootfs": ROOTFS}) == TAG
    # A registry base is pinned by its ID; the tag keeps only tag characters.
    assert (published_tag("nvidia/cuda:12.5.1-runtime+x", {"id": LOCKED_ID, "rootfs": None})
            == f"base-12.5.1-runtime-x-{'ba' * 6}")  # fmt: skip
    with pytest.raises(GpuenvError, match="neither a root filesystem nor an image ID"):
        published_tag(BASE, {"id": None, "rootfs": None})


# --------------------------------------------------------------------------- pulling it back


def test_the_locked_base_is_pulled_and_tagged(fake_engine, tmp_path):
    engine = fake_engine(local={BASE: base("sha256:" + "d7" * 32, TODAYS)},
                         remote={f"{REPO}:{TAG}": base()})  # fmt: skip
    image, image_id, where = pull_locked_base(engine, lock(tmp_path / "matrix.lock"), BASE, REPO)
    assert (image, image_id, where) == (BASE, LOCKED_ID, f"pulled from {REPO}:{TAG}")
    assert engine.image(BASE).id == LOCKED_ID
    # Already there: nothing is pulled.
    again = pull_locked_base(engine, lock(tmp_path / "matrix.lock"), BASE, REPO)
    assert again[2] == "already in the engine" and engine.pulled == [f"{REPO}:{TAG}"]


@pytest.mark.parametrize(
    "forged",
    [
        base("sha256:" + "f0" * 32, TODAYS),  # another root filesystem under the tag
        # The locked label on another layer: the layer, as the engine hashed it, decides.
        ImageInfo(id="sha256:" + "f1" * 32, labels={"io.gpuenv.rootfs": ROOTFS}, layers=(TODAYS,)),
    ],
)
def test_another_image_under_the_tag_is_refused_and_nothing_is_tagged(fake_engine, tmp_path,
                                                                       forged):  # fmt: skip
    todays = base("sha256:" + "d7" * 32, TODAYS)
    engine = fake_engine(local={BASE: todays}, remote={f"{REPO}:{TAG}": forged})
    with pytest.raises(GpuenvError) as exc:
        pull_locked_base(engine, lock(tmp_path / "matrix.lock"), BASE, REPO)
    assert exc.value.message.startswith(f"{REPO}:{TAG} is not the base matrix.lock pins for "
                                        f"{BASE} (root filesystem {TODAYS} is not the locked "
                                        f"{ROOTFS}); nothing was tagged")  # fmt: skip
    assert engine.image(BASE) == todays  # the base name did not move
    assert engine.image(f"{REPO}:{TAG}") is None and forged.id not in engine.images


@pytest.mark.parametrize(
    "answer",
    [
        EngineError("pull failed", detail="manifest unknown: manifest unknown"),
        [{"error": "manifest unknown", "errorDetail": {"message": "manifest unknown"}}],
    ],
)
def test_a_tag_the_registry_lacks_says_so_and_how_else(fake_engine, tmp_path, answer: Any):
    engine = fake_engine(local={}, remote={f"{REPO}:{TAG}": answer})
    with pytest.raises(GpuenvError) as exc:
        pull_locked_base(engine, lock(tmp_path / "matrix.lock"), BASE, REPO)
    assert exc.value.message.startswith(f"gpuenv base --pull: cannot pull {REPO}:{TAG}: "
                                        "manifest unknown")  # fmt: skip
    assert "gpuenv base --load FILE" in exc.value.message
    assert engine.image(BASE) is None


def test_a_base_the_lock_does_not_pin_is_not_pulled(fake_engine, tmp_path):
    engine = fake_engine(local={})
    with pytest.raises(GpuenvError, match="pins no base gpuenv/debian:trixie"):
        pull_locked_base(engine, lock(tmp_path / "matrix.lock"), "gpuenv/debian:trixie", REPO)
    assert engine.pulled == []


# --------------------------------------------------------------------------- pushing it


def test_only_the_locked_base_is_pushed(fake_engine, tmp_path, monkeypatch):
    """A base that drifted is refused (it is not the one a puller could check against the
    lock); a base the lock does not pin is left out."""
    pushed: list[str] = []

    class Pushing(fake_engine):  # type: ignore[misc,valid-type]
        def push(self, ref: str) -> Any:
            pushed.append(ref)
            yield {"aux": {"Digest": "sha256:" + "99" * 32}}

    engine = Pushing(local={BASE: base("sha256:" + "d7" * 32)})
    monkeypatch.setattr("gpuenv.publish.push._registry_holds", lambda *a: None)
    the_lock = lock(tmp_path / "matrix.lock")
    (result,) = push_locked_bases(engine, the_lock, [BASE, BASE, "other:1"], REPO)
    assert (result.cell, result.ref, result.status) == (BASE, f"{REPO}:{TAG}", "pushed")
    assert pushed == [f"{REPO}:{TAG}"]

    engine = Pushing(local={BASE: base("sha256:" + "d7" * 32, TODAYS)})
    (result,) = push_locked_bases(engine, the_lock, [BASE], REPO)
    assert result.status == "refused" and f"is not the locked {ROOTFS}" in str(result.error)
    assert pushed == [f"{REPO}:{TAG}"]  # nothing more
