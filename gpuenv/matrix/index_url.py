"""An index URL as gpuenv takes one, wherever it is written: `build.index_url` and
`build.extra_index_urls` in matrix.yaml, and a requirements file's `--index-url` and
`--extra-index-url` lines (held to the same rule, so neither is a way around the other)."""

from __future__ import annotations

import re

_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]+)?(?:/[A-Za-z0-9._~%+/-]*)?")


def check_index_url(value: str) -> str:
    """`value`, or ValueError saying what is wrong with it."""
    if "@" in value:
        raise ValueError("credentials do not belong in the matrix; use pip's netrc or keyring")
    if not _URL.fullmatch(value):
        raise ValueError(f"{value!r} is not a plain http(s) URL (no query, quotes or spaces)")
    if value.lower().startswith("http://") and not _loopback(value):
        # As pip refuses one without --trusted-host: anyone on the path could alter the pages
        # (an unlocked cell installs what they list) and read what is asked.
        raise ValueError(
            f"{value!r}: a plain-http index can be read and altered on the way; use its "
            "https:// URL (http is accepted on loopback addresses only, and never gets "
            "credentials)"
        )
    return value


def _loopback(url: str) -> bool:
    """Whether an URL's host is this machine's loopback (pip's "secure origins" for http)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
