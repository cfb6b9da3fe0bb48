"""`gpuenv sbom`: an image's software bill of materials, CycloneDX 1.6 JSON (default) or
SPDX 2.3 JSON, built with the formats' own libraries (cyclonedx-python-lib, spdx-tools).

It lists every Python distribution the image's `python` finds (purl `pkg:pypi/NAME@VER`,
with the lock's sha256 hashes when the cell is locked), every Debian package dpkg knows
(`pkg:deb/debian/NAME@VER?arch=ARCH`) and the base image. The same image gives the same
bytes: the serial number and the namespace derive from the image ID, the timestamp is the
image's own `created` (the lock's date under --reproducible), components are sorted.
Purl: https://github.com/package-url/purl-spec (types pypi and deb).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from packaging.utils import canonicalize_name as normalize  # PEP 503's, as purl's pypi asks

from gpuenv import __version__
from gpuenv.publish.attest.contents import Contents

FORMATS = ("cyclonedx", "spdx")
# in-toto predicate types of the two documents (as cosign and in-toto's attestation
# framework name them: https://github.com/in-toto/attestation/tree/main/spec/predicates).
PREDICATE_TYPES = {"cyclonedx": "https://cyclonedx.org/bom", "spdx": "https://spdx.dev/Document"}


@dataclass(frozen=True)
class Subject:
    """The image the SBOM describes, as the engine knows it."""

    name: str  # the reference it was asked for, e.g. gpuenv/tensorflow:tf2.21-py3.11-cpu
    image_id: str  # sha256:<config digest>
    created: str  # the config's `created` (RFC 3339)
    labels: dict[str, str] = field(default_factory=dict)
    base_name: str = ""
    base_id: str = ""


def lock_hashes(requirements_texts: list[str]) -> dict[str, list[str]]:
    """normalised name -> the lock's sha256 hashes (sorted), from a cell's lock entry."""
    from gpuenv.store.wheelhouse import locked_requirements

    out: dict[str, set[str]] = {}
    for text in requirements_texts:
        for req in locked_requirements(text):
            out.setdefault(normalize(req.name), set()).update(req.hashes)
    return {k: sorted(v) for k, v in out.items()}


def created_at(created: str) -> datetime:
    """The image's `created` as a UTC datetime to the second (engines write nanoseconds,
    which fromisoformat reads since Python 3.11); the epoch when it cannot be read."""
    try:
        value = datetime.fromisoformat(created.strip())
    except ValueError:
        return datetime(1970, 1, 1, tzinfo=UTC)
    return value.replace(microsecond=0, tzinfo=value.tzinfo or UTC).astimezone(UTC)


def serial(image_id: str) -> uuid.UUID:
    """A fixed UUID per image (RFC 4122 layout, version 5 bits) from its ID."""
    return uuid.UUID(bytes=hashlib.sha256(image_id.encode()).digest()[:16], version=5)


def pypi_purl(name: str, version: str) -> str:
    from packageurl import PackageURL

    return str(PackageURL(type="pypi", name=normalize(name), version=version))


def deb_purl(name: str, version: str, arch: str) -> str:
    from packageurl import PackageURL

    return str(PackageURL(type="deb", namespace="debian", name=name, version=version,
                          qualifiers={"arch": arch}))  # fmt: skip


def sbom(
    subject: Subject,
    contents: Contents,
    hashes: dict[str, list[str]] | None = None,
    fmt: str = "cyclonedx",
) -> bytes:
    """The document's bytes (UTF-8 JSON, ending in a newline)."""
    if fmt == "spdx":
        return _spdx(subject, contents, hashes or {})
    return _cyclonedx(subject, contents, hashes or {})


