"""Registries: where images are published, and the one client that speaks to them.

- `names`: registry names (`--registry`, $GPUENV_REGISTRY) and the repository an image
  of the matrix goes to;
- `client`: one repository of one registry over oras-py (references as Docker reads them,
  manifests and blobs read with size limits and checked against their digests, uploads);
  pull before build reads labels through it, attestations and multi-platform indexes write.
"""
