"""gpuenv/publish/attest/provenance.py: the in-toto statements and SLSA provenance v1 contents."""

from __future__ import annotations

import json

from gpuenv.publish.attest import provenance

DIGEST = "sha256:" + "d" * 64
FACTS = provenance.BuildFacts(
    cell="jax0.7-py3.11-cpu", spec_hash="e" * 64, image_id="sha256:" + "c" * 64,
    matrix_path="matrix.yaml", matrix_digest="1" * 64, lock_digest="2" * 64,
    base_name="gpuenv/debian:bookworm", base_id="sha256:" + "b" * 64, gpuenv_version="0.1.0",
    builder_id="urn:gpuenv:builder:local", reproducible=True, inputs={"base": "sha256:b"},
    locked=(("jax", "0.7.2", "f" * 64),),
)  # fmt: skip


def test_the_provenance_statement_names_the_digest_and_every_recorded_fact():
    body = provenance.statement("127.0.0.1:5000/t/x", DIGEST, provenance.SLSA_PROVENANCE,
                                provenance.slsa_predicate(FACTS))  # fmt: skip
    doc = json.loads(body)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["subject"] == [{"name": "127.0.0.1:5000/t/x", "digest": {"sha256": "d" * 64}}]
    assert doc["predicateType"] == "https://slsa.dev/provenance/v1"
    build, run = doc["predicate"]["buildDefinition"], doc["predicate"]["runDetails"]
    ext = build["externalParameters"]
    assert ext["cell"] == "jax0.7-py3.11-cpu"
    assert ext["matrix"]["digest"] == {"sha256": "1" * 64}
    assert ext["lock"]["digest"] == {"sha256": "2" * 64}
    assert build["internalParameters"]["specHash"] == "e" * 64
    assert {"name": "base", "uri": "docker-image:gpuenv/debian:bookworm",
            "digest": {"sha256": "b" * 64}} in build["resolvedDependencies"]  # fmt: skip
    assert {"uri": "pkg:pypi/jax@0.7.2", "digest": {"sha256": "f" * 64}} in (
        build["resolvedDependencies"]
    )
    assert run["builder"] == {"id": "urn:gpuenv:builder:local", "version": {"gpuenv": "0.1.0"}}
    assert run["byproducts"] == [{"name": "image-config", "digest": {"sha256": "c" * 64}}]
    # Canonical bytes: the same facts, the same statement.
    assert body == provenance.statement("127.0.0.1:5000/t/x", DIGEST,
                                        provenance.SLSA_PROVENANCE,
                                        provenance.slsa_predicate(FACTS))  # fmt: skip
    st = provenance.parse(body)
    assert st.names_digest(DIGEST) and not st.names_digest("sha256:" + "0" * 64)
    text = "\n".join(provenance.describe(st))
    for fact in ("jax0.7-py3.11-cpu", "1" * 64, "2" * 64, "b" * 64, "c" * 64, "(reproducible)"):
        assert fact in text


def test_builder_id_from_the_environment():
    assert provenance.builder_id({}) == "urn:gpuenv:builder:local"
    assert provenance.builder_id({"GPUENV_BUILDER_ID": "https://ci.example/x"}) == (
        "https://ci.example/x"
    )
    gha = {"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com",
           "GITHUB_WORKFLOW_REF": "o/r/.github/workflows/images.yml@refs/heads/main"}  # fmt: skip
    assert provenance.builder_id(gha) == (
        "https://github.com/o/r/.github/workflows/images.yml@refs/heads/main"
    )


def test_what_is_not_a_statement():
    for payload in (b"nope", b"[]", b'{"_type": "https://in-toto.io/Statement/v0.1"}'):
        try:
            provenance.parse(payload)
        except provenance.NotAStatement:
            continue
        raise AssertionError(payload)


def test_locked_entries_list_every_hash():
    text = "jax==0.7.2 \\\n    --hash=sha256:" + "1" * 64 + " \\\n    --hash=sha256:" + "2" * 64
    assert provenance.locked_entries([text, ""]) == (
        ("jax", "0.7.2", "1" * 64), ("jax", "0.7.2", "2" * 64),
    )  # fmt: skip
