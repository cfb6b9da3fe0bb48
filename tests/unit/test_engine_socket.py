"""The engine's socket transport (gpuenv/wire.py): the container it asks for is
the one the Docker SDK would ask for, it finds the same engine the SDK would, and a peer
that is not an engine is one error, never a traceback. A tiny Engine API on a Unix socket
(http.server) answers; the real engine's behaviour is covered by the integration tests."""

from __future__ import annotations

import json
from typing import Any

import docker
import pytest

from gpuenv import engine as engines
from gpuenv.engine import ContainerSpec, EngineError

SPECS = [
    ContainerSpec("img:tag", ["python", "-c", "pass"]),
    ContainerSpec(
        "acme/tf:cell", ["python", "train.py", "--epochs", "2"], user="1000:1000",
        workdir="/work", env={"HOME": "/home/x", "A": "b=c"}, binds=["/data:/data:ro"],
        tmpfs={"/tmp": "rw,exec"}, shm_size="2g", ipc="host", network="none",
        labels={"io.gpuenv.run": "1"}, init=True,
        device_requests=[{"Driver": "", "Count": -1, "DeviceIDs": None,
                          "Capabilities": [["gpu"]], "Options": {}}],
    ),
    ContainerSpec("img", ["sh"], tty=True, stdin=True, init=False, shm_size="512m"),
]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS)
def test_the_create_body_is_the_sdks(spec):
    api = docker.APIClient(base_url="unix:///nonexistent", version="1.45")
    host = api.create_host_config(
        binds=spec.binds or None,
        port_bindings=None,
        device_requests=[engines._device_request(d) for d in spec.device_requests] or None,
        init=spec.init, shm_size=spec.shm_size, ipc_mode=spec.ipc, network_mode=spec.network,
        tmpfs=spec.tmpfs or None, auto_remove=False,
    )  # fmt: skip
    config = api.create_container_config(
        image=spec.image, command=spec.command, user=spec.user, working_dir=spec.workdir,
        environment=spec.env or None, host_config=host, labels=spec.labels or None,
        tty=spec.tty, stdin_open=spec.stdin, ports=None,
    )  # fmt: skip
    sdk = json.loads(json.dumps({k: v for k, v in config.items() if v is not None}))
    mine = json.loads(json.dumps(engines._create_body(spec)))
    # Keys the SDK always sends with their defaults (empty strings/false) mean the same.
    defaults = {"Hostname": None, "Domainname": None, "StopSignal": None, "Volumes": None,
                "Entrypoint": None, "MacAddress": None, "Healthcheck": None,
                "StopTimeout": None, "Runtime": None, "ExposedPorts": None}  # fmt: skip
    for key in defaults:
        sdk.pop(key, None)
    assert mine == sdk


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"}, None, "/run/user/1000/docker.sock"),
        ({"DOCKER_HOST": "tcp://10.0.0.1:2376"}, None, None),
        ({"DOCKER_HOST": "ssh://me@gpu-host"}, None, None),
        ({"DOCKER_HOST": "unix://relative.sock"}, None, None),
        ({}, None, "/var/run/docker.sock"),
        ({}, {"currentContext": "default"}, "/var/run/docker.sock"),
        ({}, {"currentContext": "remote-gpu"}, None),
        ({"DOCKER_CONTEXT": "remote-gpu"}, None, None),
        ({}, "{not json", None),
    ],
)
def test_the_socket_is_used_only_where_the_sdk_would_use_it(
    env, config, expected, tmp_path, monkeypatch
):
    for name in ("DOCKER_HOST", "DOCKER_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "config.json").write_text(text)
    assert engines.local_socket() == expected


def test_a_container_run_through_the_socket(fake_socket):
    path, routes = fake_socket
    created: list[dict[str, Any]] = []
    routes[("POST", "/containers/create")] = (201, lambda b: created.append(json.loads(b))
                                              or {"Id": "c1"})  # fmt: skip
    routes[("POST", "/containers/c1/attach")] = "attach"
    routes[("POST", "/containers/c1/start")] = (204, b"")
    routes[("POST", "/containers/c1/wait")] = (200, {"StatusCode": 3})
    routes[("DELETE", "/containers/c1")] = (204, b"")
    routes[("GET", "/images/acme%2Ftf%3Acell/json")] = (
        200,
        {"Id": "sha256:abc", "RepoTags": ["acme/tf:cell"], "Config": {"Labels": {"a": "b"}}},
    )
    eng = engines.Engine(socket_path=path)
    assert eng.is_local and eng.url == f"unix://{path}"
    info = eng.image("acme/tf:cell")
    assert info is not None and info.id == "sha256:abc" and info.labels == {"a": "b"}
    assert eng.image("missing:tag") is None  # 404
    cid = eng.create(ContainerSpec("acme/tf:cell", ["true"], network="none"))
    assert cid == "c1" and created[0]["HostConfig"]["NetworkMode"] == "none"
    stream = eng.attach(cid)
    eng.start(cid)
    assert list(stream) == [(b"out1\n", None), (None, b"err\n"), (b"out2\n", None)]
    assert eng.wait(cid) == 3
    eng.remove_container(cid)
    eng.remove_container("gone")  # 404: already gone is no error
    assert eng._client is None, "none of this needs the SDK"


def test_a_tty_containers_stream_is_read_raw(fake_socket):
    path, routes = fake_socket
    routes[("POST", "/containers/create")] = (201, {"Id": "t1"})
    routes[("POST", "/containers/t1/attach")] = "attach-tty"
    routes[("POST", "/containers/other/attach")] = "attach-tty"
    routes[("GET", "/containers/other/json")] = (200, {"Config": {"Tty": True}})
    eng = engines.Engine(socket_path=path)
    cid = eng.create(ContainerSpec("img", ["sh"], tty=True, stdin=True))
    assert b"".join(out or b"" for out, _ in eng.attach(cid)) == b"hello\r\nworld\r\n"
    # A container this engine did not create: its Tty is asked for.
    assert b"".join(out or b"" for out, _ in eng.attach("other")) == b"hello\r\nworld\r\n"


def test_refusals_keep_the_engines_words(fake_socket):
    path, routes = fake_socket
    message = 'could not select device driver "" with capabilities: [[gpu]]'
    routes[("POST", "/containers/create")] = (500, {"message": message})
    eng = engines.Engine(socket_path=path)
    with pytest.raises(EngineError) as exc:
        eng.create(ContainerSpec("img", ["true"]))
    assert message in exc.value.detail and exc.value.status == 500
    assert exc.value.message.startswith("Docker Engine error: 500 Server Error")


def test_a_peer_that_is_not_an_engine_is_one_error(fake_socket, monkeypatch):
    path, routes = fake_socket
    routes[("GET", "/_ping")] = "garbage"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.setattr(engines, "_conn", engines._Connection())
    with pytest.raises(EngineError, match="no Engine API answer"):
        engines.connect()
    routes[("GET", "/_ping")] = (200, b"OK")
    routes[("GET", "/info")] = (200, b"<html>not json</html>")
    with pytest.raises(EngineError, match="not the Engine API's JSON"):
        engines.connect().info()


def test_no_engine_at_the_socket_says_how_to_start_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    monkeypatch.setattr(engines, "_conn", engines._Connection())
    with pytest.raises(EngineError, match="cannot reach the Docker Engine"):
        engines.connect()
