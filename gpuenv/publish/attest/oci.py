"""Attestations stored beside an image in its registry, as OCI 1.1 artifacts whose
`subject` is the image's manifest; found again through the referrers API or, where the
registry lacks it (Debian's docker-registry 2.8, distribution 2.x), the tag fallback.

Specs (v1.1.0 of each):
- an artifact manifest: https://github.com/opencontainers/image-spec/blob/v1.1.0/manifest.md
  (`artifactType`, `subject`, the empty config `application/vnd.oci.empty.v1+json` whose
  content is `{}`: artifacts-guidance.md);
- finding referrers: https://github.com/opencontainers/distribution-spec/blob/v1.1.0/spec.md
  "Listing Referrers" (GET /v2/<name>/referrers/<digest>; a 404 means the registry lacks the
  API) and "Referrers Tag Schema" (an image index tagged `<alg>-<hex>` listing the
  referrers' descriptors, updated by the client after pushing a manifest with a subject
  when the registry answered without an `OCI-Subject` header).

The HTTP side is gpuenv's registry client (gpuenv/registry/client.py: oras-py, with the
credentials Docker's own ~/.docker/config.json holds for the registry, as `docker push` uses).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpuenv.matrix.errors import GpuenvError
from gpuenv.registry import client
from gpuenv.registry.client import MAX_MANIFEST, OCI_INDEX, OCI_MANIFEST, RegistryUnreadable, sha256

EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
# The artifactType of gpuenv's attestations: a DSSE envelope carrying an in-toto statement.
ATTESTATION = "application/vnd.in-toto+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
MAX_ENVELOPE = 64 << 20  # an SBOM of a large GPU image is a few MB


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def fallback_tag(digest: str) -> str:
    """The Referrers Tag Schema's tag: `<alg>-<ref>`, e.g. sha256-<64 hex>."""
    return digest.replace(":", "-", 1)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    artifact_type: str = ""
    annotations: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest,
                               "size": self.size}  # fmt: skip
        if self.artifact_type:
            doc["artifactType"] = self.artifact_type
        if self.annotations:
            doc["annotations"] = dict(self.annotations)
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> Descriptor | None:
        if not isinstance(doc, dict):
            return None
        digest = doc.get("digest")
        if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            return None
        notes = doc.get("annotations") if isinstance(doc.get("annotations"), dict) else {}
        return cls(str(doc.get("mediaType", "")), digest, int(doc.get("size") or 0),
                   str(doc.get("artifactType", "")),
                   tuple(sorted((str(k), str(v)) for k, v in notes.items())))  # fmt: skip

    def annotation(self, key: str) -> str:
        return dict(self.annotations).get(key, "")


class Repository(client.Repository):
    """One repository of one registry, as REF names it, and the attestations in it."""

    def subject(self) -> Descriptor:
        """The descriptor of the image REF names (a tag resolved to its digest)."""
        found = self.manifest(self.reference)
        if found is None:
            raise GpuenvError(f"{self.ref}: no such image in the registry; push it first "
                              f"(gpuenv push)")  # fmt: skip
        data, media = found
        return Descriptor(media or json.loads(data).get("mediaType", ""), sha256(data), len(data))

    # ----------------------------------------------------------------- referrers

    def referrers(self, subject: str) -> tuple[list[Descriptor], str]:
        """The descriptors of what refers to `subject`, and where they were found
        ("referrers API" or "fallback tag sha256-...")."""
        try:
            found = self.get(f"/referrers/{subject}", OCI_INDEX, MAX_MANIFEST)
        except RegistryUnreadable:  # a registry without the API may answer 400 or 405
            found = None
        if found and found[1] == OCI_INDEX:
            return _descriptors(json.loads(found[0])), "referrers API"
        tag = fallback_tag(subject)
        found = self.manifest(tag)
        return (_descriptors(json.loads(found[0])) if found else []), f"fallback tag {tag}"

    def attach(self, subject: Descriptor, payload: bytes, annotations: dict[str, str]) -> str:
        """Push `payload` (a DSSE envelope) as an artifact referring to `subject`; its
        manifest digest. The fallback index is updated unless the registry says it
        indexed the subject itself (`OCI-Subject`)."""
        config = Descriptor(EMPTY, self.put_blob(EMPTY_BLOB), len(EMPTY_BLOB))
        layer = Descriptor(DSSE_LAYER, self.put_blob(payload), len(payload))
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": ATTESTATION,
            "config": config.to_json(),
            "layers": [layer.to_json()],
            "subject": subject.to_json(),
            "annotations": annotations,
        }
        data = canonical(manifest)
        digest = sha256(data)
        resp = self.put_manifest(data, OCI_MANIFEST, digest)
        if resp.headers.get("OCI-Subject") == subject.digest:
            return digest
        entry = Descriptor(OCI_MANIFEST, digest, len(data), ATTESTATION,
                           tuple(sorted(annotations.items())))  # fmt: skip
        self._add_to_fallback(subject.digest, entry)
        return digest

    def _add_to_fallback(self, subject: str, entry: Descriptor) -> None:
        tag = fallback_tag(subject)
        found = self.manifest(tag)
        index: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        if found is not None:
            doc = json.loads(found[0])
            if isinstance(doc, dict) and isinstance(doc.get("manifests"), list):
                index = doc
        if any(isinstance(m, dict) and m.get("digest") == entry.digest
               for m in index["manifests"]):  # fmt: skip
            return
        index["manifests"].append(entry.to_json())
        self.put_manifest(canonical(index), OCI_INDEX, tag)

    def envelope(self, descriptor: Descriptor) -> tuple[bytes | None, str]:
        """The DSSE envelope an attestation artifact holds (checked against the digests
        its manifest gives), or (None, why)."""
        found = self.manifest(descriptor.digest)
        if found is None:
            return None, "its manifest is missing"
        doc = json.loads(found[0])
        layers = [d for d in map(Descriptor.from_json, doc.get("layers") or []) if d]
        if len(layers) != 1 or layers[0].media_type != DSSE_LAYER:
            return None, "its manifest holds no DSSE envelope"
        data = self.blob(layers[0].digest, MAX_ENVELOPE)
        if data is None:
            return None, f"its envelope {layers[0].digest[:19]} is missing or altered"
        return data, ""


def _descriptors(doc: Any) -> list[Descriptor]:
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    return [d for d in map(Descriptor.from_json, manifests or []) if d]
