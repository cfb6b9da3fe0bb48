"""Credentials for private package indexes, read on the host when a build starts.

They are used only on this machine: by gpuenv's fetches into the wheelhouse (gpuenv/store/fetch.py)
and by `uv pip compile` for an unlocked cell (in its environment); the build gets wheels in
its context and no index at all, so no layer, history entry, config or build log can hold
them. The matrix file never holds them (matrix/schema.py refuses a URL
with credentials).

Where they come from, first found, per index host (host:port as in the index URL):

1. `GPUENV_INDEX_USERNAME` and `GPUENV_INDEX_PASSWORD`: for the hosts of the matrix's own
   indexes (`build.index_url`, `build.extra_index_urls`) only, never for any other host a
   page links to;
2. netrc: `$NETRC`, else `~/.netrc` (the file pip, uv and curl read), by host.

Credentials are sent only to the host they belong to and never follow a redirect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpuenv.matrix.errors import GpuenvError


@dataclass(frozen=True)
class Credential:
    username: str
    password: str
    source: str  # where it came from, for messages: "$GPUENV_INDEX_USERNAME", "netrc FILE"

    def header(self) -> str:
        import base64

        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def host_of(url: str) -> str:
    """host[:port] of a URL, lowercased (netrc's machine is the host alone)."""
    return urlsplit(url).netloc.rsplit("@", 1)[-1].lower()


@dataclass
class Credentials:
    by_host: dict[str, Credential]

    def for_url(self, url: str) -> Credential | None:
        netloc = host_of(url)
        return self.by_host.get(netloc) or self.by_host.get(netloc.split(":")[0])


def netrc_path() -> Path | None:
    explicit = os.environ.get("NETRC")
    if explicit:
        return Path(explicit)
    home = os.path.expanduser("~")
    return Path(home) / ".netrc" if os.path.isabs(home) else None


def load(own_indexes: tuple[str, ...]) -> Credentials:
    """The credentials a build's fetches may use. `own_indexes` are the matrix's own index
    URLs (the environment variables apply to their hosts only)."""
    by_host: dict[str, Credential] = {}
    path = netrc_path()
    if path is not None and path.is_file():
        import netrc

        try:
            parsed = netrc.netrc(str(path))
        except (netrc.NetrcParseError, OSError, UnicodeDecodeError) as exc:
            line = getattr(exc, "lineno", None)
            where = f"{path}:{line}" if line else str(path)
            raise GpuenvError(
                f"{where}: cannot read the netrc file ({getattr(exc, 'msg', exc)}); fix it or "
                "point $NETRC elsewhere"
            ) from None
        for machine, (login, _account, password) in parsed.hosts.items():
            if login and password:
                by_host[machine.lower()] = Credential(login, password, f"netrc {path}")
    user, password = (
        os.environ.get("GPUENV_INDEX_USERNAME"),
        os.environ.get("GPUENV_INDEX_PASSWORD"),
    )
    if bool(user) != bool(password):
        given = "GPUENV_INDEX_USERNAME" if user else "GPUENV_INDEX_PASSWORD"
        raise GpuenvError(
            f"${given} is set without its pair; set both GPUENV_INDEX_USERNAME and "
            "GPUENV_INDEX_PASSWORD, or neither"
        )
    if user and password:
        for url in own_indexes:
            by_host[host_of(url)] = Credential(user, password, "$GPUENV_INDEX_USERNAME/PASSWORD")
    return Credentials(by_host)
