"""The one stand-in for gpuenv.engine.client.Engine in unit tests: the same typed operations,
over dictionaries, with scripted answers. It imitates gpuenv's engine interface, not the
Docker SDK, so a test reads in gpuenv's terms (images, tags, specs, results).

Unit tests get it through the ``fake_engine`` fixture (tests/unit/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuenv.engine.client import ContainerSpec, EngineError, GpuEngineFacts, ImageInfo


class FakeEngine:
    url = "unix:///var/run/docker.sock"
    is_local = True
    is_podman = False

    def __init__(
        self,
        local: dict[str, ImageInfo] | None = None,
        remote: dict[str, Any] | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.images = {i.id: i for i in (local or {}).values()}
        self.refs = {ref: i.id for ref, i in (local or {}).items()}
        # ref -> what a pull of it brings: an ImageInfo, an EngineError, or an error stream
        self.remote = remote or {}
        self._info = info or {"ID": "ENGINE-1", "KernelVersion": "6.1.0-28-amd64"}
        self.removed: list[str] = []
        self.pulled: list[str] = []  # refs a pull was started for
        self.created: list[ContainerSpec] = []
        self.containers: dict[str, ContainerSpec] = {}
        # What a container of an image does: (exit code, stdout); or an EngineError on start
        self.outcomes: dict[str, Any] = {}

    # -- engine
    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def identity(self) -> str:
        return str(self._info.get("ID") or "")

    def architecture(self) -> str:
        return "x86_64"

    def gpu_facts(self) -> GpuEngineFacts:
        return GpuEngineFacts.from_info(self.info(), self.is_podman, self.is_local)

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeEngine:  # as a verb opens the engine: `with connect() as e`
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- images
    @property
    def local(self) -> dict[str, ImageInfo]:
        return {ref: self.images[i] for ref, i in self.refs.items()}

    def image(self, ref: str) -> ImageInfo | None:
        return self.images.get(self.refs.get(ref, ref))

    def labels(self, ref: str) -> dict[str, str] | None:
        info = self.image(ref)
        return None if info is None else dict(info.labels)

    def tag(self, image_id: str, ref: str) -> None:
        if image_id not in self.images:
            raise EngineError(f"No such image: {image_id}")
        self.refs[ref] = image_id

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        self.removed.append(ref)
        if ref in self.refs:
            image_id = self.refs.pop(ref)
        elif ref in self.images and ref not in self.refs.values():
            image_id = ref
        else:
            return False
        if image_id not in self.refs.values():
            del self.images[image_id]
        return True

    def remove_if_untagged(self, image_id: str) -> bool:
        if image_id in self.refs.values():
            return False
        return self.remove_image(image_id)

    # -- registries
    def pull(self, ref: str) -> Iterator[dict[str, Any]]:
        self.pulled.append(ref)
        what = self.remote[ref]
        if isinstance(what, Exception):
            raise what
        if isinstance(what, list):
            yield from what
            return
        self.images[what.id], self.refs[ref] = what, what.id
        yield {"status": "Pulling from x"}
        yield {"status": f"Digest: sha256:{'0' * 64}"}

    # -- containers
    def create(self, spec: ContainerSpec) -> str:
        self.created.append(spec)
        cid = f"c{len(self.created)}"
        self.containers[cid] = spec
        return cid

    def start(self, cid: str) -> None:
        outcome = self.outcomes.get(self.containers[cid].image)
        if isinstance(outcome, Exception):
            raise outcome

    def attach(self, cid: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """The outcome's output as one stdout chunk (read after start, as the engine's)."""
        outcome = self.outcomes.get(self.containers[cid].image, (0, ""))
        if not isinstance(outcome, Exception):
            yield str(outcome[1]).encode(), None

    def wait(self, cid: str, timeout: float | None = None) -> int:
        return int(self.outcomes.get(self.containers[cid].image, (0, ""))[0])

    def logs(self, cid: str, *, stderr: bool = False) -> str:
        spec = self.containers[cid]
        if spec.mounts and spec.command[:1] == ["cat"]:  # an engine on this machine sees its
            source, target, _ = spec.mounts[0]  # files: sync.probe reads its token back
            return Path(spec.command[1].replace(target, source, 1)).read_text()
        return str(self.outcomes.get(spec.image, (0, ""))[1])

    def stop(self, cid: str, timeout: int) -> None:
        pass

    def remove_container(self, cid: str) -> None:
        self.containers.pop(cid, None)

    # -- an engine that goes away: `reachable` False makes pings fail and removal wait
    reachable = True

    def ping(self, timeout: float) -> bool:
        return self.reachable

    def remove_container_patiently(self, cid: str, patience: float) -> bool:
        if not self.reachable:
            return False
        self.remove_container(cid)
        return True


def image(image_id: str, labels: dict[str, str] | None = None, **kw: Any) -> ImageInfo:
    return ImageInfo(id=image_id, labels=dict(labels or {}), **kw)
