"""No CA bundle is left behind: not in a layer, not in the history, not in the config.

The test makes its own CA (so nothing else can contain it by accident), builds a cell with
`--ca-bundle` = that CA + the proxy's CA ($PIP_CERT, so PyPI still answers through the
TLS-intercepting proxy), and searches the `docker save` stream of the image byte by byte.
`--no-cache` makes the install step really run with this bundle (the RUN line does not
depend on the bundle's contents, so the engine's cache would otherwise reuse a layer made
with another bundle and the test would prove nothing).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import ssl
import subprocess
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

CHUNK = 16 << 20


def make_ca(directory: Path) -> tuple[Path, str]:
    """A fresh self-signed CA; returns (PEM path, its common name)."""
    cn = f"gpuenv-test-ca-{secrets.token_hex(8)}"
    pem = directory / "test-ca.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", str(directory / "test-ca.key"), "-out", str(pem), "-subj", f"/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE"],
            check=True, capture_output=True,
        )  # fmt: skip
        return pem, cn
    import datetime

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pem, cn


def needles(pem: Path, cn: str) -> dict[str, bytes]:
    """Distinctive byte strings of the CA: a base64 line from the middle of its body, a
    fragment of its DER encoding (the random key and signature live there), its name."""
    lines = [ln for ln in pem.read_text().splitlines() if ln and not ln.startswith("-----")]
    der = base64.b64decode("".join(lines))
    middle = len(der) // 2
    return {
        "PEM line": lines[len(lines) // 2].encode(),
        "DER bytes": der[middle : middle + 32],
        "common name": cn.encode(),
    }


def scan(stream: io.RawIOBase | io.BufferedReader, wanted: dict[str, bytes]) -> set[str]:
    """Which needles occur in a byte stream (chunked, with overlap across chunk borders)."""
    found: set[str] = set()
    keep = max(len(n) for n in wanted.values()) - 1
    tail = b""
    while chunk := stream.read(CHUNK):
        window = tail + chunk
        found |= {what for what, n in wanted.items() if n in window}
        tail = window[-keep:]
    return found


def scan_saved_image(image_id: str, wanted: dict[str, bytes]) -> dict[str, set[str]]:
    """`docker save`, streamed: every member (each layer.tar, the config JSON, manifest) is
    searched; returns member name -> needles found in it."""
    hits: dict[str, set[str]] = {}
    proc = subprocess.Popen(["docker", "save", image_id], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                f = tar.extractfile(member)
                assert f is not None
                hits[member.name] = scan(f, wanted)
    finally:
        proc.stdout.close()
        assert proc.wait(timeout=120) == 0
    return hits


def proxy_bundle() -> bytes:
    """What lets the build reach PyPI: $PIP_CERT (the proxy's CA) or, without a proxy, the
    public roots certifi ships."""
    if os.environ.get("PIP_CERT"):
        return Path(os.environ["PIP_CERT"]).read_bytes()
    import certifi

    return Path(certifi.where()).read_bytes()


def wheel_record_hash(package: str, version: str, path: str) -> str:
    """The sha256 a published wheel's RECORD gives for one of its files (from PyPI)."""
    cafile = os.environ.get("PIP_CERT")
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    # The simple API (PEP 691), as installers read it.
    index = urllib.request.Request(
        f"https://pypi.org/simple/{package}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(index, timeout=60, context=context) as reply:
        files = json.load(reply)["files"]
    prefix = f"{package.replace('-', '_')}-{version}-"
    wheel = next(
        f for f in files if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
    )
    with urllib.request.urlopen(wheel["url"], timeout=120, context=context) as reply:
        data = reply.read()
    assert hashlib.sha256(data).hexdigest() == wheel["hashes"]["sha256"]
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        for line in zf.read(record).decode().splitlines():
            name, digest, _size = line.rsplit(",", 2)
            if name == path:
                return digest
    raise AssertionError(f"{path} is not in {wheel['filename']}'s RECORD")


@pytest.fixture(scope="module")
def ca_build(tmp_path_factory, shipped_cpu, gpuenv, parse_build, extra_pip):
    """A cell built with --ca-bundle = fresh test CA + the proxy's CA, without the cache."""
    from gpuenv.contract import CA_PORT

    tmp = tmp_path_factory.mktemp("ca")
    pem, cn = make_ca(tmp)
    bundle = tmp / "bundle.pem"
    bundle.write_bytes(pem.read_bytes() + b"\n" + proxy_bundle())
    matrix = tmp / "matrix.yaml"
    doc = {
        "name": "gpuenv-test/ca",
        "matrix": {"tensorflow": ["2.21"], "python": ["3.11"], "variant": ["cpu"]},
        "bases": {"3.11": {"debian": "bookworm"}},
        "packages": {"pip": [extra_pip]},
    }
    matrix.write_text(json.dumps(doc))
    proc = gpuenv(
        "build", "-f", str(matrix), "--ca-bundle", str(bundle), "--no-cache", "--json"
    )  # fmt: skip
    (result,) = parse_build(proc).values()
    assert result["status"] == "built", result
    return {"result": result, "needles": needles(pem, cn), "port": CA_PORT}


def test_test_ca_is_in_no_layer_and_not_in_the_config(ca_build):
    wanted = ca_build["needles"]
    image_id = ca_build["result"]["image_id"]
    # Positive control: the scanner does see the image's files (the user the image adds).
    control = scan_saved_image(image_id, {**wanted, "control": b"gpuenv:x:1000:1000:"})
    assert any("control" in found for found in control.values()), "scanner saw no layer"
    assert any(name.endswith("layer.tar") for name in control), sorted(control)
    leaks = {name: found - {"control"} for name, found in control.items()}
    assert {name: found for name, found in leaks.items() if found} == {}


def test_test_ca_is_not_in_the_history(ca_build, docker):
    wanted = ca_build["needles"]
    image_id = ca_build["result"]["image_id"]
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image_id).stdout
    # Positive control: the install step is there, fetching the bundle over loopback.
    assert f"127.0.0.1:{ca_build['port']}" in history
    assert [what for what, n in wanted.items() if n.decode("latin-1") in history] == []
    config = docker("image", "inspect", image_id).stdout
    assert [what for what, n in wanted.items() if n.decode("latin-1") in config] == []


def test_certifi_bundle_is_the_published_one(ca_build, in_image):
    code = (
        "import base64, hashlib, importlib.metadata as m, json, certifi; "
        "d = m.distribution('certifi'); "
        "rec = next(f for f in d.files if f.name == 'cacert.pem'); "
        "data = open(certifi.where(), 'rb').read(); "
        "print(json.dumps({'version': d.version, 'path': str(rec), "
        "'record': f'{rec.hash.mode}={rec.hash.value}', "
        "'actual': 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest())"
        ".rstrip(b'=').decode()}))"
    )
    got = json.loads(in_image(ca_build["result"]["image"], "python", "-c", code).splitlines()[-1])
    assert got["actual"] == got["record"], got
    assert got["actual"] == wheel_record_hash("certifi", got["version"], got["path"])
