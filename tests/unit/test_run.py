"""A run on this engine, its pure parts: the command and -e/-v/-p (gpuenv/run/options.py),
the container spec and grace period (local.py), the target (target.py), the preflight
verdict wiring and the driver cache (preflight.py); no engine needed.

(Test modules need unique basenames: the test directories are not packages. The
integration modules are therefore named test_engine_*.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fake_engine import image

from gpuenv.gpu.gpus import GpuInfo, parse_gpus
from gpuenv.matrix.errors import GpuenvError
from gpuenv.project.project import looks_like_image
from gpuenv.run import local as run
from gpuenv.run import options, preflight, target
from gpuenv.run.target import Target
from gpuenv.store import cache


def opts(tmp: Path | str = "/home/ana/proj", **kw) -> run.RunOptions:
    base = {"image": "acme/tf:cpu", "command": ["python", "train.py"], "uid": 1234, "gid": 5678}
    return run.RunOptions(cwd=Path(tmp), **{**base, **kw})


# --------------------------------------------------------------------------- container_spec


def test_container_spec_runs_as_the_caller_in_the_current_directory():
    spec = run.container_spec(opts())
    assert spec.image == "acme/tf:cpu"
    assert spec.command == ["python", "train.py"]
    assert spec.user == "1234:5678"
    assert spec.workdir == "/home/ana/proj"
    assert spec.binds == ["/home/ana/proj:/home/ana/proj"]  # same path inside
    assert spec.env == {"HOME": "/home/gpuenv-run"}
    # HOME is a tmpfs owned by the caller: writable even for a uid with no passwd entry.
    assert spec.tmpfs == {"/home/gpuenv-run": "rw,exec,uid=1234,gid=5678,mode=0755"}
    assert spec.init is True  # an init process delivers signals
    assert spec.shm_size == "2g"  # not Docker's 64 MB
    assert spec.ipc is None
    assert spec.network is None  # the engine's default network unless --network
    assert spec.device_requests == []
    assert spec.labels == {"io.gpuenv.run": "1"}
    assert (spec.tty, spec.stdin) == (False, False)
    assert spec.ports == {}


def test_container_spec_options():
    spec = run.container_spec(
        opts(
            gpus=parse_gpus("device=0,2"),
            env=["A=1", "HOME=/data/home"],
            volumes=["/data:/data:ro"],
            ports=["6006:6006"],
            network="none",
            workdir="/work",
            ipc="host",
            interactive=True,
        )
    )
    assert spec.device_requests == [parse_gpus("device=0,2").as_api()]
    assert spec.env == {"HOME": "/data/home", "A": "1"}  # the user's -e wins
    assert spec.binds == ["/home/ana/proj:/home/ana/proj", "/data:/data:ro"]
    assert spec.ports == {"6006/tcp": 6006}
    assert spec.network == "none"
    assert spec.workdir == "/work"
    assert (spec.ipc, spec.shm_size) == ("host", None)  # --ipc replaces the shm size
    assert (spec.tty, spec.stdin) == (True, True)


def test_container_spec_refuses_the_root_directory():
    with pytest.raises(GpuenvError) as err:
        run.container_spec(opts("/"))
    assert err.value.exit_code == 125
    assert "mounts the current directory" in err.value.message


def test_options_default_to_the_calling_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    o = run.RunOptions(image="x", command=["true"])
    assert (o.uid, o.gid, o.cwd) == (os.getuid(), os.getgid(), tmp_path)


# --------------------------------------------------------------------------- command_for


def test_py_script_runs_with_the_images_python(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "eval.py").write_text("")
    assert options.command_for(["train.py", "--epochs", "3"], tmp_path) == [
        "python",
        "train.py",
        "--epochs",
        "3",
    ]
    assert options.command_for(["sub/eval.py"], tmp_path) == ["python", "sub/eval.py"]


@pytest.mark.parametrize(
    "args", [["nvidia-smi"], ["python", "-c", "pass"], ["bash", "-lc", "x.py"], ["jupyter"]]
)
def test_anything_else_runs_as_a_command(tmp_path, args):
    assert options.command_for(args, tmp_path) == args


def test_missing_script_is_127(tmp_path):
    with pytest.raises(GpuenvError) as err:
        options.command_for(["train.py"], tmp_path)
    assert err.value.exit_code == 127
    assert f"train.py: no such file in {tmp_path}" in err.value.message


def test_nothing_to_run_is_125(tmp_path):
    with pytest.raises(GpuenvError) as err:
        options.command_for([], tmp_path)
    assert err.value.exit_code == 125


# --------------------------------------------------------------------------- -e


def test_parse_env(monkeypatch):
    monkeypatch.setenv("FROM_HOST", "host value")
    monkeypatch.delenv("NOT_SET", raising=False)
    assert options.parse_env(["A=1", "B=", "C=x=y", "FROM_HOST", "NOT_SET", "D=a b"]) == {
        "A": "1",
        "B": "",
        "C": "x=y",
        "FROM_HOST": "host value",  # -e KEY passes the caller's value
        "D": "a b",
    }  # NOT_SET: as docker run, an unset KEY passes nothing


@pytest.mark.parametrize("item", ["=1", "", "A=1\nB=2"])
def test_parse_env_errors(item):
    with pytest.raises(GpuenvError) as err:
        options.parse_env([item])
    assert err.value.exit_code == 125
    assert "expected KEY=VALUE or KEY" in err.value.message


# --------------------------------------------------------------------------- -v


def test_parse_volume(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cwd = tmp_path / "proj"
    assert options.parse_volume("./data:/data", cwd) == f"{cwd}/data:/data"
    assert options.parse_volume("../shared:/shared:ro", cwd) == f"{tmp_path}/shared:/shared:ro"
    assert options.parse_volume("/abs/path:/x:rw", cwd) == "/abs/path:/x:rw"
    assert (
        options.parse_volume("~/datasets:/datasets", cwd) == f"{tmp_path}/home/datasets:/datasets"
    )
    assert options.parse_volume("cache:/root/.cache", cwd) == "cache:/root/.cache"  # named volume


@pytest.mark.parametrize("item", ["data", "./data:relative", ":/x", "a:/b:ro:extra", "./d:"])
def test_parse_volume_errors(item):
    with pytest.raises(GpuenvError) as err:
        options.parse_volume(item, Path("/proj"))
    assert err.value.exit_code == 125
    assert "expected SRC:DST[:ro|rw] with an absolute DST" in err.value.message


# --------------------------------------------------------------------------- -p


def test_parse_ports():
    assert options.parse_ports(["8888:8888"]) == {"8888/tcp": 8888}
    assert options.parse_ports(["127.0.0.1:6006:6006"]) == {"6006/tcp": ("127.0.0.1", 6006)}
    assert options.parse_ports(["5000:5000/udp"]) == {"5000/udp": 5000}
    assert options.parse_ports(["9000"]) == {"9000/tcp": None}  # a port the engine picks
    assert options.parse_ports(["1:2", "3:4"]) == {"2/tcp": 1, "4/tcp": 3}


@pytest.mark.parametrize("item", ["", "8888:", "x:8888", "8888:y", "a:b:c", "8888:http"])
def test_parse_ports_errors(item):
    with pytest.raises(GpuenvError) as err:
        options.parse_ports([item])
    assert err.value.exit_code == 125
    assert "expected [IP:]HOST_PORT:CONTAINER_PORT" in err.value.message


# --------------------------------------------------------------------------- grace period


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 10), ("3", 3), ("0", 0), (" 25 ", 25), ("x", 10), ("-1", 10)]
)
def test_grace_seconds(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("GPUENV_STOP_GRACE", raising=False)
    else:
        monkeypatch.setenv("GPUENV_STOP_GRACE", value)
    assert run.grace_seconds() == seconds


# --------------------------------------------------------------------------- images and errors


@pytest.mark.parametrize(
    ("ref", "image"),
    [
        ("gpuenv/tensorflow:tf2.21-py3.11-cpu", True),
        ("ubuntu:22.04", True),
        ("registry.local:5000/acme/tf", True),
        ("acme/tf@sha256:" + "0" * 64, True),
        ("tf2.21-py3.11-cpu", False),  # a cell name
        ("tf2.21-*-gpu", False),  # a glob over cells
        ("localhost:5000/tf2.21-*", False),
    ],
)
def test_looks_like_image(ref, image):
    assert looks_like_image(ref) is image


@pytest.mark.parametrize(
    ("text", "code", "needle"),
    [
        (
            'exec: "nvcc": executable file not found in $PATH: unknown',
            127,
            "nvcc: command not found in acme/tf:cpu",
        ),
        ('exec: "./x.sh": permission denied: unknown', 126, "cannot be executed in acme/tf:cpu"),
        (
            'could not select device driver "" with capabilities: [[gpu]]',
            125,
            "NVIDIA Container Toolkit",
        ),
        ("500 Server Error: something else entirely", 125, "Docker Engine error: 500"),
    ],
)
def test_start_errors(text, code, needle):
    err = run._start_error(Exception(text), opts(command=["nvcc"] if code == 127 else ["x"]))
    assert err.exit_code == code
    assert needle in err.message


# --------------------------------------------------------------------------- preflight


GPU_LABELS = {"io.gpuenv.variant": "gpu", "io.gpuenv.cuda": "12.5"}


@pytest.mark.parametrize(
    ("option", "asked", "labels", "says"),
    [
        ("--gpus all", False, GPU_LABELS, "is a GPU image but no --gpus was given"),
        ("--gpus-per-node N", False, GPU_LABELS, "(add --gpus-per-node N)"),
        ("--gpus N", True, {"io.gpuenv.variant": "cpu"}, "is a CPU image: the framework"),
        ("--gpus all", False, {"io.gpuenv.variant": "cpu"}, None),
        ("--gpus all", True, GPU_LABELS, None),
    ],
)
def test_every_front_end_chooses_its_image_with_one_warning(
    fake_engine, capsys, option, asked, labels, says
):
    """target.choose: the one place local, kube and slurm runs are warned that the image
    and the GPU request disagree (issue 46, item 0)."""
    engine = fake_engine({"acme/tf:x": image("sha256:" + "a" * 64, labels)})
    chosen = target.choose(engine, "acme/tf:x", None, option, asked)
    assert chosen.image == "acme/tf:x"
    err = capsys.readouterr().err
    if says is None:
        assert err == ""
    else:
        assert err.startswith("warning: acme/tf:x ") and says in err, err
        assert err.count("warning:") == 1


@pytest.mark.parametrize(
    ("driver", "outcome"),
    [("470.256.02", "error"), ("535.104.05", "warning"), ("560.35.03", "ok"), (None, "ok")],
)
def test_gpu_preflight_applies_the_driver_verdicts(
    fake_engine, monkeypatch, capsys, driver, outcome
):
    found = [GpuInfo(driver, "NVIDIA A100-SXM4-80GB", "8.0")] if driver else None
    monkeypatch.setattr(preflight, "probe_gpus", lambda engine, image, gpus: found)
    target = Target("acme/tf:gpu", GPU_LABELS)
    if outcome == "error":
        with pytest.raises(GpuenvError) as err:
            preflight.gpu_preflight(fake_engine(), target, parse_gpus("all"))
        assert err.value.exit_code == 125
        assert "470.256.02" in err.value.message and "525.60.13" in err.value.message
        return
    preflight.gpu_preflight(fake_engine(), target, parse_gpus("all"))
    err = capsys.readouterr().err
    if outcome == "warning":
        assert err.startswith("warning: the host's NVIDIA driver 535.104.05")
        assert "555.42.06" in err
    else:
        assert err == ""


# --------------------------------------------------------------------------- driver cache

NVIDIA_SMI = "560.35.03, NVIDIA H100 80GB HBM3, 9.0\n"


def drivers(found):
    return found[0].driver if found else None


GPU_IMAGE = "acme/tf:gpu"


def test_probe_learns_the_driver_once_and_caches_it(tmp_path, monkeypatch, fake_engine):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUENV_REPROBE", raising=False)
    eng = fake_engine()
    eng.outcomes[GPU_IMAGE] = (0, NVIDIA_SMI)
    assert drivers(preflight.probe_gpus(eng, GPU_IMAGE, parse_gpus("all"))) == "560.35.03"
    assert len(eng.created) == 1 and eng.containers == {}  # the probe container is removed
    probe = eng.created[0]
    assert probe.device_requests == [parse_gpus("all").as_api()]
    assert probe.network == "none" and probe.labels == {"io.gpuenv.probe": "1"}
    eng.outcomes[GPU_IMAGE] = (0, NVIDIA_SMI.replace("560.35.03", "999.1"))
    assert drivers(preflight.probe_gpus(eng, GPU_IMAGE, parse_gpus("all"))) == "560.35.03"  # cached
    assert len(eng.created) == 1


@pytest.mark.parametrize(
    ("change", "reprobes"),
    [
        ({}, False),
        ({"kernel": "6.12.0-1-amd64"}, True),  # a reboot into another kernel
        ({"age": 2 * 24 * 3600}, True),  # a driver upgraded without a reboot
        ({"reprobe": True}, True),  # on demand: GPUENV_REPROBE=1
    ],
)
def test_a_cached_driver_that_may_be_stale_is_probed_again(
    tmp_path, monkeypatch, fake_engine, change, reprobes
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUENV_REPROBE", raising=False)
    eng = fake_engine()
    preflight.remember_gpus(eng, [GpuInfo("535.104.05", "Tesla T4", "7.5")])
    if "kernel" in change:
        eng._info["KernelVersion"] = change["kernel"]
    if "age" in change:
        assert preflight.cached_gpus(eng, now=time.time() + change["age"]) is None
        return
    if change.get("reprobe"):
        monkeypatch.setenv("GPUENV_REPROBE", "1")
    eng.outcomes[GPU_IMAGE] = (0, NVIDIA_SMI)
    found = drivers(preflight.probe_gpus(eng, GPU_IMAGE, parse_gpus("all")))
    assert found == ("560.35.03" if reprobes else "535.104.05")
    assert len(eng.created) == (1 if reprobes else 0)


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"ENGINE-1": "470.1"}'])
def test_a_cache_that_is_not_understood_means_probing(tmp_path, monkeypatch, fake_engine, content):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUENV_REPROBE", raising=False)
    (tmp_path / "gpuenv").mkdir()
    (tmp_path / "gpuenv" / "drivers.json").write_text(content)
    eng = fake_engine()
    eng.outcomes[GPU_IMAGE] = (0, NVIDIA_SMI)
    assert drivers(preflight.probe_gpus(eng, GPU_IMAGE, parse_gpus("all"))) == "560.35.03"


def test_a_probe_that_finds_no_gpu_warns_and_skips_the_driver_check(
    tmp_path, monkeypatch, fake_engine, capsys
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    eng = fake_engine()
    eng.outcomes[GPU_IMAGE] = (9, "NVIDIA-SMI has failed")
    assert preflight.probe_gpus(eng, GPU_IMAGE, parse_gpus("all")) is None
    assert "nvidia-smi in a probe container exited 9" in capsys.readouterr().err
    assert cache.read_record("drivers.json") == {}


def test_cache_file_location(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_file("drivers.json") == tmp_path / "gpuenv" / "drivers.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/ana")
    assert cache.cache_file("drivers.json") == Path("/home/ana/.cache/gpuenv/drivers.json")


def test_no_cache_for_a_uid_without_home(monkeypatch):
    """uid 4242 in CI: no HOME, no passwd entry; expanduser gives "~" back unchanged."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(cache.os.path, "expanduser", lambda path: path)
    assert cache.cache_file("drivers.json") is None
    assert cache.write_record("drivers.json", {"a": 1}) is False


