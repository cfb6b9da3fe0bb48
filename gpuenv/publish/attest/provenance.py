"""The in-toto statements gpuenv signs: SLSA provenance v1 for how an image was built, and
the SBOM as a predicate of its own. Pure functions; nothing here does I/O.

Formats: in-toto Statement v1,
https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md (`_type`, `subject`
with a sha256 digest, `predicateType`, `predicate`); SLSA provenance v1,
https://slsa.dev/spec/v1.0/provenance (`buildDefinition` with `buildType`,
`externalParameters`, `internalParameters`, `resolvedDependencies`; `runDetails` with
`builder.id` and `builder.version`, `metadata`, `byproducts`).

The subject is the pushed manifest's digest, the thing a registry serves; the image ID
(the config's digest, what an engine names it and what `--reproducible` fixes) is a
byproduct, so `gpuenv verify --rebuild` compares it with a rebuild.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
# A URI naming how gpuenv builds a cell (SLSA asks for one per build type; a URN needs
# no domain).
BUILD_TYPE = "urn:gpuenv:build:cell:v1"
BUILDER_ENV = "GPUENV_BUILDER_ID"


@dataclass(frozen=True)
class BuildFacts:
    """What the provenance records about one image."""

    cell: str
    spec_hash: str
    image_id: str  # sha256:<config digest>
    matrix_path: str  # as given, for people; the digest is what counts
    matrix_digest: str  # sha256 hex of the matrix file's bytes
    lock_digest: str  # sha256 hex of matrix.lock's bytes ("" when there is none)
    base_name: str
    base_id: str  # sha256:<hex>
    gpuenv_version: str
    builder_id: str
    reproducible: bool  # the image is in --reproducible's canonical form
    inputs: dict[str, str] = field(default_factory=dict)  # the io.gpuenv.inputs label
    locked: tuple[tuple[str, str, str], ...] = ()  # (name, version, sha256) per lock hash
    # The io.gpuenv.recipe label: the gpuenv that built the image ("VERSION sha256:HEX"),
    # which `verify --rebuild` needs to reproduce it; "" for an image built before 0.2.0.
    recipe: str = ""


def builder_id(environ: dict[str, str] | None = None) -> str:
    """Who built it: $GPUENV_BUILDER_ID; in GitHub Actions the workflow file at its ref
    (what SLSA's GitHub builders use as an id); else this machine as a local builder."""
    env = os.environ if environ is None else environ
    if env.get(BUILDER_ENV):
        return env[BUILDER_ENV]
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_WORKFLOW_REF"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{env['GITHUB_WORKFLOW_REF']}"
    return "urn:gpuenv:builder:local"


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1] if ":" in digest else digest


def statement(name: str, manifest_digest: str, predicate_type: str, predicate: Any) -> bytes:
    """An in-toto Statement v1 about `name` at `manifest_digest`, as canonical JSON bytes
    (sorted keys, no spaces: the same facts give the same bytes)."""
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": _hex(manifest_digest)}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def slsa_predicate(facts: BuildFacts) -> dict[str, Any]:
    external: dict[str, Any] = {
        "cell": facts.cell,
        "matrix": {"path": facts.matrix_path, "digest": {"sha256": facts.matrix_digest}},
        "reproducible": facts.reproducible,
    }
    if facts.lock_digest:
        external["lock"] = {"digest": {"sha256": facts.lock_digest}}
    dependencies: list[dict[str, Any]] = [
        {"name": "base", "uri": f"docker-image:{facts.base_name}",
         "digest": {"sha256": _hex(facts.base_id)}},
    ]  # fmt: skip
    for name, version, sha in facts.locked:
        dependencies.append({"uri": f"pkg:pypi/{name}@{version}", "digest": {"sha256": sha}})
    internal: dict[str, Any] = {"specHash": facts.spec_hash, "inputs": facts.inputs}
    if facts.recipe:
        internal["recipe"] = facts.recipe
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": external,
            "internalParameters": internal,
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": facts.builder_id, "version": {"gpuenv": facts.gpuenv_version}},
            "byproducts": [{"name": "image-config", "digest": {"sha256": _hex(facts.image_id)}}],
        },
    }


