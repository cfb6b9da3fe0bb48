"""The container engine, the only door to Docker or podman.

- `client`: `Engine`, the typed operations, and `connect()`; gpuenv imports the engine's
  names from here. Its pieces: `images` (image operations), `transport` (addresses,
  contexts, TLS, ssh: the one module that knows the Docker SDK's insides), `podman`
  (podman's differences), `buildkit` and `apibuild` (the two build drivers), `values`
  (errors and typed values). Only this package imports `docker`, lazily.
- `protocol`: `EngineProtocol`, what the production engine and the tests' fake both offer.
"""
