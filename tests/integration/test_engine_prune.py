"""`gpuenv prune` on a real engine (issue 46, item 4): the working-directory volumes a
remote engine keeps for a client's directory (run/sync.py labels each with its owner:
client host, uid and path). Only this user's, on this host, are ever removed: a volume whose
directory is gone by default, every one not mounted with --all; another host's or user's is
left alone. The volumes are made here with the label sync writes (no run needed: the
sync itself is test_engine_remote_workdir.py's), for a client host of the test's own (a UTS
namespace): the machine's user's own volumes are never the test's to remove."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid

import pytest
from support.cli import GPUENV, output
from support.engine import docker

pytestmark = pytest.mark.engine

LABEL = "io.gpuenv.workdir"


def _gpuenv(host: str, *args: str) -> subprocess.CompletedProcess[str]:
    """gpuenv as a client host of its own (a UTS namespace named `host`): what it counts as
    the user's own volumes are the test's, never the machine's user's."""
    argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *GPUENV, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_prune_removes_only_the_users_own_volumes_of_a_directory_gone(tmp_path):
    run = uuid.uuid4().hex[:8]
    here = tmp_path / "project"
    here.mkdir()
    host = f"gpuenv-test-{run}"
    me = f"{host}:{os.getuid()}"
    volumes = {
        f"gpuenv-workdir-test-{run}-gone": f"{me}:{tmp_path / 'deleted'}",
        f"gpuenv-workdir-test-{run}-here": f"{me}:{here}",
        # This machine's own name: another host's, from the test's client host.
        f"gpuenv-workdir-test-{run}-other": f"{socket.gethostname()}:{os.getuid()}:/deleted",
    }
    for name, owner in volumes.items():
        docker("volume", "create", "--label", f"{LABEL}={owner}", name)
    try:
        names = list(volumes)
        dry = _gpuenv(host, "prune", "--dry-run")
        assert dry.returncode == 0, output(dry)
        assert f"volume {names[0]} " in dry.stdout and "gone; would remove" in dry.stdout
        assert f"volume {names[1]} " in dry.stdout and names[2] not in dry.stdout
        assert set(names) <= _volumes(), "a dry run removes nothing"

        pruned = _gpuenv(host, "prune")
        assert pruned.returncode == 0, output(pruned)
        assert _volumes() & set(names) == {names[1], names[2]}, output(pruned)

        everything = _gpuenv(host, "prune", "--all")
        assert everything.returncode == 0, output(everything)
        assert _volumes() & set(names) == {names[2]}, output(everything)  # never another's
    finally:
        docker("volume", "rm", *volumes, check=False)


def _volumes() -> set[str]:
    return set(docker("volume", "ls", "-q").stdout.split())
