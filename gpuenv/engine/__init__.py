"""The container engine, the only door to Docker or podman.

- `client`: the Docker SDK (and the docker CLI for BuildKit), imported lazily; typed
  operations and `EngineError`. The only module that imports `docker`.
- `protocol`: `EngineProtocol`, what the production engine and the tests' fake both offer.
"""
