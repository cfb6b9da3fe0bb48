"""gpuenv's registry client (gpuenv/registry/client.py) reading an image's labels
(pull.remote_labels), and pull before build deciding on them (pull.pull_matching): a small
registry API v2 served by http.server on loopback, answering manifests, an index, config
blobs and bearer challenges."""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuenv.building import pull
from gpuenv.engine.client import ImageInfo
from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry import client

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX = "application/vnd.oci.image.index.v1+json"
DIGEST = "sha256:" + "d" * 64


class Store:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[str, bytes]] = {}  # tag or digest -> (type, body)
        self.seen: list[str] = []
        self.authorization: dict[str, str] = {}  # path -> the Authorization header it came with
        self.token: str | None = None  # when set, requests need "Bearer <token>"
        self.scheme = "Bearer"  # of the challenge; its realm is this server's /token

    def add_image(self, repo: str, tag: str, labels: dict[str, str], *, index: bool = False,
                  config: bytes | None = None) -> None:  # fmt: skip
        body = config or json.dumps({"config": {"Labels": labels}}).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        self.blobs[f"{repo}@{digest}"] = body
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                               "config": {"digest": digest, "size": len(body)},
                               "layers": []}).encode()  # fmt: skip
        if not index:
            self.manifests[f"{repo}:{tag}"] = (MANIFEST, manifest)
            return
        m_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        self.manifests[f"{repo}:{m_digest}"] = (MANIFEST, manifest)
        entries = [
            {"digest": "sha256:" + "0" * 64, "platform": {"os": "linux", "architecture": "s390x"}},
            {"digest": m_digest, "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": m_digest, "platform": {"os": "linux", "architecture": "arm64"}},
        ]
        self.manifests[f"{repo}:{tag}"] = (INDEX, json.dumps({"manifests": entries}).encode())


def handler_for(store: Store, port_box: list[int]) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            store.seen.append(self.path)
            if self.headers.get("Authorization"):
                store.authorization[self.path] = self.headers["Authorization"]
            if self.path.startswith("/token"):
                return self._send(200, "application/json", b'{"token": "t0k"}')
            if store.token and self.headers.get("Authorization") != f"Bearer {store.token}":
                challenge = (f'{store.scheme} realm="http://127.0.0.1:{port_box[0]}/token",'
                             'service="test",scope="repository:x:pull"')  # fmt: skip
                return self._send(401, "application/json", b"{}", challenge)
            parts = self.path.split("/")  # /v2/<repo...>/manifests|blobs/<ref>
            kind, ref, repo = parts[-2], parts[-1], "/".join(parts[2:-2])
            if kind == "manifests" and f"{repo}:{ref}" in store.manifests:
                media, body = store.manifests[f"{repo}:{ref}"]
                return self._send(200, media, body)
            if kind == "blobs" and f"{repo}@{ref}" in store.blobs:
                return self._send(200, "application/octet-stream", store.blobs[f"{repo}@{ref}"])
            return self._send(404, "application/json", b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')

        def _send(self, code: int, media: str, body: bytes, challenge: str = "") -> None:
            self.send_response(code)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            if challenge:
                self.send_header("WWW-Authenticate", challenge)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def served() -> Iterator[tuple[Store, str]]:
    store, box = Store(), [0]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(store, box))
    box[0] = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield store, f"127.0.0.1:{box[0]}"
    finally:
        server.shutdown()
        server.server_close()


def test_labels_from_a_manifest_and_its_config(served):
    store, host = served
    store.add_image("x/tensorflow", "c1", {"io.gpuenv.spec-hash": "h1", "a": "b"})
    assert pull.remote_labels(f"{host}/x/tensorflow:c1") == {
        "io.gpuenv.spec-hash": "h1", "a": "b"}  # fmt: skip
    assert all("/blobs/" not in p or p.endswith(tuple("0123456789abcdef")) for p in store.seen)


