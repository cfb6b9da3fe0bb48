"""`gpuenv run` on the real engine: exit codes, streams, ownership, signals, --gpus.

Every test runs the installed CLI in a subprocess, from a fresh working directory, on the
shipped CPU cell's image with `--network none`, and checks that no container is left. The
device-request tests run against a second dockerd this session starts with a stand-in
nvidia-container-runtime-hook (run_fixtures.py): it lets the engine accept --gpus and shows
what the engine received; no GPU appears, and no test claims one.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

import docker.errors
import pytest

pytest.register_assert_rewrite("run_fixtures")

from run_fixtures import (  # noqa: E402
    CPU_CELL,
    GPU_CELL,
    GPUENV,
    SHIPPED_MATRIX,
    SMALL_IMAGE,
    STOP_GRACE,
    base_env,
    containers_of,
    wait_for_container,
)

# The fixtures (cpu_image, workdir, gpuenv_run, spawn_run, leftovers, docker_user,
# nameless_uid, gpu_engine, ...) live in run_fixtures.py, beside conftest.py.
pytest_plugins = ["run_fixtures"]

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("leftovers")]

TOOLKIT_MESSAGE = "install the NVIDIA Container Toolkit"


def py(code: str) -> list[str]:
    return ["--", "python", "-c", code]


# --------------------------------------------------------------------------- exit codes, streams


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("import sys; sys.exit(7)", 7),
        ("pass", 0),
        ("raise SystemExit('boom')", 1),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137),
    ],
    ids=["exit7", "exit0", "exception", "sigkill"],
)
def test_exit_code_is_the_containers(gpuenv_run, code, expected):
    proc = gpuenv_run(*py(code))
    assert proc.returncode == expected, proc.stderr


def test_stdout_and_stderr_stay_apart(gpuenv_run):
    proc = gpuenv_run(*py("import sys; print('to-out'); print('to-err', file=sys.stderr)"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "to-out\n"
    assert "to-err\n" in proc.stderr
    assert "to-out" not in proc.stderr


def test_output_streams_live(spawn_run):
    running = spawn_run(
        *py("import time; print('first', flush=True); time.sleep(3); print('second')")
    )
    first = running.expect("first", timeout=60)
    assert running.proc.poll() is None, "the first line only came when gpuenv had ended"
    assert running.finish() == 0, running.stderr
    second = running.expect("second")
    assert second - first >= 2.5, "the lines arrived together, not as they were printed"


def test_script_runs_with_the_images_python(gpuenv_run, workdir):
    (workdir / "train.py").write_text("import sys\nprint(sys.argv[1:], sys.executable)\n")
    proc = gpuenv_run("train.py", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("['--epochs', '3'] ")


def test_container_is_set_up_like_the_caller(gpuenv_run, workdir):
    code = (
        "import os, json; s = os.statvfs('/dev/shm'); "
        "open(os.path.expanduser('~/probe'), 'w').write('x'); "
        "print(json.dumps({'cwd': os.getcwd(), 'uid': os.getuid(), 'gid': os.getgid(), "
        "'home': os.environ['HOME'], 'shm': s.f_blocks * s.f_frsize, "
        "'init': open('/proc/1/cmdline').read().split('\\0')[0], "
        "'ls': sorted(os.listdir('.'))}))"
    )
    (workdir / "marker").write_text("")
    proc = gpuenv_run(*py(code))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["cwd"] == str(workdir)  # the current directory, at the same path
    assert seen["ls"] == ["marker"]
    assert (seen["uid"], seen["gid"]) == (os.getuid(), os.getgid())
    assert seen["home"] == "/home/gpuenv-run"
    assert seen["shm"] == 2 * 1024**3
    assert "init" in seen["init"]  # docker-init (tini) is PID 1 and forwards signals


def test_workdir_option(gpuenv_run):
    proc = gpuenv_run("--workdir", "/tmp", *py("import os; print(os.getcwd())"))
    assert (proc.returncode, proc.stdout) == (0, "/tmp\n"), proc.stderr


@pytest.mark.parametrize(
    ("argv", "expected", "message"),
    [
        # docker-init (tini) execs the command: its failure is the container's 127/126, as
        # with `docker run --init`, and tini's one line says why.
        (["--", "no-such-command"], 127, "exec no-such-command failed: No such file"),
        (["--", "/etc/hostname"], 126, "exec /etc/hostname failed: Permission denied"),
        # gpuenv's own check, before any container: the script is not in the mounted cwd.
        (["missing.py"], 127, "error: missing.py: no such file in "),
    ],
    ids=["command", "not-executable", "script"],
)
def test_commands_that_cannot_run_exit_like_docker_run(gpuenv_run, argv, expected, message):
    proc = gpuenv_run(*argv)
    assert proc.returncode == expected, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr


def test_missing_image_is_125(gpuenv_run):
    proc = gpuenv_run(*py("pass"), image="gpuenv-test/no-such-image:none")
    assert proc.returncode == 125
    assert proc.stderr == "error: image gpuenv-test/no-such-image:none not found in the engine\n"


def test_interactive_terminal(workdir, cpu_image):
    """-it relays a terminal: the workload sees a TTY and reads what the user types."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [*GPUENV, "run", "-it", "-i", cpu_image, "--network", "none", "--",
         "python", "-c", "import sys; print(sys.stdin.isatty(), sum(map(int, input().split())))"],
        cwd=workdir, env=base_env(), stdin=slave, stdout=slave, stderr=slave,
        start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    # Typed at once: the terminal (then the container's) holds the line until input() reads.
    os.write(master, b"40 2\r")
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"True 42" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:  # EIO: gpuenv has exited and closed the terminal
                    break
        assert proc.wait(timeout=30) == 0, seen
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert b"True 42" in seen, seen


