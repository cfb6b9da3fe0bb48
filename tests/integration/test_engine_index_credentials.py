"""The credential attack of issue 35 (H1, M7, M10), performed against index servers the test
runs on loopback: a private one that requires basic auth (HTTPS, a CA of the test's own),
and a hostile one a matrix adds (support/private_index.py's RecordingIndex), which records
the Authorization header of every request it gets.

- `gpuenv build`, the CI case: the index credentials are the runner's secrets
  (GPUENV_INDEX_USERNAME/PASSWORD, bound to the private index's origin by
  GPUENV_INDEX_ORIGIN), the matrix comes from the branch under test and lists the
  attacker's https index beside the private one; the private index also redirects a page
  to the attacker. Before the fix, gpuenv gave the pair to every index the matrix listed.
- `gpuenv lock`: the same pair, netrc credentials for the host (`machine 127.0.0.1`, any
  port and scheme before the fix, and uv read netrc itself), the attacker a plain-http
  index on another port of that host, and the CA only in the matrix's build.ca_bundle.
  Before the fix, lock used neither the bundle nor the pair (M10), and uv sent the netrc
  credentials to the attacker in cleartext (M7).

Each time the private index must get its credentials (the positive control: the attack
was tried with credentials in play) and the attacker none, in any request.

And a matrix's package with a source distribution only: `lock` used to build it (uv reads
an sdist's metadata by building it), running its setup.py on this machine with the
environment's secrets; now uv resolves with --no-build.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from support import cells
from support.cells import test_repository
from support.cli import clean_env, gpuenv_cmd, output
from support.engine import inspect
from support.private_index import (
    JSON_TYPE,
    PACKAGE,
    PASSWORD,
    USER,
    VERSION,
    PrivateIndex,
    RecordingIndex,
    basic,
    serve,
)

pytestmark = pytest.mark.engine

REPOSITORY = test_repository("creds")
IMAGE = f"{REPOSITORY}:{cells.CPU_CELL}"
NETRC_USER, NETRC_PASSWORD = "netrc-user", "netrc-password-for-the-host"


def project(tmp: Path, indexes: list[str], **build: Any) -> Path:
    doc = json.loads(cells.matrix_text(name=REPOSITORY, variants=("cpu",)))
    doc["packages"]["pip"] = [f"{PACKAGE}=={VERSION}"]
    doc["build"] = {"extra_index_urls": indexes, **build}
    matrix = tmp / "matrix.yaml"
    matrix.write_text(json.dumps(doc, indent=2))
    return matrix


def environment(tmp: Path, private: PrivateIndex, **extra: str) -> dict[str, str]:
    """The runner's: its secrets bound to the private index, its own (empty) cache; the
    CA bundle and netrc only where a test gives them."""
    env = clean_env(**{
        "XDG_CACHE_HOME": str(tmp / "cache"), "NETRC": str(tmp / "no-netrc"),
        "GPUENV_INDEX_USERNAME": USER, "GPUENV_INDEX_PASSWORD": PASSWORD,
        "GPUENV_INDEX_ORIGIN": private.origin, **extra,
    })  # fmt: skip
    for name in ("no_proxy", "NO_PROXY"):  # the indexes are on this machine's loopback
        env[name] = ",".join(filter(None, (env.get(name), "127.0.0.1")))
    return env


def sent_to_attacker(attacker: RecordingIndex) -> list[tuple[str, str | None]]:
    return [(path, auth) for path, auth in attacker.seen if auth is not None]


def test_a_build_sends_the_index_secrets_to_their_origin_only(tmp_path):
    with (
        PrivateIndex(tmp_path) as private,
        RecordingIndex(private.tls, codes={"/simple/uv/": 503}) as attacker,
    ):
        # A page of the private index moved to the attacker's host: the redirect is followed
        # (404 there), then the attacker's own index is asked (503: the build ends there).
        moved = attacker.url.replace("/simple/", "/moved/uv/")
        private.redirects["/simple/uv/"] = moved
        matrix = project(tmp_path, [private.url, attacker.url])
        env = environment(tmp_path, private, GPUENV_CA_BUNDLE=str(private.bundle))
        proc = gpuenv_cmd("build", "-f", str(matrix), env=env, check=False)
    assert proc.returncode == 1, output(proc)
    # The attack ran: the private index got the secrets, the attacker was asked directly
    # and after the redirect, and its refusal is the build's one error.
    assert ("/simple/uv/", basic(USER, PASSWORD)) in private.authorizations
    assert {"/moved/uv/", "/simple/uv/"} <= {path for path, _ in attacker.seen}, attacker.seen
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "503" in errors[0], output(proc)
    assert sent_to_attacker(attacker) == []
    assert PASSWORD not in proc.stdout + proc.stderr
    assert inspect(IMAGE) is None


def test_lock_resolves_with_the_builds_ca_and_secrets_and_gives_them_to_no_one_else(tmp_path):
    with PrivateIndex(tmp_path) as private, RecordingIndex(None) as attacker:
        assert attacker.url.startswith("http://127.0.0.1:")  # plain http, another port
        # uv asks the extra indexes in order for each project: the private one redirects
        # one of TensorFlow's dependencies to the attacker's host as well.
        private.redirects["/simple/numpy/"] = attacker.url.replace("/simple/", "/moved/numpy/")
        bundle = tmp_path / "ca-bundle.pem"  # only here: the matrix's build.ca_bundle
        bundle.write_bytes(private.bundle.read_bytes())
        matrix = project(tmp_path, [private.url, attacker.url], ca_bundle=bundle.name)
        netrc = tmp_path / "netrc"  # the host's: in the old rules, any port and scheme
        netrc.write_text(f"machine 127.0.0.1 login {NETRC_USER} password {NETRC_PASSWORD}\n")
        netrc.chmod(0o600)
        env = environment(tmp_path, private, NETRC=str(netrc))
        for name in ("PIP_CERT", "GPUENV_CA_BUNDLE", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
            env.pop(name, None)  # the bundle is the matrix's, nothing else
        proc = gpuenv_cmd("lock", "-f", str(matrix), env=env, check=False)
    assert proc.returncode == 0, output(proc)
    lock = (tmp_path / "matrix.lock").read_text()
    assert f"{PACKAGE}=={VERSION}" in lock and private.sha in lock
    assert (f"/simple/{PACKAGE}/", basic(USER, PASSWORD)) in private.authorizations
    assert attacker.seen, "uv never asked the attacker's index: the attack was not tried"
    assert sent_to_attacker(attacker) == []
    netrc_pair = basic(NETRC_USER, NETRC_PASSWORD)
    assert all(auth != netrc_pair for _, auth in private.authorizations)  # bound to :443
    assert PASSWORD not in proc.stdout + proc.stderr


# What the sdist's setup.py checks of the sandbox it runs in (issue 44, N9).
SANDBOX_CHECK = """import os
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
seen = {'uid': os.getuid(), 'CapEff': status['CapEff'].strip(),
        'NoNewPrivs': status['NoNewPrivs'].strip()}
