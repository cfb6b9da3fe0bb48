"""Supply chain for published images: what is inside (SBOM), who built it from what
(provenance), and whether it was tampered with (signed DSSE envelopes attached to the
pushed manifest as OCI 1.1 artifacts).

- `contents`: what an image holds, read from a container of it (network none);
- `sbom`: CycloneDX 1.6 (or SPDX 2.3) JSON from those contents, the lock and the base;
- `provenance`: the in-toto statements (SLSA provenance v1, the SBOM as a predicate);
- `dsse`: signing and checking DSSE envelopes with an ECDSA P-256 key;
- `oci`: artifacts whose `subject` is the image, through the referrers API or its
  tag fallback;
- `attach` (after `gpuenv push --attest`) and `verify` (`gpuenv verify`) put them together.
"""
