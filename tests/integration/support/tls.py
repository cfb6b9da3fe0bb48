"""Throwaway TLS for servers a test runs on loopback: a CA of its own (so nothing else can
hold it by accident), a certificate for 127.0.0.1 it signs, and the public roots that still
let gpuenv reach PyPI beside it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, cn: str) -> tuple[Path, Path]:
    """A fresh self-signed CA; returns (certificate PEM, key)."""
    pem, key = directory / f"{cn}.pem", directory / f"{cn}.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
            "-out", str(pem), "-subj", f"/CN={cn}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return pem, key


def server_certificate(directory: Path, ca: Path, ca_key: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by the CA; returns (certificate PEM, key)."""
    pem, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-out", str(pem), "-extfile", str(ext))  # fmt: skip
    return pem, key


def public_roots() -> bytes:
    """What lets gpuenv reach PyPI: $PIP_CERT (a TLS-intercepting proxy's CA, or the system
    bundle) or, without it, the public roots certifi ships."""
    if os.environ.get("PIP_CERT"):
        return Path(os.environ["PIP_CERT"]).read_bytes()
    import certifi

    return Path(certifi.where()).read_bytes()


def loopback_tls(directory: Path, cn: str) -> tuple[Path, Path, Path]:
    """A CA and a 127.0.0.1 certificate in `directory`: (certificate, key, bundle), the
    bundle being that CA + the public roots (what gpuenv is given to trust)."""
    pem, key = make_ca(directory, cn)
    cert, cert_key = server_certificate(directory, pem, key)
    bundle = directory / "bundle.pem"
    bundle.write_bytes(pem.read_bytes() + b"\n" + public_roots())
    return cert, cert_key, bundle
