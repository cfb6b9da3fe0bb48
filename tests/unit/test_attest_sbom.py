"""gpuenv/publish/attest/sbom.py: CycloneDX 1.6 / SPDX 2.3 documents from recorded contents.

The contents are what gpuenv.publish.attest.contents read from the shipped CPU image on this
project's machine (tests/unit/recorded/attest-contents-tf2.21-cpu.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from gpuenv.publish.attest import sbom
from gpuenv.publish.attest.contents import Contents

RECORDED = Path(__file__).parent / "recorded" / "attest-contents-tf2.21-cpu.json"
LOCK_TEXT = (
    "numpy==2.3.4 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64 + "\n"
)


def recorded() -> tuple[sbom.Subject, Contents]:
    doc = json.loads(RECORDED.read_text())
    subject = sbom.Subject(
        "gpuenv/tensorflow:tf2.21-py3.11-cpu", doc["image_id"], doc["created"], doc["labels"],
        doc["base_name"], doc["base_id"],
    )  # fmt: skip
    return subject, Contents.from_json(doc)


def test_the_same_image_gives_the_same_bytes_in_either_format():
    subject, contents = recorded()
    for fmt in sbom.FORMATS:
        first = sbom.sbom(subject, contents, {"numpy": ["a" * 64]}, fmt)
        # The same contents listed in another order: still the same document.
        shuffled = Contents(tuple(reversed(contents.python)), tuple(reversed(contents.debian)))
        again = sbom.sbom(subject, Contents.from_json(shuffled.to_json()), {"numpy": ["a" * 64]},
                          fmt)  # fmt: skip
        assert first == again, fmt
        other = sbom.Subject(subject.name, "sha256:" + "0" * 64, subject.created)
        assert sbom.sbom(other, contents, None, fmt) != first, fmt


def test_cyclonedx_validates_against_the_1_6_schema_and_lists_everything():
    subject, contents = recorded()
    data = sbom.sbom(subject, contents, sbom.lock_hashes([LOCK_TEXT]))
    # The schema cyclonedx-python-lib ships (bom-1.6.SNAPSHOT.schema.json), strict mode.
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode()) is None
    doc = json.loads(data)
    assert doc["specVersion"] == "1.6"
    purls = {c.get("purl") for c in doc["components"]}
    for name, version in contents.python:
        assert sbom.pypi_purl(name, version) in purls
    for name, version, arch in contents.debian:
        assert sbom.deb_purl(name, version, arch) in purls
    assert len(purls - {None}) == len(contents.python) + len(contents.debian)
    numpy = next(c for c in doc["components"] if c["name"].lower() == "numpy")
    assert [h["content"] for h in numpy["hashes"]] == ["a" * 64, "b" * 64]
    base = next(c for c in doc["components"] if c["type"] == "container")
    assert (base["name"], base["version"]) == (subject.base_name, subject.base_id)
    assert doc["metadata"]["component"]["version"] == subject.image_id
    assert doc["metadata"]["timestamp"].startswith(subject.created[:19])
    assert doc["serialNumber"] == f"urn:uuid:{sbom.serial(subject.image_id)}"


def test_the_schema_check_catches_a_broken_document():
    subject, contents = recorded()
    doc = json.loads(sbom.sbom(subject, contents))
    doc["components"][0]["type"] = "wheel"  # not a CycloneDX component type
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc)) is not None


def test_spdx_2_3_names_every_package_by_purl():
    subject, contents = recorded()
    doc = json.loads(sbom.sbom(subject, contents, {"numpy": ["a" * 64]}, "spdx"))
    assert doc["spdxVersion"] == "SPDX-2.3"
    purls = {r["referenceLocator"] for p in doc["packages"] for r in p.get("externalRefs", [])}
    assert len(purls) == len(contents.python) + len(contents.debian)
    assert any(r["relationshipType"] == "DESCENDANT_OF" for r in doc["relationships"])


@pytest.mark.parametrize(
    ("created", "expected"),
    [
        ("2026-11-24T07:19:21.819282296Z", "2026-11-24T07:19:21+00:00"),
        ("2025-01-01T00:00:00Z", "2025-01-01T00:00:00+00:00"),
        ("2025-01-01T02:00:00+02:00", "2025-01-01T00:00:00+00:00"),
        ("garbage", "1970-01-01T00:00:00+00:00"),
    ],
)
def test_the_timestamp_is_the_images_own(created, expected):
    assert sbom.created_at(created).isoformat() == expected


def test_purls_follow_the_spec():
    assert sbom.pypi_purl("Typing_Extensions", "4.1") == "pkg:pypi/typing-extensions@4.1"
    assert sbom.deb_purl("libc6", "2.36-9+deb12u1", "amd64") == (
        "pkg:deb/debian/libc6@2.36-9%2Bdeb12u1?arch=amd64"
    )
