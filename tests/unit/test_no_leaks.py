"""Nothing leaks and nothing is escalated: secrets given with `-e NAME` stay out of gpuenv's
messages, the containers gpuenv starts get no privileges, validation containers no network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.gpu.gpus import parse_gpus
from gpuenv.matrix.errors import GpuenvError
from gpuenv.run import local as run
from gpuenv.run import options as run_options
from gpuenv.validate import runner

SECRET = "s3cr3t-Value-that-must-never-be-printed"

# What would escalate a container, as the Engine API's HostConfig names it: none may be
# asked for (absent, or an empty/false value).
ESCALATIONS = (
    "Privileged", "CapAdd", "SecurityOpt", "Devices", "PidMode", "UsernsMode", "CgroupnsMode",
    "DeviceCgroupRules", "Sysctls", "UTSMode", "VolumesFrom", "GroupAdd", "Runtime",
)  # fmt: skip


def options(tmp_path: Path, **kw: object) -> run.RunOptions:
    base: dict[str, object] = dict(image="img", command=["true"], cwd=tmp_path, uid=1000, gid=1000)
    base.update(kw)
    return run.RunOptions(**base)  # type: ignore[arg-type]


RUN_OPTIONS = [
    {},
    {"gpus": parse_gpus("all")},
    {"gpus": parse_gpus("capabilities=compute,utility")},
    {"ipc": "host", "network": "host", "interactive": True},
    {"env": ["A=1"], "volumes": ["/tmp:/data:ro"], "ports": ["8080:80"]},
]
RUN_IDS = ["plain", "gpus-all", "gpus-capabilities", "host-ipc-network-tty", "env-volume-port"]


@pytest.mark.parametrize("kw", RUN_OPTIONS, ids=RUN_IDS)
def test_the_engine_is_asked_for_no_privilege(tmp_path, kw, engine_on_fake_api):
    """The body the engine receives (POST /containers/create, as the SDK sends it for a
    `run`'s container): the caller's uid:gid, GPUs only as a DeviceRequest, no escalation,
    no engine socket mounted."""
    engine, routes = engine_on_fake_api
    bodies: list[dict] = []
    routes[("POST", "/v1.41/containers/create")] = (
        201, lambda body: bodies.append(json.loads(body)) or {"Id": "c1"})  # fmt: skip
    engine.create(run.container_spec(options(tmp_path, **kw)))
    [body] = bodies
    host = body["HostConfig"]
    assert body["User"] == "1000:1000"  # never root for a user
    asked = {key: host[key] for key in ESCALATIONS if host.get(key)}
    assert asked == {}, f"the container asks for {asked}"
    for request in host.get("DeviceRequests") or []:
        assert set(request) == {"Driver", "Count", "DeviceIDs", "Capabilities", "Options"}
    assert bool(host.get("DeviceRequests")) == ("gpus" in kw)
    assert not any("docker.sock" in b for b in host.get("Binds") or [])


def test_validation_containers_have_no_network_and_the_image_user(fake_engine):
    engine = fake_engine()
    runner._start(engine, "img", None)
    runner._start(engine, "img", parse_gpus("all"))
    assert [s.network for s in engine.created] == ["none", "none"]
    assert [s.user for s in engine.created] == [None, None]  # the image's default user
    assert engine.created[0].device_requests == []
    assert all(s.labels.get("io.gpuenv.validate") == "1" for s in engine.created)


@pytest.mark.parametrize(
    "item",
    [f"=  {SECRET}", f"A B={SECRET}", f"KEY={SECRET}\nX", f"\n={SECRET}", f"K\0={SECRET}"],
    ids=["no-name", "space-in-name", "newline", "newline-name", "nul"],
)
def test_env_errors_never_print_the_value(item, monkeypatch):
    monkeypatch.setenv("TOKEN", SECRET)
    with pytest.raises(GpuenvError) as caught:
        run_options.parse_env(["TOKEN", item])
    assert SECRET not in caught.value.message
    assert caught.value.exit_code == 125


def test_env_from_the_environment_reaches_only_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKEN", SECRET)
    spec = run.container_spec(options(tmp_path, env=["TOKEN"]))
    assert spec.env["TOKEN"] == SECRET
    assert SECRET not in repr(spec.labels) + " ".join(spec.command) + " ".join(spec.binds)


def test_start_errors_never_print_the_environment(tmp_path, monkeypatch):
    """The engine's refusal is explained from its own text and the command, not the env."""
    from gpuenv.engine.client import EngineError

    monkeypatch.setenv("TOKEN", SECRET)
    opts = options(tmp_path, env=["TOKEN"], command=["nope"])
    for text in (
        'exec: "nope": executable file not found in $PATH',
        'could not select device driver "" with capabilities: [[gpu]]',
        "permission denied: exec nope",
        "some other engine failure",
    ):
        message = run._start_error(EngineError(text), opts).message
        assert SECRET not in message
