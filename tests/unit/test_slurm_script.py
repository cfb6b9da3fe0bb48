"""The batch script of `gpuenv slurm run` (gpuenv/run/slurm/script.py): --time's syntax, the
names and paths it carries, and one golden script per runtime. Set GPUENV_UPDATE_GOLDEN=1
to rewrite the golden files (then read the diff). The lab cluster runs the charliecloud
script and passes every runtime's through `sbatch --test-only`
(tests/integration/test_engine_slurm.py)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuenv.run.slurm import SlurmError
from gpuenv.run.slurm.script import (
    EXPORTED,
    RUNTIMES,
    ImageFiles,
    JobInputs,
    batch_script,
    check_partition,
    check_path,
    job_name,
    parse_time,
    submission_environment,
)

GOLDEN = Path(__file__).parent / "golden" / "slurm"
IMAGES = "/shared/gpuenv-1000/images"
JOB = JobInputs(
    name="gpuenv-tf2.21-py3.11-cuda12.5-gpu",
    command=("python", "train.py", "--epochs", "3"),
    image=ImageFiles(f"{IMAGES}/ab12.sqfs", f"{IMAGES}/ab12.env", f"{IMAGES}/ab12.sh.env"),
    image_id="sha256:ab12",
    what="tf2.21-py3.11-cuda12.5-gpu",
    cwd="/home/ada/project",
    jobs_dir="/shared/gpuenv-1000/jobs",
    nodes=2,
    gpus_per_node=4,
    partition="gpu",
    time="0-02:00:00",
    env=(("WANDB_MODE", "offline"), ("NOTE", "it's quoted")),
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("30", "0-00:30:00"),  # MINUTES
        ("90", "0-01:30:00"),
        ("5:30", "0-00:05:30"),  # MINUTES:SECONDS
        ("1:00:00", "0-01:00:00"),  # HOURS:MINUTES:SECONDS
        ("36:00:00", "1-12:00:00"),
        ("2-0", "2-00:00:00"),  # DAYS-HOURS
        ("2-12:30", "2-12:30:00"),  # DAYS-HOURS:MINUTES
        ("2-00:00:00", "2-00:00:00"),
        ("unlimited", "UNLIMITED"),
        (" 45 ", "0-00:45:00"),
    ],
)
def test_time_in_slurms_syntax(text, want):
    assert parse_time(text) == want


@pytest.mark.parametrize(
    "text", ["", "0", "1h", "90m", "1:60", "1:00:60", "1:60:00", "2-24", "1-2:3:4:5", "-5",
             "1.5", "2d", "0:00:00"],
)  # fmt: skip
def test_time_refused_with_the_syntax_named(text):
    with pytest.raises(SlurmError) as exc:
        parse_time(text)
    assert exc.value.message.startswith(f"--time {text!r}: expected Slurm's syntax")
    assert "1:30:00" in exc.value.message and exc.value.exit_code == 125


def test_job_name():
    assert job_name("tf2.21-py3.11-cpu") == "gpuenv-tf2.21-py3.11-cpu"
    assert job_name("gpuenv/debian:bookworm") == "gpuenv-debian-bookworm"
    assert job_name("host:5000/a/b@sha256:00") == "gpuenv-b"


@pytest.mark.parametrize("path", ["/a b", "/a,b", "/a:b", "/a%j", "relative", "/a'b", "/a\nb"])
def test_paths_slurm_cannot_carry(path):
    with pytest.raises(SlurmError, match="cannot carry"):
        check_path(path, "--shared")


def test_partition_names():
    assert check_partition("gpu-a100") == "gpu-a100"
    with pytest.raises(SlurmError, match="--partition"):
        check_partition("gpu;rm")


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_golden(runtime):
    got = batch_script(replace(JOB, runtime=runtime))
    path = GOLDEN / f"{runtime}.sh"
    if os.environ.get("GPUENV_UPDATE_GOLDEN") == "1":
        path.write_text(got, encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with GPUENV_UPDATE_GOLDEN=1"
    assert got == path.read_text(encoding="utf-8"), (
        f"the {runtime} script differs from {path}; if intended, rerun with "
        "GPUENV_UPDATE_GOLDEN=1 and review the diff"
    )


PULLED = "registry.example:5000/team/tf@sha256:" + "ab" * 32


@pytest.mark.parametrize("runtime", ["apptainer", "pyxis", "podman"])
def test_golden_pulled_by_the_runtime(runtime):
    """--from-registry: these runtimes get the image by digest, not the SquashFS."""
    got = batch_script(replace(JOB, runtime=runtime, pull=PULLED))
    path = GOLDEN / f"{runtime}-pulled.sh"
    if os.environ.get("GPUENV_UPDATE_GOLDEN") == "1":
        path.write_text(got, encoding="utf-8")
    assert got == path.read_text(encoding="utf-8"), f"differs from {path}"
    assert IMAGES not in got  # neither the SquashFS nor the ENV files beside it
    want = {"apptainer": f"docker://{PULLED}",
            "pyxis": "--container-image=registry.example:5000#team/tf@sha256:",
            "podman": f"--entrypoint= {PULLED}"}[runtime]  # fmt: skip
    assert want in got


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_script_is_valid_bash(runtime, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(batch_script(replace(JOB, runtime=runtime)))
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_directives():
    text = batch_script(JOB)
    directives = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=gpuenv-tf2.21-py3.11-cuda12.5-gpu",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --no-requeue",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=0-02:00:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --output=/shared/gpuenv-1000/jobs/gpuenv-%j.out",
        "#SBATCH --chdir=/home/ada/project",
        "#SBATCH --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ,TMPDIR,XDG_RUNTIME_DIR",
    ]
    # Without GPUs, time or partition: no such line (the partition's defaults hold).
    bare = batch_script(replace(JOB, gpus_per_node=0, time=None, partition=None))
    assert not any(k in bare for k in ("--gpus-per-node", "--time", "--partition"))


# `scontrol show node -o n17` as Slurm 22.05 prints it (the Slurm lab, trimmed), with the
# node's NodeAddr and its name apart.
NODE_LINE = (
    "NodeName=n17 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 Gres=gpu:4 "
    "NodeAddr=10.233.34.11 NodeHostName=n17 Port=47651 Version=22.05.8 RealMemory=2000"
)


@pytest.mark.parametrize(("node_line", "want"), [(NODE_LINE, "10.233.34.11"), ("", "n17")])
def test_the_rendezvous_is_the_first_nodes_address(tmp_path, node_line, want):
    """MASTER_ADDR is the first node's NodeAddr (a node's name need not resolve on the
    others: the lab's do not), or its name where scontrol says nothing of it."""
    text = batch_script(JOB)
    head = text[text.index("gpuenv_first=") : text.index("export WANDB_MODE")]
    fake = tmp_path / "scontrol"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in\n hostnames) printf "n17\\nn18\\n" ;;\n'
        f" node) [ \"$4\" = n17 ] && printf '%s\\n' '{node_line}' ;;\nesac\n"
    )
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[17-18]",
           "SLURM_JOB_ID": "10042"}  # fmt: skip
    proc = subprocess.run(["sh", "-c", head + 'echo "$MASTER_ADDR:$MASTER_PORT"'], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert proc.stdout == f"{want}:20042\n", proc.stderr


def test_environment_for_multi_node_training():
    text = batch_script(JOB)
    assert 'export MASTER_PORT="$((20000 + SLURM_JOB_ID % 10000))"' in text
    assert "export WANDB_MODE=offline" in text
    assert "export NOTE='it'\"'\"'s quoted'" in text


@pytest.mark.parametrize("name", ["X$(id>/tmp/pwned)", "1X", "A-B", "A.B", "A\u00e9"])
def test_env_names_are_shell_identifiers(name):
    """-e names become `export NAME=...` lines: anything but a shell identifier is refused
    (`X$(id>/tmp/pwned)` ran `id` when the script did)."""
    with pytest.raises(SlurmError, match=r"-e .*a shell variable's") as exc:
        batch_script(replace(JOB, env=((name, "1"),)))
    assert exc.value.exit_code == 125


def test_the_job_gets_only_what_gpuenv_names_and_the_users_e():
    """sbatch runs with the names EXPORTED and Slurm's settings, never the rest of the login
    node's environment; nothing can widen --export; srun passes the script's on."""
    login = {"PATH": "/usr/bin", "HOME": "/home/ada", "SLURM_CONF": "/etc/slurm/x.conf",
             "SBATCH_ACCOUNT": "proj", "GPUENV_INDEX_PASSWORD": "s3cret",
             "AWS_SECRET_ACCESS_KEY": "k", "SBATCH_EXPORT": "ALL", "SLURM_EXPORT_ENV": "ALL",
             "SBATCH_GET_USER_ENV": "1"}  # fmt: skip
    assert submission_environment(login) == {"PATH": "/usr/bin", "HOME": "/home/ada",
                                             "SLURM_CONF": "/etc/slurm/x.conf",
                                             "SBATCH_ACCOUNT": "proj"}  # fmt: skip
    text = batch_script(JOB)
    assert f"#SBATCH --export={','.join(EXPORTED)}\n" in text
    assert "srun --kill-on-bad-exit=1 --export=ALL" in text


def test_first_failing_task_decides(tmp_path):
    """The task wrapper, run as srun would run it: the first failing task's code is kept,
    a later failure does not overwrite it, and a task that succeeds writes nothing."""
    text = batch_script(replace(JOB, runtime="apptainer"))
    task = text.split("sh -c '", 1)[1].split("' gpuenv-task", 1)[0]
    failed = tmp_path / "failed"

    def task_exits(code: int) -> int:
        return subprocess.run(["sh", "-c", task, "gpuenv-task", str(failed), "sh", "-c",
                               f"exit {code}"]).returncode  # fmt: skip

    assert task_exits(0) == 0 and not failed.exists()
    assert task_exits(5) == 5 and failed.read_text() == "5\n"
    assert task_exits(7) == 7 and failed.read_text() == "5\n"
