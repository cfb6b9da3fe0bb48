"""GPUs as CDI devices, on podman 4.3 (Debian's), with a CDI spec this test writes for two
fake NVIDIA GPUs: device nodes made with mknod (major 195, as the driver's; no driver behind
them, as in the Slurm lab) and a stand-in `libcuda.so.1` that is a text file.

podman's Docker API drops a `--gpus` device request and runs the container without GPUs
(issue 36: `gpuenv run --gpus device=1` ran on the CPU and exited 0); gpuenv asks podman for
CDI devices through its own API instead. Shown here, on a real podman:

- `run --gpus all` and `--gpus device=1` give the container exactly the spec's devices,
  mounts and environment for what was asked, and nothing else of it;
- the device checks still fail: nothing here is a GPU (`validate --gpus all`), and run's
  driver probe says it could not learn a driver;
- with no spec for the device, the request is one `error:` line and exit 125; the workload
  never runs.

The image is a ~3 MB root filesystem of this machine's `sh`, `ls`, `cat` and `sleep` and their
libraries, imported into podman with the labels of a GPU cell: no engine build, no pull.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.cells import SHIPPED_MATRIX
from support.cli import clean_env, gpuenv_cmd, output
from support.podman_engine import PodmanEngine, podman_engine

IMAGE = "localhost/gpuenv-cdi/tiny:gpu"
LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
STAND_IN = "stand-in for libcuda.so.1: no driver here\n"
# The device checks of gpuenv/validate/suites/check_devices.py, as `validate` names them.
DEVICE_CHECKS = (
    "nvidia smi works",
    "framework sees the requested gpus",
    "matmul runs on gpu0",
    "cudnn op runs",
    "gpu compute capability runs the framework",
    "all reduce across the requested gpus",
)


@dataclass
class CdiLab:
    engine: PodmanEngine
    root: Path  # the fake devices, the stand-in library, the spec directory
    workdir: Path

    @property
    def spec(self) -> Path:
        return self.root / "cdi" / "nvidia.yaml"

    def env(self) -> dict[str, str]:
        return clean_env(**self.engine.env(), XDG_CACHE_HOME=str(self.root / "cache"),
                         GPUENV_REPROBE="1")  # fmt: skip


def write_spec(root: Path) -> Path:
    """A spec as `nvidia-ctk cdi generate` shapes one (kind nvidia.com/gpu, devices by index,
    by UUID and `all`, the control device and driver library for every device), naming the
    fake nodes and the stand-in library."""
    dev = root / "dev"
    dev.mkdir()
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(195, minor))
    (root / "libcuda.so.1").write_text(STAND_IN)

    def node(name: str) -> dict[str, str]:
        return {"path": f"/dev/{name}", "hostPath": str(dev / name)}

    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node("nvidia0")]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node("nvidia1")]}},
            {"name": "GPU-11111111-2222-3333-4444-555555555555",
             "containerEdits": {"deviceNodes": [node("nvidia1")]}},
            {"name": "all", "containerEdits": {"deviceNodes": [node("nvidia0"),
                                                               node("nvidia1")]}},
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("nvidiactl")],
            "mounts": [{"hostPath": str(root / "libcuda.so.1"), "containerPath": LIB,
                        "options": ["ro", "nosuid", "nodev", "bind"]}],
        },
    }  # fmt: skip
    (root / "cdi").mkdir()
    path = root / "cdi" / "nvidia.yaml"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML: podman reads either
    return path


def gpu_labels() -> dict[str, str]:
    """The labels of a GPU cell of the shipped matrix, so `validate -i` knows what the image
    must hold (it holds none of it: those checks fail too, which this test does not count)."""
    from gpuenv.matrix.contract import image_labels
    from gpuenv.project.project import open_project

    cell = next(c for c in open_project(SHIPPED_MATRIX).cells if c.is_gpu)
    return image_labels(cell)


def import_tiny_image(engine: PodmanEngine, where: Path) -> None:
    """This machine's sh, ls, cat and sleep (validate's containers idle in it) with the
    libraries they load, as an image."""
    rootfs = where / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        for program in ("sh", "ls", "cat", "sleep"):
            path = shutil.which(program)
            assert path is not None, program
            libs = subprocess.run(["ldd", path], capture_output=True, text=True, check=True)
            for file in [path, *(w for w in libs.stdout.split() if w.startswith("/"))]:
                real = os.path.realpath(file)
                name = "bin/" + program if file == path else file.lstrip("/")
                if name not in tar.getnames():
                    tar.add(real, arcname=name)
    changes = [f"--change=LABEL {k}={json.dumps(v)}" for k, v in gpu_labels().items()]
    done = engine.podman("import", *changes, str(rootfs), IMAGE)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CdiLab]:
    root = tmp_path_factory.mktemp("cdi")
    os.chmod(root, 0o755)  # the container's user reads the stand-in library through it
    write_spec(root)
    with podman_engine(cdi_dir=root / "cdi") as engine:
        import_tiny_image(engine, root)
        workdir = root / "work"
        workdir.mkdir()
        yield CdiLab(engine, root, workdir)


def gpuenv_run(lab: CdiLab, gpus: str, command: str) -> subprocess.CompletedProcess[str]:
    return gpuenv_cmd("run", "-i", IMAGE, "--gpus", gpus, "--", "sh", "-c", command,
                      check=False, env=lab.env(), cwd=lab.workdir, timeout=300)  # fmt: skip


SHOW = f'ls -l /dev; echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; cat {LIB}; cat /proc/mounts'


def nvidia_nodes(stdout: str) -> dict[str, str]:
    """/dev entries named nvidia*, with their major, minor ("195, 1")."""
    found = {}
    for line in stdout.splitlines():
        words = line.split()
        if line.startswith("c") and words[-1].startswith("nvidia"):
            found[words[-1]] = " ".join(words[4:6])
    return found


@pytest.mark.parametrize(
    ("gpus", "nodes"),
    [
        ("all", {"nvidia0": "195, 0", "nvidia1": "195, 1", "nvidiactl": "195, 255"}),
        ("device=1", {"nvidia1": "195, 1", "nvidiactl": "195, 255"}),
        ("device=nvidia.com/gpu=GPU-11111111-2222-3333-4444-555555555555",
         {"nvidia1": "195, 1", "nvidiactl": "195, 255"}),
    ],
)  # fmt: skip
def test_run_gives_exactly_the_cdi_devices_asked_for(
    lab: CdiLab, gpus: str, nodes: dict[str, str]
) -> None:
    ran = gpuenv_run(lab, gpus, SHOW)
    assert ran.returncode == 0, output(ran)
    assert nvidia_nodes(ran.stdout) == nodes, output(ran)
    assert "VISIBLE=void" in ran.stdout and STAND_IN.strip() in ran.stdout, output(ran)
    mounted = [line.split()[1] for line in ran.stdout.splitlines() if LIB in line.split()[1:2]]
    assert mounted == [LIB], output(ran)
    # Nothing here is a GPU: the driver probe (nvidia-smi in a container) learns nothing and
    # says so; it never passes.
    assert "could not learn the host's NVIDIA driver" in ran.stderr, output(ran)


def test_device_checks_fail_without_a_real_gpu(lab: CdiLab) -> None:
    checked = gpuenv_cmd("validate", "-i", IMAGE, "--gpus", "all", "--json", check=False,
                         env=lab.env(), cwd=lab.workdir, timeout=600)  # fmt: skip
    assert checked.returncode == 1, output(checked)
    (outcome,) = json.loads(checked.stdout)["images"]
    failed = {f.split(":")[0] for f in outcome["failures"]}
    skipped = {s.split(":")[0] for s in outcome["skips"]}
    assert set(DEVICE_CHECKS) <= failed, output(checked)
    # They fail where a GPU would answer (nvidia-smi, the framework), not for want of a
    # running container: the one with the CDI devices started.
    reasons = [f for f in outcome["failures"] if f.split(":")[0] in DEVICE_CHECKS]
    assert all("not found" in f for f in reasons), reasons
    assert not set(DEVICE_CHECKS) & skipped, output(checked)
    assert "could not start a container with the requested GPUs" not in checked.stdout


def test_a_device_no_spec_names_is_one_error_and_no_run(lab: CdiLab) -> None:
    ran = gpuenv_run(lab, "device=5", "echo WORKLOAD-RAN")
    assert ran.returncode == 125, output(ran)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no CDI spec for nvidia.com/gpu=5" in errors[0], output(ran)
    assert "WORKLOAD-RAN" not in ran.stdout and "Traceback" not in ran.stderr


def test_podman_without_a_cdi_spec_refuses_instead_of_running_on_the_cpu(lab: CdiLab) -> None:
    """Issue 36's case: podman 4.3 with no NVIDIA CDI spec at all."""
    saved = lab.spec.read_text()
    lab.spec.unlink()
    try:
        ran = gpuenv_run(lab, "device=1", "echo WORKLOAD-RAN; ls /dev")
    finally:
        lab.spec.write_text(saved)
    assert ran.returncode == 125, output(ran)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no CDI spec for nvidia.com/gpu=1" in errors[0], output(ran)
    assert "nvidia-ctk cdi generate" in errors[0]
    assert "WORKLOAD-RAN" not in ran.stdout, output(ran)


def test_doctor_says_podman_takes_cdi_devices(lab: CdiLab) -> None:
    found = gpuenv_cmd("doctor", "--json", check=False, env=lab.env(), cwd=lab.workdir)
    findings = {f["topic"]: f for f in json.loads(found.stdout)["findings"]}
    assert findings["gpu path"]["message"].startswith(
        "--gpus reaches containers as CDI devices (nvidia.com/gpu=...), which podman 4.3"
    ), output(found)
