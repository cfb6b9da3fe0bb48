"""gpuenv.gpu.cdi and the engine's side of it: which way `--gpus` reaches each kind of engine,
the request each one is sent (read off the wire of a tiny Engine API), and the names
`--gpus device=...` takes (indices, UUIDs, MIG devices, CDI names).

The engine facts come from recorded `docker info` (tests/unit/recorded/README.md cites them)
and from podman 4.3.1 as this project's lab runs it (`tests/integration/test_engine_cdi.py`
runs the same request shapes against it for real).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_doctor import info_from_text, recorded

from gpuenv.engine.client import ContainerSpec, EngineError, GpuEngineFacts, libpod_spec
from gpuenv.gpu import cdi
from gpuenv.gpu.gpus import explain_start_error, parse_gpus
from gpuenv.matrix.errors import GpuenvError

UUID = "GPU-0008bcf4-cae8-0120-a18f-bc344fb1c710"  # the recorded host's (Discovered Devices)
MIG_UUID = "MIG-4f2c8d3e-1a2b-5c6d-7e8f-9a0b1c2d3e4f"


def docker_facts(text: str, local: bool = True) -> GpuEngineFacts:
    return GpuEngineFacts.from_info(info_from_text(text), podman=False, local=local)


PODMAN_43 = GpuEngineFacts(podman=True, version="4.3.1", runtimes=("crun", "runc"))
PODMAN_40 = GpuEngineFacts(podman=True, version="4.0.3", runtimes=("crun", "runc"))


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("spec", "count", "ids"),
    [
        ("device=0:1", None, ("0:1",)),  # a MIG device: GPU 0, instance 1
        ("device=0:0,1:2", None, ("0:0", "1:2")),
        (f"device={MIG_UUID}", None, (MIG_UUID,)),
        (f"device={UUID}", None, (UUID,)),
        ("device=nvidia.com/gpu=1", None, ("1",)),  # a CDI name: the same device as device=1
        (f"device=nvidia.com/gpu={UUID}", None, (UUID,)),
        ("device=nvidia.com/gpu=0:1", None, ("0:1",)),
        ("device=nvidia.com/gpu=0,nvidia.com/gpu=1", None, ("0", "1")),
        ("device=nvidia.com/gpu=all", -1, ()),
        ("nvidia.com/gpu=all", -1, ()),  # CDI names alone, as `--device` takes them
        ("nvidia.com/gpu=1", None, ("1",)),
    ],
)
def test_device_names_mig_uuid_and_cdi(spec: str, count: int | None, ids: tuple[str, ...]) -> None:
    request = parse_gpus(spec)
    assert (request.count, request.device_ids) == (count, ids)


@pytest.mark.parametrize(
    "spec",
    [
        "device=nvidia.com/gpu=",  # no name
        "device=nvidia.com/gpu=all,nvidia.com/gpu=0",  # every GPU and one of them
        "device=amd.com/gpu=0",  # another vendor's kind: not NVIDIA's devices
        "device=0:x",
        "device=0:1:2",
        "nvidia.com/gpu=0;rm",
        "device=nvidia.com/gpu=all,count=2",
    ],
)
def test_bad_device_names_are_one_error(spec: str) -> None:
    with pytest.raises(GpuenvError) as exc:
        parse_gpus(spec)
    assert exc.value.exit_code == 125 and "--gpus" in exc.value.message


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("all", ["nvidia.com/gpu=all"]),
        ("count=all", ["nvidia.com/gpu=all"]),
        ("2", ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),  # Docker's count: the first N
        ("device=1", ["nvidia.com/gpu=1"]),
        ("device=0:1", ["nvidia.com/gpu=0:1"]),
        (f"device={UUID}", [f"nvidia.com/gpu={UUID}"]),
        (f"device={MIG_UUID}", [f"nvidia.com/gpu={MIG_UUID}"]),
        ("device=nvidia.com/gpu=all", ["nvidia.com/gpu=all"]),
    ],
)
def test_cdi_names_of_each_request(spec: str, names: list[str]) -> None:
    assert cdi.cdi_names(parse_gpus(spec)) == names


# --------------------------------------------------------------------------- the path


def test_podman_takes_gpus_as_cdi_devices() -> None:
    path = cdi.choose_path(PODMAN_43)
    assert path.kind == "cdi" and "podman 4.3.1" in path.how


def test_podman_before_cdi_is_an_error_before_any_container() -> None:
    path = cdi.choose_path(PODMAN_40)
    assert path.kind == "none" and ">= 4.1" in path.problem
    with pytest.raises(GpuenvError) as exc:
        cdi.devices(parse_gpus("all"), path)
    assert exc.value.exit_code == 125
    assert exc.value.message.startswith("--gpus asked for all GPUs, but podman 4.0.3")


def test_recorded_docker_with_cdi_and_discovered_devices_takes_cdi() -> None:
    # NVIDIA/nvidia-container-toolkit#1967: Docker 29.7.2, CDI spec directories, Discovered
    # Devices nvidia.com/gpu=0, =GPU-0008..., =all (and the nvidia runtime registered too).
    facts = docker_facts(recorded("docker-info-nvidia-runtime.txt"))
    assert facts.cdi_devices == ("nvidia.com/gpu=0", f"nvidia.com/gpu={UUID}", "nvidia.com/gpu=all")
    path = cdi.choose_path(facts)
    assert path.kind == "cdi" and "nvidia.com/gpu=0" in path.how


def test_recorded_hook_only_docker_keeps_the_hook() -> None:
    # NVIDIA/nvidia-container-toolkit#653: toolkit installed, no runtime, no CDI directories.
    path = cdi.choose_path(docker_facts(recorded("docker-info-hook-only.txt")))
    assert path.kind == "hook" and "hook" in path.how


def test_docker_with_cdi_enabled_but_no_nvidia_devices_keeps_the_runtime() -> None:
    # Derived: #1967's info without its Discovered Devices (Docker 25-28.2 lists none).
    text = recorded("docker-info-nvidia-runtime.txt")
    facts = docker_facts(text.split(" Discovered Devices:")[0] + " Runtimes: runc nvidia\n")
    assert facts.cdi_spec_dirs and not facts.cdi_devices
    assert cdi.choose_path(facts).kind == "hook"
    assert "the nvidia runtime" in cdi.choose_path(facts).how
    # ... unless the spec files (read here for a local engine) name NVIDIA devices.
    assert cdi.choose_path(facts, ["nvidia.com/gpu=0"]).kind == "cdi"


def test_cdi_devices_without_cdi_enabled_are_not_used() -> None:
    facts = docker_facts(recorded("docker-info-hook-only.txt"))
    assert cdi.choose_path(facts, ["nvidia.com/gpu=0"]).kind == "hook"


def test_device_fields_on_each_path() -> None:
    request = parse_gpus("device=0:1")
    hook = cdi.devices(request, cdi.GpuPath("hook", ""))
    assert hook == {"device_requests": [request.as_api()], "cdi_devices": []}
    assert hook["device_requests"][0]["DeviceIDs"] == ["0:1"]  # MIG for the toolkit's hook
    assert cdi.devices(request, cdi.GpuPath("cdi", "")) == {
        "device_requests": [],
        "cdi_devices": ["nvidia.com/gpu=0:1"],
    }
    assert cdi.devices(None, cdi.GpuPath("none", "", "x")) == {
        "device_requests": [],
        "cdi_devices": [],
    }


# --------------------------------------------------------------------------- spec files

SPEC = """\
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: "0:1"
  containerEdits: {deviceNodes: [{path: /dev/nvidia-caps/nvidia-cap21}]}
