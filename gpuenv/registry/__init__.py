"""Registries: `names` (--registry, $GPUENV_REGISTRY, where a matrix's images go) and
`client` (gpuenv's one registry client, on oras-py: pull before build reads through it,
attestations and multi-platform indexes write)."""