def _cyclonedx(subject: Subject, contents: Contents, hashes: dict[str, list[str]]) -> bytes:
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def sha256(values: list[str]) -> list[Any]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in values]

    components = []
    for name, version in contents.python:
        purl = pypi_purl(name, version)
        components.append(Component(
            type=ComponentType.LIBRARY, name=name, version=version, bom_ref=purl,
            purl=PackageURL.from_string(purl), hashes=sha256(hashes.get(normalize(name), [])),
        ))  # fmt: skip
    for name, version, arch in contents.debian:
        purl = deb_purl(name, version, arch)
        components.append(Component(
            type=ComponentType.LIBRARY, name=name, version=version, bom_ref=purl,
            purl=PackageURL.from_string(purl),
        ))  # fmt: skip
    if subject.base_name:
        components.append(Component(
            type=ComponentType.CONTAINER, name=subject.base_name, version=subject.base_id,
            bom_ref=f"base:{subject.base_name}", description="base image",
        ))  # fmt: skip
    tools = ToolRepository(components=[
        Component(type=ComponentType.APPLICATION, name="gpuenv", version=__version__)
    ])  # fmt: skip
    image = Component(
        type=ComponentType.CONTAINER, name=subject.name, version=subject.image_id,
        bom_ref=f"image:{subject.image_id}",
        properties=[Property(name=k, value=v) for k, v in sorted(subject.labels.items())
                    if k.startswith("io.gpuenv.") and v],
    )  # fmt: skip
    bom = Bom(
        components=components,
        serial_number=serial(subject.image_id),
        metadata=BomMetaData(tools=tools, component=image,
                             timestamp=created_at(subject.created)),
    )  # fmt: skip
    # The image contains everything listed: the dependency graph says so.
    bom.register_dependency(image, components)
    return JsonV1Dot6(bom).output_as_string(indent=2).encode() + b"\n"


def _spdx(subject: Subject, contents: Contents, hashes: dict[str, list[str]]) -> bytes:
    import io

    from spdx_tools.spdx.model import (
        Actor,
        ActorType,
        Checksum,
        ChecksumAlgorithm,
        CreationInfo,
        Document,
        ExternalPackageRef,
        ExternalPackageRefCategory,
        Package,
        Relationship,
        RelationshipType,
        SpdxNoAssertion,
    )
    from spdx_tools.spdx.writer.json.json_writer import write_document_to_stream

    def spdx_id(kind: str, *parts: str) -> str:
        # SPDX ids allow letters, digits, '.' and '-' only; a digest keeps them unique.
        digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
        return f"SPDXRef-{kind}-{digest}"

    def package(kind: str, name: str, version: str, purl: str, sums: list[str]) -> Package:
        return Package(
            spdx_id=spdx_id(kind, purl), name=name, version=version,
            download_location=SpdxNoAssertion(), files_analyzed=False,
            checksums=[Checksum(ChecksumAlgorithm.SHA256, h) for h in sums],
            external_references=[ExternalPackageRef(
                ExternalPackageRefCategory.PACKAGE_MANAGER, "purl", purl)],
        )  # fmt: skip

    packages = [package("pypi", n, v, pypi_purl(n, v), hashes.get(normalize(n), []))
                for n, v in contents.python]  # fmt: skip
    packages += [package("deb", n, v, deb_purl(n, v, a), []) for n, v, a in contents.debian]
    image = Package(spdx_id="SPDXRef-image", name=subject.name, version=subject.image_id,
                    download_location=SpdxNoAssertion(), files_analyzed=False)  # fmt: skip
    relationships = [Relationship("SPDXRef-DOCUMENT", RelationshipType.DESCRIBES,
                                  "SPDXRef-image")]  # fmt: skip
    if subject.base_name:
        base = Package(spdx_id="SPDXRef-base", name=subject.base_name,
                       version=subject.base_id or None, download_location=SpdxNoAssertion(),
                       files_analyzed=False)  # fmt: skip
        packages.append(base)
        relationships.append(Relationship("SPDXRef-image", RelationshipType.DESCENDANT_OF,
                                          "SPDXRef-base"))  # fmt: skip
    relationships += [Relationship("SPDXRef-image", RelationshipType.CONTAINS, p.spdx_id)
                      for p in packages if p.spdx_id != "SPDXRef-base"]  # fmt: skip
    info = CreationInfo(
        spdx_version="SPDX-2.3", spdx_id="SPDXRef-DOCUMENT", name=subject.name,
        document_namespace=f"urn:gpuenv:sbom:{subject.image_id}",
        creators=[Actor(ActorType.TOOL, f"gpuenv-{__version__}")],
        created=created_at(subject.created).replace(tzinfo=None),
    )  # fmt: skip
    doc = Document(creation_info=info, packages=[image, *sorted(packages, key=_key)],
                   relationships=relationships)  # fmt: skip
    out = io.StringIO()
    write_document_to_stream(doc, out, validate=True)
    return out.getvalue().encode() + b"\n"


def _key(p: Any) -> tuple[str, str, str]:
    return (p.name, p.version or "", p.spdx_id)
