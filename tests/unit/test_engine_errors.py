"""What the engine module (gpuenv/engine/client.py, the Docker SDK) makes of an engine's answers:
a refusal keeps the engine's own words (gpuenv/gpu/gpus.py explains the NVIDIA toolkit's from
them), a container is created, waited for and removed, and a peer that is not an engine, or no
engine at all, is one EngineError saying what to do. A tiny Engine API on a Unix socket
(tests/unit/engine_api.py) answers; the real engine, and attach (whose upgraded stream this
server cannot imitate), are the integration tests'."""

from __future__ import annotations

import pytest

from gpuenv.engine import buildkit
from gpuenv.engine import client as engines
from gpuenv.engine.client import ContainerSpec, EngineError


def test_a_container_is_created_run_and_removed(engine_on_fake_api):
    eng, routes = engine_on_fake_api
    routes[("POST", "/v1.41/containers/create")] = (201, {"Id": "c1"})
    routes[("POST", "/v1.41/containers/c1/start")] = (204, b"")
    routes[("POST", "/v1.41/containers/c1/wait")] = (200, {"StatusCode": 3})
    routes[("DELETE", "/v1.41/containers/c1")] = (204, b"")
    routes[("GET", "/v1.41/images/acme/tf:cell/json")] = (
        200,
        {"Id": "sha256:abc", "RepoTags": ["acme/tf:cell"], "Config": {"Labels": {"a": "b"}}},
    )
    assert eng.is_local
    info = eng.image("acme/tf:cell")
    assert info is not None and info.id == "sha256:abc" and info.labels == {"a": "b"}
    assert eng.image("missing:tag") is None  # 404
    cid = eng.create(ContainerSpec("acme/tf:cell", ["true"], network="none"))
    eng.start(cid)
    assert eng.wait(cid) == 3
    eng.remove_container(cid)
    eng.remove_container("gone")  # 404: already gone is no error


def test_refusals_keep_the_engines_words(engine_on_fake_api):
    eng, routes = engine_on_fake_api
    message = 'could not select device driver "" with capabilities: [[gpu]]'
    routes[("POST", "/v1.41/containers/create")] = (500, {"message": message})
    with pytest.raises(EngineError) as exc:
        eng.create(ContainerSpec("img", ["true"]))
    assert message in exc.value.detail and exc.value.status == 500
    assert exc.value.message.startswith("Docker Engine error: 500 Server Error")


def test_a_peer_that_is_not_an_engine_is_one_error(fake_socket, monkeypatch):
    path, routes = fake_socket
    routes[("GET", "/_ping")] = routes[("GET", "/version")] = "garbage"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    with pytest.raises(EngineError):
        engines.connect()


def test_no_engine_at_the_socket_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(EngineError, match="cannot reach the Docker Engine"):
        engines.connect()


def test_close_leaves_the_engine_usable_and_end_builds_starts_no_build(
    engine_on_fake_api, tmp_path, monkeypatch
):
    """close() drops connections (the SDK opens new ones on a later call); after end_builds()
    (Ctrl-C under `build -j`) no docker CLI starts, since one started then would outlive
    gpuenv and could tag."""
    eng, _ = engine_on_fake_api
    started = tmp_path / "started"
    cli = tmp_path / "docker-build"
    cli.write_text(  # a stand-in for `docker buildx build`: it writes the image ID asked for
        f"#!/bin/sh\necho >> {started}\nwhile [ $# -gt 0 ]; do\n"
        '  [ "$1" = --iidfile ] && echo sha256:built > "$2"\n  shift\ndone\n'
    )
    cli.chmod(0o755)
    monkeypatch.setattr(buildkit, "buildkit_cli", lambda engine=None: ([str(cli)], {}))
    context = tmp_path / "context"
    context.mkdir()

    def build() -> str:
        return eng._builds.build(eng.url, context, {}, False, "none", lambda line: None)

    eng.close()
    assert build() == "sha256:built"
    eng.end_builds()
    with pytest.raises(EngineError, match="not started"):
        build()
    assert started.read_text().count("\n") == 1


def test_each_connect_is_an_engine_of_its_own_closed_with_its_block(engine_on_fake_api):
    """No engine is shared by the process: a verb opens the one it uses and closes it."""
    eng, routes = engine_on_fake_api
    routes[("GET", "/v1.41/info")] = (200, {"ID": "the fake"})
    with engines.connect() as other:
        assert other is not eng and other.info()["ID"] == "the fake"
    assert eng.info()["ID"] == "the fake"  # another's close is not this one's