def test_an_index_resolves_to_this_platform(served, monkeypatch):
    store, host = served
    store.add_image("x/tf", "c1", {"io.gpuenv.spec-hash": "h2"}, index=True)
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert pull.remote_labels(f"{host}/x/tf:c1")["io.gpuenv.spec-hash"] == "h2"
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    with pytest.raises(client.RegistryUnreadable, match="no linux/riscv64") as exc:
        pull.remote_labels(f"{host}/x/tf:c1")
    assert exc.value.missing


def test_an_anonymous_bearer_challenge_is_followed(served):
    store, host = served
    store.token = "t0k"
    store.add_image("x/tf", "c1", {"io.gpuenv.spec-hash": "h3"})
    assert pull.remote_labels(f"{host}/x/tf:c1")["io.gpuenv.spec-hash"] == "h3"
    assert any(p.startswith("/token?") and "scope=repository" in p for p in store.seen)


def test_missing_tampered_and_down(served):
    store, host = served
    with pytest.raises(client.RegistryUnreadable) as exc:
        pull.remote_labels(f"{host}/x/tf:nope")
    assert exc.value.missing and not exc.value.down
    store.add_image("x/tf", "bad", {}, config=b"not json")
    with pytest.raises(client.RegistryUnreadable, match="not JSON"):
        pull.remote_labels(f"{host}/x/tf:bad")
    store.add_image("x/tf", "swapped", {"io.gpuenv.spec-hash": "h1"})
    _, manifest = store.manifests["x/tf:swapped"]
    digest = json.loads(manifest)["config"]["digest"]
    forged = json.dumps({"config": {"Labels": {"io.gpuenv.spec-hash": "h9"}}}).encode()
    store.blobs[f"x/tf@{digest}"] = forged
    with pytest.raises(client.RegistryUnreadable, match="does not match its digest"):
        pull.remote_labels(f"{host}/x/tf:swapped")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(client.RegistryUnreadable) as exc:
        pull.remote_labels(f"127.0.0.1:{free}/x/tf:c1")
    assert exc.value.down and not exc.value.missing


def test_a_manifest_over_the_limit_is_refused(served, monkeypatch):
    store, host = served
    store.add_image("x/tf", "c1", {"io.gpuenv.spec-hash": "h1"})
    monkeypatch.setattr(client, "MAX_MANIFEST", 100)
    with pytest.raises(client.RegistryUnreadable, match="larger than 100 bytes"):
        pull.remote_labels(f"{host}/x/tf:c1")


@pytest.fixture
def docker_login(tmp_path, monkeypatch):
    """A home whose ~/.docker/config.json (read by oras-py) and ~/.netrc hold a credential
    for `host`: docker_login(host)."""

    def login(host: str) -> None:
        (tmp_path / ".docker").mkdir()
        auth = base64.b64encode(b"user:secret").decode()
        (tmp_path / ".docker" / "config.json").write_text(
            json.dumps({"auths": {host: {"auth": auth}}})
        )
        (tmp_path / ".netrc").write_text("machine 127.0.0.1 login nuser password nsecret\n")
        (tmp_path / ".netrc").chmod(0o600)
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.delenv("NETRC", raising=False)

    return login


def test_pull_before_build_sends_no_credential(served, docker_login):
    store, host = served
    docker_login(host)
    store.token = "t0k"
    store.add_image("x/tf", "c1", {"io.gpuenv.spec-hash": "h3"})
    assert pull.remote_labels(f"{host}/x/tf:c1")["io.gpuenv.spec-hash"] == "h3"
    assert {v.split()[0] for v in store.authorization.values()} == {"Bearer"}  # no netrc either


def test_docker_credentials_go_to_the_token_service_of_a_bearer_challenge_only(
    served, docker_login
):
    store, host = served
    docker_login(host)
    store.token = "t0k"
    store.add_image("x/tf", "c1", {})
    assert client.Repository(f"{host}/x/tf:c1").manifest("c1") is not None
    token = [v for p, v in store.authorization.items() if p.startswith("/token")]
    assert token == ["Basic " + base64.b64encode(b"user:secret").decode()]
    store.authorization.clear()
    store.scheme = "Basic"  # oras-py alone would send it to the realm of this challenge too
    with pytest.raises(client.RegistryUnreadable, match="needs credentials"):
        client.Repository(f"{host}/x/tf:c1").manifest("c1")
    assert store.authorization == {}