# --------------------------------------------------------------------------- -e and -v


def test_env_options(gpuenv_run):
    env = base_env(FROM_HOST="host value")
    env.pop("NOT_SET_ANYWHERE", None)
    code = (
        "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
        "['PLAIN', 'SPACED', 'FROM_HOST', 'NOT_SET_ANYWHERE', 'HOME']}))"
    )
    proc = gpuenv_run(
        "-e", "PLAIN=1", "-e", "SPACED=a b=c", "-e", "FROM_HOST", "-e", "NOT_SET_ANYWHERE",
        "-e", "HOME=/tmp", *py(code), env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "PLAIN": "1",
        "SPACED": "a b=c",
        "FROM_HOST": "host value",
        "NOT_SET_ANYWHERE": None,  # as docker run: -e KEY of an unset KEY passes nothing
        "HOME": "/tmp",  # the user's -e wins over gpuenv's HOME
    }


def test_bad_env_option_is_125(gpuenv_run):
    proc = gpuenv_run("-e", "=value", *py("pass"))
    assert proc.returncode == 125
    # The value is not echoed: it may be a secret.
    assert proc.stderr.startswith("error: -e '=...'") and "value" not in proc.stderr


def test_volume_options(gpuenv_run, workdir, tmp_path_factory):
    (workdir / "data").mkdir()
    (workdir / "data" / "in.txt").write_text("from host")
    out = tmp_path_factory.mktemp("volume-out")
    code = (
        "import pathlib; print(pathlib.Path('/data/in.txt').read_text()); "
        "pathlib.Path('/out/result.txt').write_text('from container')\n"
        "try:\n    open('/data/new.txt', 'w')\nexcept OSError as e:\n    print(e.strerror)"
    )
    proc = gpuenv_run("-v", "./data:/data:ro", "-v", f"{out}:/out", *py(code))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["from host", "Read-only file system"]
    assert (out / "result.txt").read_text() == "from container"


def test_bad_volume_option_is_125(gpuenv_run):
    proc = gpuenv_run("-v", "./data:relative", *py("pass"))
    assert proc.returncode == 125
    assert "expected SRC:DST[:ro|rw] with an absolute DST" in proc.stderr


