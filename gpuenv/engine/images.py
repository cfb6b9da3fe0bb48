"""The engine's image operations (inspect, tag, remove, import, save, load, push, pull),
half of `Engine`'s typed operations: a base class of `gpuenv.engine.client.Engine`, which
gives it the SDK's client (`_api`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from gpuenv.engine.transport import (
    _connection_error,
    _sdk_error,
    _status,
    _translated,
    engine_error,
)
from gpuenv.engine.values import ImageInfo
from gpuenv.matrix import contract
from gpuenv.matrix.errors import GpuenvError


class ImageOperations:
    @property
    def _api(self) -> Any:
        raise NotImplementedError  # the Engine's SDK client

    # ------------------------------------------------------------------ images

    def image(self, ref: str) -> ImageInfo | None:
        """`docker image inspect`, or None when there is no such image."""
        try:
            return ImageInfo.from_inspect(self._api.inspect_image(ref))
        except Exception as exc:
            if _status(exc) == 404 or _sdk_error(exc, "ImageNotFound"):
                return None
            if isinstance(exc, OSError) or _connection_error(exc):
                raise engine_error(exc) from None
            raise

    def labels(self, ref: str) -> dict[str, str] | None:
        info = self.image(ref)
        return None if info is None else dict(info.labels)

    def container_image(self, container: str) -> ImageInfo | None:
        """The image a container runs (one gpuenv may not have started), or None when
        there is no such container."""
        try:
            data = self._api.inspect_container(container)
        except Exception as exc:
            if _sdk_error(exc, "NotFound"):
                return None
            if isinstance(exc, OSError) or _sdk_error(exc):
                raise engine_error(exc) from None
            raise
        return self.image(str(data["Image"]))

    def gpuenv_images(self) -> list[dict[str, str]]:
        """Labels of every tagged image gpuenv built (they carry io.gpuenv.cell)."""
        with _translated():
            images = self._api.images(filters={"label": contract.CELL, "dangling": False})
        return [dict(i.get("Labels") or {}) for i in images if i.get("RepoTags")]

    def history(self, ref: str) -> list[dict[str, Any]]:
        """The image's layers, newest first: {"size", "created_by"}."""
        with _translated():
            history = self._api.history(ref)
        return [
            {
                "size": int(h.get("Size") or 0),
                "created_by": " ".join(str(h.get("CreatedBy") or "(imported)").split()),
            }
            for h in history
        ]

    def tag(self, image_id: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":")
        with _translated():
            self._api.tag(image_id, repo, tag)

    def remove_if_untagged(self, image_id: str) -> bool:
        """Remove a superseded image only when no tag points at it any more (removing by
        ID would also drop a tag a user added, e.g. docker tag acme/tf:cell acme/tf:rel1)."""
        info = self.image(image_id)
        if info is None or info.tags:
            return False
        return self.remove_image(image_id)

    def remove_image(self, ref: str, *, force: bool = False) -> bool:
        try:
            self._api.remove_image(ref, force=force, noprune=False)
            return True
        except Exception as exc:
            if _sdk_error(exc, "APIError"):
                return False
            raise

    def import_image(self, tar_path: str, ref: str, changes: list[str]) -> str:
        """`docker import` of a root filesystem tar file, tagged ref."""
        repo, _, tag = ref.rpartition(":")
        with _translated():
            out = self._api.import_image(src=tar_path, repository=repo, tag=tag, changes=changes)
        status = str(out)
        match = re.search(r"sha256:[0-9a-f]{64}", status)
        if match is None:
            raise GpuenvError(f"docker import of {ref} failed: {status.strip()[:300]}")
        return match.group(0)

    def save(self, ref: str, path: str) -> None:
        """`docker save` to a tar file."""
        with _translated(), open(path, "wb") as fh:
            for chunk in self._api.get_image(ref):
                fh.write(chunk)

    def load(self, path: str) -> list[str]:
        """`docker load` of a tar file; returns what the engine said it loaded. A FIFO or a
        device given as the file is refused, not waited on."""
        from gpuenv.matrix.files import open_regular

        try:
            archive = open_regular(path)
        except OSError as exc:
            raise GpuenvError(f"{path}: cannot read ({exc.strerror}); give a tar file "
                              "(docker save, gpuenv base --save)") from None  # fmt: skip
        messages = []
        with _translated(), archive as fh:
            # The reply streams while the engine loads: it is read to its end, so the image
            # is there when this returns (an unread stream let a tag on a slow vfs engine
            # come first: "No such image") and an error inside the stream is seen.
            for item in self._api.load_image(fh):
                if isinstance(item, dict) and item.get("error"):
                    raise GpuenvError(f"docker load {path}: {item['error']}")
                if isinstance(item, dict) and item.get("stream"):
                    messages.append(str(item["stream"]).strip())
        return messages

    # ------------------------------------------------------------------ registries

    def push(self, ref: str) -> Iterator[dict[str, Any]]:
        """The decoded push stream. The SDK raises nothing for a failed push: the error is
        inside the stream, and the caller must read it to the end (gpuenv/publish/push.py)."""
        repo, _, tag = ref.rpartition(":")
        with _translated():
            yield from self._api.push(repo, tag=tag, stream=True, decode=True)

    def pull(self, ref: str) -> Iterator[dict[str, Any]]:
        """The decoded pull stream (errors may come inside it, as for push). REPO@DIGEST
        pulls exactly that manifest (the API takes the digest as the tag)."""
        repo, _, tag = ref.partition("@") if "@" in ref else ref.rpartition(":")
        with _translated():
            yield from self._api.pull(repo, tag=tag, stream=True, decode=True)
