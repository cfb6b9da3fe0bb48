"""`gpuenv push --attest --key`, `gpuenv sbom` and `gpuenv verify [--rebuild]` against a real
registry on loopback (Debian's docker-registry 2.8, which has no referrers API: the
attestations go into the OCI 1.1 tag fallback index).

Everything the test checks about what was pushed it reads with a client of its own: plain
HTTP to the registry (urllib), the DSSE pre-authentication encoding written out here and
the signature checked with `cryptography`, the image's contents listed by `docker run`.
The cell is JAX 0.7 on CPU (the smallest locked framework cell), built once --reproducible.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.cells import BASE_IMAGE, BUILD_TIMEOUT, REPO, test_repository
from support.cli import Proc, clean_env, gpuenv_cmd, output, run
from support.engine import docker, run_in_image

pytest.register_assert_rewrite("push_fixtures")
pytest_plugins = ["push_fixtures"]
pytestmark = pytest.mark.engine

NAME = test_repository("attest")
CELL = "jax0.7-py3.11-cpu"
IMAGE = f"{NAME}:{CELL}"
MATRIX = f"""\
name: {NAME}
matrix:
  jax: ["0.7"]
  python: ["3.11"]
  variant: [cpu]
default: {{jax: "0.7", python: "3.11"}}
bases:
  "3.11": {{debian: bookworm}}
"""
INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
SLSA = "https://slsa.dev/provenance/v1"
CDX = "https://cyclonedx.org/bom"


# --------------------------------------------------------------------------- the test's own client


def http(url: str, *, method: str = "GET", data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:  # fmt: skip
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def put_blob(base: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    status, _, headers = http(f"{base}/blobs/uploads/", method="POST")
    assert status == 202, status
    location = headers["Location"]
    url = location if location.startswith("http") else base.split("/v2/")[0] + location
    sep = "&" if "?" in url else "?"
    status, body, _ = http(f"{url}{sep}digest={digest}", method="PUT", data=data,
                           headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    assert status == 201, body
    return digest


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding (protocol.md), what the signature covers."""
    t = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(t), t, len(payload), payload)


def signature_verifies(envelope: dict[str, Any], public_pem: Path) -> bool:
    key = serialization.load_pem_public_key(public_pem.read_bytes())
    payload = base64.b64decode(envelope["payload"])
    for sig in envelope["signatures"]:
        try:
            key.verify(base64.b64decode(sig["sig"]), pae(envelope["payloadType"], payload),
                       ec.ECDSA(hashes.SHA256()))  # fmt: skip
            return True
        except Exception:
            continue
    return False


@dataclass
class Artifact:
    digest: str
    manifest: dict[str, Any]
    envelope: dict[str, Any]
    statement: dict[str, Any]


def read_attestations(base: str, subject: str) -> list[Artifact]:
    """The fallback index `sha256-<hex>` and every artifact it lists, digests checked."""
    status, _, _ = http(f"{base}/referrers/{subject}", headers={"Accept": INDEX})
    assert status == 404  # distribution 2.8: no referrers API, so the fallback tag
    status, raw, _ = http(f"{base}/manifests/{subject.replace(':', '-')}",
                          headers={"Accept": INDEX})  # fmt: skip
    assert status == 200, raw
    index = json.loads(raw)
    assert index["mediaType"] == INDEX
    out = []
    for entry in index["manifests"]:
        status, raw, _ = http(f"{base}/manifests/{entry['digest']}",
                              headers={"Accept": OCI_MANIFEST})  # fmt: skip
        assert status == 200
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == entry["digest"]
        manifest = json.loads(raw)
        (layer,) = manifest["layers"]
        status, blob, _ = http(f"{base}/blobs/{layer['digest']}")
        assert status == 200 and "sha256:" + hashlib.sha256(blob).hexdigest() == layer["digest"]
        envelope = json.loads(blob)
        statement = json.loads(base64.b64decode(envelope["payload"]))
        out.append(Artifact(entry["digest"], manifest, envelope, statement))
    return out


# --------------------------------------------------------------------------- fixtures


