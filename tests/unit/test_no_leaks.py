"""Nothing leaks and nothing is escalated: secrets given with `-e NAME` stay out of gpuenv's
messages, the containers gpuenv starts get no privileges, validation containers no network."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from unittest import mock

import pytest

from gpuenv import run
from gpuenv.engine import ContainerSpec, Engine
from gpuenv.errors import GpuenvError
from gpuenv.gpus import parse_gpus
from gpuenv.validate import runner

SECRET = "s3cr3t-Value-that-must-never-be-printed"

# Every field a ContainerSpec has. A new one (privileged, cap_add, security_opt, pid, a
# device list, userns_mode...) must be argued for, here, first.
SPEC_FIELDS = {
    "image", "command", "user", "workdir", "env", "binds", "ports", "tmpfs",
    "device_requests", "init", "shm_size", "ipc", "network", "labels", "tty", "stdin",
}  # fmt: skip
ESCALATIONS = {
    "privileged", "cap_add", "security_opt", "devices", "pid_mode", "userns_mode",
    "cgroupns", "device_cgroup_rules", "sysctls", "uts_mode", "volumes_from", "group_add",
}  # fmt: skip


def test_container_spec_cannot_express_privileges():
    assert {f.name for f in dataclasses.fields(ContainerSpec)} == SPEC_FIELDS


def options(tmp_path: Path, **kw: object) -> run.RunOptions:
    base: dict[str, object] = dict(image="img", command=["true"], cwd=tmp_path, uid=1000, gid=1000)
    base.update(kw)
    return run.RunOptions(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"gpus": parse_gpus("all")},
        {"gpus": parse_gpus("capabilities=compute,utility")},
        {"ipc": "host", "network": "host", "interactive": True},
        {"env": ["A=1"], "volumes": ["/tmp:/data:ro"], "ports": ["8080:80"]},
    ],
    ids=["plain", "gpus-all", "gpus-capabilities", "host-ipc-network-tty", "env-volume-port"],
)
def test_run_never_adds_privileges(tmp_path, kw):
    spec = run.container_spec(options(tmp_path, **kw))
    assert spec.user == "1000:1000"  # the caller's uid:gid, never root for a user
    for request in spec.device_requests:  # GPUs come only through a DeviceRequest
        assert set(request) == {"Driver", "Count", "DeviceIDs", "Capabilities", "Options"}
    assert all(":" in b and not b.startswith("/var/run/docker.sock") for b in spec.binds)


def test_engine_create_passes_no_privilege_to_the_api(tmp_path):
    client = mock.MagicMock()
    client.api.create_container.return_value = {"Id": "c1"}
    engine = Engine(client)
    engine.create(run.container_spec(options(tmp_path, gpus=parse_gpus("all"), ipc="host")))
    host_kwargs = client.api.create_host_config.call_args.kwargs
    create_kwargs = client.api.create_container.call_args.kwargs
    assert not (set(host_kwargs) | set(create_kwargs)) & ESCALATIONS
    assert create_kwargs["user"] == "1000:1000"


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
        run.parse_env(["TOKEN", item])
    assert SECRET not in caught.value.message
    assert caught.value.exit_code == 125


def test_env_from_the_environment_reaches_only_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKEN", SECRET)
    spec = run.container_spec(options(tmp_path, env=["TOKEN"]))
    assert spec.env["TOKEN"] == SECRET
    assert SECRET not in repr(spec.labels) + " ".join(spec.command) + " ".join(spec.binds)


def test_start_errors_never_print_the_environment(tmp_path, monkeypatch):
    """The engine's refusal is explained from its own text and the command, not the env."""
    from gpuenv.engine import EngineError

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
