"""Publishing images from CI.

- `push`: tag and push cells, refusing stale or failed images, retrying transient errors;
- `multiplatform`: one index for an amd64/arm64 cell pair;
- `attest/`: SBOMs, signed provenance attached to pushed digests, and `verify`.
"""
