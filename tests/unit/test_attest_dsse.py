"""gpuenv/publish/attest/dsse.py: DSSE envelopes signed with ECDSA P-256, checked independently."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gpuenv.matrix.errors import GpuenvError
from gpuenv.publish.attest import dsse


def write_key(tmp: Path, name: str, key) -> tuple[Path, Path]:
    private = tmp / f"{name}.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))  # fmt: skip
    public = tmp / f"{name}.pub"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return private, public


@pytest.fixture
def keys(tmp_path):
    return (write_key(tmp_path, "a", ec.generate_private_key(ec.SECP256R1())),
            write_key(tmp_path, "b", ec.generate_private_key(ec.SECP256R1())))  # fmt: skip


def pae(payload_type: str, payload: bytes) -> bytes:
    # DSSE protocol.md, written out here rather than taken from the code under test.
    t = payload_type.encode()
    return b"DSSEv1 " + str(len(t)).encode() + b" " + t + b" " + str(len(payload)).encode() + \
        b" " + payload  # fmt: skip


def test_round_trip_and_an_independent_check_of_the_signature(keys):
    (priv, pub), _ = keys
    payload = b'{"_type":"https://in-toto.io/Statement/v1"}'
    envelope = dsse.sign(payload, dsse.load_signer(priv))
    assert dsse.verify(envelope, dsse.load_public(pub)) == (dsse.IN_TOTO, payload)
    doc = json.loads(envelope)
    assert base64.b64decode(doc["payload"]) == payload
    (sig,) = doc["signatures"]
    key = serialization.load_pem_public_key(pub.read_bytes())
    key.verify(base64.b64decode(sig["sig"]), pae(doc["payloadType"], payload),
               ec.ECDSA(hashes.SHA256()))  # fmt: skip


def test_another_key_and_a_tampered_payload_do_not_verify(keys):
    (priv, pub), (_, other) = keys
    envelope = dsse.sign(b'{"a":1}', dsse.load_signer(priv))
    with pytest.raises(dsse.Unverified):
        dsse.verify(envelope, dsse.load_public(other))
    doc = json.loads(envelope)
    doc["payload"] = base64.b64encode(b'{"a":2}').decode()
    with pytest.raises(dsse.Unverified):
        dsse.verify(json.dumps(doc).encode(), dsse.load_public(pub))
    doc = json.loads(envelope)
    doc["payloadType"] = "text/plain"  # the type is signed too (PAE)
    with pytest.raises(dsse.Unverified):
        dsse.verify(json.dumps(doc).encode(), dsse.load_public(pub))
    with pytest.raises(dsse.Unverified):
        dsse.verify(b"not json", dsse.load_public(pub))


def test_keys_that_are_not_p256_are_refused_with_the_option(tmp_path, keys):
    rsa_priv, rsa_pub = write_key(tmp_path, "rsa", rsa.generate_private_key(65537, 2048))
    for load, path in ((dsse.load_signer, rsa_priv), (dsse.load_public, rsa_pub)):
        with pytest.raises(GpuenvError, match=r"--key .*P-256"):
            load(path)
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(GpuenvError, match=r"--key .*junk\.pem"):
        dsse.load_signer(junk)
    with pytest.raises(GpuenvError, match="cannot read"):
        dsse.load_public(tmp_path / "missing.pem")
    # The private key's PEM verifies too: its public half.
    (priv, pub), _ = keys
    assert dsse.load_public(priv).keyid == dsse.load_public(pub).keyid
