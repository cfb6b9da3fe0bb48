"""The Engine API's own builder (POST /build, a context uploaded as a tar): podman's path
for a context directory (its builder takes the same RUN --mount steps), and the sdists'
builds. Docker engines build context directories with BuildKit instead (`buildkit`)."""

from __future__ import annotations

import re
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from gpuenv.engine.buildkit import _ANSI
from gpuenv.engine.transport import _translated
from gpuenv.engine.values import BuildFailed, LogSink


@contextmanager
def uploaded(directory: Path) -> Iterator[IO[bytes]]:
    """`directory` as a tar file to upload, read from its start."""
    with tempfile.TemporaryFile() as tar_file:
        with tarfile.open(fileobj=tar_file, mode="w") as tar:
            tar.add(directory, arcname=".")
        tar_file.seek(0)
        yield tar_file


def stream(
    api: Any,
    context: Any,
    labels: dict[str, str],
    nocache: bool,
    on_log: LogSink,
    running: list[str],
    network: str,
    platform: str | None = None,
) -> tuple[str | None, str | None]:
    image_id = short_id = None
    with _translated():
        stream: Iterator[dict[str, Any]] = api.build(
            fileobj=context,
            custom_context=True,
            encoding="gzip" if getattr(context, "gzipped", False) else None,
            labels=labels,
            nocache=nocache,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode=network,
            decode=True,
            **({"platform": platform} if platform else {}),
        )
        for chunk in stream:
            if "stream" in chunk:
                # The engine passes the step's colour codes through; logs get plain text.
                for line in _ANSI.sub("", str(chunk["stream"])).splitlines():
                    on_log(line)
                    m = re.match(r"Successfully built ([0-9a-f]{12,64})", line)
                    if m:
                        short_id = m.group(1)
                    m = re.match(r"\s*---> Running in ([0-9a-f]{12,64})", line)
                    if m:
                        running.append(m.group(1))
            if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
                image_id = str(chunk["aux"]["ID"])
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail") or {}
                raise BuildFailed(str(detail.get("message") or chunk.get("error")).strip())
    return image_id, short_id
