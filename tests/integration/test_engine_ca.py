"""The CA bundle is what gpuenv's own fetches trust, and it reaches no build.

The test makes its own CA (so nothing else can contain it by accident) and serves a package
index over HTTPS on loopback with a certificate that CA signed: one small wheel, with a
token unique to the session in it (so the install step really runs, never a cached layer).
A cell that installs it is built with `--ca-bundle` = that CA + the public roots ($PIP_CERT,
else certifi's; PyPI still answers for the rest). The cell is the JAX CPU cell, the smallest
framework cell (690 MB, where TF's is 2.26 GB: the image is saved and searched byte by
byte), with certifi added for the last check. gpuenv resolves and fetches on the
client, with the bundle; the build gets the wheels in its context and fetches nothing. So:

- the bundle decides: without the test CA in it, the same build fails on the index's
  certificate; with it, the index is reached and the package is in the image;
- no trace of the CA in the image (`docker save`, searched byte by byte: every layer, the
  config, the manifest), its history, the build log and the build's command line (the
  docker CLI gpuenv builds with is wrapped, GPUENV_DOCKER_CLI, to keep both), what gpuenv
  printed, or the context directory it sent;
- another bundle, or none, rebuilds nothing: the spec hash does not depend on it;
- certifi's CA file in the image is the published one (nothing was added to it).
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
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import cells
from support.cells import test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import logging_docker_cli
from support.tls import make_ca, public_roots, server_certificate

pytestmark = pytest.mark.engine

CHUNK = 16 << 20
REPOSITORY = test_repository("ca")
CELL = cells.JAX_CPU_CELL
IMAGE = f"{REPOSITORY}:{CELL}"
PACKAGE, VERSION = "gpuenv-ca-probe", "1.0"
TOKEN = secrets.token_hex(12)  # in the probe's module: this session's wheel, and no other


def make_wheel() -> tuple[str, bytes]:
    """A minimal pure-Python wheel: a module (with TOKEN), METADATA, WHEEL and RECORD."""
    dist = f"{PACKAGE.replace('-', '_')}-{VERSION}"
    files = {
        "gpuenv_ca_probe.py": f"ANSWER = 42\nTOKEN = {TOKEN!r}\n".encode(),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\n".encode()
        ),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: gpuenv-test\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), data)
    return f"{dist}-py3-none-any.whl", buf.getvalue()


JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def json_page(filename: str, sha: str) -> bytes:
    """A PEP 691 project page, with PEP 700's upload time (as PyPI serves them)."""
    return json.dumps({
        "meta": {"api-version": "1.1"}, "name": PACKAGE, "versions": [VERSION],
        "files": [{"filename": filename, "url": f"/files/{filename}", "hashes": {"sha256": sha},
                   "upload-time": "2026-01-01T00:00:00.000000Z"}],
    }).encode()  # fmt: skip


class TlsIndex:
    """PEP 503 pages over HTTPS on 127.0.0.1:<free port>: the probe, and 404 for the rest."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.filename, self.wheel = make_wheel()
        sha = hashlib.sha256(self.wheel).hexdigest()
        self.requests: list[tuple[str, int]] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # uv asks before it downloads
                self.answer(send_body=False)

            def do_GET(self) -> None:
                self.answer(send_body=True)

            def answer(self, send_body: bool) -> None:
                if self.path == f"/simple/{PACKAGE}/":
                    code, body = 200, json_page(index.filename, sha)
                elif self.path == f"/files/{index.filename}":
                    code, body = 200, index.wheel
                else:
                    code, body = 404, b"not here\n"
                index.requests.append((self.path, code))
                self.send_response(code)
                kind = JSON_TYPE if self.path.startswith("/simple/") else "application/zip"
                self.send_header("Content-Type", kind)  # uv requires one
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A client that refuses the certificate fails the handshake: an OSError the server
        # drops (socketserver), as it should.
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/simple/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> TlsIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


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


def scan(stream: Any, wanted: dict[str, bytes]) -> set[str]:
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
        assert proc.wait(timeout=300) == 0
    return hits


@pytest.fixture(scope="module")
def ca_index(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The test CA, the HTTPS index it vouches for, the matrix that installs from it and the
    environment the builds run in."""
    tmp = tmp_path_factory.mktemp("ca")
    cn = f"gpuenv-test-ca-{secrets.token_hex(8)}"
    pem, key = make_ca(tmp, cn)
    cert, cert_key = server_certificate(tmp, pem, key)
    bundle = tmp / "bundle.pem"
    bundle.write_bytes(pem.read_bytes() + b"\n" + public_roots())
    with TlsIndex(cert, cert_key) as index:
        doc = yaml.safe_load(cells.jax_cpu_matrix(REPOSITORY))
        # certifi: a CA file for test_certifi_bundle_is_the_published_one (JAX needs none).
        doc["packages"] = {"pip": [f"{PACKAGE}=={VERSION}", cells.EXTRA_PIP]}
        doc["build"] = {"extra_index_urls": [index.url]}
        matrix = tmp / "matrix.yaml"
        matrix.write_text(json.dumps(doc, indent=2))
        cli = logging_docker_cli(tmp)
        # The session's wheelhouse (JAX fetched once, shared with the wheelhouse and
        # private-index tests); its contexts/ holds what this build sent.
        cache = tmp_path_factory.getbasetemp() / "wheelhouse-cache"
        env = clean_env(XDG_CACHE_HOME=str(cache), GPUENV_DOCKER_CLI=str(cli["wrapper"]))
        for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
            env.pop(name, None)  # the bundle is what --ca-bundle says, nothing else
        for name in ("no_proxy", "NO_PROXY"):  # the index is on this machine's loopback
            env[name] = ",".join(filter(None, (env.get(name), "127.0.0.1")))
        yield {"tmp": tmp, "index": index, "matrix": matrix, "bundle": bundle, "env": env,
               "cache": cache, "needles": needles(pem, cn), **cli}  # fmt: skip


