"""What binds an attestation to an image, and a pulled image to its attestations (issue 35,
M1 and M4): a registry that serves what a test put there (a stand-in for
gpuenv/publish/attest/oci.Repository, whose HTTP side tests/integration/test_engine_attest.py
covers), real ECDSA keys and real DSSE envelopes.

- `verify` passes only when both statements `push --attest` attaches are there and verify;
  a registry writer removing one used to leave verify passing (M4b).
- `push --attest` inventories the image the pushed manifest names, not whatever the tag
  names by then (M4a), and signs no provenance for an image it pulled (M1).
- pull before build adopts a published image only when its provenance verifies with
  $GPUENV_VERIFY_KEY and records the plan's spec hash (M1): the `vet` it is given.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from test_attest_dsse import write_key

from gpuenv.engine.client import ImageInfo
from gpuenv.matrix.errors import GpuenvError
from gpuenv.publish.attest import attach, contents, dsse, oci, provenance, sbom, verify
from gpuenv.store.cache import write_record

REPO = "127.0.0.1:5000/team/tensorflow"
REF = f"{REPO}:tf2.21-py3.11-cpu"
CONFIG = "sha256:" + "c1" * 32  # the pushed image's ID
OTHER = "sha256:" + "0e" * 32  # another image the tag names by attest time
SPEC = "5p" * 32
SBOM_TYPE = sbom.PREDICATE_TYPES["cyclonedx"]


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


MANIFEST = json.dumps({"config": {"digest": CONFIG}, "layers": []}).encode()
DIGEST = digest_of(MANIFEST)


class Registry:
    """What the registry holds: one image manifest and the attestations referring to it."""

    def __init__(self) -> None:
        self.envelopes: dict[str, bytes] = {}  # attestation digest -> envelope
        self.types: dict[str, str] = {}  # attestation digest -> annotated predicate type

    def add(self, predicate_type: str, envelope: bytes) -> str:
        d = digest_of(envelope)
        self.envelopes[d], self.types[d] = envelope, predicate_type
        return d

    def strip(self, predicate_type: str) -> None:
        for d in [d for d, t in self.types.items() if t == predicate_type]:
            del self.envelopes[d], self.types[d]


@dataclass
class FakeRepository:
    """oci.Repository's reading and attaching, over a Registry."""

    ref: str
    registry: Registry

    def subject(self) -> oci.Descriptor:
        return oci.Descriptor(oci.OCI_MANIFEST, DIGEST, len(MANIFEST))

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        return (MANIFEST, oci.OCI_MANIFEST) if reference in (DIGEST, REF.split(":")[-1]) else None

    def referrers(self, subject: str) -> tuple[list[oci.Descriptor], str]:
        assert subject == DIGEST
        return [oci.Descriptor(oci.OCI_MANIFEST, d, 1, oci.ATTESTATION,
                               ((oci.PREDICATE_ANNOTATION, t),))
                for d, t in self.registry.types.items()], "referrers API"  # fmt: skip

    def envelope(self, d: oci.Descriptor) -> tuple[bytes | None, str]:
        return self.registry.envelopes.get(d.digest), "missing"

    def attach(self, subject: oci.Descriptor, payload: bytes, notes: dict[str, str]) -> str:
        return self.registry.add(notes[oci.PREDICATE_ANNOTATION], payload)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Registry:
    reg = Registry()
    monkeypatch.setattr(oci, "Repository", lambda ref, **kw: FakeRepository(ref, reg))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return reg


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return write_key(tmp_path, "k", ec.generate_private_key(ec.SECP256R1()))


def prov_predicate(spec: str = SPEC, image: str = CONFIG) -> dict[str, Any]:
    config = {"name": "image-config", "digest": {"sha256": image.split(":")[1]}}
    return {"buildDefinition": {"internalParameters": {"specHash": spec}},
            "runDetails": {"byproducts": [config]}}  # fmt: skip


def publish(reg: Registry, private: Path, spec: str = SPEC, image: str = CONFIG) -> None:
    """What `push --attest` attaches: an SBOM and a provenance, signed, naming DIGEST."""
    signer = dsse.load_signer(private)
    for kind, predicate in ((SBOM_TYPE, {"bom": True}),
                            (provenance.SLSA_PROVENANCE, prov_predicate(spec, image))):  # fmt: skip
        body = provenance.statement(REPO, DIGEST, kind, predicate)
        reg.add(kind, dsse.sign(body, signer))


# ------------------------------------------------------------------------- verify (M4b)


