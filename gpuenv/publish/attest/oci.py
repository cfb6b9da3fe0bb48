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

The HTTP side is oras-py's `Registry` (its requests session, and the credentials Docker's
own ~/.docker/config.json holds for the registry, helpers included, as `docker push` uses):
loopback registries over http, others over https.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.building.registry import MANIFEST_TYPES, is_loopback, split_ref
from gpuenv.matrix.errors import GpuenvError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
DSSE_LAYER = "application/vnd.dsse.envelope.v1+json"
# The artifactType of gpuenv's attestations: a DSSE envelope carrying an in-toto statement.
ATTESTATION = "application/vnd.in-toto+json"
PREDICATE_ANNOTATION = "in-toto.io/predicate-type"
MAX_JSON = 4 << 20
MAX_ENVELOPE = 64 << 20  # an SBOM of a large GPU image is a few MB


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


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


class Repository:
    """One repository of one registry, as REF names it."""

    def __init__(self, ref: str, *, timeout: float = 60) -> None:
        import oras.provider

        self.ref = ref
        name = ref.split("@", 1)[0]
        self.pinned = ref.split("@", 1)[1] if "@" in ref else None
        self.host, self.name, self.tag = split_ref(name if self.pinned else ref)
        loopback = is_loopback(self.host)
        self.base = f"{'http' if loopback else 'https'}://{self.host}/v2/{self.name}"
        self.client = oras.provider.Registry(hostname=self.host, insecure=loopback)
        if loopback:
            self.client.session.trust_env = False  # never send loopback through a proxy
        self.container = self.client.get_container(f"{self.host}/{self.name}:{self.tag}")
        self.client.auth.load_configs(self.container)
        self.timeout = timeout

    # ----------------------------------------------------------------- requests

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            return self.client.do_request(self.base + path, method, **kwargs)
        except Exception as exc:  # requests' connection errors, oras' auth refusals
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            raise GpuenvError(f"registry {self.host}: {why}") from None

    def _fail(self, what: str, resp: Any) -> GpuenvError:
        body = (resp.text or "")[:200].replace("\n", " ")
        return GpuenvError(f"registry {self.host}: {what}: HTTP {resp.status_code} {body}".strip())

    def manifest(self, reference: str) -> tuple[bytes, str] | None:
        """(the manifest's bytes, its media type) by tag or digest; None when missing."""
        resp = self._request("GET", f"/manifests/{reference}",
                             headers={"Accept": ", ".join((*MANIFEST_TYPES,))})  # fmt: skip
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._fail(f"manifest {reference}", resp)
        data = resp.content
        if len(data) > MAX_JSON:
            raise GpuenvError(f"registry {self.host}: manifest {reference} is too large")
        if reference.startswith("sha256:") and sha256(data) != reference:
            raise GpuenvError(f"registry {self.host}: manifest {reference} does not match "
                              f"its digest")  # fmt: skip
        media = str(resp.headers.get("Content-Type", "")).split(";")[0].strip()
        return data, media

    def subject(self) -> Descriptor:
        """The descriptor of the image REF names (a tag resolved to its digest)."""
        reference = self.pinned or self.tag
        found = self.manifest(reference)
        if found is None:
            raise GpuenvError(f"{self.ref}: no such image in the registry; push it first "
                              f"(gpuenv push)")  # fmt: skip
        data, media = found
        return Descriptor(media or json.loads(data).get("mediaType", ""), sha256(data), len(data))

    def blob(self, digest: str, limit: int = MAX_ENVELOPE) -> bytes | None:
        """A blob, checked against its digest; None when missing or it does not match."""
        resp = self._request("GET", f"/blobs/{digest}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._fail(f"blob {digest}", resp)
        data = resp.content
        if len(data) > limit or sha256(data) != digest:
            return None
        return bytes(data)

    def put_blob(self, data: bytes, media_type: str) -> Descriptor:
        descriptor = Descriptor(media_type, sha256(data), len(data))
        with tempfile.TemporaryDirectory(prefix="gpuenv-attest-") as tmp:
            path = Path(tmp) / "blob"
            path.write_bytes(data)
            try:
                resp = self.client.upload_blob(
                    str(path), self.container,
                    {"digest": descriptor.digest, "size": descriptor.size},
                )  # fmt: skip
            except Exception as exc:
                raise GpuenvError(f"registry {self.host}: blob upload: "
                                  f"{str(exc).splitlines()[0][:200]}") from None  # fmt: skip
        if resp.status_code not in (200, 201, 202):
            raise self._fail("blob upload", resp)
        return descriptor

    def put_manifest(self, data: bytes, media_type: str, reference: str) -> Any:
        resp = self._request("PUT", f"/manifests/{reference}", data=data,
                             headers={"Content-Type": media_type})  # fmt: skip
        if resp.status_code not in (200, 201):
            raise self._fail(f"manifest {reference}", resp)
        return resp

    # ----------------------------------------------------------------- referrers

    def referrers(self, subject: str) -> tuple[list[Descriptor], str]:
        """The descriptors of what refers to `subject`, and where they were found
        ("referrers API" or "fallback tag sha256-...")."""
        resp = self._request("GET", f"/referrers/{subject}",
                             headers={"Accept": OCI_INDEX})  # fmt: skip
        ctype = str(resp.headers.get("Content-Type", "")).split(";")[0].strip()
        if resp.status_code == 200 and ctype == OCI_INDEX:
            doc = json.loads(resp.content)
            return _descriptors(doc), "referrers API"
        tag = fallback_tag(subject)
        found = self.manifest(tag)
        if found is None:
            return [], f"fallback tag {tag}"
        return _descriptors(json.loads(found[0])), f"fallback tag {tag}"

    def attach(self, subject: Descriptor, payload: bytes, annotations: dict[str, str]) -> str:
        """Push `payload` (a DSSE envelope) as an artifact referring to `subject`; its
        manifest digest. The fallback index is updated unless the registry says it
        indexed the subject itself (`OCI-Subject`)."""
        config = self.put_blob(EMPTY_BLOB, EMPTY)
        layer = self.put_blob(payload, DSSE_LAYER)
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
        data = self.blob(layers[0].digest)
        if data is None:
            return None, f"its envelope {layers[0].digest[:19]} is missing or altered"
        return data, ""


def _descriptors(doc: Any) -> list[Descriptor]:
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    return [d for d in map(Descriptor.from_json, manifests or []) if d]
