"""`gpuenv slurm run --from-registry REGISTRY/REPO@sha256:... --key PUB.pem` on a login node
without a Docker engine (issue 46, item 2): the Slurm lab (support/slurm_cluster.py) runs a
job in the SquashFS gpuenv made from the loopback registry's layers (push_fixtures.py's
`registry`), after the image's attestations verified; an unsigned image, another key and a
tampered layer blob are each refused in one line, with nothing written.

The engine is hidden from every gpuenv started here (DOCKER_HOST names a socket that does not
exist): the path never asks one. The image is the smallest that proves it, the base plus one
file, ENV and the spec-hash label (`docker commit`, no build); it is pushed with `docker push`
and signed by gpuenv's own signing code (publish/attest/attach.py's attest_pushed, as
`gpuenv push --attest` calls it), in this process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support.cells import BASE_IMAGE, test_repository
from support.cli import GPUENV, output
from support.engine import SESSION_LABEL, docker
from support.slurm_cluster import SlurmCluster, slurm_cluster

pytest.register_assert_rewrite("push_fixtures")
pytest_plugins = ["push_fixtures"]
pytestmark = pytest.mark.engine

NO_ENGINE = "unix:///nonexistent/gpuenv-test/docker.sock"
SPEC_HASH = "5" * 64
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def write_key(path: Path) -> Path:
    """A P-256 key pair: PATH (private, PKCS#8) and PATH.pub."""
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return path


@dataclass
class Published:
    signed: str  # REGISTRY/REPO@sha256:... with attestations
    unsigned: str  # another image in the same repository, without
    key: Path  # the publisher's public key
    other_key: Path
    storage: Path  # the registry's blob store, to tamper with
    probe_layer: str  # the digest of the layer holding /gpuenv-probe


def _commit(ref: str, tmp: Path, text: str) -> None:
    from gpuenv.matrix import contract

    probe = tmp / "gpuenv-probe"
    probe.write_text(text)
    cid = docker("create", "--label", SESSION_LABEL, "--network", "none", BASE_IMAGE,
                 "true").stdout.strip()  # fmt: skip
    try:
        docker("cp", str(probe), f"{cid}:/gpuenv-probe")
        docker("commit", "--change", "ENV GPUENV_PROBE=from-the-registry", "--change",
               f"LABEL {contract.SPEC_HASH}={SPEC_HASH}", cid, ref)  # fmt: skip
    finally:
        docker("rm", "-f", cid, check=False)


def _push(registry, ref: str, tag: str) -> str:
    docker("push", ref, timeout=300)
    return str(registry.manifest_digest(ref.split("/", 1)[1].rsplit(":", 1)[0], tag))


@pytest.fixture(scope="module")
def published(registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    from gpuenv.engine.client import connect
    from gpuenv.publish.attest import dsse
    from gpuenv.publish.attest.attach import attest_pushed

    tmp = tmp_path_factory.mktemp("published")
    repo = f"{registry.host}/{test_repository('slurm-registry')}"
    signed_tag, unsigned_tag = f"{repo}:signed", f"{repo}:unsigned"
    try:
        _commit(signed_tag, tmp, "inside the image\n")
        _commit(unsigned_tag, tmp, "never run\n")
        digest = _push(registry, signed_tag, "signed")
        unsigned = _push(registry, unsigned_tag, "unsigned")
        key, other = write_key(tmp / "signer.pem"), write_key(tmp / "other.pem")
        # gpuenv push --attest's own call, for a project with no lock (an image, no cell).
        project = SimpleNamespace(lock=None, path=tmp / "gpuenv.yaml", lock_path=tmp / "lock")
        pushed = SimpleNamespace(ref=signed_tag, status="pushed", digest=digest, platforms=[])
        engine = connect()
        try:
            attest_pushed(engine, project, [pushed], dsse.load_signer(key))  # type: ignore[arg-type]
        finally:
            engine.close()
        layers = _layers(registry, repo.split("/", 1)[1], digest)
        yield Published(f"{repo}@{digest}", f"{repo}@{unsigned}", key.with_suffix(".pub"),
                        other.with_suffix(".pub"), _storage(registry.pid), layers[-1])  # fmt: skip
    finally:
        docker("rmi", signed_tag, unsigned_tag, check=False)


def _layers(registry, name: str, digest: str) -> list[str]:
    import json
    import urllib.request

    req = urllib.request.Request(registry.url(f"/v2/{name}/manifests/{digest}"),
                                 headers={"Accept": MANIFEST_V2})  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        return [str(layer["digest"]) for layer in json.load(resp)["layers"]]


def _storage(pid: int) -> Path:
    """The registry's storage directory, beside the config it was started with."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(argv[argv.index(b"serve") + 1].decode()).parent / "storage"


@pytest.fixture(scope="module")
def lab() -> Iterator[SlurmCluster]:
    with slurm_cluster() as cluster:
        yield cluster


def slurm_run(lab: SlurmCluster, tmp: Path, ref: str, key: Path,
              *args: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """gpuenv slurm run --from-registry REF --key KEY ... ARGS (options, then -- and the
    command where ARGS hold none)."""
    (tmp / "work").mkdir(exist_ok=True)
    (tmp / "shared").mkdir(exist_ok=True)
    options = list(args[: args.index("--dry-run") + 1]) if "--dry-run" in args else []
    command = args[len(options) :]
    argv = [*GPUENV, "slurm", "run", "--from-registry", ref, "--key", str(key),
            "--shared", str(tmp / "shared"), "--time", "5", *options, "--", *command]  # fmt: skip
    env = lab.env(DOCKER_HOST=NO_ENGINE, TMPDIR=str(tmp), XDG_CACHE_HOME=str(tmp / "cache"))
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          cwd=tmp / "work", env=env)  # fmt: skip


def written(tmp: Path) -> list[str]:
    images = tmp / "shared" / f"gpuenv-{os.getuid()}" / "images"
    return sorted(p.name for p in images.iterdir()) if images.is_dir() else []


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 125 and len(errors) == 1, output(proc)
    assert "Traceback" not in proc.stderr, output(proc)
    return errors[0]


def test_a_signed_image_runs_from_the_registry_with_no_engine(lab, published, tmp_path):
    proc = slurm_run(lab, tmp_path, published.signed, published.key, "bash", "-c",
                     'echo "$(cat /gpuenv-probe) env=$GPUENV_PROBE"')  # fmt: skip
    assert proc.returncode == 0, output(proc)
    assert proc.stdout == "inside the image env=from-the-registry\n", output(proc)
    assert f"verified {published.signed}" in proc.stderr, output(proc)
    assert f"spec hash {SPEC_HASH[:12]}" in proc.stderr, output(proc)
    digest = published.signed.rsplit("@sha256:", 1)[1]
    assert written(tmp_path) == [f"{digest}.env", f"{digest}.sh.env", f"{digest}.sqfs"]
    # A second run verifies again and reuses the SquashFS.
    again = slurm_run(lab, tmp_path, published.signed, published.key, "true")
    assert again.returncode == 0 and "reusing" in again.stderr, output(again)
    assert f"verified {published.signed}" in again.stderr, output(again)


def test_unsigned_and_another_key_are_refused_in_one_line(lab, published, tmp_path):
    line = one_error_line(slurm_run(lab, tmp_path, published.unsigned, published.key, "true"))
    assert "no attestations" in line, line
    line = one_error_line(slurm_run(lab, tmp_path, published.signed, published.other_key,
                                    "true"))  # fmt: skip
    assert "none of 2 attestation(s) verifies" in line, line
    assert written(tmp_path) == []


def test_a_tampered_layer_is_refused_with_nothing_written(lab, published, tmp_path):
    hexdigest = published.probe_layer.removeprefix("sha256:")
    blob = published.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest
    data = (blob / "data").read_bytes()
    middle = len(data) // 2
    (blob / "data").write_bytes(data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1 :])
    try:
        proc = slurm_run(lab, tmp_path, published.signed, published.key, "true")
    finally:
        (blob / "data").write_bytes(data)
    line = one_error_line(proc)
    assert f"({published.probe_layer[:19]}) is not the blob its manifest names" in line, line
    assert written(tmp_path) == []
    own = tmp_path / "shared" / f"gpuenv-{os.getuid()}"
    assert not [p for p in own.iterdir() if p.name.startswith(".layers-")]


def test_the_runtimes_that_pull_get_the_reference_once_verified(lab, published, tmp_path):
    """pyxis, apptainer, podman: the script names the image by digest (sbatch --test-only
    accepts it) and nothing is written; an unsigned image never reaches a script."""
    for runtime, want in (("pyxis", "#"), ("apptainer", "docker://"), ("podman", "run --rm")):
        proc = slurm_run(lab, tmp_path, published.signed, published.key, "--runtime", runtime,
                         "--dry-run", "true")  # fmt: skip
        assert proc.returncode == 0, output(proc)
        host, rest = published.signed.split("/", 1)
        ref = f"{host}#{rest}" if runtime == "pyxis" else published.signed
        assert ref in proc.stdout and want in proc.stdout, output(proc)
        assert "sbatch --test-only: " in proc.stderr, output(proc)
        assert "not available" not in proc.stderr, output(proc)
    line = one_error_line(slurm_run(lab, tmp_path, published.unsigned, published.key,
                                    "--runtime", "pyxis", "--dry-run", "true"))  # fmt: skip
    assert "no attestations" in line, line
    assert written(tmp_path) == []