@pytest.fixture(scope="module")
def ca_build(ca_index) -> dict[str, Any]:
    """The cell built with --ca-bundle = the test CA + the public roots."""
    bundle = str(ca_index["bundle"])
    proc = gpuenv_cmd("build", "-f", str(ca_index["matrix"]), "--ca-bundle", bundle, "--json",
                      env=ca_index["env"], check=False)  # fmt: skip
    assert proc.returncode == 0, output(proc)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "built", result
    return {**result, "output": proc.stdout + proc.stderr}


def test_the_bundle_is_what_gpuenv_trusts(ca_build, ca_index, in_image, inspect, tmp_path):
    """With the test CA the index was reached and its package is in the image; with the
    public roots alone, the same build stops at the index's certificate."""
    got = in_image(IMAGE, "python", "-c", "import gpuenv_ca_probe as m; print(m.TOKEN)")
    assert got.strip().splitlines()[-1] == TOKEN
    assert (f"/files/{ca_index['index'].filename}", 200) in ca_index["index"].requests
    roots = tmp_path / "roots.pem"
    roots.write_bytes(public_roots())
    env = {**ca_index["env"], "UV_NO_CACHE": "1"}  # uv must ask the index again
    proc = gpuenv_cmd("build", "-f", str(ca_index["matrix"]), "--ca-bundle", str(roots),
                      "--no-cache", env=env, check=False)  # fmt: skip
    assert proc.returncode == 1, output(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, output(proc)
    assert "certificate" in errors[0].lower() and "127.0.0.1" in errors[0], errors[0]
    assert inspect(IMAGE)["Id"] == ca_build["image_id"]  # the failed build tagged nothing


def test_test_ca_is_in_no_layer_and_not_in_the_config(ca_build, ca_index):
    wanted = ca_index["needles"]
    # Positive controls: the scanner sees the image's files (the user the image adds, the
    # probe's module this build installed).
    controls = {"user": b"gpuenv:x:1000:1000:", "probe": TOKEN.encode()}
    found = scan_saved_image(ca_build["image_id"], {**wanted, **controls})
    for control in controls:
        assert any(control in hits for hits in found.values()), f"scanner saw no {control}"
    assert any(name.endswith("layer.tar") for name in found), sorted(found)
    leaks = {name: hits - set(controls) for name, hits in found.items()}
    assert {name: hits for name, hits in leaks.items() if hits} == {}


def test_test_ca_is_not_in_the_history_the_build_log_or_its_command(ca_build, ca_index, docker):
    wanted = {what: n.decode("latin-1") for what, n in ca_index["needles"].items()}
    image_id = ca_build["image_id"]
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image_id).stdout
    config = docker("image", "inspect", image_id).stdout
    log = ca_index["log"].read_text(errors="replace")
    args = ca_index["args"].read_text(errors="replace")
    # Positive controls: the install step is in the history; the wrapper saw this build.
    assert "uv pip install" in history
    assert " RUN " in log and "uv pip install" in log, log[-2000:]
    assert "io.gpuenv.spec-hash=" in args
    places = {"history": history, "config": config, "build log": log, "build command": args,
              "gpuenv's output": ca_build["output"]}  # fmt: skip
    for where, text in places.items():
        assert [what for what, n in wanted.items() if n in text] == [], where
    assert str(ca_index["bundle"]) not in args + log + history + config


def test_the_context_sent_holds_no_trace_of_the_bundle(ca_build, ca_index):
    sent = cells.context_dir(ca_index["cache"], ca_index["matrix"], CELL)
    files = [p for p in sent.rglob("*") if p.is_file()]
    names = {p.relative_to(sent).as_posix() for p in files}
    # Positive control: this build's context (the probe's wheel, fetched over TLS: a package
    # of the cell's own, so in the packages step's part).
    assert {"Dockerfile", "python-env/requirements.txt", "python-env/uv",
            f"packages/{ca_index['index'].filename}"} <= names, sorted(names)  # fmt: skip
    wanted = ca_index["needles"]
    leaks = {}
    for path in files:
        with path.open("rb") as fh:
            hits = scan(fh, wanted)
        if hits:
            leaks[path.name] = hits
    assert leaks == {}


def test_another_bundle_or_none_rebuilds_nothing(ca_build, ca_index, inspect, tmp_path):
    other_pem, _ = make_ca(tmp_path, f"gpuenv-test-other-{secrets.token_hex(4)}")
    other = tmp_path / "other.pem"
    other.write_bytes(other_pem.read_bytes() + ca_index["bundle"].read_bytes())
    for bundle in (["--ca-bundle", str(other)], []):  # another bundle; none at all
        args = ["-f", str(ca_index["matrix"]), *bundle, "--json"]
        plan = json.loads(gpuenv_cmd("build", *args, "--dry-run", env=ca_index["env"]).stdout)
        assert [(p["action"], p["reasons"]) for p in plan["cells"]] == [("up-to-date", [])]
        proc = gpuenv_cmd("build", *args, env=ca_index["env"])
        (result,) = json.loads(proc.stdout)["results"]
        assert (result["status"], result["image_id"]) == ("cached", ca_build["image_id"])
    inputs = json.loads(inspect(IMAGE)["Config"]["Labels"]["io.gpuenv.inputs"])
    assert "ca" not in inputs, inputs  # the plan's record of inputs names no CA


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
    got = json.loads(in_image(IMAGE, "python", "-c", code).splitlines()[-1])
    assert got["actual"] == got["record"], got
    assert got["actual"] == wheel_record_hash("certifi", got["version"], got["path"])


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
