"""DSSE envelopes signed with an ECDSA P-256 key (securesystemslib does the format and
the signing). Spec: https://github.com/secure-systems-lab/dsse/blob/master/envelope.md
(the envelope) and protocol.md (what is signed: the pre-authentication encoding
`DSSEv1 <len(type)> <type> <len(body)> <body>`); the signature is ECDSA over SHA-256,
DER-encoded, base64 in the envelope.

Keys are PEM files: a private key (PKCS#8 or "EC PRIVATE KEY", unencrypted or with the
passphrase in $GPUENV_KEY_PASSWORD) to sign, the public key (SubjectPublicKeyInfo) to
verify. Key ids are securesystemslib's (sha256 over the key's canonical form).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.matrix.errors import GpuenvError

if TYPE_CHECKING:
    from securesystemslib.signer import SSlibKey

IN_TOTO = "application/vnd.in-toto+json"  # DSSE payloadType of in-toto statements
SCHEME = "ecdsa-sha2-nistp256"
PASSWORD_ENV = "GPUENV_KEY_PASSWORD"


class Unverified(Exception):
    """An envelope whose signature does not verify with the key, or that is not DSSE."""


MAX_KEY_BYTES = 64 << 10  # a P-256 key's PEM is a few hundred bytes


def _read(path: Path, option: str) -> bytes:
    """The key file, through the one bounded reader of user-named files: /dev/zero or a FIFO
    given as the key is refused, never read to the end or waited on."""
    from gpuenv.matrix.files import read_regular

    try:
        data = read_regular(path, MAX_KEY_BYTES)
    except IsADirectoryError:
        raise GpuenvError(f"{option} {path}: not a regular file; give a PEM file",
                          exit_code=2) from None  # fmt: skip
    except OSError as exc:
        raise GpuenvError(f"{option} {path}: cannot read ({exc.strerror}); give a PEM file",
                          exit_code=2) from None  # fmt: skip
    if len(data) > MAX_KEY_BYTES:
        raise GpuenvError(f"{option} {path}: larger than {MAX_KEY_BYTES >> 10} KiB, not a PEM "
                          "key; give a PEM file", exit_code=2)  # fmt: skip
    return data


def _is_p256(key: Any) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ec

    return isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and (
        key.curve.name == "secp256r1"
    )


def load_signer(path: Path, option: str = "--key") -> Any:
    """A securesystemslib signer from an ECDSA P-256 private key PEM."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner, SSlibKey

    data = _read(path, option)
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = load_pem_private_key(data, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        why = str(exc).splitlines()[0][:200] if str(exc) else "not a private key"
        raise GpuenvError(
            f"{option} {path}: not an unencrypted PEM private key ({why}); give an ECDSA "
            f"P-256 key (openssl ecparam -name prime256v1 -genkey -noout -out KEY.pem), or "
            f"its passphrase in ${PASSWORD_ENV}",
            exit_code=2,
        ) from None
    if not _is_p256(key):
        raise GpuenvError(f"{option} {path}: not an ECDSA P-256 key; gpuenv signs with "
                          f"ECDSA P-256 (prime256v1)", exit_code=2)  # fmt: skip
    public = SSlibKey.from_crypto(key.public_key(), scheme=SCHEME)  # type: ignore[arg-type]
    return CryptoSigner(key, public)  # type: ignore[arg-type]


def load_public(path: Path, option: str = "--key") -> SSlibKey:
    """A public key PEM (or the private key's PEM: its public half) for verifying."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    data = _read(path, option)
    try:
        key: Any = load_pem_public_key(data)
    except ValueError:
        try:
            key = load_signer(path, option).public_key
        except GpuenvError:
            raise GpuenvError(f"{option} {path}: not a PEM public key; give the ECDSA P-256 "
                              f"public key (openssl ec -in KEY.pem -pubout)",
                              exit_code=2) from None  # fmt: skip
        return key  # type: ignore[no-any-return]
    if not _is_p256(key):
        raise GpuenvError(f"{option} {path}: not an ECDSA P-256 public key", exit_code=2)
    return SSlibKey.from_crypto(key, scheme=SCHEME)


def sign(payload: bytes, signer: Any, payload_type: str = IN_TOTO) -> bytes:
    """The envelope's JSON bytes: payload, payloadType, one signature with its keyid."""
    from securesystemslib.dsse import Envelope

    envelope = Envelope(payload, payload_type, {})
    envelope.sign(signer)
    return json.dumps(envelope.to_dict(), sort_keys=True, separators=(",", ":")).encode()


def verify(data: bytes, key: SSlibKey) -> tuple[str, bytes]:
    """(payloadType, payload) when one signature verifies with `key`; Unverified otherwise."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    try:
        doc = json.loads(data)
        envelope = Envelope.from_dict(doc)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Unverified(f"not a DSSE envelope ({type(exc).__name__})") from None
    if not envelope.signatures:
        raise Unverified("the envelope holds no signature")
    try:
        envelope.verify([key], 1)
    except VerificationError:
        raise Unverified("no signature verifies with the given key") from None
    return envelope.payload_type, envelope.payload


def keyid(key: SSlibKey) -> str:
    return str(key.keyid)
