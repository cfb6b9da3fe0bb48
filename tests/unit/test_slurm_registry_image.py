"""`slurm run --from-registry`'s checks before any image is used (gpuenv/run/slurm/
registry_image.py): a key is required, and a verified provenance must name the spec hash
and the very config the registry serves. The registry and the signatures themselves are
real in tests/integration/test_engine_slurm_registry.py; here `verify` and `resolve` are
stood in for, to reach each refusal."""

from __future__ import annotations

import pytest

from gpuenv.matrix.errors import GpuenvError
from gpuenv.publish.attest import verify
from gpuenv.publish.attest.provenance import SLSA_PROVENANCE, Statement
from gpuenv.registry import fetch
from gpuenv.run.slurm import SlurmError, registry_image
from gpuenv.run.slurm.published import PULLING

DIGEST = "sha256:" + "d" * 64
CONFIG = "sha256:" + "c" * 64
REF = f"127.0.0.1:5000/team/probe@{DIGEST}"


def provenance(spec: str, config_hex: str) -> Statement:
    predicate = {
        "buildDefinition": {"externalParameters": {"cell": "probe"},
                            "internalParameters": {"specHash": spec}},
        "runDetails": {"byproducts": [{"name": "image-config",
                                       "digest": {"sha256": config_hex}}]},
    }  # fmt: skip
    return Statement(SLSA_PROVENANCE, [("team/probe", "d" * 64)], predicate)


@pytest.fixture
def registry(monkeypatch):
    image = fetch.Image("127.0.0.1:5000", "team/probe", DIGEST, CONFIG, {}, ())
    monkeypatch.setattr(fetch, "resolve", lambda repo, arch=None: image)
    stated: dict[str, Statement] = {}

    def fake_verify(ref, key):
        assert ref == image.ref
        report = verify.Report(ref, DIGEST, CONFIG, "referrers API")
        report.verified.append(verify.Verified("sha256:" + "e" * 64, stated["provenance"]))
        return report

    monkeypatch.setattr(verify, "verify", fake_verify)
    return stated


def test_no_key_is_refused(monkeypatch):
    monkeypatch.delenv("GPUENV_VERIFY_KEY", raising=False)
    with pytest.raises(SlurmError, match=r"--key PUB.pem or \$GPUENV_VERIFY_KEY"):
        registry_image.key_path(None)


def test_verified_names_cell_and_spec_hash(registry, tmp_path):
    registry["provenance"] = provenance("5" * 64, "c" * 64)
    published = registry_image.verified(REF, tmp_path / "k.pub")
    assert (published.cell, published.spec_hash) == ("probe", "5" * 64)
    assert published.image.ref == REF


def test_a_provenance_without_spec_hash_is_refused(registry, tmp_path):
    registry["provenance"] = provenance("", "c" * 64)
    with pytest.raises(GpuenvError, match="records no spec hash"):
        registry_image.verified(REF, tmp_path / "k.pub")


def test_a_provenance_of_another_config_is_refused(registry, tmp_path):
    registry["provenance"] = provenance("5" * 64, "f" * 64)
    with pytest.raises(GpuenvError, match="records image sha256:ffffffffffff, the registry"):
        registry_image.verified(REF, tmp_path / "k.pub")


def test_a_tag_is_refused_before_the_registry_is_asked(registry, tmp_path):
    with pytest.raises(GpuenvError, match="give the image by digest"):
        registry_image.verified("127.0.0.1:5000/team/probe:latest", tmp_path / "k.pub")


def test_the_config_becomes_what_image_py_writes(tmp_path):
    config = {"architecture": "amd64",
              "config": {"Env": ["PATH=/usr/bin", "A=b c"], "WorkingDir": "/w",
                         "Entrypoint": None, "Cmd": ["bash"]}}  # fmt: skip
    image = fetch.Image("h:1", "r", DIGEST, CONFIG, config, ())
    info = registry_image.Published(image, "cell", "5", tmp_path).info()
    assert (info.id, info.env, info.working_dir, info.entrypoint, info.cmd) == (
        CONFIG, ("PATH=/usr/bin", "A=b c"), "/w", (), ("bash",))  # fmt: skip


def test_charliecloud_alone_takes_the_squashfs():
    assert set(PULLING) == {"pyxis", "apptainer", "podman"}