def locked_entries(requirements_texts: list[str]) -> tuple[tuple[str, str, str], ...]:
    """(name, version, sha256) for every hash of a cell's lock entry, sorted."""
    from gpuenv.store.wheelhouse import locked_requirements

    return tuple(sorted({(r.name, r.version, h) for text in requirements_texts
                         for r in locked_requirements(text) for h in r.hashes}))  # fmt: skip


# ------------------------------------------------------------------------- reading


class NotAStatement(Exception):
    pass


@dataclass(frozen=True)
class Statement:
    predicate_type: str
    subjects: list[tuple[str, str]]  # (name, sha256 hex)
    predicate: dict[str, Any]

    def names_digest(self, manifest_digest: str) -> bool:
        return any(sha == _hex(manifest_digest) for _, sha in self.subjects)


def parse(payload: bytes) -> Statement:
    try:
        doc = json.loads(payload)
    except ValueError:
        raise NotAStatement("the payload is not JSON") from None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        raise NotAStatement(f"not an in-toto statement v1 (_type {str(doc.get('_type'))[:80]!r})"
                            if isinstance(doc, dict) else "not an in-toto statement")  # fmt: skip
    subjects = []
    for s in doc.get("subject") or []:
        if isinstance(s, dict) and isinstance(s.get("digest"), dict):
            subjects.append((str(s.get("name", "")), str(s["digest"].get("sha256", ""))))
    predicate = doc.get("predicate")
    return Statement(str(doc.get("predicateType", "")), subjects,
                     predicate if isinstance(predicate, dict) else {})  # fmt: skip


def describe(st: Statement) -> list[str]:
    """What a statement states, one line per fact, for `gpuenv verify`."""
    p = st.predicate
    if st.predicate_type == SLSA_PROVENANCE:
        build = p.get("buildDefinition") or {}
        ext, internal = build.get("externalParameters") or {}, build.get("internalParameters") or {}
        run = p.get("runDetails") or {}
        base = next((d for d in build.get("resolvedDependencies") or []
                     if d.get("name") == "base"), {})  # fmt: skip
        config = next((b for b in run.get("byproducts") or []
                       if b.get("name") == "image-config"), {})  # fmt: skip
        lines = [
            f"cell {ext.get('cell')}, spec hash {internal.get('specHash')}",
            f"matrix {(ext.get('matrix') or {}).get('path')} "
            f"sha256:{((ext.get('matrix') or {}).get('digest') or {}).get('sha256')}",
            f"lock sha256:{((ext.get('lock') or {}).get('digest') or {}).get('sha256') or '-'}",
            f"base {str(base.get('uri', '')).removeprefix('docker-image:')} "
            f"sha256:{(base.get('digest') or {}).get('sha256')}",
            f"image ID sha256:{(config.get('digest') or {}).get('sha256')}"
            f"{' (reproducible)' if ext.get('reproducible') else ''}",
            f"built by {(run.get('builder') or {}).get('id')} with gpuenv "
            f"{((run.get('builder') or {}).get('version') or {}).get('gpuenv')}",
        ]
        return lines
    if st.predicate_type in ("https://cyclonedx.org/bom", "https://spdx.dev/Document"):
        if "components" in p:
            comps = p.get("components") or []
        else:
            comps = [{"purl": next((r.get("referenceLocator") for r in pk.get("externalRefs") or []
                                    if r.get("referenceType") == "purl"), "")}
                     for pk in p.get("packages") or []]  # fmt: skip
        pypi = sum(1 for c in comps if str(c.get("purl", "")).startswith("pkg:pypi/"))
        deb = sum(1 for c in comps if str(c.get("purl", "")).startswith("pkg:deb/"))
        return [f"{pypi} Python distributions, {deb} Debian packages"]
    return []
