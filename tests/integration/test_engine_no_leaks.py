"""Nothing leaks, nothing is escalated, on the real engine: a secret passed with `-e NAME`
(its value from the environment) never appears in what gpuenv prints or keeps, whichever
way `run` ends; validation containers run with no network; images' default user is not
root."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from support.cells import CPU_IMAGE, GPU_IMAGE
from support.cli import GPUENV, REPO, clean_env, output

pytestmark = pytest.mark.engine

SECRET = "s3cr3t-Value-7f1c9e-never-printed"


@pytest.mark.parametrize(
    "args,code",
    [
        (["python", "-c", "import os, sys; sys.exit(3 if os.environ['TOKEN'] else 4)"], 3),
        (["no-such-command-here"], 127),
        (["--gpus", "all", "true"], 125),
        (["-v", "/nonexistent/gpuenv-src:/x", "true"], 125),
        (["-p", "garbage", "true"], 125),
        (["-e", "BAD NAME=x", "true"], 125),
        (["--network", "no-such-network", "true"], 125),
    ],
    ids=["exit-3", "not-found", "gpus-refused", "missing-bind", "bad-port", "bad-env", "bad-net"],
)
def test_a_secret_from_the_environment_is_never_printed(args, code, shipped_cpu, gpuenv,
                                                        tmp_path, docker):  # fmt: skip
    cache = tmp_path / "cache"
    env = clean_env(TOKEN=SECRET, XDG_CACHE_HOME=str(cache))
    head = ["run", "-i", CPU_IMAGE, "-e", "TOKEN"]
    if "--network" not in args:
        head += ["--network", "none"]
    # Options go before the command: split what is an option from the command itself.
    proc = gpuenv(*head, *args, check=False, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == code, output(proc)
    assert SECRET not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    kept = [p for p in cache.rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert kept == []
    leftovers = docker("ps", "-aq", "--filter", "label=io.gpuenv.run=1",
                       "--filter", f"volume={tmp_path}").stdout.split()  # fmt: skip
    assert leftovers == []


def test_validation_containers_have_no_network(shipped_cpu, docker, tmp_path):
    proc = subprocess.Popen(
        [*GPUENV, "validate", "-i", CPU_IMAGE, "--json"], cwd=REPO, env=clean_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: dict[str, tuple[str, str]] = {}
    while proc.poll() is None:
        ids = docker("ps", "-q", "--no-trunc", "--filter", "label=io.gpuenv.validate=1").stdout
        for cid in ids.split():
            got = docker("inspect", cid, check=False)
            if got.returncode == 0:
                doc = json.loads(got.stdout)[0]
                seen[cid] = (doc["HostConfig"]["NetworkMode"], str(doc["HostConfig"]["Privileged"]))
        time.sleep(0.2)
    _, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert seen, "no validation container was seen running"
    assert set(seen.values()) == {("none", "False")}, seen


@pytest.mark.parametrize("image", [CPU_IMAGE, GPU_IMAGE])
def test_default_user_is_not_root(image, shipped_gpu, inspect):
    user = inspect(image)["Config"]["User"]
    assert user and user.split(":")[0] not in ("root", "0"), user


def test_run_container_gets_no_privileges(shipped_cpu, gpuenv, tmp_path):
    """What the process inside sees: the caller's uid, and at most Docker's default
    capability set (none beyond it: no --privileged, no cap-add), whoever the caller is."""
    code = (
        "import os; s = dict(l.split(':\\t') for l in open('/proc/self/status').read()"
        ".splitlines() if ':\\t' in l); print(os.getuid(), s['CapEff'], s['CapBnd'])"
    )
    proc = gpuenv("run", "-i", CPU_IMAGE, "--network", "none", "python", "-c", code,
                  cwd=tmp_path, timeout=300)  # fmt: skip
    uid, eff, bnd = proc.stdout.split()[-3:]
    assert int(uid) == os.getuid()
    assert int(eff, 16) & ~DOCKER_DEFAULT_CAPS == 0, eff
    assert int(bnd, 16) & ~DOCKER_DEFAULT_CAPS == 0, bnd
    if os.getuid() != 0:
        assert int(eff, 16) == 0, eff


# Docker's default capability set (CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW,
# SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE).
DOCKER_DEFAULT_CAPS = 0x00000000A80425FB