# --------------------------------------------------------------------------- file ownership

WRITE = (
    "import os, pathlib; pathlib.Path('out.txt').write_text('x'); os.mkdir('made'); "
    "keras = pathlib.Path.home() / '.keras'; keras.mkdir(); "
    "(keras / 'keras.json').write_text('{}'); "
    "print(os.getuid(), os.getgid(), os.environ['HOME'], keras.is_dir())"
)


@pytest.mark.parametrize("caller", ["docker_user", "nameless_uid"])
def test_files_belong_to_the_caller(request, gpuenv_run, workdir, caller):
    who = request.getfixturevalue(caller)
    os.chown(workdir, who.uid, who.gid)
    proc = gpuenv_run(*py(WRITE), prefix=who.prefix, argv=who.argv, env=who.env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(who.uid), str(who.gid), "/home/gpuenv-run", "True"]
    for name in ("out.txt", "made"):
        st = (workdir / name).stat()
        assert (st.st_uid, st.st_gid) == (who.uid, who.gid), name


# --------------------------------------------------------------------------- signals

IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(120)"
)


def test_sigterm_ignored_is_killed_after_grace_and_removed(spawn_run, workdir, docker_client):
    running = spawn_run(*py(IGNORE_TERM))
    running.expect("ready")
    container = wait_for_container(docker_client, workdir)
    sent = time.monotonic()
    running.signal(signal.SIGTERM)
    code = running.finish(timeout=STOP_GRACE + 30)
    waited = time.monotonic() - sent
    assert code == 143, running.stderr  # gpuenv's status: 128 + SIGTERM, as a shell reports it
    assert STOP_GRACE - 0.5 <= waited <= STOP_GRACE + 8, waited
    assert not containers_of(docker_client, workdir)
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(container.id)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_and_removes_the_container(spawn_run, workdir, docker_client, sig):
    running = spawn_run(*py("import time; print('ready', flush=True); time.sleep(120)"))
    running.expect("ready")
    container = wait_for_container(docker_client, workdir)
    sent = time.monotonic()
    running.signal(sig)
    code = running.finish(timeout=STOP_GRACE + 30)
    # The workload got SIGTERM (docker stop) and died of it at once; gpuenv exits as a shell
    # reports the signal it got: 130 after Ctrl-C, 143 after SIGTERM.
    assert code == 128 + sig, running.stderr
    assert time.monotonic() - sent < STOP_GRACE + 5
    assert "Traceback" not in running.stderr
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(container.id)


# --------------------------------------------------------------------------- --gpus


def test_gpus_without_toolkit_is_a_clear_125(gpuenv_run, leftovers):
    proc = gpuenv_run("--gpus", "all", *py("pass"))
    assert proc.returncode == 125
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, proc.stderr
    assert 'could not select device driver "" with capabilities: [[gpu]]' in error[0]
    assert TOOLKIT_MESSAGE in error[0] and "nvidia-ctk runtime configure" in error[0]
    assert "Traceback" not in proc.stderr
    assert leftovers() == []  # neither the driver probe nor the workload's container


def test_bad_gpus_spec_is_125_before_anything_runs(gpuenv_run):
    proc = gpuenv_run("--gpus", "device=first", *py("pass"))
    assert proc.returncode == 125
    assert proc.stderr.startswith("error: --gpus 'device=first'")


UUID = "GPU-6d5a7e3c-4f1b-2a9d-8c7e-0b1f2a3c4d5e"
SHOW = (
    "echo visible=$NVIDIA_VISIBLE_DEVICES; echo caps=$NVIDIA_DRIVER_CAPABILITIES; "
    "echo nvidia=$(ls /dev | grep -c nvidia); exec sleep 60"
)