def test_verify_passes_with_both_statements(registry, keys):
    publish(registry, keys[0])
    report = verify.verify(REF, keys[1])
    assert {v.statement.predicate_type for v in report.verified} == {
        SBOM_TYPE, provenance.SLSA_PROVENANCE}  # fmt: skip


@pytest.mark.parametrize("stripped", [SBOM_TYPE, provenance.SLSA_PROVENANCE], ids=["sbom", "slsa"])
def test_verify_fails_when_a_registry_writer_strips_one_attestation(registry, keys, stripped):
    publish(registry, keys[0])
    registry.strip(stripped)
    with pytest.raises(GpuenvError, match="SBOM" if stripped == SBOM_TYPE else "provenance"):
        verify.verify(REF, keys[1])


# -------------------------------------------------------------- pull before build's vet (M1)


def vet(monkeypatch: pytest.MonkeyPatch, public: Path) -> Any:
    monkeypatch.setenv(verify.KEY_ENV, str(public))
    found = verify.vetting_from_env()
    assert found is not None
    return found


def test_pulling_is_off_without_a_verify_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(verify.KEY_ENV, raising=False)
    assert verify.vetting_from_env() is None


def test_a_signed_image_is_adopted_by_its_verified_digest(registry, keys, monkeypatch):
    publish(registry, keys[0])
    assert vet(monkeypatch, keys[1])(REF, SPEC) == (f"{REPO}@{DIGEST}", CONFIG)


def test_an_image_with_only_a_label_is_not_adopted(registry, keys, monkeypatch):
    """The attack: whoever can write the tag pushes an image labelled with the (public)
    spec hash, unsigned, or signed with another key."""
    with pytest.raises(GpuenvError, match="no attestations"):
        vet(monkeypatch, keys[1])(REF, SPEC)
    other = write_key(keys[0].parent, "mallory", ec.generate_private_key(ec.SECP256R1()))
    publish(registry, other[0])
    with pytest.raises(GpuenvError, match="verifies with"):
        vet(monkeypatch, keys[1])(REF, SPEC)


def test_a_signed_image_of_another_spec_hash_is_not_adopted(registry, keys, monkeypatch):
    publish(registry, keys[0], spec="ab" * 32)
    with pytest.raises(GpuenvError, match="records spec hash abab"):
        vet(monkeypatch, keys[1])(REF, SPEC)


def test_an_unreadable_verify_key_is_an_error_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv(verify.KEY_ENV, str(tmp_path / "missing.pub"))
    with pytest.raises(GpuenvError, match="GPUENV_VERIFY_KEY"):
        verify.vetting_from_env()


# ---------------------------------------------------------------- push --attest (M4a, M1)


@dataclass
class Pushed:
    ref: str = REF
    status: str = "pushed"
    digest: str | None = DIGEST
    platforms: list[str] | None = None


class Engine:
    """The tag names OTHER now (a concurrent build of the cell); CONFIG is still there."""

    def image(self, ref: str) -> ImageInfo | None:
        known = {REF: OTHER, CONFIG: CONFIG, OTHER: OTHER}
        return ImageInfo(id=known[ref]) if ref in known else None


@pytest.fixture
def inventoried(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The images read_contents was asked for; statements name their image's ID."""
    seen: list[str] = []

    def read(engine: Any, ref: str) -> tuple[ImageInfo, contents.Contents]:
        seen.append(ref)
        info = engine.image(ref)
        return info, contents.Contents((), ())

    def statements(project, info, found, name, digest, fmt):
        return [(SBOM_TYPE, json.dumps({"image": info.id}).encode())]

    monkeypatch.setattr(contents, "read_contents", read)
    monkeypatch.setattr(attach, "statements", statements)
    return seen


def test_attest_inventories_the_pushed_image_not_the_tags(registry, keys, inventoried):
    signer = dsse.load_signer(keys[0])
    (done,) = attach.attest_pushed(Engine(), None, [Pushed()], signer)  # type: ignore[arg-type]
    assert inventoried == [CONFIG]
    (envelope,) = registry.envelopes.values()
    _, payload = dsse.verify(envelope, dsse.load_public(keys[1]))
    assert json.loads(payload) == {"image": CONFIG}
    assert [t for t, _ in done.artifacts] == [SBOM_TYPE]


def test_attest_signs_nothing_for_an_image_it_pulled(registry, keys, inventoried):
    write_record("pulled", {CONFIG: f"{REPO}@{DIGEST}"})
    signer = dsse.load_signer(keys[0])
    (done,) = attach.attest_pushed(Engine(), None, [Pushed()], signer)  # type: ignore[arg-type]
    assert done.artifacts == [] and "pulled from" in done.not_attested
    assert registry.envelopes == {} and inventoried == []