@pytest.mark.parametrize(
    ("gpu", "outcome"),
    [
        (GpuInfo("560.35.03", "Tesla K80", "3.7"), "error"),  # no kernel image for sm_37
        (GpuInfo("570.86.15", "NVIDIA B200", "10.0"), "warning"),  # PTX JIT from compute_90
        (GpuInfo("560.35.03", "NVIDIA L4", "8.9"), "ok"),
    ],
)
def test_gpu_preflight_judges_the_compute_capability(
    fake_engine, monkeypatch, capsys, gpu, outcome
):
    monkeypatch.setattr(preflight, "probe_gpus", lambda engine, image, gpus: [gpu])
    labels = {**GPU_LABELS, "io.gpuenv.framework": "tensorflow",
              "io.gpuenv.framework-version": "2.21.0"}  # fmt: skip
    target = Target("acme/tf:gpu", labels)
    if outcome == "error":
        with pytest.raises(GpuenvError) as err:
            preflight.gpu_preflight(fake_engine(), target, parse_gpus("all"))
        assert err.value.exit_code == 125 and "sm_37" in err.value.message
        return
    preflight.gpu_preflight(fake_engine(), target, parse_gpus("all"))
    err = capsys.readouterr().err
    assert ("PTX JIT" in err) if outcome == "warning" else err == ""