def write_key(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    public = path.with_suffix(".pub")
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return path


@dataclass
class Pushed:
    root: Path
    env: dict[str, str]
    image_id: str
    ref: str  # REGISTRY/team/attest:CELL
    digest: str
    base: str  # the registry repository's API base
    key: Path
    other_key: Path

    def gpuenv(self, *args: str, check: bool = False) -> Proc:
        return gpuenv_cmd(*args, cwd=self.root, env=self.env, check=check)


@pytest.fixture(scope="module")
def pushed(registry, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("attest")
    (root / "matrix.yaml").write_text(MATRIX)
    env = clean_env(XDG_CACHE_HOME=str(root / "cache"))
    gpuenv_cmd("lock", "--exclude-newer", "2026-11-20", cwd=root, env=env)
    built = gpuenv_cmd("build", "--reproducible", "--json", CELL, cwd=root, env=env)
    image_id = json.loads(built.stdout)["results"][0]["image_id"]
    key, other = write_key(root / "signer.pem"), write_key(root / "other.pem")
    try:
        proc = gpuenv_cmd("push", CELL, "--registry", f"{registry.host}/team", "--attest",
                          "--key", str(key), "--json", cwd=root, env=env)  # fmt: skip
        (result,) = json.loads(proc.stdout)["results"]
        assert result["status"] == "pushed", output(proc)
        yield Pushed(root, env, image_id, result["ref"], result["digest"],
                     registry.url("/v2/team/attest"), key, other)  # fmt: skip
    finally:
        docker("rmi", IMAGE, check=False)


# --------------------------------------------------------------------------- tests


def test_every_attestation_is_signed_and_names_the_pushed_digest(pushed):
    artifacts = read_attestations(pushed.base, pushed.digest)
    assert {a.statement["predicateType"] for a in artifacts} == {CDX, SLSA}
    for a in artifacts:
        assert a.manifest["subject"]["digest"] == pushed.digest
        assert a.manifest["artifactType"] == "application/vnd.in-toto+json"
        assert a.envelope["payloadType"] == "application/vnd.in-toto+json"
        assert signature_verifies(a.envelope, pushed.key.with_suffix(".pub"))
        assert not signature_verifies(a.envelope, pushed.other_key.with_suffix(".pub"))
        assert a.statement["_type"] == "https://in-toto.io/Statement/v1"
        assert [s["digest"]["sha256"] for s in a.statement["subject"]] == [pushed.digest[7:]]
    (prov,) = [a.statement["predicate"] for a in artifacts if a.statement["predicateType"] == SLSA]
    ext = prov["buildDefinition"]["externalParameters"]
    assert ext["cell"] == CELL and ext["reproducible"] is True
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert ext["matrix"]["digest"]["sha256"] == sha(pushed.root / "matrix.yaml")
    assert ext["lock"]["digest"]["sha256"] == sha(pushed.root / "matrix.lock")
    labels = json.loads(docker("image", "inspect", pushed.image_id).stdout)[0]["Config"]["Labels"]
    assert (
        prov["buildDefinition"]["internalParameters"]["specHash"] == (labels["io.gpuenv.spec-hash"])
    )
    deps = prov["buildDefinition"]["resolvedDependencies"]
    base = next(d for d in deps if d.get("name") == "base")
    base_id = docker("image", "inspect", "-f", "{{.Id}}", BASE_IMAGE).stdout.strip()
    assert "sha256:" + base["digest"]["sha256"] == base_id
    assert prov["runDetails"]["byproducts"][0]["digest"]["sha256"] == pushed.image_id[7:]
    assert prov["runDetails"]["builder"]["version"]["gpuenv"]


def test_the_sbom_names_exactly_what_the_image_holds(pushed):
    # Imported here, not at the top: jsonschema's import compiles ~40 grammars (a second), and
    # tests/unit/test_proven.py collects this module.
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    artifacts = read_attestations(pushed.base, pushed.digest)
    (doc,) = [a.statement["predicate"] for a in artifacts if a.statement["predicateType"] == CDX]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc)) is None
    listing = run_in_image(IMAGE, "python", "-c", (
        "import importlib.metadata as m, json, subprocess\n"
        "print(json.dumps({'py': [[d.metadata['Name'], d.version] for d in m.distributions()],"
        " 'deb': subprocess.run(['dpkg-query', '-W', '-f', '${Package} ${Version} "
        "${Architecture}\\n'], capture_output=True, text=True).stdout.split('\\n')}))"
    ))  # fmt: skip
    found = json.loads(listing)
    want_py = {(n, v) for n, v in found["py"]}
    want_deb = {tuple(line.split(" ")) for line in found["deb"] if line}
    comps = doc["components"]
    got_py = {(c["name"], c["version"]) for c in comps if c.get("purl", "").startswith("pkg:pypi/")}
    got_deb = {(c["name"], c["version"], c["purl"].rsplit("arch=", 1)[1])
               for c in comps if c.get("purl", "").startswith("pkg:deb/")}  # fmt: skip
    assert got_py == want_py and got_deb == want_deb
    assert len(want_py) > 5 and len(want_deb) > 50
    # The lock's hashes ride along, and `gpuenv sbom` gives the same document every time.
    assert any(c.get("hashes") for c in comps if c["name"] == "jax")
    first = pushed.gpuenv("sbom", CELL, check=True).stdout
    assert first == pushed.gpuenv("sbom", CELL, check=True).stdout
    local = json.loads(first)  # names the local image, where the attestation names the pushed
    assert (local["components"], local["serialNumber"]) == (doc["components"], doc["serialNumber"])


