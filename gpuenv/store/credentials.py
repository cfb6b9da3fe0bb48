"""Credentials for private package indexes: which one goes to which URL (the one place that
decides it), read on the host when a build or a lock starts.

They are used only on this machine: by gpuenv's fetches into the wheelhouse (gpuenv/store/fetch.py)
and by `uv pip compile` (in its environment, inside the index URLs: gpuenv/building/lock.py);
the build gets wheels in its context and no index at all, so no layer, history entry, config
or build log can hold them. The matrix file never holds them (matrix/schema.py refuses a URL
with credentials).

A credential is bound to one origin, scheme://host:port, that the user named, never to
whatever host a matrix lists (its author may not be the user: in CI the matrix comes from the
branch under test, the credentials from the runner's secrets):

1. `GPUENV_INDEX_USERNAME` and `GPUENV_INDEX_PASSWORD` go to `GPUENV_INDEX_ORIGIN`
   (`https://host[:port]`, required with them);
2. netrc (`$NETRC`, else `~/.netrc`): `machine HOST` goes to https://HOST:443, and
   `machine HOST:PORT` (gpuenv reads that form; pip and curl do not) to https://HOST:PORT.
   The `default` entry, which stands for every host, is never used.

Only https URLs of exactly that origin get one: never plain http (anyone on the path could
read it), never another port of the host, never after a redirect (fetch.py drops the header
when it follows one; uv gets no netrc of its own, only the URLs gpuenv gave credentials to).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpuenv.matrix.errors import GpuenvError

DEFAULT_PORTS = {"https": 443, "http": 80}
Origin = tuple[str, str, int]  # scheme, host (lowercase, IPv6 without brackets), port


@dataclass(frozen=True)
class Credential:
    username: str
    password: str
    source: str  # where it came from, for messages: "$GPUENV_INDEX_USERNAME", "netrc FILE"

    def header(self) -> str:
        import base64

        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return f"Basic {token}"


def origin_of(url: str) -> Origin | None:
    """(scheme, host, port) of an http(s) URL, the port made explicit; None for anything
    else (another scheme, no host, a port that is not a number)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port if port is not None else DEFAULT_PORTS[scheme]


def show(origin: Origin) -> str:
    scheme, host, port = origin
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


@dataclass
class Credentials:
    by_origin: dict[Origin, Credential]

    def for_url(self, url: str) -> Credential | None:
        """The credential to send with a request for `url`: the one bound to its exact
        origin, and only over https."""
        origin = origin_of(url)
        if origin is None or origin[0] != "https":
            return None
        return self.by_origin.get(origin)

    def withheld(self, url: str) -> str | None:
        """Why a URL got none although a credential names its host (for the error when it
        answers 401): plain http, or another port than the one they are bound to."""
        origin = origin_of(url)
        if origin is None or self.for_url(url) is not None:
            return None
        bound = sorted(o for o in self.by_origin if o[1] == origin[1])
        if not bound:
            return None
        where = ", ".join(f"{show(o)} ({self.by_origin[o].source})" for o in bound)
        if origin[0] != "https":
            return (
                f"credentials are never sent over plain http (those for {origin[1]} are for "
                f"{where}); use the index's https:// URL"
            )
        return (
            f"the credentials for {origin[1]} are bound to {where}, not {show(origin)}; "
            f"name its port (netrc: machine {origin[1]}:{origin[2]}; or $GPUENV_INDEX_ORIGIN)"
        )


def netrc_path() -> Path | None:
    explicit = os.environ.get("NETRC")
    if explicit:
        return Path(explicit)
    home = os.path.expanduser("~")
    return Path(home) / ".netrc" if os.path.isabs(home) else None


def netrc_origin(machine: str) -> Origin | None:
    """The origin a netrc `machine` entry is for: HOST -> https://HOST:443, HOST:PORT ->
    https://HOST:PORT; None for `default` and for what is no host."""
    if machine == "default" or "/" in machine or "@" in machine:
        return None
    return origin_of(f"https://{machine}/")


ORIGIN_VARIABLE = "GPUENV_INDEX_ORIGIN"


def env_origin(value: str) -> Origin:
    """$GPUENV_INDEX_ORIGIN: an https origin alone, else one error saying what to write."""
    origin = origin_of(value)
    parts = urlsplit(value)
    if origin is not None and origin[0] == "http":
        raise GpuenvError(
            f"${ORIGIN_VARIABLE} {value!r}: credentials are never sent over plain http; "
            "give the index's https:// origin"
        )
    extra = parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc
    if origin is None or extra:
        raise GpuenvError(
            f"${ORIGIN_VARIABLE} {value!r}: expected the origin alone, https://host[:port] "
            "(no path, user or query), e.g. https://pypi.example.com"
        )
    return origin


def load() -> Credentials:
    """The credentials gpuenv may send, each bound to the origin its source names."""
    by_origin: dict[Origin, Credential] = {}
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
            origin = netrc_origin(machine.lower())
            if origin is not None and login and password:
                by_origin[origin] = Credential(login, password, f"netrc {path}")
    user, password = (
        os.environ.get("GPUENV_INDEX_USERNAME"),
        os.environ.get("GPUENV_INDEX_PASSWORD"),
    )
    named = os.environ.get(ORIGIN_VARIABLE)
    if bool(user) != bool(password):
        given = "GPUENV_INDEX_USERNAME" if user else "GPUENV_INDEX_PASSWORD"
        raise GpuenvError(
            f"${given} is set without its pair; set both GPUENV_INDEX_USERNAME and "
            "GPUENV_INDEX_PASSWORD, or neither"
        )
    if user and password:
        if not named:
            raise GpuenvError(
                "$GPUENV_INDEX_USERNAME/PASSWORD are set without $GPUENV_INDEX_ORIGIN: set it "
                "to the https://host[:port] of the index they are for (they go to no other)"
            )
        by_origin[env_origin(named)] = Credential(user, password, "$GPUENV_INDEX_USERNAME/PASSWORD")
    elif named:
        raise GpuenvError(
            f"${ORIGIN_VARIABLE} is set without GPUENV_INDEX_USERNAME and "
            "GPUENV_INDEX_PASSWORD; set all three, or none"
        )
    return Credentials(by_origin)
