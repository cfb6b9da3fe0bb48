"""Cleaning up after this session, and only after this session: the engine may be shared
with other people's test sessions, running now, whose images and containers look alike.

Images. The tests cannot label what the gpuenv CLI builds, so the janitor decides "created by
this session" from a snapshot taken when the session (or a module) starts:

1. A reference under a loopback host:port this session picked (``claim_registry``: its
   registries, and the closed ports it pushes to), tag or digest, that did not exist at
   the start: untagged.
2. An image whose ID did not exist at the start and whose tags all lie in the given test
   repositories (cells.TEST_REPOSITORIES, or a module's own subset): its tags are removed,
   and with the last one the image. An image that also carries a name outside them (say
   gpuenv/tensorflow:..., which another session may be building right now) is left alone.
3. An untagged image whose ID did not exist at the start and whose OCI title names one of
   those repositories (a build the session superseded): removed.

Never removed: anything that existed at the start, anything outside
the test repositories (the shipped cells and their base stay, as a cache, whoever built
them), and nothing by
force (``docker rmi`` refuses an image a container uses). Two sessions of this same suite on
one engine share the test repositories' tag names, so they would clash anyway; this rule
does not make that safe, it keeps everyone else's images safe.

Containers. Those the tests start are TrackedContainers, labelled io.gpuenv.test-session=
<this session> and removed by that label at the end. gpuenv's own (labels io.gpuenv.run,
.probe, .validate, .diff) must be removed by gpuenv itself: one left behind is a failure,
reported and then removed. Per test, by ``fails_on_leftovers`` with each fixture's rule of
which are the test's; for the session, those new since the start whose image is in a test
repository or that bind-mount a directory this session made (``claim_dir``). Others are
not this session's to judge.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.cells import TEST_REPOSITORIES, repository
from support.engine import SESSION_LABEL, docker

GPUENV_LABELS = (
    "io.gpuenv.run", "io.gpuenv.probe", "io.gpuenv.validate", "io.gpuenv.diff", "io.gpuenv.monitor",
    "io.gpuenv.export",
)  # fmt: skip
TITLE = "org.opencontainers.image.title"

_registries: set[str] = set()  # loopback host:port this session picked (registries)
_dirs: set[Path] = set()  # directories this session made (containers' bind mounts)


def claim_registry(host: str) -> None:
    """Every reference under host/ that appears from now on is this session's."""
    _registries.add(host)


def claim_dir(path: Path) -> None:
    """A gpuenv container bind-mounting something under path is this session's."""
    _dirs.add(path.resolve())


# --------------------------------------------------------------------------- images


def _image_refs() -> dict[str, set[str]]:
    """Image ID -> its references (tags and digests), for every image (`docker images -a`)."""
    out = docker(
        "images", "-a", "--digests", "--no-trunc",
        "--format", "{{.ID}} {{.Repository}} {{.Tag}} {{.Digest}}",
    ).stdout  # fmt: skip
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        iid, repo, tag, digest = [*line.split(), "", "", ""][:4]
        refs = found.setdefault(iid, set())
        if repo != "<none>" and tag and tag != "<none>":
            refs.add(f"{repo}:{tag}")
        if repo != "<none>" and digest and digest != "<none>":
            refs.add(f"{repo}@{digest}")
    return found


@dataclass(frozen=True)
class Snapshot:
    """The engine's images at one moment."""

    ids: frozenset[str]
    refs: frozenset[str]

    @classmethod
    def take(cls) -> Snapshot:
        images = _image_refs()
        return cls(frozenset(images), frozenset(r for refs in images.values() for r in refs))


def _in_claimed_registry(ref: str) -> bool:
    return ref.split("/", 1)[0] in _registries


def _title(image: str) -> str:
    proc = docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{TITLE}"}}}}', image,
                  check=False)  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else ""


def sweep(
    before: Snapshot, repositories: Collection[str] = TEST_REPOSITORIES, *, registries: bool = True
) -> list[str]:
    """Remove what was created since ``before`` (the rule above); the references removed.
    registries=False leaves rule 1 out (a module's sweep: the session's registries are
    session fixtures, whose pulled references later modules use)."""
    removed = []
    # 1. The session's registries: tags before digests (a digest reference may be the last).
    new_refs = {r for refs in _image_refs().values() for r in refs} - before.refs
    claimed = filter(_in_claimed_registry, new_refs) if registries else ()
    for ref in sorted(claimed, key=lambda r: "@" in r):
        if docker("rmi", ref, check=False).returncode == 0:
            removed.append(ref)
    # 2. New images named only in the test repositories.
    for iid, refs in _image_refs().items():
        if iid in before.ids or not refs:
            continue
        if all(repository(r) in repositories for r in refs):
            for ref in sorted(refs, key=lambda r: "@" in r):
                if docker("rmi", ref, check=False).returncode == 0:
                    removed.append(ref)
    # 3. New untagged images titled after a test repository: superseded builds.
    dangling = docker("images", "-q", "--no-trunc", "-f", "dangling=true").stdout.split()
    for iid in set(dangling) - before.ids:
        if (
            repository(_title(iid)) in repositories
            and docker("rmi", iid, check=False).returncode == 0
        ):
            removed.append(iid)
    return removed


# --------------------------------------------------------------------------- containers


def containers(labels: Collection[str] = GPUENV_LABELS) -> dict[str, dict[str, Any]]:
    """`docker container inspect` of every container carrying one of the labels (keys)."""
    ids: set[str] = set()
    for label in labels:
        ids |= set(
            docker("ps", "-a", "-q", "--no-trunc", "--filter", f"label={label}").stdout.split()
        )
    if not ids:
        return {}
    # A container may go in between: inspect prints the others and exits 1.
    proc = docker("container", "inspect", *sorted(ids), check=False)
    return {c["Id"]: c for c in json.loads(proc.stdout or "[]")}


def describe(container: dict[str, Any]) -> str:
    labels = container["Config"].get("Labels") or {}
    mine = ",".join(k for k in GPUENV_LABELS if k in labels)
    state = container["State"]["Status"]
    return f"{container['Id'][:12]} {mine} {container['Config']['Image']} {state}"


def mounts(container: dict[str, Any]) -> set[Path]:
    return {Path(m["Source"]) for m in container.get("Mounts") or [] if m.get("Source")}


@contextlib.contextmanager
def fails_on_leftovers(found: Callable[[], dict[str, str]]) -> Iterator[None]:
    """found() -> {container ID: description} of the containers gpuenv must not leave.

    Those there afterwards that were not there before are removed, then fail the test."""
    before = set(found())
    yield
    left = {cid: what for cid, what in found().items() if cid not in before}
    for cid in left:
        docker("rm", "-f", "-v", cid, check=False)
    assert not left, f"gpuenv left containers behind: {sorted(left.values())}"


def session_containers() -> dict[str, str]:
    """gpuenv's containers that are provably this session's (see the module docstring)."""
    found = {}
    for cid, c in containers().items():
        ours = repository(c["Config"]["Image"]) in TEST_REPOSITORIES or any(
            d == m or d in m.parents for m in mounts(c) for d in _dirs
        )
        if ours:
            found[cid] = describe(c)
    return found


def remove_session_containers() -> None:
    """The containers this session started by hand and did not remove (none, normally)."""
    ids = docker("ps", "-a", "-q", "--no-trunc", "--filter", f"label={SESSION_LABEL}").stdout
    for cid in ids.split():
        docker("rm", "-f", "-v", cid, check=False)