def test_a_missing_bind_source_is_refused(tmp_path):
    run.check_bind_sources([f"{tmp_path}:/work", "cache:/root/.cache"])  # exists; a volume
    with pytest.raises(GpuenvError) as err:
        run.check_bind_sources([f"{tmp_path}/no/such/dir:/data"])
    assert err.value.exit_code == 125
    assert "does not exist on this machine" in err.value.message
    assert f"mkdir -p {tmp_path}/no/such/dir" in err.value.message
    assert not (tmp_path / "no").exists()


# ------------------------------------------------- `run --gpus` and a cell to build first

REFUSED = 'could not select device driver "" with capabilities: [[gpu]]'


@pytest.mark.parametrize("gives_gpus", [False, True], ids=["refuses", "gives"])
def test_a_missing_gpu_cell_is_built_only_on_an_engine_that_gives_gpus(
    fake_engine, shipped_matrix, monkeypatch, gives_gpus
):
    """The engine is asked (a container of the cell's base, with the request) before the
    cell is built: an engine without NVIDIA support is one error and nothing is built."""
    from fake_engine import image

    from gpuenv.engine.client import EngineError
    from gpuenv.project.project import open_project

    project = open_project(shipped_matrix)
    cell = project.default_cell(True)
    engine = fake_engine(local={cell.base.image: image("sha256:base")})
    if not gives_gpus:
        engine.outcomes[cell.base.image] = EngineError(f"500 Server Error: {REFUSED}")
    from gpuenv.building import builder
    from gpuenv.building.results import CellResult

    built = []

    def plan_and_build(engine, project, cells, reporter, **kw):
        built.append(cells[0].name)
        return [CellResult(cells[0], status="built")]

    monkeypatch.setattr(builder, "plan_and_build", plan_and_build)
    monkeypatch.delenv("GPUENV_REGISTRY", raising=False)
    gpus = parse_gpus("all")
    if gives_gpus:
        target.target_for(engine, None, True, project, gpus)
        assert built == [cell.name]
    else:
        with pytest.raises(GpuenvError) as exc:
            target.target_for(engine, None, True, project, gpus)
        assert exc.value.exit_code == 125 and "\n" not in exc.value.message
        assert "cannot give containers GPUs" in exc.value.message and REFUSED in exc.value.message
        assert built == [], "the cell was built before the refusal"
    [probe] = engine.created
    assert probe.image == cell.base.image and probe.device_requests == [gpus.as_api()]
    assert engine.containers == {}, "the probe container is left"


