"""The CA bundle gpuenv trusts when it fetches packages: which one, and whether it is sound.

Corporate proxies intercept TLS, so fetching from the package indexes must trust their CA.
Only gpuenv's own fetches (gpuenv/store/fetch.py) and resolutions (`uv pip compile`,
gpuenv/building/lock.py) use it, on the client; builds fetch nothing, so no layer, history entry
or config can hold it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuenv.matrix.errors import GpuenvError


def find_bundle(explicit: Path | None, matrix_value: str | None, matrix_dir: Path) -> Path | None:
    """The first of --ca-bundle, the matrix's build.ca_bundle, $GPUENV_CA_BUNDLE, $PIP_CERT."""
    if explicit is not None:
        candidate, origin = explicit, "--ca-bundle"
    elif matrix_value:
        candidate, origin = matrix_dir / matrix_value, "build.ca_bundle"
    elif os.environ.get("GPUENV_CA_BUNDLE"):
        candidate, origin = Path(os.environ["GPUENV_CA_BUNDLE"]), "$GPUENV_CA_BUNDLE"
    elif os.environ.get("PIP_CERT"):
        candidate, origin = Path(os.environ["PIP_CERT"]), "$PIP_CERT"
    else:
        return None
    check_bundle(candidate, origin)
    return candidate


MAX_BUNDLE_BYTES = 16 << 20
CHECKED = "ca-checked.json"  # in gpuenv's cache: sha256 of a bundle -> valid until (epoch s)


def known_good_until(path: Path) -> float | None:
    """Until when (epoch s) check_bundle's verdict on these exact bytes holds (remembered by
    content digest until their last valid certificate expires, so a build that needs no CA
    need not import ssl and parse a 200 KB system bundle); None when it is not remembered
    or has expired."""
    from gpuenv.store import cache
    from gpuenv.store.cache import file_digest

    until = cache.read_record(CHECKED).get(file_digest(path))
    return until if isinstance(until, (int, float)) and time.time() <= until else None


def _remember_good(text: bytes, until: float) -> None:
    import hashlib

    from gpuenv.store import cache

    now = time.time()
    kept = {k: v for k, v in cache.read_record(CHECKED).items()
            if isinstance(v, (int, float)) and v >= now}  # fmt: skip
    kept[hashlib.sha256(text).hexdigest()] = until
    # Spares work only: written when the command succeeds (cache.held_records).
    cache.write_record(CHECKED, dict(sorted(kept.items(), key=lambda kv: -kv[1])[:32]), held=True)


def check_bundle(path: Path, origin: str) -> None:
    """A readable regular file (not a directory or /dev/zero) of PEM certificates that
    OpenSSL loads, at least one of them valid now: else an error naming where it came from."""
    if known_good_until(path) is not None:
        return
    import ssl

    from gpuenv.matrix.files import read_regular

    where = f"CA bundle {path} (from {origin})"
    try:
        text = read_regular(path, MAX_BUNDLE_BYTES)
    except IsADirectoryError:
        raise GpuenvError(f"{where}: not a regular file") from None
    except OSError as exc:
        raise GpuenvError(f"{where}: {exc.strerror}") from None
    if len(text) > MAX_BUNDLE_BYTES:
        raise GpuenvError(f"{where}: larger than {MAX_BUNDLE_BYTES} bytes")
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise GpuenvError(f"{where} holds no PEM certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cadata=text.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise GpuenvError(f"{where}: a PEM certificate in it does not parse") from None
    now = time.time()
    certs = context.get_ca_certs()
    valid = [
        c
        for c in certs
        if ssl.cert_time_to_seconds(c["notBefore"])
        <= now
        <= ssl.cert_time_to_seconds(c["notAfter"])
    ]
    if certs and not valid:
        raise GpuenvError(f"{where}: every certificate in it has expired (or is not yet valid)")
    if valid:
        _remember_good(text, max(ssl.cert_time_to_seconds(c["notAfter"]) for c in valid))