def test_verify_passes_with_the_right_key(pushed):
    proc = pushed.gpuenv("verify", pushed.ref, "--key", str(pushed.key.with_suffix(".pub")))
    assert proc.returncode == 0, output(proc)
    assert f"verified {SLSA}" in proc.stdout and f"verified {CDX}" in proc.stdout
    assert f"cell {CELL}" in proc.stdout


def one_error_line(proc: Proc) -> str:
    assert proc.returncode == 1, output(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_verify_fails_with_another_key(pushed):
    proc = pushed.gpuenv("verify", pushed.ref, "--key", str(pushed.other_key.with_suffix(".pub")))
    assert "none of 2 attestation(s) verifies" in one_error_line(proc)


def test_verify_fails_on_an_image_without_attestations(pushed, registry):
    plain = f"{registry.host}/team/plain:base"  # the session janitor removes the tag
    docker("tag", BASE_IMAGE, plain)
    docker("push", plain, timeout=300)
    proc = pushed.gpuenv("verify", plain, "--key", str(pushed.key.with_suffix(".pub")))
    assert "no attestations" in one_error_line(proc)


def test_verify_rebuild_names_the_layer_and_file_a_perturbed_step_changed(pushed, tmp_path):
    """Issue 43: a gpuenv whose first install step writes one more file (a copy of this one,
    its template changed) cannot reproduce the image; verify --rebuild names the layer, the
    file, and that the recipe differs. The published image is not in the engine (removed
    here), so verify pulls it by digest to compare, and removes it after. The next test's
    honest rebuild puts the cell's tag back."""
    copy = tmp_path / "perturbed"
    shutil.copytree(REPO / "gpuenv", copy / "gpuenv",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copytree(REPO / "images", copy / "gpuenv" / "images")  # where a wheel carries them
    template = copy / "gpuenv" / "images" / "partials" / "python-env.j2"
    text = template.read_text()
    assert '"rm -f /etc/passwd- ' in text
    template.write_text(text.replace('"rm -f /etc/passwd- ',
                                     '"echo perturbed > /etc/gpuenv-perturbed",\n    '
                                     '"rm -f /etc/passwd- ', 1))  # fmt: skip
    docker("rmi", IMAGE, pushed.ref)
    proc = run([sys.executable, "-m", "gpuenv", "verify", pushed.ref, "--key",
                str(pushed.key.with_suffix(".pub")), "--rebuild"], cwd=pushed.root,
               env={**pushed.env, "PYTHONPATH": str(copy)}, check=False,
               timeout=BUILD_TIMEOUT)  # fmt: skip
    assert proc.returncode == 1, output(proc)
    assert "\n  layer 2 of 3 differs: " in proc.stderr, output(proc)
    assert "\n  etc/gpuenv-perturbed: only in the rebuild\n" in proc.stderr, output(proc)
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --rebuild: not reproduced"), error
    assert "(this one is modified)" in error, error
    assert docker("image", "inspect", pushed.image_id, check=False).returncode != 0


def test_verify_rebuild_reproduces_the_image(pushed):
    proc = pushed.gpuenv("verify", pushed.ref, "--key", str(pushed.key.with_suffix(".pub")),
                         "--rebuild")  # fmt: skip
    assert proc.returncode == 0, output(proc)
    assert f"reproduced: {pushed.image_id}" in proc.stdout


def test_verify_fails_when_one_attestation_is_stripped(pushed):
    """Issue 35, M4b: whoever may write the registry removes the SBOM (or the provenance)
    from the image's fallback index; verify passed with the other one. Restored after."""
    tag = pushed.digest.replace(":", "-")
    _, raw_index, _ = http(f"{pushed.base}/manifests/{tag}", headers={"Accept": INDEX})
    index = json.loads(raw_index)
    sbom = [m for m in index["manifests"]
            if m["digest"] in {a.digest for a in read_attestations(pushed.base, pushed.digest)
                               if a.statement["predicateType"] == CDX}]  # fmt: skip
    assert len(sbom) == 1
    stripped = dict(index, manifests=[m for m in index["manifests"] if m not in sbom])

    def put(doc: dict[str, Any]) -> None:
        status, body, _ = http(f"{pushed.base}/manifests/{tag}", method="PUT",
                               data=json.dumps(doc).encode(),
                               headers={"Content-Type": INDEX})  # fmt: skip
        assert status == 201, body

    put(stripped)
    try:
        proc = pushed.gpuenv("verify", pushed.ref, "--key", str(pushed.key.with_suffix(".pub")))
        assert "no SBOM attestation verifies" in one_error_line(proc)
    finally:
        put(index)


def test_build_pulls_the_signed_image_and_push_attests_it_no_more(pushed, registry):
    """Issue 35, M1: with $GPUENV_VERIFY_KEY, pull before build adopts the published image
    whose provenance verifies and records the spec hash (pulled by that digest), and a later
    `push --attest` signs no provenance of its own for it. The unsigned case:
    tests/integration/test_engine_push.py."""
    env = {**pushed.env, "GPUENV_REGISTRY": f"{registry.host}/team",
           "GPUENV_VERIFY_KEY": str(pushed.key.with_suffix(".pub"))}  # fmt: skip
    docker("rmi", IMAGE)
    proc = gpuenv_cmd("build", CELL, "--json", cwd=pushed.root, env=env)
    (result,) = json.loads(proc.stdout)["results"]
    assert result["status"] == "pulled", output(proc)
    assert result["image_id"] == pushed.image_id
    assert "provenance verified" in proc.stderr
    before = {a.digest for a in read_attestations(pushed.base, pushed.digest)}
    proc = gpuenv_cmd("push", CELL, "--registry", f"{registry.host}/team", "--attest",
                      "--key", str(pushed.key), "--json", cwd=pushed.root, env=env)  # fmt: skip
    (attested,) = json.loads(proc.stdout)["attestations"]
    assert attested["artifacts"] == [] and "pulled from" in attested["not_attested"]
    assert {a.digest for a in read_attestations(pushed.base, pushed.digest)} == before


def test_verify_fails_on_a_tampered_attestation(pushed):
    """Last: it adds a forged artifact to the image's fallback index (the provenance with
    another cell, the original signature kept)."""
    artifacts = read_attestations(pushed.base, pushed.digest)
    (prov,) = [a for a in artifacts if a.statement["predicateType"] == SLSA]
    statement = dict(prov.statement)
    statement["predicate"]["buildDefinition"]["externalParameters"]["cell"] = "forged"
    forged = dict(prov.envelope, payload=base64.b64encode(
        json.dumps(statement).encode()).decode())  # fmt: skip
    layer = json.dumps(forged).encode()
    manifest = dict(prov.manifest)
    manifest["layers"] = [dict(manifest["layers"][0], digest=put_blob(pushed.base, layer),
                               size=len(layer))]  # fmt: skip
    raw = json.dumps(manifest).encode()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    status, body, _ = http(f"{pushed.base}/manifests/{digest}", method="PUT", data=raw,
                           headers={"Content-Type": OCI_MANIFEST})  # fmt: skip
    assert status == 201, body
    tag = pushed.digest.replace(":", "-")
    _, raw_index, _ = http(f"{pushed.base}/manifests/{tag}", headers={"Accept": INDEX})
    index = json.loads(raw_index)
    index["manifests"].append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(raw),
                               "artifactType": manifest["artifactType"]})  # fmt: skip
    status, body, _ = http(f"{pushed.base}/manifests/{tag}", method="PUT",
                           data=json.dumps(index).encode(),
                           headers={"Content-Type": INDEX})  # fmt: skip
    assert status == 201, body
    proc = pushed.gpuenv("verify", pushed.ref, "--key", str(pushed.key.with_suffix(".pub")))
    line = one_error_line(proc)
    assert digest[:19] in line and "no signature verifies" in line, line