@pytest.mark.parametrize(
    ("ref", "split"),
    [
        ("127.0.0.1:5000/x/tf:c1", ("127.0.0.1:5000", "x/tf", "c1")),
        ("localhost/tf:c1", ("localhost", "tf", "c1")),
        ("ghcr.io/acme/tf:c1", ("ghcr.io", "acme/tf", "c1")),
        ("acme/tf:c1", ("registry-1.docker.io", "acme/tf", "c1")),
        ("python:3.11", ("registry-1.docker.io", "library/python", "3.11")),
        ("docker.io/python", ("registry-1.docker.io", "library/python", "latest")),
        ("127.0.0.1:5000/x/tf", ("127.0.0.1:5000", "x/tf", "latest")),
        (f"127.0.0.1:5000/x/tf:c1@{DIGEST}", ("127.0.0.1:5000", "x/tf", DIGEST)),
    ],
)
def test_references_split_as_docker_reads_them(ref, split):
    assert client.parse_reference(ref) == split


# ------------------------------------------------------------ pull before build decides


def _image(spec: str) -> ImageInfo:
    return ImageInfo(id="sha256:pulled", labels={"io.gpuenv.spec-hash": spec})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the pulled record


def pinned(ref: str):
    """A vet whose verification passed at DIGEST (gpuenv/publish/attest/verify.py's does it)."""
    return lambda r, spec: (f"{ref.rsplit(':', 1)[0]}@{DIGEST}", "sha256:pulled")


def test_another_spec_hash_in_the_registry_is_not_pulled(served, fake_engine):
    store, host = served
    ref = f"{host}/x/tensorflow:c1"
    store.add_image("x/tensorflow", "c1", {"io.gpuenv.spec-hash": "h-old"})
    eng = fake_engine(remote={ref: _image("h-old")})
    image_id, why = pull.pull_matching(eng, ref, "h1", keep_as="acme/tf:c1", vet=pinned(ref))
    assert image_id is None and "another spec hash" in why and "not pulled" in why
    assert eng.pulled == [] and eng.local == {}


def test_the_same_spec_hash_is_pulled(served, fake_engine):
    store, host = served
    ref = f"{host}/x/tensorflow:c1"
    store.add_image("x/tensorflow", "c1", {"io.gpuenv.spec-hash": "h1"})
    at_digest = f"{host}/x/tensorflow@{DIGEST}"
    eng = fake_engine(remote={at_digest: _image("h1")})
    got = pull.pull_matching(eng, ref, "h1", keep_as="acme/tf:c1", vet=pinned(ref))
    assert got == ("sha256:pulled", "")
    assert eng.pulled == [at_digest]


def test_a_missing_tag_or_a_registry_that_is_down_is_not_pulled(served, fake_engine):
    _, host = served
    eng = fake_engine(remote={})
    ref = f"{host}/x/tf:none"
    image_id, why = pull.pull_matching(eng, ref, "h1", keep_as="a/b:c", vet=pinned(ref))
    assert image_id is None and "not found" in why and eng.pulled == []


def test_a_remote_engine_pulls_only_what_verifies(served, fake_engine):
    store, host = served
    ref = f"{host}/x/tensorflow:c1"
    store.add_image("x/tensorflow", "c1", {"io.gpuenv.spec-hash": "h-old"})
    eng = fake_engine(remote={f"{host}/x/tensorflow@{DIGEST}": _image("h-old")})
    eng.is_local = False  # its view of 127.0.0.1 is another host's: the label is not read

    def vet(ref: str, spec: str) -> tuple[str, str]:  # as verify's, on another spec hash
        raise GpuenvError("its provenance records spec hash h-old, not h1")

    image_id, why = pull.pull_matching(eng, ref, "h1", keep_as="acme/tf:c1", vet=vet)
    assert image_id is None and "not adopted" in why and "h-old" in why
    assert eng.pulled == [] and eng.local == {}
