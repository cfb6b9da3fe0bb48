"""Throwaway containers, the other half of `Engine`'s typed operations beside images.py: a
short command in a container made, run and removed (`run_capture`), and the confined one
that runs code no one vetted and hands back a directory (`run_collecting`: building a
source package). A base class of `gpuenv.engine.client.Engine`, which gives it the
container operations it uses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuenv.engine.transport import _translated
from gpuenv.engine.values import ContainerSpec, EngineError
from gpuenv.matrix import contract


class ThrowawayContainers:
    # What Engine (client.py) provides.
    @property
    def _api(self) -> Any:
        raise NotImplementedError

    def create(self, spec: ContainerSpec) -> str:
        raise NotImplementedError

    def start(self, cid: str) -> None:
        raise NotImplementedError

    def wait(self, cid: str, timeout: float | None = None) -> int:
        raise NotImplementedError

    def logs(self, cid: str, *, stderr: bool = False) -> str:
        raise NotImplementedError

    def get_archive(self, cid: str, path: str) -> Iterator[bytes]:
        raise NotImplementedError

    def remove_container(self, cid: str) -> None:
        raise NotImplementedError

    def run_capture(
        self,
        image: str,
        command: list[str],
        platform: str | None = None,
        *,
        network: str = "none",
        files: dict[str, bytes] | None = None,
    ) -> tuple[int, str]:
        """Run a short command in a throwaway container (no network unless asked); (exit
        code, stdout). `files` (absolute path -> bytes) are put in before it starts."""
        spec = ContainerSpec(image, command, network=network, init=False, platform=platform,
                             labels=contract.container_labels("probe"))  # fmt: skip
        cid = self.create(spec)
        try:
            if files:
                with _translated():
                    self._api.put_archive(cid, "/", _tar_of(files))
            self.start(cid)
            code = self.wait(cid, timeout=120)
            out = self.logs(cid)
        finally:
            self.remove_container(cid)
        return code, out

    def run_collecting(
        self,
        image: str,
        command: list[str],
        *,
        files: dict[str, bytes],
        collect: str,
        timeout: float,
        platform: str | None = None,
        max_bytes: int = 512 << 20,
    ) -> tuple[int, str, bytes]:
        """Run a command in a throwaway container with no network, `files` (absolute path
        -> bytes) put in first; (exit code, its output, directory `collect` as a tar, or
        b"" when the command failed). The container is removed whatever happens; a run
        past `timeout` seconds is stopped (exit 124). Through the API only, so a remote
        engine runs it as a local one.

        It runs code no one vetted (a package's setup.py), so it is confined (issue 44,
        N9): as SANDBOX_USER, not root, every capability dropped, no-new-privileges, at
        most SANDBOX_PIDS processes and SANDBOX_MEMORY of memory. The directories `files`
        make are writable by that user (the image is not changed for it)."""
        spec = ContainerSpec(image, command, network="none", init=False, platform=platform,
                             labels=contract.container_labels("sdist"), user=SANDBOX_USER,
                             cap_drop=["ALL"], security_opt=["no-new-privileges"],
                             pids_limit=SANDBOX_PIDS, mem_limit=SANDBOX_MEMORY)  # fmt: skip
        cid = self.create(spec)
        try:
            with _translated():
                self._api.put_archive(cid, "/", _tar_of(files))
            self.start(cid)
            try:
                code = self.wait(cid, timeout=timeout)
            except EngineError:
                code = 124  # the wait timed out (the SDK's read timeout)
            output = self.logs(cid, stderr=True)
            collected = b""
            if code == 0:
                chunks: list[bytes] = []
                size = 0
                for chunk in self.get_archive(cid, collect):
                    size += len(chunk)
                    if size > max_bytes:
                        raise EngineError(f"{collect} in the container is larger than "
                                          f"{max_bytes} bytes")  # fmt: skip
                    chunks.append(chunk)
                collected = b"".join(chunks)
        finally:
            self.remove_container(cid)
        return code, output, collected


SANDBOX_USER = "65534:65534"  # nobody, in Debian's and most bases' passwd, or none at all
SANDBOX_PIDS = 4096
SANDBOX_MEMORY = "8g"


def _tar_of(files: dict[str, bytes]) -> bytes:
    """A tar of absolute paths -> contents (mode 0644, owned by root), for put_archive; the
    directories above them, below /, made 0777 (the sandbox's user writes in them)."""
    import io
    import tarfile

    buf = io.BytesIO()
    parents = {"/".join(p.lstrip("/").split("/")[:i]) for p in files
               for i in range(1, p.lstrip("/").count("/") + 1)}  # fmt: skip
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(parents):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o777
            tar.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