@pytest.mark.parametrize(
    ("spec", "count", "ids", "caps", "visible", "driver_caps"),
    [
        ("all", -1, [], ["gpu"], "all", ""),
        ("2", 2, [], ["gpu"], "0,1", ""),  # N means the first N GPUs, as in Docker
        ("device=0,2", 0, ["0", "2"], ["gpu"], "0,2", ""),
        (f"device={UUID}", 0, [UUID], ["gpu"], UUID, ""),
        (
            "capabilities=compute,utility",
            -1,
            [],
            ["compute", "gpu", "utility"],
            "all",
            "compute,utility",
        ),
    ],
    ids=["all", "count", "indices", "uuid", "capabilities"],
)
def test_engine_receives_the_device_request(
    spawn_run, gpu_engine, workdir, spec, count, ids, caps, visible, driver_caps
):
    env = base_env(DOCKER_HOST=gpu_engine.host)
    try:
        running = spawn_run(
            "-i", SMALL_IMAGE, "--network", "none", "--gpus", spec, "--", "sh", "-c", SHOW,
            image=None, env=env,
        )  # fmt: skip
        running.expect("nvidia=")
        container = wait_for_container(gpu_engine.client, workdir)
        requests = container.attrs["HostConfig"]["DeviceRequests"]
        assert requests == [
            {"Driver": "", "Count": count, "DeviceIDs": ids, "Capabilities": [caps],
             "Options": {}}
        ]  # fmt: skip
        # The engine's nvidia device driver set the devices for the toolkit and called the
        # (stand-in) hook before the workload started; no device appeared.
        assert f"visible={visible}\n" in running.stdout
        assert f"caps={driver_caps}\n" in running.stdout
        assert "nvidia=0\n" in running.stdout
        assert f'"id":"{container.id}"' in gpu_engine.hook_log.read_text()
        running.signal(signal.SIGTERM)
        assert running.finish(timeout=STOP_GRACE + 30) == 143, running.stderr
    finally:
        left = gpu_engine.clean()
    assert not left, f"gpuenv left containers behind (probe or run): {left}"


# --------------------------------------------------------------------------- choosing the image

VERSION = "import os, sys; print(sys.version_info[:2], os.getenv('NVIDIA_DRIVER_CAPABILITIES'))"


def test_cell_name_selects_its_image(gpuenv_run, cpu_image):
    proc = gpuenv_run(
        "-i", CPU_CELL, "-f", str(SHIPPED_MATRIX), "--network", "none", *py(VERSION), image=None
    )
    assert (proc.returncode, proc.stdout) == (0, "(3, 11) None\n"), proc.stderr


def test_default_cell_without_i_is_the_cpu_one(gpuenv_run, cpu_image):
    env = base_env(GPUENV_MATRIX=str(SHIPPED_MATRIX))
    proc = gpuenv_run("--network", "none", *py(VERSION), image=None, env=env)
    assert (proc.returncode, proc.stdout) == (0, "(3, 11) None\n"), proc.stderr
    assert proc.stderr == ""


def test_glob_matching_one_cell_and_the_gpu_warning(gpuenv_run, gpu_image):
    proc = gpuenv_run(
        "-i", "tf2.21-py3.11-cuda*", "-f", str(SHIPPED_MATRIX), "--network", "none",
        *py(VERSION), image=None,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, "(3, 11) compute,utility\n"), proc.stderr
    assert f"warning: gpuenv/tensorflow:{GPU_CELL} is a GPU image but no --gpus" in proc.stderr


def test_glob_matching_several_cells_is_an_error(gpuenv_run):
    proc = gpuenv_run("-i", "tf2.21-*", "-f", str(SHIPPED_MATRIX), *py("pass"), image=None)
    assert proc.returncode == 125
    assert proc.stderr.startswith("error: -i 'tf2.21-*' matches ")


def test_unknown_cell_is_an_error(gpuenv_run):
    proc = gpuenv_run("-i", "tf9.9-py3.11-cpu", "-f", str(SHIPPED_MATRIX), *py("pass"), image=None)
    assert proc.returncode == 125
    assert "pattern 'tf9.9-py3.11-cpu' matches no cell" in proc.stderr