def limit(*names):  # cgroup v2, then v1; unlimited: max (or v1's 2**63 rounded to pages)
    found = [n for n in names if os.path.exists('/sys/fs/cgroup/' + n)]
    text = open('/sys/fs/cgroup/' + found[0]).read().strip() if found else 'max'
    return None if text == 'max' or int(text) >= 1 << 62 else int(text)
seen['pids'] = limit('pids.max', 'pids/pids.max')
seen['memory'] = limit('memory.max', 'memory/memory.limit_in_bytes')
if seen['uid'] == 0 or int(seen['CapEff'], 16) or seen['NoNewPrivs'] != '1' or None in (
        seen['pids'], seen['memory']):
    raise SystemExit('the sandbox is not confined: ' + repr(seen))
"""


def test_lock_never_builds_a_source_distribution_on_this_machine(tmp_path):
    """A matrix naming a package with a source distribution only: uv pip compile used to
    build it to read its metadata, running its setup.py here, as the user, with the
    environment's secrets (the CI runner's). Now it is built in a network-less container
    of the cell's base on the engine (gpuenv/building/sdists.py): the lock holds the sdist's
    hash, and its setup.py, which writes a file, wrote none here.

    And the sandbox holds the package's code (issue 44, N9): its setup.py fails the build
    unless it runs as a user other than root, with no capability, no-new-privileges and a
    pids and memory limit (read from /proc/self/status and the container's cgroup)."""
    ran = tmp_path / "setup.py-ran"
    name = "gpuenv-sdist-probe"
    sdist = io.BytesIO()
    with tarfile.open(fileobj=sdist, mode="w:gz") as tar:
        for member, text in {
            "setup.py": f"import pathlib\np = pathlib.Path({str(ran)!r})\n"
            "p.parent.mkdir(parents=True, exist_ok=True)\np.write_text('ran')\n"
            f"{SANDBOX_CHECK}from setuptools import setup\nsetup(name={name!r}, version='1.0')\n",
            "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"gpuenv_sdist_probe-1.0/{member}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    filename, body = "gpuenv_sdist_probe-1.0.tar.gz", sdist.getvalue()
    page = json.dumps({  # with an upload time, which lock's --exclude-newer needs
        "meta": {"api-version": "1.1"}, "name": name, "versions": ["1.0"],
        "files": [{"filename": filename, "url": f"/files/{filename}",
                   "hashes": {"sha256": hashlib.sha256(body).hexdigest()},
                   "upload-time": "2026-01-01T00:00:00.000000Z"}],
    })  # fmt: skip
    with StaticIndex({f"/simple/{name}/": page.encode(), f"/files/{filename}": body}) as index:
        doc = json.loads(cells.matrix_text(name=REPOSITORY, variants=("cpu",)))
        doc["packages"]["pip"] = [f"{name}==1.0"]
        doc["build"] = {"extra_index_urls": [index.url]}  # PyPI after it: setuptools is there
        (tmp_path / "matrix.yaml").write_text(json.dumps(doc, indent=2))
        env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
        for var in ("no_proxy", "NO_PROXY"):
            env[var] = ",".join(filter(None, (env.get(var), "127.0.0.1")))
        proc = gpuenv_cmd("lock", "-f", str(tmp_path / "matrix.yaml"), env=env, check=False)
    assert f"/simple/{name}/" in index.asked  # uv found it there (and PyPI has setuptools)
    assert not ran.exists(), "the source distribution's setup.py ran on this machine"
    assert proc.returncode == 0, output(proc)
    assert f"{filename}: built into" in proc.stderr, output(proc)
    lock = (tmp_path / "matrix.lock").read_text()
    assert f"{name}==1.0" in lock and hashlib.sha256(body).hexdigest() in lock


class StaticIndex:
    """Fixed answers by path on http://127.0.0.1:<free port> (404 for the rest); pages are
    PEP 691 JSON."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.asked: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.answer(send_body=False)

            def do_GET(self) -> None:
                self.answer(send_body=True)

            def answer(self, send_body: bool) -> None:
                index.asked.append(self.path)
                body = answers.get(self.path)
                self.send_response(404 if body is None else 200)
                kind = JSON_TYPE if self.path.startswith("/simple/") else "application/gzip"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                if send_body and body:
                    self.wfile.write(body)

        self.server, self.url = serve(Handler, None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StaticIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