- name: GPU-0008bcf4-cae8-0120-a18f-bc344fb1c710
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
containerEdits: {}
"""


def test_spec_devices_of_nvidias_kind(tmp_path: Path) -> None:
    assert cdi.spec_devices(SPEC) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=0:1",
        f"nvidia.com/gpu={UUID}",
        "nvidia.com/gpu=all",
    ]
    assert cdi.spec_devices(SPEC.replace("nvidia.com/gpu", "vendor.com/fpga")) == []
    assert cdi.spec_devices("{not: [yaml") == []
    assert cdi.spec_devices("[1, 2]") == []
    (tmp_path / "nvidia.yaml").write_text(SPEC)
    (tmp_path / "other.json").write_text(json.dumps({"kind": "vendor.com/x", "devices": []}))
    (tmp_path / "notes.txt").write_text(SPEC)  # not a spec file's name
    found = cdi.spec_devices_in([str(tmp_path), str(tmp_path / "missing")])
    assert list(found) == [str(tmp_path / "nvidia.yaml")]


def test_path_for_reads_a_local_dockers_spec_dirs(tmp_path: Path, fake_engine: type) -> None:
    (tmp_path / "nvidia.yaml").write_text(SPEC)
    engine = fake_engine(info={"ServerVersion": "27.5.1", "CDISpecDirs": [str(tmp_path)],
                               "Runtimes": {"runc": {}}})  # fmt: skip
    assert cdi.path_for(engine).kind == "cdi"
    (tmp_path / "nvidia.yaml").unlink()
    engine = fake_engine(info={"ServerVersion": "27.5.1", "CDISpecDirs": [str(tmp_path)]})
    assert cdi.path_for(engine).kind == "hook"


# --------------------------------------------------------------------------- on the wire


def _capture(routes: dict, method: str, path: str, answer: dict, status: int = 201) -> list:
    seen: list = []

    def record(body: bytes) -> dict:
        seen.append(json.loads(body))
        return answer

    routes[(method, path)] = (status, record)
    return seen


def test_docker_hook_request_on_the_wire(engine_on_fake_api) -> None:
    eng, routes = engine_on_fake_api
    seen = _capture(routes, "POST", "/v1.41/containers/create", {"Id": "c1"})
    eng.create(ContainerSpec("img", ["true"], **cdi.devices(parse_gpus("device=0:1,1"),
                                                            cdi.GpuPath("hook", ""))))  # fmt: skip
    (request,) = seen[0]["HostConfig"]["DeviceRequests"]
    assert request["Driver"] == "" and request["DeviceIDs"] == ["0:1", "1"]
    assert request["Capabilities"] == [["gpu"]]


def test_docker_cdi_request_on_the_wire(engine_on_fake_api) -> None:
    # What `docker run --device nvidia.com/gpu=all` sends (docker/cli's cdi handling).
    eng, routes = engine_on_fake_api
    seen = _capture(routes, "POST", "/v1.41/containers/create", {"Id": "c1"})
    eng.create(ContainerSpec("img", ["true"], **cdi.devices(parse_gpus("all"),
                                                            cdi.GpuPath("cdi", ""))))  # fmt: skip
    (request,) = seen[0]["HostConfig"]["DeviceRequests"]
    assert request["Driver"] == "cdi" and request["DeviceIDs"] == ["nvidia.com/gpu=all"]


@pytest.fixture
def podman_on_fake_api(engine_on_fake_api):
    from gpuenv.engine import client as engines

    _, routes = engine_on_fake_api
    version = (200, {"ApiVersion": "1.41", "Version": "4.3.1",
                     "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}]})  # fmt: skip
    routes[("GET", "/version")] = routes[("GET", "/v1.41/version")] = version
    routes[("GET", "/_ping")] = "ping-podman"  # its Libpod-API-Version header
    routes[("GET", "/v1.41/info")] = (200, {"ServerVersion": "4.3.1"})
    # Connected now: an Engine keeps the /_ping answer it was made with (is_podman).
    return engines.connect(), routes


def test_podman_cdi_devices_go_through_its_own_api(podman_on_fake_api) -> None:
    eng, routes = podman_on_fake_api
    compat = _capture(routes, "POST", "/v1.41/containers/create", {"Id": "wrong"})
    seen = _capture(routes, "POST", "/v4.0.0/libpod/containers/create", {"Id": "c1"})
    fields = cdi.devices_for(eng, parse_gpus("device=1"))
    assert fields["cdi_devices"] == ["nvidia.com/gpu=1"]
    spec = ContainerSpec("img", ["ls", "/dev"], user="1000:1000", workdir="/w",
                         binds=["/w:/w", "data:/data:ro"], network="none", shm_size="2g",
                         tmpfs={"/home/x": "rw,exec,uid=1000,gid=1000,mode=0755"},
                         labels={"io.gpuenv.run": "1"}, **fields)  # fmt: skip
    assert eng.create(spec) == "c1" and not compat
    body = seen[0]
    assert body["devices"] == [{"path": "nvidia.com/gpu=1"}]
    assert body["netns"] == {"nsmode": "none"} and body["shm_size"] == 2 << 30
    assert {"type": "bind", "source": "/w", "destination": "/w", "options": ["rbind"]} in (
        body["mounts"]
    )
    assert body["volumes"] == [{"Name": "data", "Dest": "/data", "Options": ["ro"]}]
    tmpfs = next(m for m in body["mounts"] if m["type"] == "tmpfs")
    assert tmpfs["options"] == ["rw", "exec", "mode=0755", "U"]  # podman refuses uid=/gid=
    assert (body["user"], body["work_dir"], body["labels"]) == ("1000:1000", "/w", spec.labels)


def test_podman_is_never_sent_a_request_it_would_drop(podman_on_fake_api) -> None:
    # podman 4.3's Docker API accepts a --gpus DeviceRequest and runs without the GPUs.
    eng, routes = podman_on_fake_api
    compat = _capture(routes, "POST", "/v1.41/containers/create", {"Id": "c1"})
    request = parse_gpus("all")
    with pytest.raises(EngineError, match="podman takes GPUs as CDI devices only"):
        eng.create(ContainerSpec("img", ["true"], device_requests=[request.as_api()]))
    assert not compat


def test_podmans_refusal_keeps_its_words(podman_on_fake_api) -> None:
    eng, routes = podman_on_fake_api
    message = "image not known"
    routes[("POST", "/v4.0.0/libpod/containers/create")] = (
        404, {"cause": message, "message": f"img: {message}", "response": 404})  # fmt: skip
    with pytest.raises(EngineError) as exc:
        eng.create(ContainerSpec("img", ["true"], cdi_devices=["nvidia.com/gpu=0"]))
    assert exc.value.status == 404 and "img: image not known" in exc.value.message


def test_libpod_spec_ports_and_ipc() -> None:
    body = libpod_spec(ContainerSpec("img", ["x"], ports={"8888/tcp": 8888, "53/udp": None,
                                                          "80/tcp": ("127.0.0.1", 8080)},
                                     ipc="host", cdi_devices=["nvidia.com/gpu=all"]))  # fmt: skip
    assert body["portmappings"] == [
        {"container_port": 8888, "host_port": 8888, "host_ip": "", "protocol": "tcp"},
        {"container_port": 53, "host_port": 0, "host_ip": "", "protocol": "udp"},
        {"container_port": 80, "host_port": 8080, "host_ip": "127.0.0.1", "protocol": "tcp"},
    ]
    assert body["ipcns"] == {"nsmode": "host"} and "netns" not in body


# --------------------------------------------------------------------------- refusals

# podman 4.3.1's words when a CDI name is in no spec, as this project's lab printed them
# (tests/integration/test_engine_cdi.py); podman's CLI saying the same
# (https://github.com/warmshao/FasterLivePortrait/issues/116); Docker 26 with the nvidia
# runtime in CDI mode (https://github.com/NVIDIA/nvidia-container-toolkit/issues/434, its title).
PODMAN_UNRESOLVABLE = (
    "500 Server Error for http+docker://localhost/v1.41/containers/ff24d2bc695f24c6d510c72556118"
    '541d2839e3114c7f8c85fa3beb9e884b69b/start: Internal Server Error ("setting up CDI devices: '
    'unresolvable CDI devices nvidia.com/gpu=7")'
)
PODMAN_CLI = "Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all"
DOCKER_UNRESOLVABLE = (
    "Rootless Docker CDI Injection: error modifying OCI spec: failed to inject CDI devices: "
    "unresolvable CDI devices nvidia.com/gpu=all: unknown."
)


@pytest.mark.parametrize(
    ("text", "name"),
    [(PODMAN_UNRESOLVABLE, "nvidia.com/gpu=7"), (PODMAN_CLI, "nvidia.com/gpu=all"),
     (DOCKER_UNRESOLVABLE, "nvidia.com/gpu=all")],
)  # fmt: skip
def test_an_unknown_cdi_device_names_it_and_the_fix(text: str, name: str) -> None:
    message = explain_start_error(text, "img")
    assert message is not None and f"no CDI spec for {name}: it takes" in message
    assert "nvidia-ctk cdi generate" in message and "\n" not in message


# --------------------------------------------------------------------------- callers


def podman(fake_engine: type, version: str = "4.3.1"):
    engine = fake_engine(
        info={"ID": "PODMAN-1", "KernelVersion": "6.1.0", "ServerVersion": version}
    )
    engine.is_podman = True
    return engine


def test_probe_and_run_ask_podman_for_cdi_devices(tmp_path, monkeypatch, fake_engine) -> None:
    from gpuenv.run import local, preflight

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("GPUENV_REPROBE", "1")
    eng = podman(fake_engine)
    eng.outcomes["img"] = (0, "560.35.03, NVIDIA H100 80GB HBM3, 9.0\n")
    preflight.probe_gpus(eng, "img", parse_gpus("device=1"))
    local.run(eng, local.RunOptions("img", ["ls", "/dev"], gpus=parse_gpus("2"), cwd=tmp_path))
    probe, workload = eng.created[0], eng.created[-1]  # between them: run's directory probe
    assert workload.command == ["ls", "/dev"]
    assert probe.cdi_devices == ["nvidia.com/gpu=1"] and not probe.device_requests
    assert workload.cdi_devices == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert not workload.device_requests


def test_run_on_podman_before_cdi_starts_nothing(tmp_path, fake_engine) -> None:
    from gpuenv.run import local

    eng = podman(fake_engine, "4.0.3")
    with pytest.raises(GpuenvError) as exc:
        local.run(eng, local.RunOptions("img", ["true"], gpus=parse_gpus("all"), cwd=tmp_path))
    assert exc.value.exit_code == 125 and "podman 4.0.3" in exc.value.message
    assert eng.created == []


def test_validate_on_an_engine_without_a_gpu_path_fails_the_device_checks(
    fake_engine, monkeypatch
) -> None:
    from gpuenv.engine.client import ImageInfo
    from gpuenv.validate import runner

    eng = podman(fake_engine, "4.0.3")
    eng.refs["img"], eng.images["sha256:1"] = "sha256:1", ImageInfo(id="sha256:1")
    monkeypatch.setattr(runner, "_run_pytest", lambda targets, gpus, junitxml, verbose: [])
    monkeypatch.setattr(runner, "_largest_layers", lambda engine, image: [])
    target = runner.Subject("img", "img", {"variant": "gpu"})
    runner.validate(eng, [target], parse_gpus("all"), None)
    assert target.gpu_container is None and "podman 4.0.3" in (target.gpu_error or "")
    assert "cannot give containers GPUs" in (target.gpu_error or "")


def test_doctor_says_which_path_each_engine_takes() -> None:
    from gpuenv.validate.doctor import Facts, evaluate

    cases = {
        "cdi": docker_facts(recorded("docker-info-nvidia-runtime.txt")),
        "hook": docker_facts(recorded("docker-info-hook-only.txt")),
    }
    for kind, facts in cases.items():
        path = cdi.choose_path(facts)
        found = {f.topic: f for f in evaluate(Facts(info={}, gpu_path=path))}
        assert found["gpu path"].level == "info" and kind in path.kind
        assert found["gpu path"].message == f"--gpus reaches containers as {path.how}"
    found = {f.topic: f for f in evaluate(Facts(podman=True, gpu_path=cdi.choose_path(PODMAN_40)))}
    assert found["gpu path"].level == "error" and "podman >= 4.1" in found["gpu path"].message


def test_doctor_on_podman_looks_for_cdi_specs() -> None:
    from gpuenv.gpu.gpus import GpuInfo
    from gpuenv.validate.doctor import Facts, gpu_support

    gpus = [GpuInfo("560.35.03", "NVIDIA L4", "8.9")]
    missing = gpu_support(Facts(podman=True, gpus=gpus))
    assert missing.level == "error" and missing.fix == cdi.GENERATE
    assert gpu_support(Facts(podman=True)).level == "info"  # no GPU here: nothing is wrong
    found = gpu_support(Facts(podman=True, cdi_specs=["/etc/cdi/nvidia.yaml"], gpus=gpus))
    assert found.level == "ok" and "/etc/cdi/nvidia.yaml" in found.message
    remote = gpu_support(Facts(podman=True, local=False, gpus=gpus))
    assert remote.level == "info" and "podman's host" in (remote.fix or "")


def test_libpod_spec_mount_binds_keep_read_only() -> None:
    # `--mount`-style binds (run on an engine that cannot see this machine: -v of the
    # engine host's own paths), which refuse a missing source.
    body = libpod_spec(ContainerSpec("img", ["x"], mounts=[("/data", "/data", True),
                                                           ("/out", "/out", False)]))  # fmt: skip
    assert body["mounts"] == [
        {"type": "bind", "source": "/data", "destination": "/data", "options": ["rbind", "ro"]},
        {"type": "bind", "source": "/out", "destination": "/out", "options": ["rbind"]},
    ]