def test_a_missing_cell_is_built_as_gpuenv_build_would_pulling_a_published_image_first(
    fake_engine, shipped_matrix, monkeypatch, capsys
):
    """With $GPUENV_REGISTRY and a verify key, build-if-missing hands the builder the
    repository to pull from and the check a pulled image must pass, as `gpuenv build` does
    (gpuenv/building/pull.py); without them it builds."""
    from gpuenv.building import builder
    from gpuenv.building.results import CellResult
    from gpuenv.project.project import open_project
    from gpuenv.publish.attest import verify

    project = open_project(shipped_matrix)
    cell = project.default_cell(False)
    asked: list[dict[str, object]] = []

    def plan_and_build(engine, project, cells, reporter, **kw):
        asked.append(kw)
        return [CellResult(cells[0], status="built")]

    def vet(ref: str, spec: str) -> tuple[str, str]:
        raise AssertionError("not called here")

    monkeypatch.setattr(builder, "plan_and_build", plan_and_build)
    monkeypatch.setattr(verify, "vetting_from_env", lambda: vet)
    monkeypatch.setenv("GPUENV_REGISTRY", "registry.example:5000/ml")
    target.target_for(fake_engine(), None, False, project)
    assert asked[-1]["pull_from"] == "registry.example:5000/ml/tensorflow"  # gpuenv/tensorflow
    assert asked[-1]["vet"] is vet
    monkeypatch.delenv("GPUENV_REGISTRY")
    target.target_for(fake_engine(), None, False, project)
    assert asked[-1]["pull_from"] is None and asked[-1]["vet"] is None
    assert f"{cell.image} is not built yet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("labels", "runs"),
    [
        ({}, False),  # issue 44, M2a: the crafted import's image, with no labels
        ({"io.gpuenv.cell": "tf2.21-py3.11-cpu"}, False),  # no builder's spec hash
        ({"io.gpuenv.cell": "other", "io.gpuenv.spec-hash": "a" * 64}, False),
        ({"io.gpuenv.cell": "tf2.21-py3.11-cpu", "io.gpuenv.spec-hash": "a" * 64}, True),
    ],
    ids=["no-labels", "no-spec-hash", "another-cell", "the-cell"],
)
def test_run_starts_a_cells_tag_only_where_gpuenv_built_that_cell(
    fake_engine, shipped_matrix, labels, runs
):
    from fake_engine import image

    from gpuenv.project.project import open_project

    project = open_project(shipped_matrix)
    cell = project.one_cell("tf2.21-py3.11-cpu", "-i")
    engine = fake_engine(local={cell.image: image("sha256:planted", labels)})
    if runs:
        assert target.target_for(engine, cell.name, False, project).image == cell.image
        return
    with pytest.raises(GpuenvError) as refused:
        target.target_for(engine, cell.name, False, project)
    assert refused.value.exit_code == 125 and "\n" not in refused.value.message
    assert refused.value.message.startswith(
        f"{cell.image} is not an image gpuenv built for cell {cell.name} "
    )
